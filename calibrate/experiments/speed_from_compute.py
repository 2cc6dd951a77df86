"""Where a run's slow episodes come from (calibrate/README, "The loop pays for what it
holds"): the speed process's episodes found (:func:`calibrate.speed.find_episodes`) in the
fitted levels' batch times as the fit takes them (the hand-off to the instance and back,
whose second half waits for the front end's loop, plus compute), and in the instance's own
compute alone, each against its mean per batch size; the log ratios' spread beside.

    python calibrate/experiments/speed_from_compute.py /tmp/fp5   # seconds
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

import calibrate.speed as sp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="A `calibrate run` folder of a server with the hand-off timed.")
    a = ap.parse_args()
    req = pd.read_csv(a.run / "measurements.csv.gz")
    slices = pd.read_csv(a.run / "slices.csv")
    fit_levels = [x["level"] for x in json.loads((a.run / "profile.json").read_text())["fit_levels"]]
    fitted = slices[slices["kept"] & slices["level"].isin(fit_levels)]
    ok = sp.fit_slices_only(req, fit_levels)
    for name, hand_off in (("batch time (hand-off and compute)", True), ("compute alone", False)):
        d = ok if hand_off else ok.assign(handoff_us=0.0)
        ms = pd.Series((sp.batch_time_us(d) / 1e3).to_numpy(), index=d["batch_size"].to_numpy())
        means = ms.groupby(level=0).mean()
        period = float(fitted["seconds"].median())
        b = sp.batch_log_ratios(d, lambda sizes, m=means: m.reindex(sizes).to_numpy(), period)
        episodes, _ = sp.find_episodes(b)
        shown = (
            "none"
            if episodes is None
            else f"{episodes['factor']:.2f}x for {episodes['mean_duration_s'] * 1e3:.0f} ms, "
            f"one every {episodes['mean_interval_s']:.1f} s"
        )
        print(f"{name}: log ratio sd {b['log_ratio'].std():.3f}; episodes {shown}")  # noqa: T201


if __name__ == "__main__":
    main()
