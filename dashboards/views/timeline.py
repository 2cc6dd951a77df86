"""The run over time: offered, completed and dropped requests, workers (active, warming,
draining), queue depth and windowed p50/p99, with scaling and deploy events as rules."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import cache, charts
from dashboards.data import Choice
from simulator.scenario.config import Scenario


def intervals(t: pd.DataFrame, s: Scenario) -> pd.DataFrame:
    """The timeline's intervals inside the run, with drops per second: the interval that
    starts at the run's end holds only the drain (it would read as a crash to zero), and
    a last interval cut short by the run's end is scaled to its width."""
    t = t[t["t_s"] < s.duration_s].copy()
    if len(t) < 2:
        return t
    width = float(t["t_s"].iloc[1] - t["t_s"].iloc[0])
    short = s.duration_s - float(t["t_s"].iloc[-1])
    if 0 < short < width:  # rates over the part of the interval that was run
        for col in ("offered_rps", "completed_rps"):
            t.loc[t.index[-1], col] *= width / short
    t["rejected_rps"] = t["rejected"] / width
    t["timed_out_rps"] = t["timed_out"] / width
    return t


def render(choice: Choice, s: Scenario) -> None:
    st.header("Timeline")
    r = cache.result(choice)
    t, ev = intervals(r.timeline, s), r.events
    traffic = ["offered_rps", "completed_rps", "rejected_rps", "timed_out_rps"]
    st.altair_chart(charts.timeline(t, ev, traffic, "traffic", "req/s"), width="stretch")
    workers = ["active_workers", "warming_workers", "draining_workers"]
    workers += [c for c in ("prefill_workers", "decode_workers") if c in t]  # each pool's, prefill and decode apart
    st.altair_chart(charts.timeline(t, ev, workers, "workers", "workers"), width="stretch")
    st.altair_chart(charts.timeline(t, ev, ["queue_depth"], "queue depth", "requests"), width="stretch")
    st.altair_chart(
        charts.timeline(t, ev, ["p50_ms", "p99_ms"], "latency per interval", "ms", target=s.sla.target_ms),
        width="stretch",
    )
    if len(ev):
        st.subheader("events")
        st.dataframe(ev, width="stretch", hide_index=True)
