"""Where the ranker's tails come from, on one `calibrate run` folder of the MGET ranker and a
refit of it (calibrate/README, "The window's timer drawn per window, and reads before
resumptions"). Each part prints measured figures beside the refit scenario's:

* ``timer``: how late the batching window's timer closed the windows no request closed, by
  level (mean, median, 99th percentile, ms), and the batch queue's p50/p99, measured and
  simulated;
* ``fetch``: the fetch's time (``feature_us``) p50/p90/p99 by held-out load, measured, and
  simulated in the order jobs become ready and with reads first (the light-load round trip
  drawn, plus the simulated wait from the reply to the queue);
* ``overtake``: the share of requests whose resumption a request that reached the server
  after their reply was read before (a lower bound: arrival taken at the client's send plus
  the slice's least delay; the reply at the read plus the light-load median fetch), and
  those requests' mean fetch;
* ``ticks``: the client's sends clumped at the loop's millisecond ticks (share of send gaps
  under 0.05 ms), and the p50/p99 of a simulation sending at 1 ms ticks against one adding
  the measured send lags at random, both refitted on the latency from the send (a refit of
  a copy whose ``latency_ms`` loses ``send_lag_ms``);
* ``idle``: each stage's mean by how long the server had idled before the request (batch-
  of-one requests), and the p99 by level with that excess taken off;
* ``pieces``: the held-out p50/p99 above 20% load with the loop's work in other pieces
  (0.1 or 0.2 ms of the read moved to the resumption; the load generator's and the
  redis-server's CPU out of the read, every loop job slowed by their mean share of the
  core instead), in the order ready and reads first (120 s a rate).

    python calibrate/experiments/ranker_loop_models.py RUN REFIT --model loop_await   # ~1 min
    python calibrate/experiments/ranker_tails.py RUN REFIT --part fetch                  # ~1 min
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from calibrate.cycle import clocked, window_lateness

PARTS = ("timer", "fetch", "overtake", "ticks", "idle", "pieces")


def _measured(run: Path) -> pd.DataFrame:
    d = pd.read_csv(run / "measurements.csv.gz")
    d = d[d["status"] == 200].copy()
    d["fetch"] = d["feature_us"] / 1e3
    d["batch"] = (d["handoff_us"] + d["compute_input_us"] + d["compute_infer_us"] + d["compute_output_us"]) / 1e3
    d["pre"] = (d["enqueued_at_ns"] - d["received_at_ns"]) / 1e6 - d["fetch"]
    d["http"] = d["latency_ms"] - d["request_us"] / 1e3 - d["send_lag_ms"]
    return d


def _levels(d: pd.DataFrame) -> dict[int, float]:
    return d.groupby("level")["offered_rps"].first().to_dict()


def _simulate(scenario: Path | dict, rate: float, out: Path, *, reads_first=False, arrivals=None, secs=60.0):
    """A run of the refit's scenario (or an edited copy) at ``rate`` (or from an arrivals
    file): every request's record, in arrival order."""
    doc = yaml.safe_load(scenario.read_text()) if isinstance(scenario, Path) else scenario
    doc["duration_s"] = secs
    el = doc["preprocess"]["event_loop"]
    el.pop("reads_first_ms", None)  # no bound, or none at all (a refit's hold left out)
    el["reads_first"] = bool(reads_first)
    doc["traffic"] = {"arrivals_file": str(arrivals)} if arrivals is not None else {"rate_rps": rate}
    path = out.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    subprocess.run(["servesim", "run", str(path), "--records", str(out)], check=True, capture_output=True)
    return pd.read_parquet(out)


def _done(rec: pd.DataFrame) -> np.ndarray:
    return ~rec["warmup"].to_numpy() & (rec["outcome"] == "completed").to_numpy()


def _fired(s: pd.DataFrame, window: float, max_batch: int) -> np.ndarray:
    """The lateness of one slice's window-bound batches that the timer closed."""
    w = window_lateness(s, window, max_batch)
    return w.loc[~w["woke"], "late"].to_numpy()


def timer(run: Path, refit: Path, tmp: Path) -> None:
    d = _measured(run)
    server = json.loads((run / "profile.json").read_text())["server"]
    window, max_batch = float(server["max_queue_delay_ms"]), int(server["max_batch_size"])
    for level, rate in _levels(d).items():
        m = np.concatenate([_fired(s, window, max_batch) for _, s in clocked(d[d["level"] == level]).groupby("slice")])
        rec = _simulate(refit / "scenario.yaml", rate, tmp / "timer.parquet")
        ok = rec[rec["outcome"] == "completed"]
        sim = pd.DataFrame(  # the simulated requests with the server's clocks' columns (one instance)
            {
                "warmup": ok["warmup"], "batch_size": ok["batch_size"], "enq_ms": ok["t_preprocessed_ms"],
                "disp_ms": ok["t_dispatch_ms"], "end_ms": ok["t_inferred_ms"],
            }
        )  # fmt: skip
        s = _fired(sim, window, max_batch)
        mq = d.loc[(d["level"] == level) & ~d["warmup"], "queue_us"] / 1e3
        sq = (ok["t_dispatch_ms"] - ok["t_preprocessed_ms"])[~ok["warmup"]]
        print(  # noqa: T201
            f"{rate:7.1f} req/s  measured mean {m.mean():.2f} median {np.median(m):.2f} p99 "
            f"{np.percentile(m, 99):.2f} ms ({len(m)}), queue p50/p99 {mq.quantile(0.5):.2f}/{mq.quantile(0.99):.2f}"
            f"  |  simulated {s.mean():.2f} {np.median(s):.2f} {np.percentile(s, 99):.2f} ({len(s)}), queue "
            f"{sq.quantile(0.5):.2f}/{sq.quantile(0.99):.2f}"
        )


def fetch(run: Path, refit: Path, tmp: Path) -> None:
    d = _measured(run)
    d = d[~d["warmup"]]
    doc = yaml.safe_load((refit / "scenario.yaml").read_text())
    light = np.asarray(doc["features"]["round_trip"]["samples_ms"])
    rng = np.random.default_rng(0)
    for level, rate in _levels(d).items():
        m = d.loc[d["level"] == level, "fetch"]
        row = [f"{rate:7.1f} req/s  measured {' / '.join(f'{v:.2f}' for v in m.quantile([0.5, 0.9, 0.99]))}"]
        for first in (False, True):
            rec = _simulate(refit / "scenario.yaml", rate, tmp / "fetch.parquet", reads_first=first)
            after = (rec["t_preprocessed_ms"] - rec["t_features_ms"]).to_numpy()[_done(rec)]
            f = rng.choice(light, len(after)) + after
            name = "reads first" if first else "in order ready"
            row.append(f"{name} {' / '.join(f'{v:.2f}' for v in np.percentile(f, [50, 90, 99]))}")
        print("  |  ".join(row))  # noqa: T201


def overtake(run: Path, refit: Path, tmp: Path) -> None:
    d = _measured(run)
    f0 = float(d.loc[d["level"] == d["level"].min(), "fetch"].median())
    for level, rate in _levels(d).items():
        over, fetched = [], []
        for _, s in d[d["level"] == level].groupby("slice"):
            s = s.sort_values("received_at_ns")
            recv, enq = s["received_at_ns"].to_numpy() / 1e6, s["enqueued_at_ns"].to_numpy() / 1e6
            sent = s["scheduled_s"].to_numpy() * 1e3 + s["send_lag_ms"].to_numpy()
            arrived = sent + np.quantile(recv - sent, 0.001)  # the client's and the server's monotonic clock
            ready = recv + s["pre"].to_numpy() + f0
            order = np.argsort(arrived)
            arrived_sorted, read_sorted = arrived[order], recv[order]
            for i in np.flatnonzero(~s["warmup"].to_numpy()):
                lo, hi = np.searchsorted(arrived_sorted, ready[i]), np.searchsorted(arrived_sorted, enq[i])
                over.append(int((read_sorted[lo:hi] < enq[i] - 0.3).sum()))
                fetched.append(s["fetch"].to_numpy()[i])
        over, fetched = np.asarray(over), np.asarray(fetched)
        print(  # noqa: T201
            f"{rate:7.1f} req/s  overtaken {np.mean(over > 0):.1%}  mean fetch: overtaken twice or more "
            f"{fetched[over >= 2].mean() if (over >= 2).any() else float('nan'):.2f} ms, never "
            f"{fetched[over == 0].mean():.2f} ms"
        )


def ticks(run: Path, refit: Path, tmp: Path) -> None:
    d = _measured(run)
    ok = d[~d["warmup"]]
    for level, rate in _levels(d).items():
        g = ok[ok["level"] == level]
        sends = [s["scheduled_s"].to_numpy() * 1e3 + s["send_lag_ms"].to_numpy() for _, s in g.groupby("slice")]
        gaps = np.concatenate([np.diff(np.sort(x)) for x in sends])
        poisson = 1 - np.exp(-rate * 5e-5)
        print(f"{rate:7.1f} req/s  send gaps under 0.05 ms: {np.mean(gaps < 0.05):.1%} (Poisson {poisson:.1%})")  # noqa: T201
    # the model fitted on the latency from the send: a copy whose latency loses the send lag
    copy = tmp / "from_send"
    subprocess.run(["cp", "-r", str(run), str(copy)], check=True)
    m = pd.read_csv(run / "measurements.csv.gz")
    m["latency_ms"] = m["latency_ms"] - m["send_lag_ms"]
    m.to_csv(copy / "measurements.csv.gz", index=False)
    out = tmp / "from_send_refit"
    here = Path(__file__).parent / "ranker_loop_models.py"
    subprocess.run(["python", str(here), str(copy), str(out), "--model", "loop_await"], check=True, capture_output=True)
    rng = np.random.default_rng(0)
    lags = ok.loc[ok["level"] == ok["level"].min(), "send_lag_ms"].to_numpy()
    for level, rate in _levels(d).items():
        measured = ok.loc[ok["level"] == level, "latency_ms"]
        sched = np.cumsum(rng.exponential(1000.0 / rate, int(rate * 66)))
        sched = sched[sched < 60_000.0]
        row = [f"{rate:7.1f} req/s  measured p50/p99 {measured.quantile(0.5):.2f}/{measured.quantile(0.99):.2f}"]
        phase = rng.uniform(0.0, 1.0)
        for name, sent in (("lags at random", sched + rng.choice(lags, len(sched))),
                           ("1 ms ticks", np.ceil(sched - phase) + phase + 0.11)):  # fmt: skip
            order = np.argsort(sent, kind="stable")
            arrivals = tmp / "sends.txt"
            np.savetxt(arrivals, sent[order] / 1000.0, fmt="%.7f")
            rec = _simulate(out / "scenario.yaml", rate, tmp / "ticks.parquet", arrivals=arrivals)  # in send order
            lag = (sent - sched)[order][: len(rec)]  # latency counts from the schedule
            e = ((rec["t_response_ms"] - rec["arrival_ms"]).to_numpy() + lag)[_done(rec)]
            row.append(f"{name} {np.percentile(e, 50):.2f}/{np.percentile(e, 99):.2f}")
        print("  |  ".join(row))  # noqa: T201


def idle(run: Path, refit: Path, tmp: Path) -> None:
    d = _measured(run)
    parts = []
    for _, s in d.groupby("slice"):
        s = s.sort_values("received_at_ns").copy()
        recv = s["received_at_ns"].to_numpy() / 1e6
        done = np.maximum.accumulate(recv + s["request_us"].to_numpy() / 1e3)
        s["idle"] = np.r_[np.nan, recv[1:] - done[:-1]]
        parts.append(s)
    d = pd.concat(parts)
    d = d[~d["warmup"] & d["idle"].notna()]
    bins = [-np.inf, 0, 1, 2, 5, 10, 20, np.inf]
    light = d[(d["level"] == d["level"].min()) & (d["batch_size"] == 1)]
    table = light.groupby(pd.cut(light["idle"], bins), observed=True)[["http", "pre", "fetch", "batch", "latency_ms"]]
    print(table.mean().round(3).assign(requests=table.size()).to_string())  # noqa: T201
    for level, rate in _levels(d).items():
        g = d[d["level"] == level]
        base = g.loc[(g["idle"] > 0) & (g["idle"] <= 2), "latency_ms"].mean()
        excess = g.groupby(pd.cut(g["idle"], bins), observed=True)["latency_ms"].transform("mean") - base
        kept = g["latency_ms"] - np.where(g["idle"] > 2, excess, 0.0)
        print(  # noqa: T201
            f"{rate:7.1f} req/s  p99 {g['latency_ms'].quantile(0.99):.2f} -> {kept.quantile(0.99):.2f} ms without "
            f"the idle's excess; idled over 5 ms before {np.mean(g['idle'] > 5):.1%}"
        )


def pieces(run: Path, refit: Path, tmp: Path) -> None:
    import copy

    d = _measured(run)
    d = d[~d["warmup"]]
    fe = json.loads((refit / "profile.json").read_text())["frontend"]
    # the load generator's and the redis-server's CPU a request, with the background's share
    other = (fe["client_cpu_ms_per_request"] + fe["sidecar_cpu_ms_per_request"]) / (1 - fe["background_cores"])
    base = yaml.safe_load((refit / "scenario.yaml").read_text())
    held = [r["offered_rps"] for r in json.loads((refit / "validation.json").read_text())["levels"] if r["held_out"]]

    def edited(rate: float, shift: float, share: bool) -> dict:
        doc = copy.deepcopy(base)
        loop, read = doc["preprocess"]["event_loop"], doc["preprocess"]["service"]
        f = 1 / (1 - rate * other / 1000) if share else 1.0
        moved = other if share else shift
        read["samples_ms"] = [round((v - moved) * f, 5) for v in read["samples_ms"]]
        loop["resume_ms"] = (loop["resume_ms"] + (0 if share else shift)) * f
        for k in ("return_ms", "respond_per_batch_ms", "respond_per_request_ms"):
            loop[k] *= f
        return doc

    variants = {
        "as fitted": (0.0, False),
        "0.1 ms read -> resume": (0.1, False),
        "0.2 ms read -> resume": (0.2, False),
        "the others' mean share": (0.0, True),
    }
    print(f"other processes' CPU: {other:.3f} ms a request")  # noqa: T201
    for rate in held[1:]:
        m = d.loc[np.isclose(d["offered_rps"], rate), "latency_ms"]
        row = [f"{rate:7.1f} req/s  measured p50/p99 {m.quantile(0.5):.2f}/{m.quantile(0.99):.2f}"]
        for name, (shift, share) in variants.items():
            for first in (False, True):
                rec = _simulate(edited(rate, shift, share), rate, tmp / "pieces.parquet", reads_first=first, secs=120.0)
                e = (rec["t_response_ms"] - rec["arrival_ms"]).to_numpy()[_done(rec)]
                tag = " reads first" if first else ""
                row.append(f"{name}{tag} {np.percentile(e, 50):.2f}/{np.percentile(e, 99):.2f}")
        print("\n    ".join(row))  # noqa: T201


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="A `calibrate run` folder of the ranker (with the server's clocks).")
    ap.add_argument("refit", type=Path, help="Its refit by ranker_loop_models.py --model loop_await.")
    ap.add_argument("--part", choices=PARTS, required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        globals()[a.part](a.run, a.refit, Path(tmp))


if __name__ == "__main__":
    main()
