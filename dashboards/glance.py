"""The truth at a glance: a run's verdict, drops, stability and where its latency lives,
in words and compact numbers. No Streamlit here: the pages draw what these return, and the
tests check them on their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from simulator.results.anatomy import STAGE_WORDS, tail_stage

DROPS = ("rejected", "timed_out", "failed", "crashed", "errors")
DROP_WORDS = {"rejected": "rejected", "timed_out": "timed out", "failed": "failed", "crashed": "lost to crashes"}


def ms(x: float | None) -> str:
    """A latency as people read it: 0.42 ms, 31.2 ms, 905 ms, 1.06 s, 2.5 min."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if math.isinf(x):
        return "∞"
    a = abs(x)
    if a < 1:
        return f"{x:.2f} ms"
    if a < 100:
        return f"{x:.1f} ms"
    if a < 1000:
        return f"{x:.0f} ms"
    if a < 60_000:
        return f"{x / 1000:.3g} s"
    return f"{x / 60_000:.3g} min"


def target(x: float) -> str:
    """A target as it was written: 60 ms, 150 ms, 2.5 s."""
    return f"{x:g} ms" if x < 1000 else ms(x)


def short_of(attainment: float, percentile: float) -> str:
    """Why an SLA whose percentile is within target is still missed: the drops."""
    return f"missed: {attainment:.2%} within target, drops included, short of the {percentile:g}% needed"


def count(n: float) -> str:
    """A count in three significant figures: 940, 54.7k, 1.2M."""
    a = abs(n)
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:,.0f}" if float(n).is_integer() else f"{n:.3g}"


def usd(x: float | None) -> str:
    """Money: $0.74, $533, $12.8k."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if abs(x) < 10:
        return f"${x:.2f}"
    if abs(x) < 1000:
        return f"${x:.0f}"
    return "$" + count(x)


def change(x: float, fmt, *, unit: str = "") -> str | None:
    """A signed change as people read it ("+12.5 ms", "−3 workers"); None for no change,
    so nothing is coloured."""
    if x == 0 or (isinstance(x, float) and (math.isnan(x) or abs(x) < 1e-12)):
        return None
    text = fmt(abs(x))
    return ("+" if x > 0 else "−") + text + unit


@dataclass(frozen=True)
class Verdict:
    """The SLA verdict of a run, in words."""

    met: bool
    percentile: str  # "p99"
    target_ms: float
    attained_ms: float
    attainment: float  # share of requests within the target, drops counted as misses
    dropped: dict[str, int]  # by kind, only the non-zero ones
    arrived: int
    unstable: str | None  # why the run is unstable (overloaded), or None

    @property
    def headline(self) -> str:
        """'SLA p99 ≤ 150 ms: met with 119 ms to spare' / '…: missed by 905 ms'."""
        gap = self.target_ms - self.attained_ms
        if self.met:
            how = f"met with {ms(gap)} to spare"
        elif gap >= 0:  # the percentile is within target, the drops are not
            how = short_of(self.attainment, float(self.percentile[1:]))
        else:
            how = f"missed by {ms(-gap)}"
        return f"SLA {self.percentile} ≤ {target(self.target_ms)}: {how}"

    @property
    def drops_text(self) -> str:
        """'54.7k rejected (12.2%) · 120 timed out' or 'no requests dropped'."""
        if not self.dropped:
            return "no requests dropped"
        parts = [f"{count(v)} {DROP_WORDS.get(k, k)} ({v / max(self.arrived, 1):.1%})" for k, v in self.dropped.items()]
        return " · ".join(parts)


def verdict(summary: dict, timeline: pd.DataFrame | None = None) -> Verdict:
    """The verdict of a run's summary; ``timeline`` (its intervals) shows a queue that keeps
    growing."""
    sla, req = summary["sla"], summary["requests"]
    dropped = {k: int(req.get(k, 0)) for k in DROPS if req.get(k, 0)}
    return Verdict(
        met=bool(sla["met"]),
        percentile=f"p{sla['percentile']:g}",
        target_ms=float(sla["target_ms"]),
        attained_ms=float(sla["attained_ms"]),
        attainment=float(sla.get("attainment", float("nan"))),
        dropped=dropped,
        arrived=int(req["arrived"]),
        unstable=instability(summary, timeline),
    )


def instability(summary: dict, timeline: pd.DataFrame | None = None) -> str | None:
    """Why a run is overloaded (its latency percentiles then grow with the run's length),
    or None: offered load at the fleet's peak capacity, or a queue that grows through the
    measurement window."""
    peak = summary.get("utilization", {}).get("of_peak_capacity")
    if peak is not None and peak >= 0.99:
        return (
            f"offered load is {peak:.0%} of the fleet's peak capacity (every worker at its largest batch): "
            "the queue grows for as long as the run lasts, so the percentiles shown grow with the run's length"
        )
    if timeline is None or not len(timeline) or "queue_depth" not in timeline:
        return None
    w0, w1 = summary["requests"].get("window_s"), None
    t = timeline
    if w0 is not None:
        end = t["t_s"].max()
        w1 = end - w0
        t = t[(t["t_s"] >= w1) & (t["t_s"] < end)]
    if len(t) < 5:
        return None
    depth = t["queue_depth"].to_numpy()
    fifth = max(1, len(depth) // 5)
    first, last = float(depth[:fifth].mean()), float(depth[-fifth:].mean())
    slots = summary.get("workers", {}).get("count", 1) * max(summary.get("batch_size", {}).get("mean", 1.0), 1.0)
    if last >= 2 * first and last - first >= slots:
        return (
            f"the queue grew from {count(first)} to {count(last)} requests through the measurement window: "
            "the fleet does not keep up, and the percentiles shown grow with the run's length"
        )
    return None


def latency_home(stages: pd.DataFrame, percentile: str = "p99") -> str | None:
    """Where latency lives, in words: 'queueing is 96% of p99 (29.8 ms of 31.2 ms)',
    from :func:`simulator.results.anatomy.stage_bands`."""
    top = tail_stage(stages, percentile)
    if top is None:
        return None
    stage, share = top
    band = stages[stages["percentile"] == percentile]
    total = float(band["ms"].sum())
    words = STAGE_WORDS.get(stage, stage)
    text = f"{words} is {share:.0%} of {percentile} ({ms(share * total)} of {ms(total)})"
    rest = band[band["stage"] != stage].sort_values("ms", ascending=False)
    if len(rest) and float(rest["ms"].iloc[0]) / total >= 0.15:
        second = rest.iloc[0]
        text += (
            f", then {STAGE_WORDS.get(str(second['stage']), str(second['stage']))} ({float(second['ms']) / total:.0%})"
        )
    return text[0].upper() + text[1:]


def classes_table(summary: dict) -> pd.DataFrame | None:
    """Per traffic class: requests, p50 and p99, its own SLA and verdict, drops; None
    without traffic classes."""
    classes = summary.get("classes")
    if not classes:
        return None
    rows = []
    for name, c in classes.items():
        sla = c.get("sla") or {}
        lat = c["latency_ms"]
        attained = sla.get("attained_ms")
        met = sla.get("met")
        goal = sla.get("target_ms")
        if goal is None:
            verdict_text = "no SLA of its own"
        elif met:
            verdict_text = f"met, {ms(goal - attained)} to spare"
        elif attained <= goal:
            verdict_text = short_of(sla.get("attainment", float("nan")), sla["percentile"])
        else:
            verdict_text = f"missed by {ms(attained - goal)}"
        dropped = int(c.get("rejected", 0)) + int(c.get("timed_out", 0))
        rows.append(
            {
                "class": name,
                "requests": count(c["requests"]),
                "p50": ms(lat["p50"]),
                "p99": ms(lat["p99"]),
                "SLA": f"p{sla['percentile']:g} ≤ {target(goal)}" if goal is not None else "–",
                "verdict": verdict_text,
                "dropped": f"{count(dropped)} ({dropped / max(c['requests'], 1):.1%})" if dropped else "0",
                "met": bool(met) if met is not None else None,
            }
        )
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class TokenTarget:
    """An LLM run's TTFT or TPOT against its target, at the SLA's percentile."""

    name: str  # TTFT or TPOT
    percentile: str
    target_ms: float
    attained_ms: float
    attainment: float  # share of requests within the target
    met: bool

    @property
    def margin_ms(self) -> float:
        return self.target_ms - self.attained_ms

    @property
    def headline(self) -> str:
        word = "met" if self.met else "missed"
        return (
            f"{self.name} {self.percentile} ≤ {target(self.target_ms)}: {word} (attained {ms(self.attained_ms)}, "
            f"margin {'+' if self.margin_ms >= 0 else '−'}{ms(abs(self.margin_ms))}; "
            f"{self.attainment:.2%} within target)"
        )


def token_targets(summary: dict) -> list[TokenTarget]:
    """The TTFT and TPOT verdicts of an LLM run (those with a target), in that order."""
    llm = summary.get("llm")
    if not llm:
        return []
    pct = f"p{llm['sla']['percentile']:g}"
    out = []
    for name in ("ttft", "tpot"):
        v = llm["sla"][name]
        if v is not None:
            out.append(
                TokenTarget(
                    name.upper(),
                    pct,
                    float(v["target_ms"]),
                    float(v["attained_ms"]),
                    float(v["attainment"]),
                    bool(v["met"]),
                )
            )
    return out


def token_figures(summary: dict) -> dict[str, str]:
    """An LLM run's throughput, cost and cache figures as people read them."""
    llm = summary["llm"]
    t, c, g = llm["tokens"], llm["cost"], llm["sla"]
    hit = t["prefix_hit_rate"]
    return {
        "output tokens/s": count(t["output_per_s"]),
        "prompt tokens/s": count(t["prompt_per_s"]),
        "goodput": f"{g['goodput_rps']:,.1f} req/s ({g['good_share']:.1%})",
        "$ per M tokens": usd(c["per_million_tokens_usd"]),
        "$ per M output tokens": usd(c["per_million_output_tokens_usd"]),
        "$ per M input tokens": usd(c["per_million_input_tokens_usd"]),
        "preemptions a request": f"{t['preemptions_per_request']:.3f}",
        "prefix cache hit rate": "–" if hit != hit else f"{hit:.1%}",
    }
