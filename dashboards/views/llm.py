"""LLM scenarios (``batching.kind: continuous``) on the pages: TTFT and TPOT against their
targets with margins, tokens and their cost, the KV cache and the queue over time; the load
curve of TTFT and TPOT with the knee; the plan over replicas × GPU ×
``max_num_batched_tokens``. The Results, Load curve and Plan pages hand an LLM scenario
here; Compare shows continuous against static batching by default."""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from dashboards import cache, charts, data, glance
from dashboards.data import Choice, Result
from simulator.scenario.config import Scenario
from simulator.scenario.loader import ScenarioError

GPUS = "h100,a100"
BUDGETS = "2048,8192"


def verdicts(r: Result) -> None:
    """TTFT and TPOT against their targets, one coloured line each, with the margin."""
    targets = glance.token_targets(r.summary)
    for t in targets:
        (st.success if t.met else st.error)(f"**{t.headline}**")
    if not targets:
        st.info("No TTFT or TPOT target in sla: set sla.ttft_ms and sla.tpot_ms to judge them.")


def kpis(r: Result, reference: Result | None = None) -> None:
    """TTFT and TPOT at the SLA's percentile, goodput and tokens, cost per million tokens,
    preemptions and the prefix cache (with ``reference``: each change from it)."""
    verdicts(r)
    llm = r.summary["llm"]
    pct = f"p{llm['sla']['percentile']:g}"
    k, f = r.kpis(), glance.token_figures(r.summary)
    ref = reference.kpis() if reference else None

    def delta(name, fmt=glance.ms):
        return glance.change(k[name] - ref[name], fmt) if ref else None

    top = st.columns(4)
    top[0].metric(f"TTFT {pct}", glance.ms(k["ttft_ms"]), delta("ttft_ms"), delta_color="inverse")
    top[1].metric(f"TPOT {pct}", glance.ms(k["tpot_ms"]), delta("tpot_ms"), delta_color="inverse")
    top[2].metric(
        "goodput",
        f"{k['goodput_rps']:,.1f} req/s",
        delta("goodput_rps", lambda x: f"{x:,.1f} req/s"),
        help="Completions a second that met both the TTFT and the TPOT target.",
    )
    top[3].metric(
        "output tokens/s",
        f["output tokens/s"],
        delta("output_tokens_per_s", glance.count),
        help=f"{f['prompt tokens/s']} prompt tokens/s",
    )
    bottom = st.columns(4)
    bottom[0].metric(
        "$ per M tokens",
        f["$ per M tokens"],
        delta("cost_per_million_tokens_usd", glance.usd),
        delta_color="inverse",
        help=f"input {f['$ per M input tokens']}, output {f['$ per M output tokens']} per million "
        "(the GPUs' time split by what the prompts took)",
    )
    bottom[1].metric("cost per hour", glance.usd(k["cost_per_hour_usd"]), delta("cost_per_hour_usd", glance.usd))
    bottom[2].metric("preemptions a request", f["preemptions a request"], help="Recompute preemptions (KV full).")
    bottom[3].metric("prefix cache hit rate", f["prefix cache hit rate"], help="Share of prompt tokens served cached.")
    ses = llm.get("sessions")
    if ses is not None and not ses["later_turns_share"] > 0:  # one turn each (a benchmark's concurrency)
        closed = ses.get("turn_gap_from") == "answer"
        st.caption("conversations: one turn each" + ("; a user's next is sent after its answer" if closed else ""))
    elif ses is not None:
        loop = (
            "each sent a think time after that answer (users wait: a closed loop)"
            if ses.get("turn_gap_from") == "answer"
            else "turns come a gap after the turn before them arrived (an open loop)"
        )
        st.caption(
            f"conversations: {ses['later_turns_share']:.0%} of requests are later turns; "
            f"{ses['early_turns_share']:.1%} of those arrived before the answer to the turn before them, {loop}"
        )


def over_time(r: Result, s: Scenario) -> None:
    """KV usage, running and waiting requests, and output tokens over the run."""
    t = r.timeline[r.timeline["t_s"] < s.duration_s]
    if "kv_usage" not in t:
        return
    ev = r.events
    t = t.assign(waiting=t["queue_depth"])
    st.altair_chart(charts.timeline(t, ev, ["kv_usage"], "KV cache in use", "share of blocks"), width="stretch")
    st.altair_chart(charts.timeline(t, ev, ["running", "waiting"], "running and waiting", "requests"), width="stretch")
    st.altair_chart(
        charts.timeline(t, ev, ["output_tokens_per_s"], "output tokens", "tokens/s"),
        width="stretch",
    )


def results(s: Scenario, r: Result) -> None:
    kpis(r)
    over_time(r, s)


def load_curve(choice: Choice, s: Scenario) -> None:
    """TTFT and TPOT at the SLA's percentile against the offered rate, from 40% to 140% of
    the napkin's capacity, with the targets and the knee marked; a population's against its
    users (:func:`users_curve`)."""
    if s.traffic.users is not None and not s.autoscaled:
        users_curve(choice, s)
        return
    if s.traffic.rate_rps is None or s.autoscaled:
        st.info("The load curve varies traffic.rate_rps: pick a scenario with a rate and a fixed fleet.")
        return
    cap = data.llm_capacity(s)
    rates = sorted({*np.round(np.linspace(0.4, 1.4, 8) * cap, 2).tolist(), float(s.traffic.rate_rps)})
    st.caption(
        f"Napkin: {s.workers.count} replica{'s' if s.workers.count != 1 else ''} × the per-replica throughput at the "
        f"widest batch within TPOT = {cap:,.1f} req/s. The curve runs the scenario at {len(rates)} rates around it."
    )
    with st.spinner("simulating the rates …"):
        curve = cache.llm_load_curve(choice.source, choice.text, choice.overrides, tuple(rates))
    _draw_curve(curve, s, "offered_rps")


def users_curve(choice: Choice, s: Scenario) -> None:
    """A population's curve: TTFT and TPOT against the number of users, from 40% to three
    times the users the napkin's capacity answers were each answer instant (capacity × the
    mean think time: answers take time, and the napkin's batch is a cautious one, so the
    knee is often well above it), with the knee in users."""
    think_s = s.traffic.tokens.sessions.turn_gap.mean / 1000.0
    if think_s > 0:
        rps = data.llm_capacity(s)
        cap = rps * think_s
        sizes = np.geomspace(0.4, 3.0, 8) * cap
        said = (
            f"A population sets its own rate: the napkin's {rps:,.1f} req/s × a mean think time of "
            f"{think_s:,.1f} s = {cap:,.0f} users, were every answer instant."
        )
    else:  # a concurrency: every user has a request out, always; the fleet's seats bound what runs
        cap = s.workers.count * s.batching.max_num_seqs
        sizes = np.geomspace(1 / 16, 2.0, 8) * cap
        said = (
            f"No think time (a benchmark's concurrency): every user has a request out, always, and the fleet "
            f"runs {cap:,} at most ({s.workers.count} × max_num_seqs {s.batching.max_num_seqs})."
        )
    users = sorted({*(max(round(float(n)), 1) for n in sizes), int(s.traffic.users)})
    st.caption(f"{said} The curve runs the scenario at {len(users)} populations around it.")
    with st.spinner("simulating the populations …"):
        curve = cache.llm_users_curve(choice.source, choice.text, choice.overrides, tuple(users))
    _draw_curve(curve, s, "users")


def _draw_curve(curve: pd.DataFrame, s: Scenario, x: str) -> None:
    """The knee against load ``x`` (the offered rate, or the users) said in words, the
    curve, and its points."""
    targets = {
        col: t for col, t in (("ttft_ms", s.sla.ttft_ms), ("tpot_ms", s.sla.tpot_ms)) if t is not None and col in curve
    }
    k = data.knee(curve, targets, x=x) if targets else None
    users = x == "users"
    if k is None and targets:
        st.error(f"Even the {'smallest population' if users else 'lowest rate'} breaks a target: the knee is below.")
    elif k is not None and not any(bool((curve[col] > t).any()) for col, t in targets.items()):
        unit = "users" if users else "req/s"
        st.success(f"**Nothing here breaks a target, up to {k:,.1f} {unit}:** the knee is above.")
    elif k is not None and users:
        st.success(f"**Knee:** {k:,.0f} users, the most meeting every target (the scenario has {s.traffic.users:,}).")
    elif k is not None:
        st.success(
            f"**Knee:** {k:,.1f} req/s, the highest rate meeting every target "
            f"(the scenario offers {s.traffic.rate_rps:g})."
        )
    st.altair_chart(token_curve(curve, s, k, x=x), width="stretch")
    with st.expander("points"):
        cols = [x, "ttft_ms", "tpot_ms", "goodput_rps", "completed_rps", "cost_per_hour_usd"]
        st.dataframe(curve[[c for c in cols if c in curve]], hide_index=True)


def token_curve(curve: pd.DataFrame, s: Scenario, knee: float | None, x: str = "offered_rps") -> alt.HConcatChart:
    """TTFT and TPOT (log) against the offered rate (or the users, ``x="users"``): the
    targets as red rules, the knee and the scenario's load as vertical rules."""
    pct = f"p{s.sla.percentile:g}"
    title = "users" if x == "users" else "offered load (req/s)"
    here = float(s.traffic.users if x == "users" else s.traffic.rate_rps)
    panels = []
    for col, name, target in (("ttft_ms", "TTFT", s.sla.ttft_ms), ("tpot_ms", "TPOT", s.sla.tpot_ms)):
        base = alt.Chart(curve, title=f"{name} {pct}").encode(
            x=alt.X(f"{x}:Q", title=title),
            y=alt.Y(f"{col}:Q", scale=alt.Scale(type="log"), title=f"{name} {pct} (ms, log)"),
            tooltip=[f"{x}:Q", alt.Tooltip(f"{col}:Q", format=".1f")],
        )
        layer = base.mark_line(point=True)
        if target is not None:
            layer += alt.Chart(pd.DataFrame({"y": [target]})).mark_rule(color="red", strokeDash=[4, 3]).encode(y="y:Q")
        marks = [("knee", knee), ("this scenario", here)]
        rules = pd.DataFrame([{"x": x, "what": w} for w, x in marks if x is not None])
        layer += (
            alt.Chart(rules)
            .mark_rule(strokeDash=[2, 2])
            .encode(x="x:Q", color=alt.Color("what:N", title=None, scale=alt.Scale(range=["black", "grey"])))
        )
        panels.append(layer.properties(width=320, height=240))
    return alt.hconcat(*panels)


def plan(choice: Choice, s: Scenario) -> None:
    """The fewest replicas meeting the SLA for each GPU type × ``max_num_batched_tokens``,
    the cheapest, and the answer as a scenario to download."""
    st.header("Plan: replicas × GPU × max_num_batched_tokens")
    if s.autoscaled or s.traffic.classes:
        st.info("Planning bisects workers.count of a fixed fleet: pick a scenario without an autoscaler or classes.")
        return
    c1, c2, c3 = st.columns(3)
    gpus = [g.strip() for g in c1.text_input("GPU types", GPUS, key="llm-plan-gpus").split(",") if g.strip()]
    raw = c2.text_input("max_num_batched_tokens", BUDGETS, key="llm-plan-budgets")
    lo, hi = c3.slider("replicas range", 1, 32, (1, max(8, 2 * s.workers.count)), key="llm-plan-range")
    reps = st.number_input("replications per point", 2, 10, 2, key="llm-plan-reps")
    try:
        budgets = [int(b) for b in raw.split(",") if b.strip()]
    except ValueError:
        st.error(f"max_num_batched_tokens: whole numbers separated by commas, not {raw!r}")
        return
    bad = [b for b in budgets if b < 1]
    if bad or not gpus or not budgets:
        st.error("Name at least one GPU type and one max_num_batched_tokens of 1 or more.")
        return
    for gpu in gpus:  # refused before anything runs, with the scenario loader's own message
        try:
            choice.load((f"workers.instance_type={gpu}", f"batching.max_num_batched_tokens={budgets[0]}"))
        except ScenarioError as e:
            st.error(str(e))
            return
    if not st.button("run the plan", type="primary", key="llm-plan-run"):
        st.caption(
            f"Each GPU type and token budget gets the fewest replicas in {lo}–{hi} meeting TTFT "
            f"{s.sla.ttft_ms} ms and TPOT {s.sla.tpot_ms} ms at p{s.sla.percentile:g}, bisected."
        )
        return
    with st.spinner("planning …"):
        table = cache.llm_plan(choice.source, choice.text, choice.overrides, tuple(gpus), tuple(budgets), lo, hi, reps)
    met = table[table["met"].astype(bool)]
    shown = ["gpu", "max_num_batched_tokens", "workers", "met", "ttft_ms", "tpot_ms", "cost_per_hour_usd"]
    st.dataframe(table[[c for c in shown if c in table]], hide_index=True, width="stretch")
    if not len(met):
        st.error(f"Nothing meets the SLA with {lo}–{hi} replicas: widen the range or try other GPUs.")
        return
    pick = met.sort_values("cost_per_hour_usd").iloc[0]
    st.success(
        f"cheapest: {int(pick['workers'])} × {pick['gpu']} at max_num_batched_tokens "
        f"{int(pick['max_num_batched_tokens'])}, {glance.usd(pick['cost_per_hour_usd'])}/h"
    )
    extra = (
        f"workers.count={int(pick['workers'])}",
        f"workers.instance_type={pick['gpu']}",
        f"batching.max_num_batched_tokens={int(pick['max_num_batched_tokens'])}",
    )
    st.download_button("chosen scenario (YAML)", choice.edited_yaml(extra), file_name=f"{s.name}_planned.yaml")
