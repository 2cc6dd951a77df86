"""The load generator's connections near saturation: who waits where (calibrate/README,
"The load generator's connections").

The calibration's client holds at most 256 connections (``calibrate.loadgen.CONNECTIONS``)
and keeps a request beyond them waiting in itself, its wait counted from its scheduled
time; the server's queue holds 256 too and refuses the 257th. So the measured server can
never refuse (256 in flight at most, some of them out of the queue), while a model of the
server alone refuses whatever finds its queue full, and leaves those requests, the slowest,
out of its percentiles. On a run's committed ``measurements.csv.gz`` (no device time):

1. measured: by held-out level, the requests owed at once (scheduled, not answered) at
   most, the errors, and in the slowest slice of the heaviest level the queue's wait
   against the wait outside the server's timer, by 0.5 s window;
2. simulated, each level's design of slices (``SliceDesign`` as the validation runs it,
   without its parameter draws): the share refused with the server's cap, and the median
   design's p99 with the cap and with it lifted (what ``calibrate.scenario.scenario_dict``
   now simulates), against the measured p99;
3. the claim that a request waits in the client as long as it would have in the queue,
   checked on the lifted runs: each request's send as the client's pool would hold it (at
   the answer that frees a connection), its way to the queue shifted by that hold; the
   share of requests held, and of those the share that would then reach the queue after
   their batch was dispatched (where the claim fails).

    python calibrate/experiments/client_pool.py [PROFILE_DIR]   # default: calibrate/profiles/gpu-h200
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.interval import SliceDesign, design_run
from calibrate.scenario import client_connections, pool_sends

say = print
DESIGNS = 100  # simulated designs per level and cap (at 85% lifted, 40 gave a median of 145.6 ms, 100 gave 150.0)


def owed_at_most(g: pd.DataFrame) -> int:
    """The most requests scheduled and not yet answered at once, over a level's slices."""
    most = 0
    for _, s in g.groupby("slice"):
        t0 = s["scheduled_s"].to_numpy()
        t1 = t0 + s["latency_ms"].to_numpy() / 1e3
        ev = np.concatenate([t0, t1])
        step = np.concatenate([np.ones(len(t0)), -np.ones(len(t1))])
        order = np.lexsort((step, ev))  # an answer before a send at the same instant
        most = max(most, int(np.cumsum(step[order]).max()))
    return most


def held_by_client(rec, n: int) -> tuple[int, int, int]:
    """On a run without refusals: requests sent, those a pool of ``n`` connections would
    hold (:func:`calibrate.scenario.pool_sends`), and of those the ones whose held send,
    their way to the queue unchanged, reaches the queue after their batch was dispatched."""
    sends = pool_sends(rec.arrival, rec.t_response, n)
    hold = sends - rec.arrival
    held = hold > 0
    late = held & (rec.t_preprocessed + hold > rec.t_dispatch + 1e-9)
    return len(sends), int(held.sum()), int(late.sum())


def main(folder: Path) -> None:
    profile = json.loads((folder / "profile.json").read_text())
    every = pd.read_csv(folder / "measurements.csv.gz")
    m = every[~every["warmup"]]
    n = client_connections(profile)
    cap = profile["server"]["max_queue_size"]
    say(f"{folder}: the load generator's connections {n}, the server's queue {cap}\n")

    say("1. measured, by level: requests owed at once at most, errors, requests waiting outside the timer > 10 ms")
    for level, g in m.groupby("level"):
        ok = g[g["status"] == 200]
        owed = owed_at_most(every[(every["level"] == level) & (every["status"] == 200)])
        outside = ok["latency_ms"] - ok["request_us"] / 1e3
        say(
            f"  {g['offered_rps'].iloc[0]:7.1f} req/s: owed at most {owed:4d}, errors "
            f"{int((g['status'] != 200).sum())}, outside > 10 ms {(outside > 10).mean():.2%}"
        )
    heavy = m[m["level"] == m["level"].max()]
    worst = heavy.groupby("slice")["latency_ms"].quantile(0.99).idxmax()
    s = heavy[(heavy["slice"] == worst) & (heavy["status"] == 200)].copy()
    s["w"] = (s["scheduled_s"] / 0.5).astype(int)
    s["outside"] = s["latency_ms"] - s["request_us"] / 1e3
    by = s.groupby("w").agg(queue=("queue_us", "median"), outside=("outside", "median"), p50=("latency_ms", "median"))
    say(f"  the heaviest level's slowest slice ({worst}), medians by 0.5 s window, ms:")
    say("    queue   " + " ".join(f"{v / 1e3:6.1f}" for v in by["queue"]))
    say("    outside " + " ".join(f"{v:6.1f}" for v in by["outside"]))

    levels = sorted(m["level"].unique())
    d = profile["design"]
    gap = (int(d["levels"]) - 1) * float(d["slice_s"])
    say(f"\n2. simulated designs (median of {DESIGNS}): refused with the cap; p99 with the cap, lifted; measured")
    checks = []
    for level in levels:
        g = m[m["level"] == level]
        rate = float(g["offered_rps"].iloc[0])
        if rate < 0.65 * profile["capacity_rps"]:
            continue
        design = SliceDesign(int(g["slice"].nunique()), float(d["slice_s"]), float(d["warmup_s"]), gap)
        p99 = {}
        refused = sent = 0
        for lifted in (False, True):
            got = []
            for k in range(DESIGNS):
                rec, keep = design_run(profile, rate, design, seed=1000 + k, load_generator=lifted)
                done = keep & rec.completed
                got.append(np.percentile((rec.t_response - rec.arrival)[done], 99))
                if not lifted:
                    refused += int((keep & ~rec.completed).sum())
                    sent += int(keep.sum())
                elif k < 8:
                    checks.append(held_by_client(rec, n))
            p99[lifted] = float(np.median(got))
        measured = float(np.percentile(g.loc[g["status"] == 200, "latency_ms"], 99))
        say(
            f"  {rate:7.1f} req/s: refused {refused / sent:.3%}; p99 {p99[False]:6.1f} (cap), {p99[True]:6.1f} "
            f"(lifted); measured {measured:6.1f} ms"
        )
    total, held, late = (sum(c[i] for c in checks) for i in range(3))
    say(
        f"\n3. the client's pool applied to the lifted runs (8 designs a level): {held} of {total} requests held "
        f"({held / max(total, 1):.2%}); of those, {late} would reach the queue after their batch was dispatched"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "calibrate/profiles/gpu-h200"))
