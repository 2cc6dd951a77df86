"""Plan: the fewest workers meeting the SLA for each value of one knob, the cost/latency
frontier, and the cheapest configuration as a scenario to download."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import charts
from dashboards.data import Choice
from simulator.planning.napkin import workers_needed
from simulator.planning.plan import Planner, label, on_instance_type
from simulator.scenario.config import Scenario
from simulator.scenario.loader import ScenarioError

KNOBS = {
    "batching window (ms)": "batching.max_queue_delay_ms",
    "instance type": "workers.instance_type",
    "max batch": "batching.max_batch_size",
}


@st.cache_data(show_spinner=False, max_entries=8)
def plan(source: str, text: str, overrides: tuple[str, ...], path: str, values: tuple, lo: int, hi: int, reps: int):
    choice = Choice(source, text, overrides)
    planner = Planner(replications=reps, max_replications=max(reps, 6))
    rows, best = [], []
    for v in values:
        s = choice.load((f"{path}={v}",) if path != "workers.instance_type" else ())
        if path == "workers.instance_type":
            s = on_instance_type(s, str(v))
        key = label({path: v})
        found, evals, check = planner.min_workers(s, lo, hi, key)
        rows += [{"config": key, **e.row()} for e in evals]
        best.append(
            {"config": key, "value": v, "monotone": check["monotone"], **(found.row() if found else {"met": False})}
        )
    return pd.DataFrame(rows), pd.DataFrame(best), planner.requests


def render(choice: Choice, s: Scenario) -> None:
    st.header("Plan: the cheapest configuration that meets the SLA")
    if s.workers.autoscaler is not None or s.traffic.classes:
        st.info("Planning bisects workers.count of a fixed fleet: pick a scenario without an autoscaler or classes.")
        return
    bare, padded = workers_needed(s)
    c1, c2, c3 = st.columns(3)
    knob = c1.selectbox("vary", list(KNOBS), key="plan-knob")
    path = KNOBS[knob]
    default = {
        "batching.max_queue_delay_ms": "1,2,5",
        "workers.instance_type": "l4,a100,h100",
        "batching.max_batch_size": "8,16,32",
    }
    raw = c2.text_input("values (comma-separated)", value=default[path], key=f"plan-values:{path}")
    lo, hi = c3.slider("workers range", 1, max(8, 4 * padded), (max(1, bare // 2), 2 * padded), key="plan-range")
    reps = st.number_input("replications per point", 2, 10, 2, key="plan-reps")
    values = tuple(v.strip() for v in raw.split(",") if v.strip())
    if not st.button("run the plan", type="primary", key="plan-run"):
        st.caption(
            f"Napkin: {bare} workers, {padded} with headroom. Each value's worker count is bisected in the range."
        )
        return
    try:
        with st.spinner("planning …"):
            points, best, requests = plan(choice.source, choice.text, choice.overrides, path, values, lo, hi, int(reps))
    except ScenarioError as e:
        st.error(str(e))
        return
    st.caption(f"{len(points)} points, {requests:,} requests simulated")
    st.dataframe(best.drop(columns=[c for c in ("rate_rps", "sampled_workers") if c in best]), hide_index=True)
    st.altair_chart(charts.frontier(points, s.sla.target_ms), width="stretch")
    met = best[best["met"]]
    if len(met):
        pick = met.sort_values("cost_per_hour_usd").iloc[0]
        extra = (f"workers.count={int(pick['workers'])}",) + (
            (f"{path}={pick['value']}",) if path != "workers.instance_type" else ()
        )
        st.success(f"cheapest: {pick['config']}, {int(pick['workers'])} workers, ${pick['cost_per_hour_usd']:,.2f}/h")
        st.download_button("chosen scenario (YAML)", choice.edited_yaml(extra), file_name=f"{s.name}_planned.yaml")
