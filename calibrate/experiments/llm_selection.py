"""Selection by speed (calibrate/README, "The host's speed shapes the batches"): same-shape
decode steps of the engine ran 8-15% slower at 30% of the knee than at 85% in every
calibration, which looked like a low-load slowdown the model lacks. The simulator, run
with the committed scenario's own step time and speed process, shows the same: when the
host runs slow, sequences pile into bigger batches, and when it runs fast the engine drains
its queue with small ones, so the steps of each shape sample the speed unevenly, more so at
one load than another. Without the speed process the shapes take no side. Per rate, the
geometric mean time (ms) of decode-only steps of 1-4 sequences over five 60-s runs.

    python calibrate/experiments/llm_selection.py   # about 20 s, from the repository root
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import yaml

from simulator.scenario.config import Scenario

PROFILE = Path("calibrate/profiles/cpu-tiny-llm")
RATES = (6.0, 16.0)  # 30% and 80% of the knee the calibrations measured (about 20 req/s)


def decode_steps(doc: dict, rate: float, seed: int) -> dict[int, float]:
    """The mean log time (ms) of decode-only steps of each size 1-4 in one run."""
    from simulator import simulate

    d = copy.deepcopy(doc)
    d["traffic"]["rate_rps"], d["duration_s"], d["warmup_s"] = rate, 60.0, 3.0
    b = simulate(Scenario.model_validate(d), seed=seed).batches
    ms = np.asarray(b.end) - np.asarray(b.start)
    size, prefill = np.asarray(b.size), np.asarray(b.prefill_share)
    return {k: float(np.log(ms[(prefill == 0) & (size == k)]).mean()) for k in (1, 2, 3, 4)}


def main() -> None:
    doc = yaml.safe_load((PROFILE / "scenario.yaml").read_text())
    still = {k: v for k, v in doc.items() if k != "platform"}
    for name, d in (("without the speed process", still), ("with it", doc)):
        got = {rate: [decode_steps(d, rate, seed) for seed in range(1, 6)] for rate in RATES}
        mean = {rate: {k: np.exp(np.mean([r[k] for r in runs])) for k in (1, 2, 3, 4)} for rate, runs in got.items()}
        low, high = mean[RATES[0]], mean[RATES[1]]
        print(name)  # noqa: T201
        for k in (1, 2, 3, 4):
            rel = low[k] / high[k] - 1
            print(f"  {k} sequences: {low[k]:.3f} ms at {RATES[0]:g} req/s, {high[k]:.3f} at {RATES[1]:g}: {rel:+.1%}")  # noqa: T201


if __name__ == "__main__":
    main()
