"""Altair charts over tidy tables: each function takes a table and returns a chart.

Thresholds (the SLA target, the napkin's estimate) come in as arguments, from the
scenario; nothing here knows a price or a target of its own.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

STAGE_ORDER = [
    "network_in",
    "router",
    "cache",
    "features",
    "preprocess",
    "queue",
    "inference",
    "postprocess",
    "network_out",
]


def waterfall(stages: pd.DataFrame, row: str | None = None) -> alt.Chart:
    """Each stage's contribution to the requests around p50 and p99, stacked left to right;
    with ``row``, one panel per value of that column on one shared time axis."""
    data = stages[stages["ms"] > 0]
    chart = (
        alt.Chart(data, title="where latency lives: requests around each percentile")
        .mark_bar()
        .encode(
            y=alt.Y("percentile:N", title=None, sort=["p50", "p99"]),
            x=alt.X("start_ms:Q", title="ms"),
            x2="end_ms:Q",
            color=alt.Color("stage:N", sort=STAGE_ORDER, scale=alt.Scale(domain=STAGE_ORDER)),
            tooltip=[
                "percentile:N",
                "stage:N",
                alt.Tooltip("ms:Q", format=".2f"),
                alt.Tooltip("e2e_ms:Q", format=".1f"),
            ],
        )
    )
    if row is None:
        return chart.properties(height=240)
    return chart.properties(height=120).facet(row=alt.Row(f"{row}:N", title=None)).resolve_scale(x="shared")


def cdf(table: pd.DataFrame, target_ms: float | None = None, color: str | None = None) -> alt.Chart:
    """End-to-end latency CDF on a log latency axis, with the SLA target as a rule."""
    enc = {
        "x": alt.X("latency_ms:Q", scale=alt.Scale(type="log"), title="end-to-end latency (ms, log)"),
        "y": alt.Y("probability:Q", title="fraction of requests", scale=alt.Scale(domain=[0, 1])),
        "tooltip": [alt.Tooltip("latency_ms:Q", format=".1f"), alt.Tooltip("probability:Q", format=".4f")],
    }
    if color:
        enc["color"] = alt.Color(f"{color}:N")
    line = alt.Chart(table, title="latency CDF").mark_line().encode(**enc)
    if target_ms is None:
        return line
    rule = alt.Chart(pd.DataFrame({"target_ms": [target_ms]})).mark_rule(strokeDash=[4, 4], color="red")
    return line + rule.encode(x="target_ms:Q", tooltip=["target_ms:Q"])


def batch_sizes(table: pd.DataFrame) -> alt.Chart:
    """Batches started per size."""
    return (
        alt.Chart(table, title="batch sizes")
        .mark_bar()
        .encode(
            x=alt.X("batch_size:O", title="batch size"),
            y=alt.Y("share:Q", title="share of batches", axis=alt.Axis(format="%")),
            tooltip=["batch_size:O", "batches:Q", alt.Tooltip("share:Q", format=".1%")],
        )
    )


def hockey_stick(table: pd.DataFrame, x: str, target_ms: float, marker: float | None, marker_label: str) -> alt.Chart:
    """p50 and p99 against ``x`` (offered load or workers), the SLA target and a marker
    (the napkin's capacity or worker count) as rules."""
    long = table.melt(id_vars=[x], value_vars=["p50_ms", "p99_ms"], var_name="percentile", value_name="ms")
    long["percentile"] = long["percentile"].str.replace("_ms", "")
    lines = (
        alt.Chart(long)
        .mark_line(point=True)
        .encode(
            x=alt.X(f"{x}:Q"),
            y=alt.Y("ms:Q", scale=alt.Scale(type="log"), title="latency (ms, log)"),
            color="percentile:N",
            tooltip=[f"{x}:Q", "percentile:N", alt.Tooltip("ms:Q", format=".1f")],
        )
    )
    target = (
        alt.Chart(pd.DataFrame({"ms": [target_ms], "what": ["SLA target"]}))
        .mark_rule(color="red", strokeDash=[4, 4])
        .encode(y="ms:Q", tooltip=["what:N", "ms:Q"])
    )
    layers = lines + target
    if marker is not None:
        layers += (
            alt.Chart(pd.DataFrame({x: [marker], "what": [marker_label]}))
            .mark_rule(color="gray")
            .encode(x=f"{x}:Q", tooltip=["what:N", f"{x}:Q"])
        )
    return layers


def timeline(
    table: pd.DataFrame, events: pd.DataFrame, columns: list[str], title: str, y: str, target: float | None = None
) -> alt.Chart:
    """Several timeline columns over time (long form), with fleet and deploy events as
    rules and, given ``target``, a horizontal rule there (the SLA target)."""
    long = table.melt(id_vars=["t_s"], value_vars=columns, var_name="series", value_name="value")
    chart = (
        alt.Chart(long, title=title)
        .mark_line()
        .encode(
            x=alt.X("t_s:Q", title="time (s)"),
            y=alt.Y("value:Q", title=y),
            color="series:N",
            tooltip=["t_s:Q", "series:N", alt.Tooltip("value:Q", format=",.1f")],
        )
        .properties(height=180)
    )
    if len(events):
        chart += (
            alt.Chart(events)
            .mark_rule(color="gray", opacity=0.4)
            .encode(x="t_s:Q", tooltip=["t_s:Q", "event:N", "detail:N"])
        )
    if target is not None:
        rule = alt.Chart(pd.DataFrame({"value": [target]})).mark_rule(color="red", strokeDash=[4, 4])
        chart += rule.encode(y="value:Q")
    return chart


def calibration(table: pd.DataFrame) -> alt.Chart:
    """Measured against predicted latency per load level, one panel per percentile."""
    return (
        alt.Chart(table, title="measured vs predicted")
        .mark_line(point=True)
        .encode(
            x=alt.X("load:Q", axis=alt.Axis(format="%"), title="load (share of measured capacity)"),
            y=alt.Y("ms:Q", title="latency (ms)"),
            color="source:N",
            column=alt.Column("percentile:N", title=None),
            tooltip=["load:Q", "percentile:N", "source:N", alt.Tooltip("ms:Q", format=".1f"), "error_pct:Q"],
        )
        .properties(width=180, height=200)
    )


def frontier(table: pd.DataFrame, target_ms: float) -> alt.Chart:
    """Cost per hour against the SLA percentile for every evaluated point, met or not."""
    points = (
        alt.Chart(table, title="cost against latency")
        .mark_point(filled=True)
        .encode(
            x=alt.X("cost_per_hour_usd:Q", title="USD per hour"),
            y=alt.Y("sla_ms:Q", scale=alt.Scale(type="log"), title="SLA percentile (ms, log)"),
            color="config:N",
            shape="met:N",
            tooltip=["config:N", "workers:Q", alt.Tooltip("sla_ms:Q", format=".1f"), "cost_per_hour_usd:Q", "met:N"],
        )
    )
    rule = alt.Chart(pd.DataFrame({"ms": [target_ms]})).mark_rule(color="red", strokeDash=[4, 4]).encode(y="ms:Q")
    return points + rule
