"""Where each first token spends its time, request by request, by load (calibrate/README,
"The light level's TTFT, request by request"). The calibration gives every request one
fixed overhead outside the engine's steps (lone requests' TTFT less their prefill step);
``llm_ttft_apart.py`` found the real one longer at load and with a tail. Here the server
says, per request, when its front end got it, when the engine took it in, when its first
forward pass began and ended, and when the front end had the token (``servesim_timing``,
on this host's clock), and the client adds when it was scheduled and when the token
arrived: the TTFT in six parts (``calibrate.llm_load.first_token_parts``).

The server as the calibration runs it, the engine aged first; the calibration's own
overhead measurement; then 20-s slices of the committed profile's workload at 5, 30, 50
and 70% of its knee, in a random order, twice. Per slice, over its requests (the first
3 s left out): each part's p50, p90 and mean; *outside* (the way in to the hand-over and
the way back: what the fixed overhead stands for, beside the engine's wake); and the
simulator's wait for the step a request joins, on the same requests handed over at the
same times (the profile's step time, no noise), against ``to_engine``; the TTFT's p50 and
p90, measured and simulated on the same requests the calibration's way (each arriving
the measured overhead after its scheduled time).

    python calibrate/experiments/llm_first_token.py   # about 5 minutes, from the repository root
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

from calibrate import llm_load
from calibrate.experiments.llm_ttft_apart import replayed
from calibrate.llm_server import ENGINE, age_engine, measured_overhead, server_args, step_records
from calibrate.servers import beside_llm_front_end, server
from simulator.scenario.config import Scenario

PROFILE = Path("calibrate/profiles/cpu-tiny-llm")
SHARES = (0.05, 0.3, 0.5, 0.7)
SLICE_S, SKIP_S, AGE_S = 20.0, 3.0, 60.0
OUTSIDE = ("in_ms", "handler_ms", "back_ms", "out_ms")


def main() -> None:
    profile = json.loads((PROFILE / "profile.json").read_text())
    knee = profile["knee"]["completed_rps"]
    doc = yaml.safe_load((PROFILE / "scenario.yaml").read_text())
    s = Scenario.model_validate(doc)
    rng = np.random.default_rng(12)
    with (
        server(server_args(ENGINE), command="serve-llm", health="/health") as url,
        beside_llm_front_end(url),
    ):
        age_engine(url, doc, profile["knee"]["offered_rps"], AGE_S, seed=3)
        step_records(url)
        overhead = measured_overhead(url, seed=5)
        print(f"knee {knee:.2f} req/s; overhead measured the calibration's way: {overhead:.2f} ms")  # noqa: T201
        for _ in range(2):
            for share in rng.permutation(SHARES):
                plan = llm_load.plan_from_scenario(s, share * knee, SLICE_S, rng)
                df = llm_load.run(url, plan, seed=int(rng.integers(1 << 31)))
                step_records(url)
                ok = df[df["error"].isna()].dropna(subset=list(llm_load.PARTS)).sort_values("scheduled_s")
                sched = ok["scheduled_s"].to_numpy() * 1000.0
                lengths = ok["prompt_tokens"], ok["output_tokens"]
                handed = np.maximum.accumulate(sched + (ok["in_ms"] + ok["handler_ms"]).to_numpy())  # in order
                wait = replayed(s, handed, *lengths)[0] - handed
                # the calibration's way: the overhead on the way in
                _, first, _ = replayed(s, sched + overhead, *lengths)
                keep = sched >= SKIP_S * 1000.0
                wait, ttft = wait[keep], (first - sched)[keep]
                ok = ok[keep]
                ok = ok.assign(outside_ms=ok[list(OUTSIDE)].sum(axis=1))
                cols = [*llm_load.PARTS, "outside_ms"]
                p50, p90, mean = ok[cols].median(), ok[cols].quantile(0.9), ok[cols].mean()
                parts = ", ".join(f"{c[:-3]} {p50[c]:.2f}/{p90[c]:.2f}/{mean[c]:.2f}" for c in cols)
                print(  # noqa: T201
                    f"{share:4.0%} ({share * knee:5.2f} req/s, {len(ok)} requests), p50/p90/mean ms: {parts}; "
                    f"the simulator's wait for its step on the same hand-overs {np.median(wait):.2f}/"
                    f"{np.percentile(wait, 90):.2f}/{wait.mean():.2f}; TTFT p50/p90 {ok['ttft_s'].median() * 1e3:.2f}/"
                    f"{ok['ttft_s'].quantile(0.9) * 1e3:.2f}, the same requests simulated {np.median(ttft):.2f}/"
                    f"{np.percentile(ttft, 90):.2f}"
                )


if __name__ == "__main__":
    main()
