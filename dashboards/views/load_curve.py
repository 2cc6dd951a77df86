"""The hockey stick: p99 against offered load and against the worker count, out to the
knee, with drops, the SLA target, the napkin's estimate and the current setup marked."""

from __future__ import annotations

import numpy as np
import streamlit as st

from dashboards import cache, charts
from dashboards.data import Choice
from simulator.planning.napkin import napkin_batch, per_worker_rps, workers_needed
from simulator.scenario.config import Scenario

WORKER_FACTORS = (0.6, 0.7, 0.8, 0.9, 1.0, 1.15, 1.3, 1.6)


def load_factors(s: Scenario) -> tuple[float, ...]:
    """Multiples of the scenario's rate from half to past the fleet's peak capacity (every
    worker at its largest batch), so the curve reaches its knee."""
    peak = s.workers.count * per_worker_rps(s, s.batching.max_batch_size)
    top = max(1.4, 1.1 * peak / s.traffic.rate_rps)
    grid = [x for x in np.round(np.linspace(0.5, top, 9), 3).tolist() if abs(x - 1.0) >= 0.05]
    return tuple(sorted({*grid, 1.0}))


def render(choice: Choice, s: Scenario) -> None:
    st.header("Load curve")
    if s.traffic.rate_rps is None or s.autoscaled:
        st.info(
            "The load curve varies traffic.rate_rps and workers.count: pick a scenario with a rate and a fixed fleet."
        )
        return
    batch = napkin_batch(s)
    capacity = s.workers.count * per_worker_rps(s, batch)
    peak = s.workers.count * per_worker_rps(s, s.batching.max_batch_size)
    bare, padded = workers_needed(s)
    st.caption(
        f"Napkin: {s.workers.count} workers × {per_worker_rps(s, batch):,.0f} req/s at batch {batch} = "
        f"{capacity:,.0f} req/s; the offered rate needs {bare} workers ({padded} with headroom). At the largest "
        f"batch ({s.batching.max_batch_size}) the fleet peaks at {peak:,.0f} req/s: the curve goes past it."
    )
    with st.spinner("simulating the load levels …"):
        by_load = cache.load_curve(choice.source, choice.text, choice.overrides, load_factors(s))
    by_load = by_load.assign(dropped_share=by_load["dropped"] / by_load["arrived"].clip(lower=1))
    st.altair_chart(
        charts.hockey_stick(
            by_load,
            "offered_rps",
            s.sla.target_ms,
            capacity,
            f"napkin capacity (batch {batch})",
            x_title="offered load (req/s)",
            current=s.traffic.rate_rps,
            current_label="this scenario",
        ),
        width="stretch",
    )
    counts = tuple(sorted({max(1, round(bare * f)) for f in WORKER_FACTORS} | {s.workers.count}))
    with st.spinner("simulating the fleet sizes …"):
        by_workers = cache.worker_curve(choice.source, choice.text, choice.overrides, counts)
    by_workers = by_workers.assign(dropped_share=by_workers["dropped"] / by_workers["arrived"].clip(lower=1))
    st.altair_chart(
        charts.hockey_stick(
            by_workers,
            "workers",
            s.sla.target_ms,
            bare,
            "napkin workers",
            x_title="workers",
            current=s.workers.count,
            current_label="this fleet",
            integer=True,
        ),
        width="stretch",
    )
    with st.expander("points"):
        st.dataframe(by_load[["offered_rps", "p50_ms", "p99_ms", "dropped", "cost_per_million_usd"]])
        st.dataframe(by_workers[["workers", "p50_ms", "p99_ms", "dropped", "cost_per_hour_usd"]])
