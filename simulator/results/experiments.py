"""The summary sections of experiments: the canary's and the shadow's traffic, latency and
cost (:func:`versions_summary`), and each traffic class's (:func:`classes_summary`).
Pure functions of a run."""

from __future__ import annotations

import numpy as np

from simulator.ledger import Outcome
from simulator.results.run import Run
from simulator.results.stats import overlap, sla_verdict, summary_stats
from simulator.serving.workers import mean_service_ms


def versions_summary(run: Run, mask: np.ndarray, price: float, billed_workers: float) -> dict | None:
    """Per-version traffic share, latency and errors; the shadow's load, latency, cost and
    the primary p99 it costs when it shares the primary's queues."""
    s, rec = run.scenario, run.records
    r = s.router
    if r.canary is None and r.shadow is None:
        return None
    out: dict = {"versions": {}}
    for code, name, cfg in ((0, "primary", None), (1, r.canary.name if r.canary else "canary", r.canary)):
        sel = mask & (rec.version == code)
        if code == 1 and cfg is None:
            continue
        done = sel & rec.completed
        out["versions"][name] = {
            "requests": int(sel.sum()),
            "share": float(sel.sum() / max(mask.sum(), 1)),
            "errors": int(np.count_nonzero(rec.outcome[sel] == Outcome.ERROR)),
            "latency_ms": summary_stats((rec.t_response - rec.arrival)[done]),
            "workers": cfg.workers if cfg else s.workers.count,
        }
    if r.shadow is not None and run.shadow is not None:
        sh = run.shadow
        inside = mask[sh["request"]]
        ok = inside & (sh["outcome"] == Outcome.COMPLETED)
        served = (sh["t_inferred"] - sh["t_preprocessed"])[ok]
        span_s = s.duration_s - s.warmup_s
        if r.shadow.pool == "own":
            gpu_cost = r.shadow.workers * price
        else:  # its share of the primary pool's batch items
            items = float(run.batches.size.sum())
            gpu_cost = (len(sh["request"]) / items if items else 0.0) * billed_workers * price
        shadow = {
            "copies": int(inside.sum()),
            "copies_per_s": float(inside.sum() / span_s),
            "dropped": int(np.count_nonzero(inside & (sh["outcome"] != Outcome.COMPLETED))),
            "server_latency_ms": summary_stats(served),
            "gpu_cost_per_hour_usd": gpu_cost,
            "pool": r.shadow.pool,
        }
        if run.response_without_shadow is not None:
            prim = mask & rec.completed & (rec.version == 0)
            with_p99 = float(np.percentile((rec.t_response - rec.arrival)[prim], 99)) if prim.any() else float("nan")
            alone = (run.response_without_shadow - rec.arrival)[prim]
            alone = alone[np.isfinite(alone)]
            without_p99 = float(np.percentile(alone, 99)) if len(alone) else float("nan")
            shadow["primary_p99_ms"] = {
                "with_shadow": with_p99,
                "without_shadow": without_p99,
                "added": with_p99 - without_p99,
            }
        out["shadow"] = shadow
    return out


def classes_summary(run: Run, mask: np.ndarray, price: float) -> dict | None:
    """Per traffic class: outcomes, latency, its own SLA verdict, and its share of the GPUs.

    ``gpu_share`` is the class's busy instance-time over its pool's instance-time in the
    window; a class on the shared pool is charged its share of the shared pool's busy time.
    """
    s, rec = run.scenario, run.records
    if not s.traffic.classes:
        return None
    t0, t1 = s.warmup_s * 1000.0, s.duration_s * 1000.0
    span_s = (t1 - t0) / 1000.0
    inst = s.workers.instances
    busy = {name: float(overlap(log.start, log.end, t0, t1).sum()) for name, log in run.pools.items()}
    shared_busy = sum(busy[n] for n, c in s.traffic.classes.items() if c.workers is None)
    out = {}
    for code, (name, cfg) in enumerate(s.traffic.classes.items()):
        sel = mask & (rec.traffic_class == code)
        done = sel & rec.completed
        outcome = rec.outcome[sel]
        e2e = (rec.t_response - rec.arrival)[done]
        dropped = int(np.count_nonzero(outcome != Outcome.COMPLETED))
        sla = cfg.sla or s.sla
        own = cfg.workers is not None
        workers = cfg.workers if own else s.workers.count
        if own:
            cost_h = workers * price
        else:
            cost_h = s.workers.count * price * (busy[name] / shared_busy if shared_busy else 0.0)
        b = s.batching.max_batch_size
        w = s.workers.model_copy(update={"service_time": cfg.service_time or s.workers.service_time})
        peak = workers * inst * b / mean_service_ms(w, b) * 1000.0
        out[name] = {
            "priority": cfg.priority,
            "pool": "own" if own else "shared",
            "workers": workers,
            "max_instances": cfg.max_instances,
            "requests": int(sel.sum()),
            "completed": int(done.sum()),
            "rejected": int(np.count_nonzero(outcome == Outcome.REJECTED)),
            "timed_out": int(np.count_nonzero(outcome == Outcome.TIMED_OUT)),
            "throughput_rps": float(done.sum() / span_s),
            "latency_ms": summary_stats(e2e),
            "queue_ms": summary_stats(rec.stage_ms("queue")[done]),
            "mean_batch_size": float(rec.batch_size[done].mean()) if done.any() else float("nan"),
            "sla": sla_verdict(e2e, sla.percentile, sla.target_ms, dropped if sla.count_dropped else 0),
            "gpu_share": busy[name] / (workers * inst * (t1 - t0)),
            "load_of_peak_capacity": float(done.sum() / span_s / peak),
            "cost_per_hour_usd": cost_h,
        }
    return out
