"""Two variants side by side: the sidebar's scenario (A) against A with more overrides (B),
B taken by default from the variants the scenario's own header documents."""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from dashboards import cache, charts, glance
from dashboards.data import Choice, documented_variants
from dashboards.views.results import classes, kpi_row
from simulator.scenario.config import Scenario
from simulator.scenario.loader import ScenarioError

OWN = "your own overrides"

# (KPI, how to show it, lower is better: True, False, or None when neither)
ROWS = [
    ("p50_ms", glance.ms, True),
    ("p95_ms", glance.ms, True),
    ("p99_ms", glance.ms, True),
    ("workers", lambda x: f"{x:,.0f}", None),
    ("utilization", lambda x: f"{x:.0%}", None),
    ("cost_per_hour_usd", glance.usd, True),
    ("cost_per_million_usd", glance.usd, True),
]
# an LLM run's: first token, each next one, what it serves and its cost
LLM_ROWS = [
    ("ttft_ms", glance.ms, True),
    ("tpot_ms", glance.ms, True),
    ("goodput_rps", lambda x: f"{x:,.1f}", False),
    ("output_tokens_per_s", glance.count, False),
    ("workers", lambda x: f"{x:,.0f}", None),
    ("cost_per_hour_usd", glance.usd, True),
    ("cost_per_million_tokens_usd", glance.usd, True),
]


def suggestion(s: Scenario) -> str:
    """A first variant worth trying when the scenario documents none (the seed articles'
    usual lever; for an LLM engine, static batching against its continuous batching, or
    prefill and decode apart against replicas doing both, where static batching cannot run)."""
    if s.traffic.tokens is not None and s.batching.disaggregation is not None:
        return "batching.disaggregation=null"
    if s.traffic.tokens is not None and s.batching.policy != "static":
        return "batching.policy=static"
    f = s.features
    if f.lookups_per_request and f.batch_size < f.lookups_per_request:
        return f"features.batch_size={f.lookups_per_request}"  # batch the feature lookups
    if s.workers.autoscaler is None:  # the scenario's own napkin headroom
        return f"workers.count={math.ceil(s.workers.count * (1 + s.napkin.headroom))}"
    return f"workers.autoscaler.min_replicas={s.workers.autoscaler.max_replicas}"


def deltas(a: dict, b: dict, rows_of=ROWS) -> pd.DataFrame:
    """One row per KPI, as people read them: A, B, the change and the change in percent
    (blank when there is none)."""
    rows = []
    for key, fmt, _ in rows_of:
        d = b[key] - a[key]
        rows.append(
            {
                "KPI": key.replace("_", " ").replace(" ms", "").replace(" usd", " ($)"),
                "A": fmt(a[key]),
                "B": fmt(b[key]),
                "change": glance.change(d, fmt) or "",
                "change %": f"{d / a[key]:+.1%}" if d and a[key] else "",
            }
        )
    return pd.DataFrame(rows)


def colours(a: dict, b: dict, rows_of=ROWS) -> list[str]:
    """Green where B is better, red where worse, nothing where equal or neither."""
    out = []
    for key, _, lower in rows_of:
        d = b[key] - a[key]
        better = None if lower is None or d == 0 else (d < 0) == lower
        out.append("" if better is None else "color: green" if better else "color: red")
    return out


def render(choice: Choice, s: Scenario) -> None:
    st.header("Compare two variants")
    documented = documented_variants(choice.text)
    options = [label for label, _ in documented] + [OWN]
    picked = st.selectbox(
        "variant B",
        options,
        key=f"variant-pick:{s.name}",
        help="The variants this scenario's header documents (its `servesim run --set …` lines), or your own.",
    )
    preset = dict(documented).get(picked)
    default = "\n".join(preset) if preset else (suggestion(s) if not documented else "")
    text = st.text_area(
        "B: overrides on top of the sidebar's scenario (one path=value per line)",
        value=default,
        key=f"variant:{s.name}:{picked}",
    )
    extra = tuple(line.strip().removeprefix("--set").strip() for line in text.splitlines() if line.strip())
    try:
        s_b = choice.load(extra)
    except ScenarioError as e:
        st.error(str(e))
        return
    a, b = cache.result(choice), cache.result(choice, extra)
    llm_run = s.traffic.tokens is not None
    if llm_run:  # side by side: an engine's two ways of batching, on the same traffic
        from dashboards.views import llm

        left, right = st.columns(2)
        with left:
            st.subheader("A: as in the sidebar")
            llm.kpis(a)
        with right:
            st.subheader("B: " + ", ".join(extra) if extra else "B: (no change)")
            llm.kpis(b, reference=a)
    else:
        st.subheader("A: as in the sidebar")
        kpi_row(a, s)
        classes(a)
        st.subheader("B: " + ", ".join(extra) if extra else "B: (no change)")
        kpi_row(b, s_b, reference=a)
        classes(b)
    ka, kb = a.kpis(), b.kpis()
    rows_of = LLM_ROWS if llm_run and "ttft_ms" in kb else ROWS
    paint = colours(ka, kb, rows_of)
    table = deltas(ka, kb, rows_of)
    st.dataframe(table.style.apply(lambda _col: paint, subset=["change", "change %"]), hide_index=True, width="stretch")
    both = pd.concat([a.cdf.assign(variant="A"), b.cdf.assign(variant="B")])
    st.altair_chart(charts.cdf(both, s.sla.target_ms, color="variant"), width="stretch")
    stages = pd.concat([a.stages.assign(variant="A"), b.stages.assign(variant="B")])
    st.altair_chart(charts.waterfall(stages, row="variant"), width="stretch")  # one shared x scale
