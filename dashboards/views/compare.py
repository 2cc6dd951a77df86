"""Two variants side by side: the sidebar's scenario (A) against A with more overrides (B)."""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from dashboards import cache, charts
from dashboards.data import Choice
from dashboards.views.results import kpi_row
from simulator.scenario.config import Scenario
from simulator.scenario.loader import ScenarioError


def suggestion(s: Scenario) -> str:
    """A first variant worth trying for this scenario (the seed articles' usual lever)."""
    f = s.features
    if f.lookups_per_request and f.batch_size < f.lookups_per_request:
        return f"features.batch_size={f.lookups_per_request}"  # batch the feature lookups
    if s.workers.autoscaler is None:  # the scenario's own napkin headroom
        return f"workers.count={math.ceil(s.workers.count * (1 + s.napkin.headroom))}"
    return f"workers.autoscaler.min_replicas={s.workers.autoscaler.max_replicas}"


def deltas(a: dict, b: dict) -> pd.DataFrame:
    """One row per KPI: A, B, and B − A."""
    keys = ["p50_ms", "p95_ms", "p99_ms", "workers", "utilization", "cost_per_hour_usd", "cost_per_million_usd"]
    return pd.DataFrame({"A": [a[k] for k in keys], "B": [b[k] for k in keys]}, index=keys).assign(
        change=lambda d: d["B"] - d["A"], change_pct=lambda d: (d["B"] / d["A"] - 1) * 100
    )


def render(choice: Choice, s: Scenario) -> None:
    st.header("Compare two variants")
    text = st.text_area(
        "variant B: overrides on top of the sidebar's scenario (one path=value per line)",
        value=suggestion(s),
        key=f"variant:{s.name}",
    )
    extra = tuple(line.strip().removeprefix("--set").strip() for line in text.splitlines() if line.strip())
    try:
        s_b = choice.load(extra)
    except ScenarioError as e:
        st.error(str(e))
        return
    a, b = cache.result(choice), cache.result(choice, extra)
    st.subheader("A: as in the sidebar")
    kpi_row(a, s)
    st.subheader("B: " + ", ".join(extra) if extra else "B: (no change)")
    kpi_row(b, s_b, reference=a)
    table = deltas(a.kpis(), b.kpis())
    st.dataframe(
        table.style.format("{:,.3g}").map(
            lambda v: "color: green" if v < 0 else "color: red" if v > 0 else "", subset=["change", "change_pct"]
        ),
        width="stretch",
    )
    both = pd.concat([a.cdf.assign(variant="A"), b.cdf.assign(variant="B")])
    st.altair_chart(charts.cdf(both, s.sla.target_ms, color="variant"), width="stretch")
    left, right = st.columns(2)
    left.caption("A")
    left.altair_chart(charts.waterfall(a.stages), width="stretch")
    right.caption("B")
    right.altair_chart(charts.waterfall(b.stages), width="stretch")
