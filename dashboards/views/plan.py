"""Plan: the fewest workers meeting the SLA for each value of one knob, the cost/latency
frontier, the current setup beside the cheapest configuration (ties shown; why nothing
meets the SLA when nothing does), and the answer as a scenario to download."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import cache, charts, glance
from dashboards.data import Choice, value_at
from simulator.planning.napkin import workers_needed
from simulator.planning.plan import Planner, label, on_instance_type
from simulator.scenario.config import Scenario
from simulator.scenario.loader import ScenarioError

KNOBS = {
    "batching window (ms)": "batching.max_queue_delay_ms",
    "instance type": "workers.instance_type",
    "max batch": "batching.max_batch_size",
}


def knob_overrides(s: Scenario, path: str, value) -> tuple[str, ...]:
    """The overrides that set ``path`` to ``value`` (an instance type is applied with its
    speed by :func:`on_instance_type`, not as an override); a max batch below the napkin's
    batch size takes the napkin's batch down with it, so the napkin stays consistent."""
    if path == "workers.instance_type":
        return ()
    out = (f"{path}={value}",)
    if path == "batching.max_batch_size" and s.napkin.batch_size and int(value) < s.napkin.batch_size:
        out += (f"napkin.batch_size={int(value)}",)
    return out


def as_set(s: Scenario, path: str, value) -> tuple[str, ...]:
    """The ``--set`` overrides of a knob's value for a scenario file: an instance type too
    (``--set workers.instance_type`` rescales the batch times as :func:`on_instance_type`
    does), with the napkin kept consistent."""
    return (f"{path}={value}", *knob_overrides(s, path, value)[1:])


def answer(best: pd.DataFrame, tol: float = 0.005) -> pd.DataFrame:
    """The configurations that meet the SLA at the lowest cost: several when their costs
    are within ``tol`` of each other (a tie), none when nothing met it."""
    met = best[best["met"].astype(bool)] if len(best) else best
    if not len(met):
        return met
    low = met["cost_per_hour_usd"].min()
    return met[met["cost_per_hour_usd"] <= low * (1 + tol)].sort_values("cost_per_hour_usd")


@st.cache_data(show_spinner=False, max_entries=8)
def plan(source: str, text: str, overrides: tuple[str, ...], path: str, values: tuple, lo: int, hi: int, reps: int):
    choice = Choice(source, text, overrides)
    planner = Planner(replications=reps, max_replications=max(reps, 6))
    rows, best = [], []
    for v in values:
        s = choice.load(knob_overrides(choice.load(), path, v))
        if path == "workers.instance_type":
            s = on_instance_type(s, str(v))
        key = label({path: v})
        found, evals, check = planner.min_workers(s, lo, hi, key)
        rows += [{"config": key, "value": v, **e.row()} for e in evals]
        best.append(
            {"config": key, "value": v, "monotone": check["monotone"], **(found.row() if found else {"met": False})}
        )
    return pd.DataFrame(rows), pd.DataFrame(best), planner.requests


def render(choice: Choice, s: Scenario) -> None:
    st.header("Plan: the cheapest configuration that meets the SLA")
    if s.autoscaled or s.traffic.classes:
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
    now = cache.result(choice).kpis()
    current = f"{s.workers.count} workers, {knob} {value_at(s, path)}"
    st.info(
        f"**Now:** {current}: {glance.usd(now['cost_per_hour_usd'])}/h, p{now['sla_percentile']:g} "
        f"{glance.ms(now['sla_attained_ms'])} against {glance.target(now['sla_target_ms'])}: "
        + ("met" if now["sla_met"] else "missed")
    )
    st.dataframe(best.drop(columns=[c for c in ("rate_rps", "sampled_workers") if c in best]), hide_index=True)
    st.altair_chart(charts.frontier(points, s.sla.target_ms), width="stretch")
    cheapest = answer(best)
    if not len(cheapest):
        nothing_meets(choice, s, path, points, lo, hi)
        return
    pick = cheapest.iloc[0]
    saving = now["cost_per_hour_usd"] - pick["cost_per_hour_usd"]
    versus = (
        f"; {glance.usd(abs(saving))}/h {'less' if saving > 0 else 'more'} than now"
        if abs(saving) > 0.005 * now["cost_per_hour_usd"]
        else "; the same cost as now"
    )
    if len(cheapest) > 1:
        tied = ", ".join(
            f"{c} ({int(w)} workers)" for c, w in zip(cheapest["config"], cheapest["workers"], strict=True)
        )
        st.success(f"cheapest, tied within 0.5%: {tied}, {glance.usd(pick['cost_per_hour_usd'])}/h{versus}")
    else:
        st.success(
            f"cheapest: {pick['config']}, {int(pick['workers'])} workers, "
            f"{glance.usd(pick['cost_per_hour_usd'])}/h{versus}"
        )
    extra = (f"workers.count={int(pick['workers'])}", *as_set(s, path, pick["value"]))
    st.download_button("chosen scenario (YAML)", choice.edited_yaml(extra), file_name=f"{s.name}_planned.yaml")


def nothing_meets(choice: Choice, s: Scenario, path: str, points: pd.DataFrame, lo: int, hi: int) -> None:
    """Why no configuration met the SLA: the closest point, and what limits it (where its
    latency lives, and whether more workers would help)."""
    close = points.sort_values("sla_ms").iloc[0]
    text = (
        f"**Nothing meets the SLA in this range** (workers {lo}–{hi}). The closest: {close['config']} with "
        f"{int(close['workers'])} workers, p{s.sla.percentile:g} {glance.ms(close['sla_ms'])} against "
        f"{glance.target(s.sla.target_ms)}."
    )
    value = close.get("value")
    over = (f"workers.count={int(close['workers'])}",) + (as_set(s, path, value) if value is not None else ())
    try:
        r = cache.result(choice, over)
        home = glance.latency_home(r.stages)
        if home:
            text += f" {home}."
    except ScenarioError:
        pass
    if int(close["workers"]) >= hi:
        text += " It is at the top of the range: widen the range, or change what limits the tail."
    else:
        text += " More workers did not bring it down: the floor is the stage named, not queueing for a worker."
    st.error(text)
