"""The way back through the hub of several front ends, measured and modelled
(calibrate/README, "The way back through the hub").

On a run of ``servesim serve --frontends N`` (the committed H200 run by default) it shows,
from the server's own clocks:

1. the time from a batch's end to its request's handler resuming, by level and by the
   request's place in its batch (the hub sends a batch's answers one after another);
2. the relay (the two hops between a front end and the hub) of answers that reached their
   front end while it was reading another request, against the others: the answer waits
   for the front end's job in progress;

then, one thing changed, the held-out levels' p50 and p99 of the run's scenario (the front
ends and the hub as stations before the queue, the way back a pure delay) against the same
scenario with ``preprocess.relay`` (each front end and the hub an event loop that also
answers), each the median of ``--seeds`` simulated designs of the run's slices. The way
back's parameters come from the fitted levels alone: the hub's time per answer is the
slope of (1) at the lightest fitted level, taken off its time per request on the way in
(the instance is free at the batch's end, the batch time holding the hand-back: no return
job); a front end's ``respond_ms`` is tried over ``--respond`` and the one whose simulated
time after the batch at the fitted levels rises from the lightest as the measured does is
kept (its CPU comes off the front end's admission, so the front end's CPU per request is
the measured one); and the pure delay gives back what the way back adds at the lightest
fitted level, so the light load stays as measured.

    python calibrate/experiments/hub_relay.py [RUN] [--seeds 20]
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from calibrate.interval import SliceDesign
from calibrate.scenario import with_load_generator
from simulator.engine import simulate
from simulator.scenario.config import Scenario

RUN = Path(__file__).resolve().parents[1] / "profiles" / "gpu-h200"
say = print  # the report goes to the console


def clocks(run: Path) -> pd.DataFrame:
    m = pd.read_csv(run / "measurements.csv.gz")
    m = m[(~m["warmup"]) & (m["status"] == 200)].copy()
    batch = m["handoff_us"] + m["compute_input_us"] + m["compute_infer_us"] + m["compute_output_us"]
    m["batch_end"] = m["dispatched_at_ns"] + batch * 1e3
    m["after_ms"] = (m["received_at_ns"] + m["request_us"] * 1e3 - m["batch_end"]) / 1e6
    m["relay_ms"] = m["relay_us"] / 1e3
    m["pos"] = m.groupby("dispatched_at_ns")["enqueued_at_ns"].rank(method="first") - 1
    return m


def answer_slope(g: pd.DataFrame) -> float:
    """The hub's time per answer: the after-batch time's slope on the place in the batch
    (least squares within batches of two or more, each batch its own intercept)."""
    g = g[g["batch_size"] >= 2]
    x = g["pos"] - g.groupby("dispatched_at_ns")["pos"].transform("mean")
    y = g["after_ms"] - g.groupby("dispatched_at_ns")["after_ms"].transform("mean")
    return float((x * y).sum() / (x * x).sum())


def busy_front_end(g: pd.DataFrame) -> pd.DataFrame:
    """Each request's relay, and whether its answer reached its front end while that front
    end was reading another request (from the other request's start to its item reaching
    the hub, less the hop: 0.3 ms); the answer taken to reach it 0.05 ms after its batch's
    end (the hub's first answer)."""
    rows = []
    for _, gw in g.groupby("frontend"):
        gw = gw.sort_values("received_at_ns")
        start = gw["received_at_ns"].to_numpy()
        end = gw["enqueued_at_ns"].to_numpy() - 300_000
        t = gw["batch_end"].to_numpy() + 50_000
        k = np.searchsorted(start, t, side="right") - 1
        kk = np.clip(k, 0, None)
        busy = (k >= 0) & (end[kk] > t) & (start[kk] != start)
        rows.append(pd.DataFrame({"busy": busy, "relay_ms": gw["relay_ms"].to_numpy()}))
    return pd.concat(rows)


def stage_tables(m: pd.DataFrame) -> None:
    say("After the batch (batch end to the handler resuming), median ms by level and place in the batch")
    say("(batches of 4 or more):")
    g = m[m["batch_size"] >= 4]
    say(g.pivot_table(index="offered_rps", columns="pos", values="after_ms", aggfunc="median").round(2).to_string())
    say("\nThe relay of answers that reached a front end reading another request, against the others:")
    rows = []
    for rate, g in m.groupby("offered_rps"):
        d = busy_front_end(g)
        for busy, h in d.groupby("busy"):
            rows.append({"req/s": rate, "front end busy": busy, "share": len(h) / len(d),
                         "median": h["relay_ms"].median(), "mean": h["relay_ms"].mean(),
                         "p99": h["relay_ms"].quantile(0.99)})  # fmt: skip
    say(pd.DataFrame(rows).round(3).to_string(index=False))


def relay_doc(doc: dict, respond_ms: float, answer_ms: float) -> dict:
    """The scenario with its way back modelled: the same CPU per request on the front ends
    and on the hub, split between the way in and the way back."""
    d = copy.deepcopy(doc)
    pre = d["preprocess"]
    hub = float(pre["hub"]["value_ms"])
    # the instance is free when the hub has its outputs (the server hands the next batch over
    # inside the pipe's callback, and the batch time measured holds that hand-back): no
    # return job of its own; the hub's time per request is its way in and its answer
    ret = 0.0
    hub_in = max(hub - answer_ms, 0.01)
    pre["hub"] = {"kind": "deterministic", "value_ms": hub_in}
    svc = pre["service"]
    scale = max(1.0 - respond_ms / float(svc["mean_ms"]), 0.05)
    pre["service"] = {**svc, "mean_ms": float(svc["mean_ms"]) * scale}
    pre["relay"] = {"respond_ms": respond_ms, "hub_return_ms": ret, "hub_answer_ms": answer_ms}
    return d


def percentiles(doc: dict, rate: float, *, seeds: int, design: SliceDesign) -> dict:
    """Median over ``seeds`` simulated designs (the run's slices, each started idle, its
    warm-up left out, as the validation simulates a level) of the pooled p50 and p99, and
    of the median time after the batch."""
    out = {"p50": [], "p99": [], "after p50": []}
    period = design.slice_s + design.gap_s
    steps = []
    for j in range(design.slices):
        steps += [{"at_s": j * period, "rate_rps": rate}, {"at_s": j * period + design.slice_s, "rate_rps": 0.0}]
    for seed in range(seeds):
        d = copy.deepcopy(doc)
        d.update(seed=seed, duration_s=design.slices * period, warmup_s=0.0)
        d["traffic"] = {"shape": {"kind": "steps", "steps": steps}}
        rec = simulate(Scenario.model_validate(d)).records
        offset = (rec.arrival / 1000.0) % period
        ok = rec.completed & (offset >= design.warmup_s) & (offset < design.slice_s)
        lat = (rec.t_response - rec.arrival)[ok]
        out["p50"].append(np.percentile(lat, 50))
        out["p99"].append(np.percentile(lat, 99))
        out["after p50"].append(np.percentile((rec.t_response - rec.t_inferred)[ok], 50))
    return {k: float(np.median(v)) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", nargs="?", type=Path, default=RUN)
    ap.add_argument("--seeds", type=int, default=20, help="simulated designs per level and model")
    ap.add_argument("--respond", default="0,0.1,0.2,0.3,0.4,0.6")
    args = ap.parse_args()
    m = clocks(args.run)
    stage_tables(m)
    profile = json.loads((args.run / "profile.json").read_text())
    # the server as the calibration's client drove it (its queue cannot refuse: calibrate/README)
    doc = with_load_generator(yaml.safe_load((args.run / "scenario.yaml").read_text()), profile)
    fit_rates = [f["rate_rps"] for f in profile["fit_levels"]]
    dz = profile["design"]
    design = SliceDesign(dz["rounds"], dz["slice_s"], dz["warmup_s"], (dz["levels"] - 1) * (dz["slice_s"] + 0.5))
    held = [r for r in sorted(m["offered_rps"].unique()) if not any(abs(r - f) < 1e-6 for f in fit_rates)]
    light = m[np.isclose(m["offered_rps"], min(fit_rates))]
    answer = answer_slope(light)
    say(f"\nThe hub's time per answer (slope at {min(fit_rates):.0f} req/s): {answer:.3f} ms")
    # the measured way back at the fitted levels: batch end to the response, less the light level's
    measured_after = {r: float(m[np.isclose(m["offered_rps"], r)]["after_ms"].median()) for r in fit_rates}
    base_after = measured_after[min(fit_rates)]
    best, best_err = None, np.inf
    say("\nrespond_ms tried on the fitted levels (after-batch median's rise over the lightest, ms):")
    say("  measured " + ", ".join(f"{measured_after[r] - base_after:+.3f}" for r in fit_rates))
    for respond in (float(x) for x in args.respond.split(",")):
        d = relay_doc(doc, respond, answer)
        sim = {r: percentiles(d, r, seeds=max(args.seeds // 2, 2), design=design)["after p50"] for r in fit_rates}
        rise = [sim[r] - sim[min(fit_rates)] for r in fit_rates]
        err = float(np.sum((np.array(rise) - np.array([measured_after[r] - base_after for r in fit_rates])) ** 2))
        say(f"  {respond:.2f} ms  " + ", ".join(f"{x:+.3f}" for x in rise) + f"  (squared error {err:.4f})")
        if err < best_err:
            best, best_err, light_after = respond, err, sim[min(fit_rates)]
    d = relay_doc(doc, best, answer)
    # the pure delay gives back what the way back now adds at the lightest fitted level
    over = (
        percentiles(d, min(fit_rates), seeds=args.seeds, design=design)["p50"]
        - percentiles(doc, min(fit_rates), seeds=args.seeds, design=design)["p50"]
    )
    samples = np.asarray(d["router"]["overhead"]["samples_ms"], dtype=float)
    d["router"]["overhead"]["samples_ms"] = np.maximum(samples - over, 0.01).round(4).tolist()
    say(f"\nKept: respond_ms {best:.2f}; the pure delay {over:+.3f} ms to keep the light p50 (after {light_after:.3f})")
    say(f"\nHeld-out levels, median of {args.seeds} simulated designs (error against the measured):")
    rows = []
    for r in held:
        g = m[np.isclose(m["offered_rps"], r)]
        meas = {"p50": g["latency_ms"].quantile(0.5), "p99": g["latency_ms"].quantile(0.99)}
        st, rl = (percentiles(x, r, seeds=args.seeds, design=design) for x in (doc, d))
        for q in ("p50", "p99"):
            rows.append({"req/s": r, "pct": q, "measured": meas[q],
                         "stations": st[q], "err stations %": (st[q] / meas[q] - 1) * 100,
                         "relay": rl[q], "err relay %": (rl[q] / meas[q] - 1) * 100})  # fmt: skip
    say(pd.DataFrame(rows).round(2).to_string(index=False))


if __name__ == "__main__":
    main()
