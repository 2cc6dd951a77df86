"""Would a longer throughput window, or more rounds of the factors' backfitting, hold more
of the level's speed? (calibrate/README, "A busy instance runs faster".)

For a run folder of ``servesim calibrate run``: refitted on copies (``servesim calibrate
refit``, 200 draws, seed 0) with the default fit (2 rounds, a 500 ms window) and three
variants; each prints the fitted ``by_rate`` table's range and the held-out p50/p99
errors. A window of 2 s leaves no fitted batch: the fit reads only a slice's batches
from its second window on (4 s slices).

    python calibrate/experiments/by_rate_variants.py [RUN]   # ~25 s a variant
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

import calibrate.fit as fit
from calibrate import idle
from calibrate.refit import refit_run

VARIANTS = ((2, 500.0), (6, 500.0), (2, 1000.0), (6, 2000.0))  # (backfitting rounds, window ms)
say = print


def main(run: Path) -> None:
    for rounds, tau in VARIANTS:
        fit.FIT_ROUNDS, idle.RATE_WINDOW_MS = rounds, tau
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "run"
            shutil.copytree(run, copy)
            refit_run(copy, draws=200, rng=np.random.default_rng(0))
            rows = json.loads((copy / "validation.json").read_text())["validation"]
            table = json.loads((copy / "profile.json").read_text())["service_time"].get("by_rate") or {1.0: 1.0}
            judged = [x for x in rows if x["percentile"] in ("p50", "p99")]
            cells = [f"{x['load']:.0%} {x['percentile']} {x['error_pct']:+.1f}" for x in judged]
            say(f"rounds {rounds}, window {tau:.0f} ms: by_rate {min(table.values()):.3f}-{max(table.values()):.3f} | "
                + " | ".join(cells))  # fmt: skip
    fit.FIT_ROUNDS, idle.RATE_WINDOW_MS = 2, 500.0


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "calibrate/profiles/cpu-resnet64-epyc"))
