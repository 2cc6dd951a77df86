"""The ranker's front end under each model, on one run's own measurements (calibrate/README,
"The ranker's loop as the ResNet's"): a `calibrate run` folder of the MGET ranker refitted
and validated again (``calibrate refit``'s path, 200 designs a level) under one model, into
a copy of the folder; its validation.md says how each held-out percentile fared.

* ``store``: the feature store's one-thread station visited per Redis trip, the configured
  batching window (the model before 2026-11-29);
* ``loop``: the front end's one event loop (admission, hand-back, responses), the configured
  window;
* ``loop_window``: the loop with the window as the server keeps it;
* ``loop_await``: and the handler awaiting its fetch mid-way (``event_loop.resume_ms``), the
  window's timer drawn late per window (``event_loop.timer_late``) and the loop reading new
  requests before a handler whose fetch is back for a hold fitted on the run
  (``event_loop.reads_first_ms``, calibrate/reads.py): the code as committed;
* ``loop_reads_first``: and the loop reading every waiting request before it resumes a
  handler whose fetch is back, for as long as any waits (``event_loop.reads_first``, no
  bound).

``--reads-first-ms MS`` holds each resumption for MS ms, not fitted, and ``--in-order`` takes
the loop's jobs in the order they became ready (the model before "Reads first, for a
while").

With ``--cost-per-in-flight K`` the loop's work grows by K per other request it holds
(``event_loop.cost_per_in_flight``, measured by ranker_in_flight_cost.py); with
``--closed-loop N:MS,...`` (the CPU per request at N in flight, as ranker_in_flight_cost.py
prints it) by its share per request held, as a run fits it, and with ``--by-held`` by the
factor at the count held (``event_loop.cost_by_held``). ``--held-counts read`` counts only
the requests read as held (``event_loop.held_counts``; the code as committed counts every
request in the server), and ``--responds-first`` writes a batch's responses before the
reads ready while it came back (``event_loop.responds_first``; off as committed), and
``--no-batcher-yields`` sends a window's batch the moment its timer's job or a request
queued past it comes, not after the jobs ready then (``event_loop.batcher_yields``; on as
committed).
``--match-light-p50`` shifts the fetch's pure delay until the model's p50 at the lightest
fitted level is the measured one (tried, not adopted: "The batcher is a task on the loop").

With ``--instance-own-time`` the instance's batch table, its noise ratios and the speed
process are fitted from the instance's own time (the hand-off in plus compute) rather than
the batch time with the hand-back, which waits for the loop; the scenario's instance no
longer loses the hand-back's mean (calibrate/README, "The hand-back's wait is tail the
model needs").

    python calibrate/experiments/ranker_loop_models.py RUN OUT --model store          # ~6 min
    python calibrate/experiments/ranker_loop_models.py RUN OUT --model loop_await     # ~1 min
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

import calibrate.cycle as cycle
import calibrate.fit as fit
import calibrate.held as held
import calibrate.refit as refit
import calibrate.report_model as report_model
import calibrate.scenario as scenario
import calibrate.speed as speed

MODELS = ("store", "loop", "loop_window", "loop_await", "loop_reads_first")
OWN_US = ("handoff_in_us", "compute_input_us", "compute_infer_us", "compute_output_us")
SHOWN = ("load", "percentile", "measured_ms", "predicted_ms", "error_pct", "verdict")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="A `calibrate run` folder of the ranker (with the server's clocks).")
    ap.add_argument("out", type=Path, help="Where the refitted copy goes (replaced).")
    ap.add_argument("--model", choices=MODELS, default="loop_await")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--cost-per-in-flight",
        type=float,
        help="The loop's work grows by this share per other request it holds (event_loop.cost_per_in_flight; "
        "ranker_in_flight_cost.py measures it).",
    )
    ap.add_argument(
        "--closed-loop",
        help="CPU ms a request by requests in flight, N:MS comma-separated (ranker_in_flight_cost.py): the loop's "
        "work by the count held (event_loop.cost_by_held), as a run's closed loop measures it.",
    )
    ap.add_argument(
        "--by-held", action="store_true", help="With --closed-loop: the factor by the count held, not the share."
    )
    ap.add_argument(
        "--held-counts",
        choices=("read", "arrived"),
        default="arrived",
        help="Which requests the loop's cost per request held counts (event_loop.held_counts).",
    )
    ap.add_argument(
        "--reads-first-ms",
        type=float,
        help="With --model loop_reads_first: how long after its fetch is back a resumption still lets reads go "
        "first, ms (event_loop.reads_first_ms; default: while any request waits).",
    )
    ap.add_argument(
        "--in-order",
        action="store_true",
        help="The loop's jobs in the order they became ready, no hold fitted (the model before \"Reads first, for "
        'a while").',
    )
    ap.add_argument(
        "--responds-first",
        action="store_true",
        help="A batch's responses before the reads and resumptions ready while it came back "
        "(event_loop.responds_first).",
    )
    ap.add_argument(
        "--batcher-yields",
        action=argparse.BooleanOptionalAction,
        default=scenario.BATCHER_YIELDS,
        help="The batcher sends at its turn, after the jobs ready then (event_loop.batcher_yields; on as committed).",
    )
    ap.add_argument(
        "--instance-own-time",
        action="store_true",
        help="Fit the instance's batch table, noise and speed process from the hand-off in plus compute.",
    )
    ap.add_argument(
        "--match-light-p50",
        action="store_true",
        help="Shift the fetch's pure delay until the model's p50 at the lightest fitted level is the measured one.",
    )
    a = ap.parse_args()
    shutil.rmtree(a.out, ignore_errors=True)
    shutil.copytree(a.run, a.out)
    if a.model == "store":  # the one-thread station per trip, as profiles without clocks run
        scenario.ranker_on_loop = report_model.ranker_on_loop = lambda profile: False
    if a.model in ("store", "loop"):  # the window as configured
        refit.fit_window = lambda *args, **kwargs: None
    if a.model not in ("loop_await", "loop_reads_first"):  # the fetch before one admission job
        cycle.fit_resume = lambda *args, **kwargs: None
    if a.model == "loop_reads_first" or a.reads_first_ms is not None:  # for every profile, not fitted
        scenario.READS_FIRST, scenario.READS_FIRST_MS = True, a.reads_first_ms
    elif a.in_order:
        scenario.READS_FIRST = False
    scenario.HELD_COUNTS = a.held_counts
    scenario.RESPONDS_FIRST = a.responds_first
    scenario.BATCHER_YIELDS = a.batcher_yields
    if a.cost_per_in_flight is not None or a.closed_loop:  # as a run's closed loop measures it (refit keeps it)
        path = a.out / "profile.json"
        profile = json.loads(path.read_text())
        rows = []
        for pair in (a.closed_loop or "").split(",") if a.closed_loop else []:
            n, ms = pair.split(":")
            rows.append({"in_flight": int(n), "cpu_ms_per_request": float(ms)})
        share = a.cost_per_in_flight if a.cost_per_in_flight is not None else held.share_per_request(rows)
        profile["loop_in_flight"] = {"by_in_flight": rows, "cost_per_in_flight": share}
        path.write_text(json.dumps(profile))
    refit.HELD_BY_COUNT = a.by_held
    if a.instance_own_time:
        own_time(a.out)
    if a.match_light_p50:
        compare = refit.compare

        def matched(profile, requests, summary, **kwargs):
            match_light_p50(profile, requests)
            return compare(profile, requests, summary, **kwargs)

        refit.compare = matched
    rep = refit.refit_run(a.out, draws=200, rng=np.random.default_rng(a.seed))
    for r in rep["validation"]:
        if r["percentile"] in ("p50", "p99"):
            print(json.dumps({k: r[k] for k in SHOWN}))  # noqa: T201


def light_p50(profile: dict, rate: float, seeds=(11, 12, 13)) -> float:
    """The model's p50 at ``rate``: the mean over three 20 s runs."""
    from simulator.engine import simulate
    from simulator.results.metrics import window
    from simulator.scenario.config import Scenario

    p50s = []
    for seed in seeds:
        s = Scenario.model_validate(scenario.scenario_dict(profile, rate, duration_s=20.0, warmup_s=1.0, seed=seed))
        rec = simulate(s).records
        w = window(rec, s) & rec.completed
        p50s.append(float(np.median(rec.t_response[w] - rec.arrival[w])))
    return float(np.mean(p50s))


def match_light_p50(profile: dict, requests: pd.DataFrame, rounds: int = 3) -> None:
    """Shift the fetch's pure delay (``features.light_round_trip``, at least 0.05 ms) by the
    model's p50 excess at the lightest fitted level, ``rounds`` times (calibrate/README,
    "The batcher is a task on the loop": the light level's wall times hold the loop's
    waits, which the model adds again). Prints the excess before each round."""
    low = min(f["level"] for f in profile["fit_levels"])
    rate = profile["levels_rps"][low]
    ok = requests[(requests["level"] == low) & (requests["status"] == 200) & ~requests["warmup"]]
    measured = float(ok["latency_ms"].median())
    trip = profile["features"]["light_round_trip"]
    for k in range(rounds):
        excess = light_p50(profile, rate) - measured
        print(f"round {k}: the model's p50 at {rate:.0f} req/s less the measured {measured:.3f} ms: {excess:+.3f} ms")  # noqa: T201
        trip["samples_ms"] = np.maximum(np.asarray(trip["samples_ms"]) - excess, 0.05).round(4).tolist()


def own_us(df: pd.DataFrame) -> pd.Series:
    """A request's batch as the instance spent it: the hand-off in and compute, no hand-back."""
    return sum((df[c].fillna(0.0) if c in df else 0.0) for c in OWN_US)


def own_time(out: Path) -> None:
    """The run copy's batch table from the instance's own time, and the refit's speed process
    and event loop to match (the instance no longer loses the hand-back's mean)."""
    path = out / "profile.json"
    profile = json.loads(path.read_text())
    levels = [f["level"] for f in profile["fit_levels"]]
    req = pd.read_csv(out / "measurements.csv.gz")
    cols = ["batch_size", *fit.BATCH_STAGES_US, "handoff_in_us"]
    ok = speed.fit_slices_only(req, levels).dropna(subset=cols)
    batches = ok.drop_duplicates(subset=[*cols, "slice"])
    b, y = batches["batch_size"].astype(int).to_numpy(), (own_us(batches) / 1e3).to_numpy()
    affine, table = fit.fit_affine(b, y), fit.fit_table(b, y)
    profile["service_time"] = table if table is not None and table["r2"] > affine["r2"] else affine
    profile["service_time_fits"] = {"affine": affine, "table": table}
    path.write_text(json.dumps(profile))
    speed.batch_time_us = own_us  # the speed process's log ratios, from the same time
    held = refit.held_cost

    def held_then_whole(p: dict) -> None:
        held(p)
        p["frontend"]["event_loop"]["instance_less_ms"] = 0.0

    refit.held_cost = held_then_whole


if __name__ == "__main__":
    main()
