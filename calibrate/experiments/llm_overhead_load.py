"""Where a request's first token spends its time, by load (calibrate/README, "The light-load
gap"): the calibration adds one fixed overhead (HTTP, the hand-offs, the stream: lone
requests' TTFT less their prefill step) to every request, whatever the load. Is it fixed?
The server as the calibration runs it, the engine aged first; then slices of the default
workload at rates from nearly idle to 70% of the committed profile's knee, in a random
order, twice. Per slice, the mean TTFT taken apart with exact means (the server's
``_sum``/``_count`` over the slice): the client's; the front end's (``vllm:time_to_first
_token_seconds``, from the request reaching the handler to its first token leaving it);
the engine's (queue and prefill: ``vllm:request_queue_time_seconds`` +
``vllm:request_prefill_time_seconds``). The client's less the front end's is the way in
and out (HTTP, the load generator's loop, both on the front end's core); the front end's
less the engine's is the token's way back from the engine's process.

    python calibrate/experiments/llm_overhead_load.py   # about 6 minutes, from the repository root
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

from calibrate import llm_load
from calibrate.llm_server import ENGINE, age_engine, server_args, step_records
from calibrate.servers import beside_llm_front_end, server
from calibrate.vllm_metrics import scrape
from simulator.scenario.config import Scenario

PROFILE = Path("calibrate/profiles/cpu-tiny-llm")
SHARES = (0.05, 0.3, 0.5, 0.7)
SLICE_S, SKIP_S, AGE_S = 20.0, 3.0, 60.0
NAMES = ("vllm:time_to_first_token_seconds", "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds")


def _means(before, after) -> dict[str, float]:
    """Each histogram's mean (ms) over the requests finished between two scrapes."""
    out = {}
    for name in NAMES:
        n = after.values[name + "_count"] - before.values[name + "_count"]
        out[name] = (after.values[name + "_sum"] - before.values[name + "_sum"]) / n * 1e3 if n else float("nan")
    return out


def main() -> None:
    profile = json.loads((PROFILE / "profile.json").read_text())
    knee = profile["knee"]["completed_rps"]
    doc = yaml.safe_load((PROFILE / "scenario.yaml").read_text())
    s = Scenario.model_validate(doc)
    rng = np.random.default_rng(11)
    overhead = doc["network"]["client_to_api"]["value_ms"]
    print(f"the profile's fixed overhead: {overhead:.2f} ms; its knee {knee:.2f} req/s")  # noqa: T201
    with (
        server(server_args(ENGINE), command="serve-llm", health="/health") as url,
        beside_llm_front_end(url),
    ):
        age_engine(url, doc, profile["knee"]["offered_rps"], AGE_S, seed=3)
        step_records(url)
        for _ in range(2):
            for share in rng.permutation(SHARES):
                plan = llm_load.plan_from_scenario(s, share * knee, SLICE_S, rng)
                before = scrape(url)
                df = llm_load.run(url, plan, seed=int(rng.integers(1 << 31)))
                after = scrape(url)
                step_records(url)
                ok = df[df["error"].isna()]
                m = _means(before, after)
                client = ok["ttft_s"].mean() * 1e3
                front = m[NAMES[0]]
                engine = m[NAMES[1]] + m[NAMES[2]]
                late = ok[ok["scheduled_s"] >= SKIP_S]["ttft_s"].median() * 1e3
                print(  # noqa: T201
                    f"{share:4.0%} of the knee ({share * knee:5.2f} req/s, {len(ok)} requests): mean TTFT client "
                    f"{client:6.2f} ms, front end {front:6.2f}, engine {engine:6.2f} (queue {m[NAMES[1]]:.2f}); "
                    f"in and out {client - front:5.2f}, back from the engine {front - engine:5.2f}; "
                    f"client p50 {late:.2f}"
                )


if __name__ == "__main__":
    main()
