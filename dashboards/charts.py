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


def _labelled_rule(value: float, label: str, field: str, *, color: str, dash: bool, vertical: bool) -> alt.Chart:
    """A rule at ``value`` with its label written beside it."""
    data = pd.DataFrame({field: [value], "what": [label]})
    enc = {("x" if vertical else "y"): alt.X(f"{field}:Q") if vertical else alt.Y(f"{field}:Q")}
    rule = (
        alt.Chart(data)
        .mark_rule(color=color, strokeDash=[4, 4] if dash else [])
        .encode(**enc, tooltip=["what:N", f"{field}:Q"])
    )
    text = (
        alt.Chart(data)
        .mark_text(align="left", dx=4, dy=-6 if not vertical else 0, baseline="bottom", color=color, fontSize=11)
        .encode(**enc, text="what:N", **({"y": alt.value(12)} if vertical else {"x": alt.value(4)}))
    )
    return rule + text


def hockey_stick(
    table: pd.DataFrame,
    x: str,
    target_ms: float,
    marker: float | None,
    marker_label: str,
    *,
    x_title: str,
    current: float | None = None,
    current_label: str = "now",
    integer: bool = False,
) -> alt.VConcatChart:
    """p50 and p99 against ``x`` (offered load or workers) on a log axis, with the SLA
    target, the napkin's estimate (``marker``, drawn only inside the points' range) and
    the current setup labelled; below, on the same x axis, the share of requests dropped
    (the points where the tail flattens only because requests are turned away)."""
    long = table.melt(id_vars=[x], value_vars=["p50_ms", "p99_ms"], var_name="percentile", value_name="ms")
    long["percentile"] = long["percentile"].str.replace("_ms", "")
    lo, hi = float(table[x].min()), float(table[x].max())
    axis = alt.Axis(format="d", tickMinStep=1) if integer else alt.Axis(format=",.0f")
    xs = alt.X(f"{x}:Q", title=x_title, axis=axis, scale=alt.Scale(domain=[lo, hi], nice=False))
    lines = (
        alt.Chart(long)
        .mark_line(point=True)
        .encode(
            x=xs,
            y=alt.Y("ms:Q", scale=alt.Scale(type="log"), title="latency (ms, log)"),
            color=alt.Color("percentile:N", scale=alt.Scale(domain=["p50", "p99"], range=["#4c78a8", "#f58518"])),
            tooltip=[alt.Tooltip(f"{x}:Q", format=",.0f"), "percentile:N", alt.Tooltip("ms:Q", format=".1f")],
        )
    )
    layers = lines + _labelled_rule(target_ms, f"SLA {target_ms:g} ms", "ms", color="red", dash=True, vertical=False)
    if marker is not None and lo <= marker <= hi:
        layers += _labelled_rule(marker, marker_label, x, color="gray", dash=True, vertical=True)
    if current is not None and lo <= current <= hi:
        layers += _labelled_rule(current, current_label, x, color="black", dash=False, vertical=True)
    share = table.assign(dropped_share=table.get("dropped_share", 0.0))
    drops = (
        alt.Chart(share)
        .mark_bar(color="#e45756", size=8)
        .encode(
            x=xs,
            y=alt.Y("dropped_share:Q", title="dropped", axis=alt.Axis(format="%")),
            tooltip=[alt.Tooltip(f"{x}:Q", format=",.0f"), alt.Tooltip("dropped_share:Q", format=".2%")],
        )
        .properties(height=70)
    )
    return alt.vconcat(layers.properties(height=260), drops).resolve_scale(x="shared")


# series colours without red: red is the SLA target's, and only its
SERIES = ["#4c78a8", "#f58518", "#54a24b", "#b279a2", "#9d755d", "#72b7b2", "#eeca3b", "#bab0ac"]
Y_AXIS_WIDTH = 64  # px for every timeline panel's y axis, so stacked panels line up


def timeline(
    table: pd.DataFrame, events: pd.DataFrame, columns: list[str], title: str, y: str, target: float | None = None
) -> alt.Chart:
    """Several timeline columns over time (long form), with fleet and deploy events as
    rules and, given ``target``, a horizontal rule there (the SLA target, the only red).
    Every panel has the same y-axis width and its legend on top, so panels stacked on a
    page share their plot area and x positions."""
    long = table.melt(id_vars=["t_s"], value_vars=columns, var_name="series", value_name="value")
    chart = (
        alt.Chart(long, title=title)
        .mark_line()
        .encode(
            x=alt.X(
                "t_s:Q",
                title="time (s)",
                scale=alt.Scale(domain=[float(table["t_s"].min()), float(table["t_s"].max())], nice=False),
            ),
            y=alt.Y("value:Q", title=y, axis=alt.Axis(minExtent=Y_AXIS_WIDTH, maxExtent=Y_AXIS_WIDTH)),
            color=alt.Color(
                "series:N",
                scale=alt.Scale(domain=columns, range=SERIES[: len(columns)]),
                legend=alt.Legend(orient="top", title=None),
            ),
            tooltip=["t_s:Q", "series:N", alt.Tooltip("value:Q", format=",.1f")],
        )
        .properties(height=280)  # the whole view: title, legend, axes and plot (Streamlit fits it)
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
