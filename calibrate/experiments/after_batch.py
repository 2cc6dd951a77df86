"""Does a factor by the size of the batch before move the held-out cells? (calibrate/README,
"A batch after a big batch: tried, not adopted".)

A batch's compute on the CPU ResNet server runs slower the bigger its instance's batch
before it (0.011-0.018 in log per request of the batch before, on three runs). The
simulator can apply that (``service_time.after_batch``), and the fit can fit it beside
``after_idle`` and ``by_rate`` (``calibrate.idle.AFTER_BATCH``, off by default). For each
run folder of ``servesim calibrate run``: refitted on copies (``servesim calibrate refit``,
200 draws, seed 0) without and with the factor; each prints the fitted table and the
held-out p50/p99 errors, and how many cells meet the target and how many measurements
fall inside their interval.

    python calibrate/experiments/after_batch.py [RUN ...]   # 42-50 s a folder
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from calibrate import idle
from calibrate.refit import refit_run

say = print


def cells(folder: Path) -> tuple[str, int, int]:
    """The held-out p50/p99 errors (``*``: outside the 90% interval), the cells meeting
    the target and the measurements inside their intervals."""
    rows = json.loads((folder / "validation.json").read_text())["validation"]
    judged = [x for x in rows if x["percentile"] in ("p50", "p99")]
    text = " | ".join(
        f"{x['load']:.0%} {x['percentile']} {x['error_pct']:+.1f}{'' if x['covered'] else '*'}" for x in judged
    )
    met = sum(x["verdict"] not in ("miss", "shown") for x in judged)
    return text, met, sum(bool(x["covered"]) for x in judged)


def refit_copy(run: Path) -> tuple[dict, str, int, int]:
    """``run`` refitted on a copy (200 draws, seed 0), as the fit's switches stand: its
    ``service_time`` and :func:`cells`."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "run"
        shutil.copytree(run, copy)
        refit_run(copy, draws=200, rng=np.random.default_rng(0))
        return json.loads((copy / "profile.json").read_text())["service_time"], *cells(copy)


def main(runs: list[Path]) -> None:
    for run in runs:
        for on in (False, True):
            idle.AFTER_BATCH = on
            service, text, met, inside = refit_copy(run)
            table = service.get("after_batch")
            shown = "none" if table is None else ", ".join(f"{float(k):g}: {v:.3f}" for k, v in table.items())
            say(f"{run} after_batch {'on' if on else 'off'} ({shown}): {text} | met {met}, inside {inside}")
    idle.AFTER_BATCH = False


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]] or [Path("calibrate/profiles/cpu-resnet64-epyc")])
