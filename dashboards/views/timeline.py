"""The run over time: rate, workers (active, warming, draining), queue depth and windowed
p99, with scaling and deploy events as rules."""

from __future__ import annotations

import streamlit as st

from dashboards import cache, charts
from dashboards.data import Choice
from simulator.scenario.config import Scenario


def render(choice: Choice, s: Scenario) -> None:
    st.header("Timeline")
    r = cache.result(choice)
    t, ev = r.timeline, r.events
    st.altair_chart(charts.timeline(t, ev, ["offered_rps", "completed_rps"], "traffic", "req/s"), width="stretch")
    st.altair_chart(
        charts.timeline(t, ev, ["active_workers", "warming_workers", "draining_workers"], "workers", "workers"),
        width="stretch",
    )
    st.altair_chart(charts.timeline(t, ev, ["queue_depth"], "queue depth", "requests"), width="stretch")
    st.altair_chart(
        charts.timeline(t, ev, ["p50_ms", "p99_ms"], "latency per interval", "ms", target=s.sla.target_ms),
        width="stretch",
    )
    if len(ev):
        st.subheader("events")
        st.dataframe(ev, width="stretch", hide_index=True)
