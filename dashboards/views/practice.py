"""Practice for system-design interviews: read a seed situation, estimate, then compare
with the simulator and the napkin math."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import cache
from dashboards.data import Choice, dominant_stage, grade, question, scenario_files
from simulator.planning.napkin import napkin, workers_needed
from simulator.planning.plan import Planner
from simulator.results.metrics import worker_price
from simulator.results.records import STAGES
from simulator.scenario.loader import load_scenario

STAGE_NAMES = [name for name, _, _ in STAGES]


def situations() -> dict[str, Choice]:
    """Shipped scenarios with a fixed fleet and one traffic stream, by their question."""
    out = {}
    for path in scenario_files():
        text = path.read_text()
        s = load_scenario(path, text=text)
        if (
            s.workers.autoscaler is None
            and not s.traffic.classes
            and s.traffic.rate_rps
            and "validation" not in path.parts
        ):
            out[path.stem] = Choice(str(path), text)
    return out


@st.cache_data(show_spinner=False, max_entries=8)
def minimum_workers(source: str, text: str) -> int | None:
    s = Choice(source, text).load()
    _, padded = workers_needed(s)
    best, _, _ = Planner(replications=2, max_replications=4).min_workers(s, 1, max(2 * padded, 2), "practice")
    return best.workers if best else None


def render(choice: Choice | None = None, s=None) -> None:
    st.header("Practice: estimate first, then check")
    options = situations()
    name = st.selectbox("situation", list(options), key="practice-situation")
    pick = options[name]
    sc = pick.load()
    st.info(question(pick.text) or sc.description)
    st.caption(
        f"Given: {sc.traffic.rate_rps:,.0f} req/s; SLA p{sc.sla.percentile:g} ≤ {sc.sla.target_ms:g} ms; "
        f"{sc.workers.count} × {sc.workers.instance_type} workers as configured; "
        f"max batch {sc.batching.max_batch_size}."
    )
    with st.form(f"estimates:{name}"):
        c = st.columns(4)
        workers = c[0].number_input("workers needed for the SLA", min_value=1, value=1, step=1)
        p99 = c[1].number_input(f"p{sc.sla.percentile:g} as configured (ms)", min_value=0.0, value=0.0)
        cost = c[2].number_input("cost as configured ($/h)", min_value=0.0, value=0.0)
        stage = c[3].selectbox("stage the tail spends most in", STAGE_NAMES)
        checked = st.form_submit_button("check my estimates")
    if not checked:
        return
    with st.spinner("simulating …"):
        r = cache.run(pick.source, pick.text, ())
        need = minimum_workers(pick.source, pick.text)
    k = r.kpis()
    truth_stage = dominant_stage(r.stages, f"p{sc.sla.percentile:g}") or dominant_stage(r.stages)
    table = pd.DataFrame(
        {
            "yours": [workers, p99, cost, stage],
            "simulator": [need, round(k["sla_attained_ms"], 1), round(k["cost_per_hour_usd"], 2), truth_stage],
        },
        index=["workers needed", f"p{sc.sla.percentile:g} (ms)", "cost ($/h)", "dominant stage"],
    )
    st.dataframe(table.astype(str), width="stretch")
    notes = grade(
        {"workers": workers, "sla_ms": p99, "cost_per_hour_usd": cost, "stage": stage},
        {
            "workers": need,
            "sla_ms": k["sla_attained_ms"],
            "cost_per_hour_usd": k["cost_per_hour_usd"],
            "stage": truth_stage,
        },
    )
    for n in notes:
        st.warning(n)
    if not notes:
        st.success("All within range.")
    st.subheader("the napkin math")
    st.dataframe(
        pd.DataFrame(
            [
                {"quantity": ln.quantity, "formula": ln.formula, "value": f"{ln.value:,.4g} {ln.unit}"}
                for ln in napkin(sc, worker_price(sc))
            ]
        ),
        hide_index=True,
        width="stretch",
    )
