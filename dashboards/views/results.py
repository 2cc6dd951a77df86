"""Scenario results: the verdict and KPIs, per-class results, where latency lives, the latency CDF, batch sizes."""

from __future__ import annotations

import json
import math

import streamlit as st

from dashboards import cache, charts, glance
from dashboards.data import Choice, Result
from simulator.scenario.config import Scenario


def verdict_banner(r: Result) -> None:
    """The SLA verdict, coloured, with its margin, the share of requests within the target
    (drops count as misses), what was dropped, and an overload warning."""
    v = glance.verdict(r.summary, r.timeline)
    within = (
        "" if math.isnan(v.attainment) else f" · {v.attainment:.2%} of requests within {glance.target(v.target_ms)}"
    )
    text = f"**{v.headline}**{within} · {v.drops_text}"
    (st.success if v.met else st.error)(text)
    if v.unstable:
        st.warning(f"**Unstable:** {v.unstable}.")


def kpi_row(r: Result, s: Scenario, reference: Result | None = None) -> None:
    """The verdict, then p50/p95/p99, attainment, drops, workers, load and cost in compact
    units (two rows of four: nothing is cut off at 1400 px); with ``reference``, each
    figure's change from it ("+12.5 ms"; none when equal)."""
    verdict_banner(r)
    k = r.kpis()
    ref = reference.kpis() if reference else None
    v = glance.verdict(r.summary)
    dropped = sum(v.dropped.values())

    def delta(name, fmt=glance.ms, unit=""):
        return glance.change(k[name] - ref[name], fmt, unit=unit) if ref else None

    top = st.columns(4)
    top[0].metric("p50", glance.ms(k["p50_ms"]), delta("p50_ms"), delta_color="inverse")
    top[1].metric("p95", glance.ms(k["p95_ms"]), delta("p95_ms"), delta_color="inverse")
    top[2].metric(
        "p99",
        glance.ms(k["p99_ms"]),
        delta("p99_ms"),
        delta_color="inverse",
        help=f"SLA: {v.percentile} ≤ {v.target_ms:g} ms",
    )
    top[3].metric(
        "within SLA",
        "–" if math.isnan(v.attainment) else f"{v.attainment:.2%}",
        help="Share of the window's requests answered within the SLA target; dropped requests count as misses.",
    )
    bottom = st.columns(4)
    bottom[0].metric(
        "dropped",
        f"{glance.count(dropped)} ({dropped / max(v.arrived, 1):.1%})" if dropped else "0",
        help=v.drops_text,
    )
    bottom[1].metric("workers", f"{k['workers']:,.0f}", delta("workers", lambda x: f"{x:,.0f}"), delta_color="off")
    bottom[2].metric(
        "load of peak", f"{k['utilization']:.0%}", delta("utilization", lambda x: f"{x:.0%}"), delta_color="off"
    )
    bottom[3].metric(
        "cost per hour",
        glance.usd(k["cost_per_hour_usd"]),
        delta("cost_per_hour_usd", glance.usd),
        delta_color="inverse",
        help=f"{glance.usd(k['cost_per_million_usd'])} per million requests",
    )


def latency_home(r: Result) -> None:
    """Where latency lives, in a sentence."""
    words = glance.latency_home(r.stages)
    if words:
        st.markdown(f"**Where latency lives:** {words}.")


def classes(r: Result) -> None:
    """Per traffic class: its own latency, SLA verdict and drops."""
    table = glance.classes_table(r.summary)
    if table is None:
        return
    st.subheader("per traffic class")
    shown = table.drop(columns=["met"])
    colours = ["color: green" if m else "color: red" if m is False else "" for m in table["met"]]
    st.dataframe(shown.style.apply(lambda _col: colours, subset=["verdict"]), hide_index=True, width="stretch")


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
    if s.traffic.tokens is not None:  # an LLM engine: first token, each next one, tokens
        from dashboards.views import llm

        llm.results(s, r)
        st.subheader("the whole request (end to end)")
    else:
        kpi_row(r, s)
        classes(r)
        latency_home(r)
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
