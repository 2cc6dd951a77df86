"""The hockey stick: p99 against offered load and against the worker count, with the SLA
target and the napkin's estimate marked."""

from __future__ import annotations

import streamlit as st

from dashboards import cache, charts
from dashboards.data import Choice
from simulator.planning.napkin import napkin_batch, per_worker_rps, workers_needed
from simulator.scenario.config import Scenario

LOAD_FACTORS = (0.5, 0.7, 0.85, 1.0, 1.1, 1.2, 1.3, 1.4)
WORKER_FACTORS = (0.6, 0.7, 0.8, 0.9, 1.0, 1.15, 1.3, 1.6)


def render(choice: Choice, s: Scenario) -> None:
    st.header("Load curve")
    if s.traffic.rate_rps is None or s.workers.autoscaler is not None:
        st.info(
            "The load curve varies traffic.rate_rps and workers.count: pick a scenario with a rate and a fixed fleet."
        )
        return
    capacity = s.workers.count * per_worker_rps(s, napkin_batch(s))
    bare, padded = workers_needed(s)
    st.caption(
        f"Napkin: {s.workers.count} workers × {per_worker_rps(s, napkin_batch(s)):,.0f} req/s at batch "
        f"{napkin_batch(s)} = {capacity:,.0f} req/s; the offered rate needs {bare} workers ({padded} with headroom)."
    )
    with st.spinner("simulating the load levels …"):
        by_load = cache.load_curve(choice.source, choice.text, choice.overrides, LOAD_FACTORS)
    st.altair_chart(
        charts.hockey_stick(by_load, "offered_rps", s.sla.target_ms, capacity, "napkin capacity"),
        width="stretch",
    )
    counts = tuple(sorted({max(1, round(bare * f)) for f in WORKER_FACTORS}))
    with st.spinner("simulating the fleet sizes …"):
        by_workers = cache.worker_curve(choice.source, choice.text, choice.overrides, counts)
    st.altair_chart(
        charts.hockey_stick(by_workers, "workers", s.sla.target_ms, bare, "napkin workers"), width="stretch"
    )
    with st.expander("points"):
        st.dataframe(by_load[["offered_rps", "p50_ms", "p99_ms", "dropped", "cost_per_million_usd"]])
        st.dataframe(by_workers[["workers", "p50_ms", "p99_ms", "dropped", "cost_per_hour_usd"]])
