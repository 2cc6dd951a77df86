"""What a calibration writes for people: the Markdown report (``validation.md``); the
profile as ``scenario.yaml`` is :func:`calibrate.scenario.write_scenario`'s."""

from __future__ import annotations

import numpy as np
import pandas as pd

from calibrate.interval import LEAD_IN_S
from calibrate.report_model import fitted_model
from calibrate.scenario import scenario_dict


def _timer_drawn(profile: dict) -> bool:
    """Whether the profile's scenario draws its window timer's lateness on the loop."""
    doc = scenario_dict(profile, 1.0, duration_s=1.0, warmup_s=0.0)
    return "timer_late" in doc["preprocess"].get("event_loop", {})


def _errors(row) -> str:
    """A level's measured errors, and the share the simulated server refused where it refused any."""
    refused = row.get("predicted_refused")
    if refused is None or not np.isfinite(refused) or refused <= 0:
        return f"{row['errors']}"
    return f"{row['errors']} (simulated: {refused:.2%} refused)"


def _ci(lo: float, hi: float) -> str:
    return "—" if not (np.isfinite(lo) and np.isfinite(hi)) else f"[{lo:.1f}, {hi:.1f}]"


def _fetch_in_flight(profile: dict) -> list[str]:
    """The feature fetch's cost against the fetches in flight, and what it means for the model."""
    rows = (profile.get("feature_fetch_microbench") or {}).get("by_in_flight")
    if not rows:
        return []
    by = pd.DataFrame(rows)
    low = by.loc[by["cpu_ms_per_fetch"].idxmin()]
    top = by.iloc[-1]
    out = [
        "",
        "## The feature fetch under concurrency",
        "",
        "The server's own Redis client, alone on the front end's core, with N fetches in flight back to back "
        "(CPU of the client and of the redis-server per fetch; failed: the pool's wait for a connection timed out, "
        "a 503 in the server).",
        "",
        "| in flight | fetches/s | CPU ms per fetch | failed |",
        "|---|---|---|---|",
        *(
            f"| {int(r.in_flight)} | {r.fetches_per_s:,.0f} | {r.cpu_ms_per_fetch:.2f} | {int(r.failed)} |"
            for r in by.itertuples()
        ),
        "",
        f"Lowest at {int(low.in_flight)} in flight ({low.cpu_ms_per_fetch:.2f} ms); at {int(top.in_flight)}, "
        f"{top.cpu_ms_per_fetch / low.cpu_ms_per_fetch - 1:+.0%}. The model holds the loop for a fixed time per round "
        "trip: where the cost rises with the fetches in flight, a level that queues that many is slower than "
        "predicted, and past the rise the server can tip into a congestion collapse the model does not have.",
    ]
    return out


def markdown(
    profile: dict,
    summary: pd.DataFrame,
    table: pd.DataFrame,
    inside: pd.DataFrame,
    slices: pd.DataFrame,
    hiccups: pd.DataFrame,
) -> str:
    """The validation report, in Markdown.

    Parameters
    ----------
    profile : dict
        The fitted profile (``profile.json``).
    summary : DataFrame
        One row per level (``level_summary``, with ``load`` and ``held_out``).
    table : DataFrame
        The held-out comparison (``calibrate.validate.compare``).
    inside : DataFrame
        Compute inside the server against the microbenchmark (``compute_inside``).
    slices, hiccups : DataFrame
        Every slice measured, and every hiccup recorded.
    """
    lines = [
        *_header(profile),
        *_held_out(table, (profile.get("design") or {}).get("slice_gap_ms")),
        *fitted_model(profile),
        *_fetch_in_flight(profile),
        *_compute_inside(inside),
        *_hiccups(profile["design"], slices, hiccups),
        *_platform_speed(profile),
        *_every_level(summary),
    ]
    return "\n".join(lines) + "\n"


def over_capacity(profile: dict) -> str | None:
    """A warning when the levels went past what the front end can take by the run's own
    fitted levels (its CPU per request there, ``frontend.capacity_rps``): the capacity
    probe's estimate was off, and the levels past it measure an overloaded server."""
    fe, levels = profile.get("frontend") or {}, profile.get("levels_rps") or []
    cap = fe.get("capacity_rps")
    if not cap or not levels or max(levels) <= 1.05 * cap:
        return None
    over = [r for r in levels if r > 1.05 * cap]
    return (
        f"the front end's CPU per request at the fitted levels puts its capacity at {cap:.0f} req/s, but "
        f"{len(over)} level(s) offered more ({', '.join(f'{r:g}' for r in over)} req/s) against the "
        f"{profile.get('capacity_rps', float('nan')):.0f} the capacity probe found: those levels measured an "
        "overloaded server; run again"
    )


def _over_capacity(profile: dict) -> list[str]:
    warning = over_capacity(profile)
    return [f"**Warning: {warning}.**", ""] if warning else []


def _header(profile: dict) -> list[str]:
    """The title, what was measured how, and the server's layout."""
    m, hw, d, server = profile["model"], profile["hardware"], profile["design"], profile["server"]
    what = (
        f"{m['kind']} ({m['resolution']} px, {m['precision']})"
        if m["kind"] == "resnet"
        else f"{m['kind']} ({m['precision']})"
    )
    return [
        f"# Calibration of {what} on {hw['cpu']}",
        "",
        *_over_capacity(profile),
        f"Measured {profile['created']}: capacity {profile['capacity_rps']:.1f} req/s"
        + (
            f" (set by the {profile['capacity']['bottleneck']}: instances {profile['capacity']['instances_rps']:.0f}, "
            f"front end {profile['capacity']['frontend_rps']:.0f}"
            + (
                f", load generator {profile['capacity']['client_rps']:.0f}"
                if profile["capacity"].get("client_rps")
                else ""
            )
            + " req/s)"
            if "capacity" in profile
            else ""
        )
        + f"; {d['rounds']} rounds of "
        f"{d['levels']} interleaved slices of {d['slice_s']:g} s (first {d['warmup_s']:g} s of each left out); "
        f"CPU stolen by the host during the run: {hw.get('cpu_steal_pct_during_run') or 0:.1f}%.",
        f"Server: {server['instances']} model instance(s) as {server['instance_mode']}es on core(s) "
        f"{server['instance_cores']}, the front end and this load generator on core(s) {server['frontend_cores']}; "
        f"batches up to {server['max_batch_size']}, {server['max_queue_delay_ms']:g} ms window"
        + (
            f", which its timers closed {w['late_ms']:.2f} ms late on average (median "
            f"{w['late_quantiles_ms']['50']:.2f}, 95th percentile {w['late_quantiles_ms']['95']:.2f} ms, over "
            f"{w['batches']:,} window-bound batches of the lightest fitted load): "
            + (
                "the scenario's loop draws its timer's lateness per window from the windows no request closed "
                f"(Kaplan-Meier: median {np.median(w['timer_ms']):.2f}, 95th percentile "
                f"{np.percentile(w['timer_ms'], 95):.2f} ms)."
                if _timer_drawn(profile)
                else f"the scenario's window is {server['max_queue_delay_ms'] + w['late_ms']:.2f} ms."
            )
            if (w := profile.get("window"))
            else "."
        ),
        "Fitted on loads "
        + ", ".join(f"{x['load']:.0%}" for x in profile["fit_levels"])
        + "; validated on the others.",
    ]


def _held_out(table: pd.DataFrame, slice_gap_ms: float | None = None) -> list[str]:
    """The held-out levels: measured against predicted, with intervals and verdicts
    (``slice_gap_ms``: each simulated slice followed another level's, that long before it)."""
    bands = "covered" in table and table["covered"].notna().any()
    after = (
        f" (each slice after the last {LEAD_IN_S:g} s of another level's and the measured {slice_gap_ms:.0f} ms "
        "between slices, as the interleaved rounds ran them)"
        if slice_gap_ms is not None
        else ""
    )
    how = (
        f"predicted ones are 90% prediction intervals: the same slice design{after} simulated 200 times with the "
        "fitted parameters drawn from their uncertainty (a bootstrap over the fitted slices), widened by the model's "
        "own error at the fitted levels beyond their luck, the prediction their median. "
        "Targets: p50 within 10%, p99 within 15%, or the measurement inside the prediction interval."
        if bands
        else "predicted ones are t-intervals over replications of the same slice design. Targets: p50 within 10%, "
        "p99 within 15%, or the prediction inside the measured interval."
    )
    lines = [
        "",
        "## Held-out levels",
        "",
        f"Measured intervals resample whole slices (95%); {how}",
        "",
        "Latencies are of the successful requests; the failed ones (timeouts, 503s, 500s) are counted in the "
        "errors column, never left out silently, and so are the requests the simulated server refused (its "
        "share, where there are any).",
        "",
        f"| load | req/s | requests | errors | pct | measured ms | 95% interval | predicted ms | "
        f"{'90% prediction interval' if bands else '95% interval'} | error | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in table.iterrows():
        lines.append(
            f"| {r['load']:.0%} | {r['offered_rps']:.1f} | {r['requests']:,} | {_errors(r)} | {r['percentile']} | "
            f"{r['measured_ms']:.1f} | {_ci(r['measured_lo'], r['measured_hi'])} | {r['predicted_ms']:.1f} | "
            f"{_ci(r['predicted_lo'], r['predicted_hi'])} | {r['error_pct']:+.1f}% | {r['verdict']} |"
        )
    judged = table[table["target_pct"].notna()]
    ok = judged["verdict"].isin(["within target", "inside prediction interval", "inside interval"])
    worst = judged.assign(a=judged["error_pct"].abs()).groupby("percentile")["a"].max()
    out = [
        *lines,
        "",
        f"**{int(ok.sum())} of {len(judged)}** judged percentiles meet the target; worst |error|: "
        + ", ".join(f"{q} {v:.1f}%" for q, v in worst.items())
        + f". Errors (non-200) during the validated levels: {int(table.groupby('level')['errors'].first().sum())}.",
    ]
    if bands:
        cover = judged["covered"].astype(bool)
        tail = judged[(judged["percentile"] == "p99") & (judged["load"] >= 0.7)]
        sides = sorted({"over" if e > 0 else "under" for e in tail["error_pct"]})
        width = judged["pi_width_ratio"].max()
        sd = judged.groupby("percentile")["structural_log_sd"].first()
        out.append(
            "The model's error at the fitted levels beyond their luck (a log-normal spread added to every "
            "prediction): " + ", ".join(f"{q} {v:.1%}" for q, v in sd.items()) + "."
        )
        out.append(
            f"Inside their 90% prediction interval: **{int(cover.sum())} of {len(judged)}**; the p99 at 70–85% "
            f"predicted {' and '.join(sides)} the measurement; the widest prediction interval is {width:.2f}× the "
            "measurement's own 95% interval."
        )
    return out


def _compute_inside(inside: pd.DataFrame) -> list[str]:
    """The forward pass inside the server against the microbenchmark (issue 11's bar)."""
    lines = [
        "",
        "## Compute inside the server against the microbenchmark",
        "",
        "The forward pass as the instance timed it, against `servesim calibrate microbench` (the same model, one "
        "torch thread, on the instance's core, before the server started).",
        "",
        "| load | batch | batches | inside ms | microbench ms | difference |",
        "|---|---|---|---|---|---|",
    ]
    for _, r in inside.iterrows():
        diff = f"{r['diff_pct']:+.1f}%" if np.isfinite(r["diff_pct"]) else "—"
        inside_ms = f"{r['inside_ms']:.2f}" if np.isfinite(r["inside_ms"]) else "—"
        lines.append(
            f"| {r['load']:.0%} | {r['batch_size']} | {r['batches']} | {inside_ms} | {r['microbench_ms']:.2f} "
            f"| {diff} |"
        )
    return lines


def _hiccups(d: dict, slices: pd.DataFrame, hiccups: pd.DataFrame) -> list[str]:
    """The sleep meters' stalls: per slice, the slices run again, the longest recorded."""
    repeated = slices[~slices["kept"]]
    lines = [
        "",
        "## Platform hiccups",
        "",
        f"A meter on each core sleeps 1 ms and records the overshoot. Longest per slice: median "
        f"{slices['hiccup_max_ms'].median():.2f} ms, max {slices['hiccup_max_ms'].max():.2f} ms. Slices with a stall "
        f"over {d['stall_ms']:g} ms are run again (up to {d['retries']} times): {len(repeated)} repeated"
        + (
            " ("
            + ", ".join(f"slice {int(r['slice'])} at {r['hiccup_max_ms']:.1f} ms" for _, r in repeated.iterrows())
            + ")"
            if len(repeated)
            else ""
        )
        + ".",
    ]
    if len(hiccups):
        big = hiccups.sort_values("overshoot_ms", ascending=False).head(10)
        lines.append(
            "Longest recorded: "
            + ", ".join(
                f"{r['overshoot_ms']:.1f} ms (core {int(r['core'])}, slice {int(r['slice'])})"
                for _, r in big.iterrows()
            )
            + "."
        )
    return lines


def _platform_speed(profile: dict) -> list[str]:
    """The speed meters per window, and the front end's speed per slice."""
    lines = []
    ps = profile.get("platform_speed") or {}
    if ps:
        q = ps["quantiles"]
        corr = ps.get("spearman_p99_vs_slowest")
        lines += [
            "",
            "## Platform speed",
            "",
            "The same meters time a fixed chunk of pure-Python work (every 10 ms; every 20 ms on an "
            "instance's core) and take its CPU time. A sleep meter sees pauses; this sees the CPU doing the same "
            "work slower. "
            f"Per {ps['window_s'] or 0:g} s window, the median core's chunk time over its usual: p50 "
            f"{q['0.5']:.2f}, p90 {q['0.9']:.2f}, p99 {q['0.99']:.2f}, max {ps['max']:.2f}; "
            f"{ps['share_slow']:.1%} of {ps['windows']:,} windows at {ps['slow_threshold']:g}× or slower."
            + (
                f" Across {ps['slices_correlated']} slices, a slice's p99 (over its level's median slice) "
                f"against its slowest window: Spearman {corr:+.2f}."
                if corr is not None
                else ""
            ),
        ]
    sp = (profile.get("frontend") or {}).get("speed")
    if sp and "speed_process" in profile:
        lines += [
            "",
            f"A slice's front-end CPU per request against this meter's mean slowdown, within each fitted level: "
            f"elasticity {sp['elasticity']:.2f} (r {sp['r']:+.2f}, {sp['slices_fitted']} slices). The simulation "
            "does not use it: the speed is a process fitted from the server's own batches (the fitted model, above).",
        ]
    elif sp:
        f = np.asarray(sp["slice_factors"])
        lines += [
            "",
            f"A slice's front-end CPU per request against its mean slowdown, within each fitted level: "
            f"elasticity {sp['elasticity']:.2f} (r {sp['r']:+.2f}, {sp['slices_fitted']} slices). Each simulated "
            f"slice runs the front end at the speed of a measured slice drawn at random: factors "
            f"{f.min():.2f}–{f.max():.2f} (p10 {np.percentile(f, 10):.2f}, p90 {np.percentile(f, 90):.2f}), mean one.",
        ]
    return lines


def _every_level(summary: pd.DataFrame) -> list[str]:
    """Every level measured, fitted or held out."""
    lines = [
        "",
        "## Every level",
        "",
        "| load | offered req/s | achieved req/s | requests | errors | p50 ms | p99 ms | mean batch | held out |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in summary.iterrows():
        lines.append(
            f"| {r['load']:.0%} | {r['offered_rps']:.1f} | {r['achieved_rps']:.1f} | {r['requests']:,} "
            f"| {r['errors']} | "
            f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['mean_batch']:.2f} | {'yes' if r['held_out'] else 'no'} |"
        )
    return lines
