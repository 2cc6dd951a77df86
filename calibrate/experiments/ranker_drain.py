"""How fast a backlog drains, measured and simulated (calibrate/README, "The ranker drains a
backlog slower than the model"): for each level of a `calibrate run` folder from
``--from-load``, the answers a second by the requests held at the start of each 100 ms bin
(:mod:`calibrate.drain`), over the measured slices and over ``--slices`` simulated from the
folder's profile as the validation runs them, with the bins each mean is over. A level the
server drains slower than the model at the same count is one it tips in more often.

    python calibrate/experiments/ranker_drain.py RUN --slices 40   # ~20 s
    python calibrate/experiments/ranker_drain.py RUN --without-factor   # the profile's loop without cost_by_held
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.drain import BIN_S, EDGES, measured, simulated
from calibrate.validate import design


def table(server: pd.DataFrame, model: pd.DataFrame) -> pd.DataFrame:
    """Per level and bin of the count held: the mean answers a second and the bins, each side."""
    out = []
    for name, d in (("measured", server), ("model", model)):
        d = d.assign(held=pd.cut(d["held"], [*EDGES, np.inf], right=False, labels=[f"{e}+" for e in EDGES]))
        g = d.groupby(["level", "held"], observed=True)["rate"]
        out.append(pd.DataFrame({f"{name} req/s": g.mean().round(0), f"{name} bins": g.size()}))
    return out[0].join(out[1], how="outer")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="A `calibrate run` folder.")
    ap.add_argument("--slices", type=int, default=40, help="Simulated slices a level.")
    ap.add_argument("--from-load", type=float, default=0.6)
    ap.add_argument("--without-factor", action="store_true", help="Simulate without the loop's cost_by_held.")
    a = ap.parse_args()
    profile = json.loads((a.run / "profile.json").read_text())
    if a.without_factor:
        profile["frontend"]["event_loop"].pop("cost_by_held", None)
    levels = pd.DataFrame(json.loads((a.run / "validation.json").read_text())["levels"])
    levels = levels[levels["load"] >= a.from_load]
    req = pd.read_csv(a.run / "measurements.csv.gz")
    slice_s, warmup_s = design(req, profile)
    server = measured(req, [int(x) for x in levels["level"]], warmup_s)
    model = pd.concat(
        [
            simulated(
                profile, int(lv["level"]), float(lv["offered_rps"]), slices=a.slices, slice_s=slice_s, warmup_s=warmup_s
            )
            for _, lv in levels.iterrows()
        ],
        ignore_index=True,
    )
    t = table(server, model).reset_index()
    t["level"] = t["level"].map(dict(zip(levels["level"], levels["load"].map("{:.0%}".format), strict=True)))
    print(f"loop factor by held: {profile['frontend']['event_loop'].get('cost_by_held')}; bins of {BIN_S * 1e3:g} ms")  # noqa: T201
    print(t.to_markdown(index=False))  # noqa: T201


if __name__ == "__main__":
    main()
