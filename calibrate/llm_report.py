"""The report of a ``calibrate llm`` run: the validation table's rows and verdicts (each
held-out level's TTFT and TPOT, measured against predicted with its 90% interval),
``validation.md`` (with the fitted step time, the knee, the host's speed in each slice) and
``validation.png``; and what a ``measured.json`` or ``profile.json`` says the engine ran on
(its device, its name, the catalog's instance type for it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.llm_sim import QUANTILES
from calibrate.stats import replication_interval
from simulator.scenario.catalog import instance_for_gpu


def device_of(measured: dict) -> str:
    """The engine's device in a measured.json or profile.json (``cpu`` before there was a
    choice; the first GPU run kept it among the engine's fields)."""
    return str(measured.get("device") or measured["engine"].get("device", "cpu"))


def engine_on(measured: dict) -> str:
    """What the engine ran on, in words: the GPU's name, or the CPU's model."""
    hw = measured.get("hardware") or {}
    if device_of(measured).startswith("cuda"):
        return (hw.get("gpu") or {}).get("name") or "a GPU"
    return hw.get("cpu") or "this machine's CPU"


def markdown(profile: dict, table: pd.DataFrame) -> str:
    fit, knee = profile["step_time"], profile["knee"]
    lines = [
        "# The tiny LLM engine, calibrated",
        "",
        f"On {engine_on(profile)} (the engine on {device_of(profile)}, "
        + ("polling its pipe when idle: `--idle spin`)." if profile.get("idle") == "spin" else "asleep when idle)."),
        "",
        f"Step time (ms) = {fit['c0_ms']:.4f} + {fit['prefill_ms_per_token']:.5f}·P + "
        f"{fit['attention_ms_per_token2']:.3g}·Σp(ctx+p/2) + {fit['decode_ms_per_seq']:.4f}·D"
        + (
            f" (up to {fit['decode_threshold']}, {fit['decode_ms_per_seq_above']:.4f} each beyond)"
            if fit.get("decode_threshold")
            else ""
        )
        + " + "
        f"{fit['kv_ms_per_token']:.3g}·Σctx, noise cv {fit['noise_cv']:.3f}; fitted on {fit['steps']} steps "
        f"with the host's speed taken out a quarter-second at a time "
        f"(median error {fit['median_abs_rel_error']:.1%}, p90 {fit['p90_abs_rel_error']:.1%})"
        + (
            f"; the first steps after the engine idled cost {', '.join(f'{w:.2f}' for w in fit['wake_ms'])} ms more"
            if any(fit.get("wake_ms") or [])
            else ""
        )
        + (
            f"; the host drifts between slices by {fit['minute_drift']['sigma']:.3f} in log beyond the fitted "
            "components (a component of the speed process)"
            if (fit.get("minute_drift") or {}).get("sigma", 0) >= 1e-3
            else ""
        )
        + ".",
        "",
        f"Knee: measured {knee['completed_rps']:.2f} req/s (the mean of {len(knee['slices_rps'])} overload "
        f"slices of {knee['slice_s']:g} s spread over the run: {', '.join(f'{k:.2f}' for k in knee['slices_rps'])}; "
        f"{placed(profile)}), simulated {knee['simulated_rps']:.2f} req/s "
        f"({knee['error']:+.1%}; target within 5%)."
        + (
            f" Before measuring, the engine was aged by {profile['age']['seconds']:g} s of overload "
            f"({profile['age']['offered_rps']:.2f} req/s offered; drained after {profile['age']['took_s']:.0f} s)."
            if (profile.get("age") or {}).get("seconds")
            else ""
        ),
        "",
    ]
    host = profile.get("host_by_slice") or {}
    own = "at_speed_ms" in table
    if host:
        lines += [
            "The host's speed in each slice, in log against the fit of the other phases (> 0: slower; "
            "the mean over the slice's quarter-seconds): "
            + "; ".join(f"{phase} {', '.join(f'{v:+.2f}' for v in vs)}" for phase, vs in host.items())
            + (
                f". On its slices' own speeds the knee is simulated at {knee['at_speed_rps']:.2f} req/s "
                f"({knee['at_speed_rps'] / knee['completed_rps'] - 1:+.1%})"
                if knee.get("at_speed_rps")
                else ""
            )
            + (
                "; the last column predicts each level again on its own slices' speeds: what the model says "
                "once the host's minutes are known (not judged; the verdict is the held-out prediction's)."
                if own
                else "."
            ),
            "",
        ]
    head = "| level | req/s | metric | measured ms | predicted ms (90% interval) | error | ok |"
    lines += [head + (" on its host's speed |" if own else ""), "|---" * (8 if own else 7) + "|"]
    for r in table.itertuples():
        lines.append(
            f"| {r.level:.0%} | {r.rate_rps:.2f} | {r.metric.upper()} p{r.q} | {r.measured_ms:.2f} | "
            f"{r.predicted_ms:.2f} ({r.lo_ms:.2f}–{r.hi_ms:.2f}) | {r.error:+.1%} | {'yes' if r.ok else 'no'} |"
            + (f" {r.at_speed_ms:.2f} ({r.at_speed_ms / r.measured_ms - 1:+.1%}) |" if own else "")
        )
    return "\n".join(lines) + "\n"


def placed(profile: dict) -> str:
    """How the run placed its levels, in words."""
    if profile.get("levels_placed_by") == "the knee so far":
        return "each round's levels are shares of the knee measured before it; a level's req/s is their mean"
    return "the levels are shares of the first"


def chart(table: pd.DataFrame, path: Path) -> None:
    """``validation.png``: TTFT and TPOT at each level, measured (points) against predicted
    (lines, with the replications' 90% interval as a band), one colour a percentile."""
    import altair as alt

    t = table.assign(
        percentile=lambda d: "p" + d["q"].astype(str),
        panel=lambda d: d["metric"].str.upper(),
    )
    base = alt.Chart(t).encode(
        x=alt.X("rate_rps:Q", title="offered load (req/s)"),
        color=alt.Color("percentile:N", title="percentile"),
    )
    band = base.mark_area(opacity=0.18).encode(
        y=alt.Y("lo_ms:Q", title="ms", scale=alt.Scale(type="log")), y2="hi_ms:Q"
    )
    line = base.mark_line().encode(y="predicted_ms:Q")
    points = base.mark_point(filled=True, size=50).encode(
        y="measured_ms:Q", tooltip=["panel", "percentile", "rate_rps", "measured_ms", "predicted_ms"]
    )
    layered = (band + line + points).properties(width=300, height=260)
    column = alt.Column("panel:N", title=None, sort=["TTFT", "TPOT"])
    figure = layered.facet(column=column).resolve_scale(y="independent")
    figure = figure.properties(title="the tiny engine: measured (points) vs predicted (lines, 90% band)")
    try:
        import vl_convert  # noqa: F401 - altair renders PNGs with it
    except ImportError:  # a GPU host with only the wheels carried to it: the report stands without it
        print(f"{path}: not drawn (vl-convert-python is missing)")  # noqa: T201
        return
    figure.save(str(path), format="png")


def cells(share: float, rate: float, measured: dict, sim: pd.DataFrame, **extra) -> list[dict]:
    """A level's rows of the validation table: each TTFT and TPOT percentile measured, and
    the median of the simulated replications ``sim`` with their 90% prediction interval."""
    rows = []
    for name in ("ttft", "tpot"):
        for q in QUANTILES:
            col = f"{name}_p{q}_ms"
            lo, mid, hi = replication_interval(sim[col])
            rows.append(
                {"level": share, "rate_rps": rate, "metric": name, "q": q, "measured_ms": measured[col]}
                | {"predicted_ms": mid, "lo_ms": lo, "hi_ms": hi, **extra}
            )
    return rows


def verdicts(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` (measured_ms, predicted_ms, lo_ms, hi_ms, q) with each percentile's error and
    verdict: within 10% at p50 and p90 and 20% at p99, or inside the 90% interval."""
    table = table.copy()
    table["error"] = table["predicted_ms"] / table["measured_ms"] - 1.0
    table["inside"] = (table["measured_ms"] >= table["lo_ms"]) & (table["measured_ms"] <= table["hi_ms"])
    table["bound"] = np.where(table["q"] == 99, 0.20, 0.10)
    table["ok"] = (table["error"].abs() <= table["bound"]) | table["inside"]
    return table


def instance_type(measured: dict) -> str:
    """The scenario's ``workers.instance_type``: the catalog's GPU when the engine ran on one
    it lists (an NVIDIA H100 is ``h100``), else ``cpu`` (priced in the scenario)."""
    if not device_of(measured).startswith("cuda"):
        return "cpu"
    return instance_for_gpu(engine_on(measured)) or "cpu"


__all__ = ["cells", "chart", "device_of", "engine_on", "instance_type", "markdown", "placed", "verdicts"]
