"""The autoscaler's metrics probe: what a scrape of a dynamic pool's workers reads.

``in_flight`` and ``queue_depth`` are averaged per serving worker (HPA) or summed over the
fleet (Knative), and include the activator's buffer, which reports itself; ``utilization``
is the share of busy instances; ``p99_ms`` the server latency (queue and service) of the
requests whose batch ended within the metric window. It reads the batch queues through
their public queries only.
"""

from __future__ import annotations

import numpy as np

from simulator.scenario.autoscaling import Autoscaler
from simulator.serving.activator import Activator
from simulator.serving.lives import Worker
from simulator.serving.workers import Feed


def scrape(cfg: Autoscaler, serving: list[Worker], t: float, activator: Activator) -> float:
    """The metric the autoscaler ``cfg`` reads at ``t`` from the ``serving`` workers."""
    if cfg.metric == "p99_ms":
        lat = [recent_latency(w.feed, t, cfg.metric_window_s * 1000.0) for w in serving]
        lat = np.concatenate(lat) if lat else np.zeros(0)
        return float(np.percentile(lat, 99)) if len(lat) else 0.0
    total = 0.0
    for w in serving:
        queued = w.feed.queue.queued(t)
        match cfg.metric:
            case "in_flight":
                total += queued + w.feed.busy
            case "queue_depth":
                total += queued
            case "utilization":
                total += 1 - len(w.feed.free) / w.feed.n_instances
    if activator.buffering() and cfg.metric in ("in_flight", "queue_depth"):  # the activator reports its buffer
        total += activator.waiting(t)
    if cfg.policy == "knative":
        return total
    return total / len(serving) if serving else 0.0


def recent_latency(feed: Feed, t: float, window: float) -> np.ndarray:
    """Queue + service time of the requests whose batch ended in (t - window, t]."""
    out = []
    for k in range(len(feed.b_end) - 1, -1, -1):
        end = feed.b_end[k]
        if end <= t - window:
            break
        if end <= t:
            out.extend(end - a for a in feed.queue.batch_arrivals(k))
    return np.asarray(out)
