"""Scenario results: the KPI row, where latency lives, the latency CDF, batch sizes."""

from __future__ import annotations

import json

import streamlit as st

from dashboards import cache, charts
from dashboards.data import Choice, Result
from simulator.scenario.config import Scenario


def kpi_row(r: Result, s: Scenario, reference: Result | None = None) -> None:
    """p50/p95/p99 against the SLA, the verdict, workers, utilization and cost; with
    ``reference``, each figure's change from it."""
    k = r.kpis()
    ref = reference.kpis() if reference else None
    q = f"p{k['sla_percentile']:g}"

    def delta(name, fmt="{:+,.1f}"):
        return fmt.format(k[name] - ref[name]) if ref else None

    cols = st.columns(8)
    cols[0].metric("p50 ms", f"{k['p50_ms']:,.1f}", delta("p50_ms"), delta_color="inverse")
    cols[1].metric("p95 ms", f"{k['p95_ms']:,.1f}", delta("p95_ms"), delta_color="inverse")
    cols[2].metric(
        "p99 ms",
        f"{k['p99_ms']:,.1f}",
        delta("p99_ms"),
        delta_color="inverse",
        help=f"SLA: {q} ≤ {k['sla_target_ms']:g} ms",
    )
    cols[3].metric(
        f"SLA {q} ≤ {k['sla_target_ms']:g} ms",
        "met" if k["sla_met"] else "missed",
        help=f"attained {q}: {k['sla_attained_ms']:,.1f} ms",
    )
    cols[4].metric("workers", f"{k['workers']:,.0f}", delta("workers", "{:+,.0f}"), delta_color="off")
    cols[5].metric("load of peak", f"{k['utilization']:.0%}", delta("utilization", "{:+.0%}"), delta_color="off")
    cols[6].metric(
        "$ per hour", f"{k['cost_per_hour_usd']:,.2f}", delta("cost_per_hour_usd", "{:+,.2f}"), delta_color="inverse"
    )
    cols[7].metric(
        "$ per M requests",
        f"{k['cost_per_million_usd']:,.4f}",
        delta("cost_per_million_usd", "{:+,.4f}"),
        delta_color="inverse",
    )


def sampling_note(r: Result, s: Scenario) -> None:
    if r.sampled:
        st.caption(
            f"Fleet sampling: {r.sampled} of {s.workers.count} workers simulated with their share of the "
            "traffic (exact in law under random routing); throughput and cost are restated for the whole fleet."
        )


def render(choice: Choice, s: Scenario | None) -> None:
    if s is None:
        st.warning("Fix the scenario in the sidebar to see results.")
        return
    st.header(s.name)
    if s.description:
        st.caption(s.description)
    r = cache.result(choice)
    sampling_note(r, s)
    kpi_row(r, s)
    st.altair_chart(charts.waterfall(r.stages), width="stretch")
    left, right = st.columns(2)
    left.altair_chart(charts.cdf(r.cdf, s.sla.target_ms), width="stretch")
    right.altair_chart(charts.batch_sizes(r.batches), width="stretch")
    with st.expander("per-stage latency (ms)"):
        st.dataframe(
            {name: {q: round(v, 2) for q, v in row.items()} for name, row in r.summary["latency_ms"]["stages"].items()}
        )
    d1, d2, d3 = st.columns(3)
    d1.download_button("edited scenario (YAML)", choice.edited_yaml(), file_name=f"{s.name}.yaml", mime="text/yaml")
    d2.download_button(
        "results (JSON)", json.dumps(r.summary, indent=2), file_name=f"{s.name}.json", mime="application/json"
    )
    d3.download_button(
        "latency anatomy (CSV)", r.stages.to_csv(index=False), file_name=f"{s.name}-stages.csv", mime="text/csv"
    )
