"""Terminal report of a run: rich tables built from the summary dict (no simulation here)."""

from __future__ import annotations

import math

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text


def _ms(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:,.2f}" if x < 1000 else f"{x:,.0f}"


def render(summary: dict) -> Group:
    """Rich renderables for a run summary (:class:`simulator.results.summary.Summary`)."""
    return Group(
        _head(summary),
        _latency(summary),
        _sla(summary["sla"]),
        _llm(summary.get("llm")),
        _classes(summary.get("classes")),
        _fleet(summary),
        _fleet_events(summary.get("fleet", {})),
        _timeline_line(summary.get("timeline", [])),
    )


def _head(summary: dict) -> Table:
    """The scenario's name, what happened to the requests, and the throughput."""
    req = summary["requests"]
    head = Table(title=f"servesim · {summary['scenario']['name']}", show_header=False, box=None, pad_edge=False)
    head.add_column(style="bold")
    head.add_column()
    head.add_row(
        "requests",
        f"{req['arrived']:,} arrived · {req['completed']:,} completed · "
        f"{req['rejected']:,} rejected · {req['timed_out']:,} timed out"
        + (f" · {req['failed']:,} failed" if req["failed"] else "")
        + (f" · {req['degraded']:,} degraded" if req["degraded"] else ""),
    )
    head.add_row("throughput", f"{req['throughput_rps']:,.1f} req/s over {req['window_s']:g} s (after warm-up)")
    return head


def _latency(summary: dict) -> Table:
    """Percentiles per stage, and end to end."""
    lat = Table(title="latency (ms), completed requests", title_justify="left")
    lat.add_column("stage")
    for col in ("p50", "p95", "p99", "p99.9", "mean"):
        lat.add_column(col, justify="right")
    for name, row in summary["latency_ms"]["stages"].items():
        lat.add_row(name, _ms(row["p50"]), _ms(row["p95"]), _ms(row["p99"]), _ms(row["p999"]), _ms(row["mean"]))
    e = summary["latency_ms"]["e2e"]
    lat.add_row(
        Text("end to end", style="bold"),
        _ms(e["p50"]),
        _ms(e["p95"]),
        _ms(e["p99"]),
        _ms(e["p999"]),
        _ms(e["mean"]),
        end_section=True,
    )
    return lat


def _sla(sla: dict) -> Text:
    """The SLA's verdict, and what was attained."""
    verdict = Text("MET", style="bold green") if sla["met"] else Text("MISSED", style="bold red")
    return Text.assemble(
        "SLA p",
        f"{sla['percentile']:g}",
        " ≤ ",
        f"{sla['target_ms']:g} ms: ",
        verdict,
        f"  (attained {_ms(sla['attained_ms'])} ms; {sla['attainment']:.2%} of requests within target)",
    )


def _llm(llm: dict | None) -> Group:
    """An LLM run's tokens: TTFT and TPOT against their targets, throughput, goodput, cost."""
    if not llm:
        return Group()
    t = Table(title="tokens (ms), completed requests", title_justify="left")
    t.add_column("")
    for col in ("p50", "p95", "p99", "p99.9", "mean"):
        t.add_column(col, justify="right")
    for name, key in (
        ("time to first token", "ttft_ms"),
        ("time per output token", "tpot_ms"),
        ("gap between tokens (every token)", "itl_ms"),
        ("worst gap between tokens", "max_itl_ms"),
    ):
        row = llm.get(key)
        if row is None:  # a summary written before the field
            continue
        t.add_row(name, _ms(row["p50"]), _ms(row["p95"]), _ms(row["p99"]), _ms(row["p999"]), _ms(row["mean"]))
    lines = []
    sla = llm["sla"]
    for name, key in (("TTFT", "ttft"), ("TPOT", "tpot")):
        v = sla[key]
        if v is None:
            continue
        verdict = Text("MET", style="bold green") if v["met"] else Text("MISSED", style="bold red")
        margin = v["target_ms"] - v["attained_ms"]
        lines.append(
            Text.assemble(
                f"{name} p{sla['percentile']:g} ≤ {v['target_ms']:g} ms: ",
                verdict,
                f"  (attained {_ms(v['attained_ms'])} ms, margin {margin:+,.1f} ms; "
                f"{v['attainment']:.2%} within target)",
            )
        )
    tok, cost = llm["tokens"], llm["cost"]
    lines.append(
        Text(
            f"goodput {sla['goodput_rps']:,.1f} req/s meeting every token target ({sla['good_share']:.2%}) · "
            f"tokens {tok['prompt_per_s']:,.0f} prompt/s, {tok['output_per_s']:,.0f} output/s · "
            f"prefix cache {tok['prefix_hit_rate']:.1%} of prompt tokens · "
            f"{tok['preemptions_per_request']:.3f} preemptions a request · "
            f"${cost['per_million_input_tokens_usd']:,.3f} per million input and "
            f"${cost['per_million_output_tokens_usd']:,.3f} per million output tokens "
            f"(prompts take {cost['prefill_share_of_gpu_time']:.0%} of the GPUs' time; "
            f"${cost['per_million_tokens_usd']:,.3f} per million tokens in and out)"
        )
    )
    ses = llm.get("sessions")
    closed = ses is not None and ses.get("turn_gap_from") == "answer"
    if ses is not None and not ses["later_turns_share"] > 0:  # conversations of one turn (a concurrency)
        lines.append(
            Text(
                "sessions: one turn each"
                + ("; a user's next is sent a think time after its answer (a closed loop)" if closed else "")
            )
        )
    elif ses is not None:
        lines.append(
            Text(
                f"sessions: {ses['later_turns_share']:.0%} of requests are later turns of a conversation; "
                f"{ses['early_turns_share']:.1%} of those arrived before the answer to the turn before them "
                + (
                    "(each sent a think time after that answer: a closed loop)"
                    if closed
                    else "(turns arrive a gap after the turn before them arrived)"
                )
            )
        )
    return Group(t, *lines)


def _fleet(summary: dict) -> Table:
    """Workers, utilization, batches, cost, then whatever else the run had (versions,
    shadow, caches, the prediction log) and how fast it was simulated."""
    fleet = Table(title="workers and batches", title_justify="left", show_header=False, box=None)
    fleet.add_column(style="bold")
    fleet.add_column()
    w, util, fl = summary["workers"], summary["utilization"], summary.get("fleet", {})
    per_worker = util["per_worker"]
    scaled = any(e["event"] in ("scale_up", "scale_down", "crash") for e in fl.get("events", []))
    pools = f" ({_pools(fl)})" if "pools" in fl else ""
    size = (
        f"{w['count']} at start, {fl['active_mean']:.1f} serving on average{pools}, peak {fl['active_max']}"
        if scaled
        else f"{w['count']}"
    )
    mix = w.get("mix") or {}
    if mix:  # a mixed fleet: each type's count (at the start, and billed on average where it scaled)
        size = f"{w['count'] - sum(mix.values())}" + "".join(f" + {t} × {n}" for t, n in mix.items())
        if scaled:
            billed = ", ".join(f"{t} {n:.1f}" for t, n in fl.get("billed_by_type", {}).items())
            size += f" at start, {fl['active_mean']:.1f} serving on average, peak {fl['active_max']}; billed {billed}"
    fleet.add_row("workers", f"{w['instance_type']} × {size} ({w['instances']} instance(s) each)")
    peak = util["of_peak_capacity"]
    fleet.add_row(
        "utilization",
        f"busy {util['workers']:.1%} (min {min(per_worker):.1%}, max {max(per_worker):.1%})"
        + (f" · load is {peak:.1%} of peak capacity (full batches)" if math.isfinite(peak) else ""),
    )
    counts = summary["batch_size"]["counts"]
    total = sum(counts.values()) or 1
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:8]
    dist = ", ".join(f"{k}: {v / total:.1%}" for k, v in sorted(top))
    mean_b = summary["batch_size"]["mean"]
    fleet.add_row(
        "batch size",
        f"mean {mean_b:.2f} · {dist}" if math.isfinite(mean_b) else "no batch ran (every request was dropped first)",
    )
    fleet.add_row("cost", _cost(summary["cost"]))
    for label, line in _extras(summary):
        fleet.add_row(label, line)
    sim = summary["sim"]
    fleet.add_row(
        "simulated",
        f"{sim['requests']:,} requests in {sim['wall_s']:.2f} s wall "
        f"({sim['requests_per_wall_s']:,.0f} req/s"
        + (
            f"; the simulation {sim['simulate_s']:.2f} s, {sim['requests'] / sim['simulate_s']:,.0f} req/s"
            if sim.get("simulate_s")
            else ""
        )
        + f") · seed {sim['seed']}"
        + (f" · numba started in {sim['start_s']:.2f} s" if sim.get("start_s") else ""),
    )
    return fleet


def _cost(c: dict) -> str:
    """The run's cost, as one line."""
    per_m = c["per_million_requests_usd"]
    return (
        f"${c['per_hour_usd']:,.2f}/h · "
        + (f"${per_m:,.4f} per million requests " if math.isfinite(per_m) else "no request completed to price ")
        + f"(${c['price_per_worker_hour_usd']:.4g} per worker-hour, {c['market'].replace('_', '-')}) · "
        f"{c['gpu_hours_per_day']:,.0f} GPU-hours/day"
        + (
            f" · canary and shadow ${c['experiments_per_hour_usd']:,.2f}/h ({c['experiments_fraction']:.1%})"
            if c["experiments_per_hour_usd"]
            else ""
        )
    )


def _extras(summary: dict) -> list[tuple[str, str]]:
    """Rows for what only some runs have: versions and shadow, caches, the prediction log."""
    rows = []
    exp = summary.get("experiments")
    if exp:
        for name, v in exp["versions"].items():
            rows.append(
                (
                    f"version {name}",
                    f"{v['share']:.1%} of requests · p50 {_ms(v['latency_ms']['p50'])} · "
                    f"p99 {_ms(v['latency_ms']['p99'])} ms" + (f" · {v['errors']:,} errors" if v["errors"] else ""),
                )
            )
        sh = exp.get("shadow")
        if sh:
            line = (
                f"{sh['copies_per_s']:,.0f} copies/s ({sh['pool']} pool) · server p99 "
                f"{_ms(sh['server_latency_ms']['p99'])} ms · ${sh['gpu_cost_per_hour_usd']:,.2f}/h"
            )
            if "primary_p99_ms" in sh:
                line += f" · adds {sh['primary_p99_ms']['added']:+.2f} ms to the primary's p99"
            rows.append(("shadow", line))
    for name, c in summary.get("caches", {}).items():
        rows.append((f"{name} cache", f"hit ratio {c['hit_ratio']:.1%} of {c['lookups']:,} lookups"))
    log = summary.get("logging")
    if log:
        rows.append(
            (
                "prediction log",
                f"{log['offered_gb_per_s']:.3g} GB/s of {log['capacity_gb_per_s']:.3g} GB/s capacity "
                f"({log['utilization']:.0%}; {log['tb_per_day']:.3g} TB/day) · lag p99 {_ms(log['lag_ms']['p99'])} ms"
                + (
                    f" · FALLING BEHIND: {log['backlog_mb_at_end']:,.0f} MB backlog at end"
                    if log["falling_behind"]
                    else ""
                ),
            )
        )
    return rows


def _classes(classes: dict | None) -> Table | Text:
    """One row per traffic class: its traffic, latency, SLA and GPU share."""
    if not classes:
        return Text("")
    t = Table(title="traffic classes (latency in ms)", title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0))
    for col in ("class", "pool", "req/s", "dropped", "p50", "p99", "SLA", "GPU", "$/h"):
        t.add_column(col, justify="left" if col in ("class", "pool", "SLA") else "right", no_wrap=True)
    for name, c in classes.items():
        pool = f"own×{c['workers']}" if c["pool"] == "own" else "shared"
        if c["max_instances"] is not None:
            pool += f" ≤{c['max_instances']}"
        sla = c["sla"]
        verdict = Text("met", style="green") if sla["met"] else Text("MISSED", style="bold red")
        t.add_row(
            name + (" (bulk)" if c["priority"] == "bulk" else ""),
            pool,
            f"{c['throughput_rps']:,.0f}",
            f"{c['rejected'] + c['timed_out']:,}",
            _ms(c["latency_ms"]["p50"]),
            _ms(c["latency_ms"]["p99"]),
            Text.assemble(f"p{sla['percentile']:g}≤{sla['target_ms']:g} ", verdict),
            f"{c['gpu_share']:.0%}",
            f"{c['cost_per_hour_usd']:,.2f}",
        )
    return t


def _fleet_events(fleet: dict) -> Text:
    """Scaling, readiness and crash events, one line each, readiness grouped by time."""
    events = fleet.get("events", [])
    if not events:
        return Text("")
    lines, ready = [], {}
    for e in events:
        if e["event"] == "ready":
            if e["t_s"] > 0:  # group readiness into 10 s bins
                key = 10 * int(e["t_s"] // 10)
                first, last, k = ready.get(key, (e["t_s"], e["t_s"], 0))
                ready[key] = (min(first, e["t_s"]), max(last, e["t_s"]), k + 1)
            continue
        lines.append((e["t_s"], f"{e['event'].replace('_', ' ')} {e['detail']}"))
    lines += [
        (first, f"{k} worker{'s' * (k > 1)} ready" + (f" (by {last:.1f} s)" if last > first else ""))
        for first, last, k in ready.values()
    ]
    lines.sort(key=lambda x: x[0])
    shown = lines[:12] + ([(lines[-1][0], f"… {len(lines) - 12} more")] if len(lines) > 12 else [])
    body = "\n".join(f"  t={t:7.1f} s  {msg}" for t, msg in shown)
    head = "events"
    if any(e["event"] in ("scale_up", "scale_down", "crash", "ready") for e in events):
        head += f": {fleet['active_mean']:.1f} workers serving on average (peak {fleet['active_max']}), "
        head += f"{fleet['billed_mean']:.1f} billed" + (f" ({_pools(fleet)} serving)" if "pools" in fleet else "")
    return Text(head + "\n" + body)


def _pools(fleet: dict) -> str:
    """Each pool's replicas serving on average, prefill and decode apart."""
    return ", ".join(f"{k} {v:.1f}" for k, v in fleet["pools"].items())


def _timeline_line(rows: list[dict]) -> Text:
    """A one-line digest of the timeline: peaks and the worst interval."""
    rows = [r for r in rows if r["completed_rps"] or r["offered_rps"]]
    if not rows:
        return Text("")
    peak = max(rows, key=lambda r: r["offered_rps"])
    p99s = [r for r in rows if r["p99_ms"] is not None and not math.isnan(r["p99_ms"])]
    worst = max(p99s, key=lambda r: r["p99_ms"]) if p99s else None
    deep = max(rows, key=lambda r: r["queue_depth"])
    dropped = sum(r["rejected"] + r["timed_out"] + r["failed"] for r in rows)
    parts = [f"timeline ({len(rows)} intervals): peak offered {peak['offered_rps']:,.0f} req/s at t={peak['t_s']:g} s"]
    if worst:
        parts.append(f"worst p99 {_ms(worst['p99_ms'])} ms at t={worst['t_s']:g} s")
    parts.append(f"deepest queue {deep['queue_depth']:,.1f} at t={deep['t_s']:g} s")
    if dropped:
        first = next(r for r in rows if r["rejected"] + r["timed_out"] + r["failed"])
        parts.append(f"drops from t={first['t_s']:g} s")
    return Text(" · ".join(parts), style="dim")
