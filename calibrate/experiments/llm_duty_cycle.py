"""Does an engine that idles more run each step slower? (calibrate/README, "The light
level's TTFT, request by request"): in runs 28, 30 and 31 the 30% level's steps ran 13-17%
above the fit of the other phases while the knee's ran below it. Within a level, time
since the last idle goes with the batches' make-up, so this holds the work fixed and
changes only the idle time: on one aged engine, the same request (a 256-token prompt,
32 tokens: a prefill, then 31 decode steps of one sequence) sent one at a time, each
after the last has finished and the engine has idled ``gap`` seconds (0, 0.05, 0.2, 0.5),
in blocks of 10 in a random order, 8 blocks a gap. Per gap: the mean cycle of the decode
steps from the fourth after the idle on (the first three carry the fitted wake cost), its
spread over blocks, and the first three's.

    python calibrate/experiments/llm_duty_cycle.py   # about 3 minutes, from the repository root
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import yaml

from calibrate import llm_load, llm_profile
from calibrate.llm_server import ENGINE, age_engine, server_args, step_records
from calibrate.servers import beside_llm_front_end, server

PROFILE = Path("calibrate/profiles/cpu-tiny-llm")
GAPS_S = (0.0, 0.05, 0.2, 0.5)
BLOCKS, PER_BLOCK, PROMPT, OUTPUT, AGE_S = 8, 10, 256, 32, 60.0


def main() -> None:
    profile = json.loads((PROFILE / "profile.json").read_text())
    doc = yaml.safe_load((PROFILE / "scenario.yaml").read_text())
    rng = np.random.default_rng(21)
    one = llm_load.Plan(np.zeros(1), np.array([PROMPT]), np.array([OUTPUT]))
    late: dict[float, list[float]] = {g: [] for g in GAPS_S}
    early: dict[float, list[float]] = {g: [] for g in GAPS_S}
    with (
        server(server_args(ENGINE), command="serve-llm", health="/health") as url,
        beside_llm_front_end(url),
    ):
        age_engine(url, doc, profile["knee"]["offered_rps"], AGE_S, seed=3)
        step_records(url)
        for gap in rng.permutation(np.repeat(GAPS_S, BLOCKS)):
            for _ in range(PER_BLOCK):
                time.sleep(gap)
                llm_load.run(url, one, seed=int(rng.integers(1 << 31)), lead_s=0.0)
            steps = step_records(url).sort_values("begin_ns")
            ms = llm_profile.step_ms(steps)
            place = llm_profile.wake_position(steps)
            decode = (steps["prefill_tokens"] == 0).to_numpy()
            late[float(gap)].append(float(ms[decode & (place >= llm_profile.WAKE_STEPS)].mean()))
            early[float(gap)].append(float(ms[place < llm_profile.WAKE_STEPS].mean()))
    base = np.mean(late[GAPS_S[0]])
    for gap in GAPS_S:
        v = np.asarray(late[gap])
        print(  # noqa: T201
            f"idle {gap * 1000:4.0f} ms before each request: decode steps from the 4th on {v.mean():.4f} ms "
            f"(sd over {len(v)} blocks {v.std(ddof=1):.4f}; {v.mean() / base:.3f} of back-to-back); "
            f"the first three steps {np.mean(early[gap]):.3f} ms"
        )


if __name__ == "__main__":
    main()
