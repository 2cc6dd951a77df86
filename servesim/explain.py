"""``servesim explain``: the napkin math, each line with its formula, then the simulator's check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table as RichTable

from servesim.console import budget, check_output, err, fail, out
from servesim.plan import _ci

if TYPE_CHECKING:
    from simulator.scenario.config import Scenario

FIXED_STAGES = ("network_in", "router", "cache", "features", "preprocess", "postprocess", "network_out")


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def anatomy(s: Scenario) -> dict:
    """One (fleet-sampled where exact) run's stage p99s, mean batch and utilization."""
    from simulator.planning.runner import run

    summary = run(s, sample="auto", interval_s=None).summary
    stages = summary["latency_ms"]["stages"]
    return {
        "mean_batch": summary["batch_size"]["mean"],
        "busy": summary["utilization"]["workers"],
        "queue_p99_ms": stages["queue"]["p99"],
        "inference_p99_ms": stages["inference"]["p99"],
        "outside_gpu_p50_ms": sum(stages[n]["p50"] for n in FIXED_STAGES if n in stages),
    }


def explain(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML file.", show_default=False)],
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a field first: path=value.")] = None,
    replications: Annotated[int, typer.Option(help="Replications per worker count checked.", min=2)] = 3,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the napkin and the verdict here.")] = None,
) -> None:
    """The napkin capacity math from the scenario's own numbers, checked by the simulator.

    Each napkin line comes with its formula; then the SLA percentile at the napkin's worker
    count, the fewest workers that really meet the SLA, and why the two differ. The napkin's
    batch size and headroom come from the scenario's `napkin:` section (default: max batch
    size, 30%)."""
    from simulator.chunks import prefer_streaming
    from simulator.planning.llm_napkin import llm_napkin
    from simulator.planning.napkin import napkin, napkin_batch, peak_rate, per_worker_rps, workers_needed
    from simulator.planning.plan import Planner, with_workers
    from simulator.planning.sampling import sampling_refusal
    from simulator.results.metrics import worker_price
    from simulator.scenario.loader import ScenarioError, load_scenario

    check_output(json_path, "--json")
    llm = None
    try:
        s = load_scenario(scenario, set_ or [])
        if s.traffic.tokens is not None:
            lines, llm = llm_napkin(s, worker_price(s))
        else:
            lines = napkin(s, worker_price(s))
    except (ScenarioError, ValueError) as e:
        raise fail(str(e)) from None
    budget(s, runs=replications, what="each simulation", streamed=prefer_streaming(s))
    t = RichTable(title=f"napkin: {s.name}")
    for col in ("quantity", "formula", "value"):
        t.add_column(col, justify="right" if col == "value" else "left")
    for ln in lines:
        t.add_row(ln.quantity, ln.formula, f"{_num(ln.value)} {ln.unit}")
    out.print(t)

    bare, padded = (llm.bare, llm.padded) if llm is not None else workers_needed(s)
    if s.autoscaled or s.traffic.classes:
        out.print(
            "The simulator's check varies workers.count of one fixed fleet; this scenario has "
            + (f"an autoscaler ({' and '.join(s.autoscaled)})" if s.autoscaled else "traffic classes")
            + f": compare with `servesim run {scenario}` or plan a fixed fleet (--set to remove it)."
        )
        return
    planner = Planner(replications=replications)
    err.print("fleet sampling refused: " + sampling_refusal(s) if sampling_refusal(s) else "fleet sampling on")
    key = "explain"
    with err.status("checking the napkin against the simulator …"):
        at_bare = planner.evaluate(with_workers(s, bare), key)
        at_padded = planner.evaluate(with_workers(s, padded), key)
        best, _, check = planner.min_workers(s, 1, max(2 * padded, 2), key)
        points = {"napkin": (bare, at_bare), "napkin + headroom": (padded, at_padded)}
        if best is not None:
            points["minimum meeting the SLA"] = (best.workers, best)
        shapes = {name: anatomy(with_workers(s, n)) for name, (n, _) in points.items()}

    if llm is not None:
        rows = _llm_verdict(s, points, shapes, replications)
        for line in why_llm(s, llm, best.workers if best else None, rows):
            out.print(f"• {line}")
        _write(json_path, lines, rows, best, check)
        return
    q, target = s.sla.percentile, s.sla.target_ms
    v = RichTable(title=f"simulator: p{q:g} ≤ {target:g} ms? ({replications}+ replications, 95% CI)")
    for col in ("", "workers", f"p{q:g} ms", "SLA", "load of full-batch peak", "mean batch", "queue p99 ms", "$/h"):
        v.add_column(col, justify="left" if col == "" else "right")
    lam, b = peak_rate(s), napkin_batch(s)
    rows = {}
    for name, (n, ev) in points.items():
        r = ev.row()
        a = shapes[name]
        rows[name] = {**r, **a, "utilization_at_napkin_batch": lam / (n * per_worker_rps(s, b))}
        v.add_row(
            name,
            str(n),
            _ci(r),
            "[green]met[/]" if r["met"] else "[red]missed[/]",
            f"{r['load_of_peak']:.0%}",
            f"{a['mean_batch']:.1f}",
            f"{a['queue_p99_ms']:.1f}",
            f"{r['cost_per_hour_usd']:,.2f}",
        )
    out.print(v)
    for line in why(s, bare, padded, best.workers if best else None, rows, check):
        out.print(f"• {line}")
    _write(json_path, lines, rows, best, check)


def _write(json_path: Path | None, lines, rows: dict, best, check: dict) -> None:
    if json_path is None:
        return
    doc = {
        "napkin": [ln.__dict__ for ln in lines],
        "verdict": rows,
        "minimum_workers": best.workers if best else None,
        "monotone": check["monotone"],
    }
    try:
        json_path.write_text(json.dumps(doc, indent=2, default=float) + "\n")
    except OSError as e:
        raise fail(f"cannot write {e.filename}: {e.strerror}") from None


def _llm_verdict(s: Scenario, points: dict, shapes: dict, replications: int) -> dict:
    """The simulator's table for an LLM scenario: TTFT and TPOT at the percentile against
    their targets at the napkin's counts and the minimum; returns its rows."""
    q = s.sla.percentile
    goal = ", ".join(f"{name} p{q:g} ≤ {t:g} ms" for name, t in (("TTFT", s.sla.ttft_ms), ("TPOT", s.sla.tpot_ms)) if t)
    v = RichTable(title=f"simulator: {goal or f'p{q:g} ≤ {s.sla.target_ms:g} ms'}? ({replications}+ replications)")
    for col in ("", "replicas", f"TTFT p{q:g} ms", f"TPOT p{q:g} ms", "SLA", "mean sequences a step", "$/h"):
        v.add_column(col, justify="left" if col == "" else "right")
    rows = {}
    for name, (n, ev) in points.items():
        r, a = ev.row(), shapes[name]
        ttft, tpot = float(ev.rows["ttft_ms"].mean()), float(ev.rows["tpot_ms"].mean())
        rows[name] = {**r, **a, "ttft_ms": ttft, "tpot_ms": tpot}
        v.add_row(
            name,
            str(n),
            f"{ttft:,.1f}",
            f"{tpot:,.1f}",
            "[green]met[/]" if r["met"] else "[red]missed[/]",
            f"{a['mean_batch']:.1f}",
            f"{r['cost_per_hour_usd']:,.2f}",
        )
    out.print(v)
    return rows


def why_llm(s: Scenario, k, minimum: int | None, rows: dict) -> list[str]:
    """Plain sentences: why the LLM napkin and the simulator differ."""
    q = s.sla.percentile
    nap = rows["napkin"]
    split = s.batching.disaggregation is not None
    out = [
        f"the napkin runs {k.batch} sequences a step ({k.step_ms:.1f} ms) with each prompt's prefill "
        f"({k.prefill_ms:.1f} ms) on top: {k.per_replica_rps:.1f} req/s a replica, so {k.bare} replicas; "
        f"the simulated replicas there run {nap['mean_batch']:.1f} sequences a step on average"
        if not split
        else f"the napkin counts prefill and decode replicas apart: {k.bare} in all, the decode ones running "
        f"{k.batch} sequences a step ({k.step_ms:.1f} ms) without a prefill's pause; a fleet of another size keeps "
        f"the scenario's share of prefill replicas ({s.batching.disaggregation.prefill_replicas} of "
        f"{s.workers.count}, rounded)",
    ]
    if minimum is None:
        out.append("no replica count in the range checked meets the targets")
        return out
    m = rows["minimum meeting the SLA"]
    out.append(
        f"the fewest replicas meeting the targets is {minimum} (TTFT p{q:g} {m['ttft_ms']:.0f} ms, "
        f"TPOT p{q:g} {m['tpot_ms']:.1f} ms): "
        + (
            f"{k.bare - minimum} fewer than the napkin, whose batch is wider than the load fills"
            if minimum < k.bare
            else f"{minimum - k.bare} more than the napkin: "
            + (
                "arrivals bunch and the prefill replicas queue the prompts, so the tail of TTFT needs slack the "
                "mean-value napkin does not have"
                if split
                else "a prompt's prefill stalls the decodes sharing its steps, and arrivals bunch, so the tail "
                "of TTFT needs slack the mean-value napkin does not have"
            )
            if minimum > k.bare
            else "the napkin's count"
        )
    )
    out.append(
        "the napkin counts means; the targets are tails: TTFT's p99 waits behind the long prompts of "
        "the requests ahead, and TPOT's p99 belongs to the requests whose decodes shared steps with them"
    )
    return out


def why(s: Scenario, bare: int, padded: int, minimum: int | None, rows: dict, check: dict) -> list[str]:
    """Plain sentences: why the napkin and the simulator differ, from the measured numbers."""
    from simulator.planning.napkin import napkin_batch, peak_rate, per_worker_rps

    q, target = s.sla.percentile, s.sla.target_ms
    b, bmax = napkin_batch(s), s.batching.max_batch_size
    lam = peak_rate(s)
    nap = rows["napkin"]
    out = [
        f"the napkin takes batches of {b}: {per_worker_rps(s, b):,.0f} req/s per worker, so {bare} workers run at "
        f"ρ = {lam:,.0f} / ({bare} × {per_worker_rps(s, b):,.0f}) = {nap['utilization_at_napkin_batch']:.0%}; "
        f"the simulated mean batch there is {nap['mean_batch']:.1f} (max {bmax}, "
        f"{per_worker_rps(s, bmax):,.0f} req/s per worker at full batches)",
    ]
    if minimum is None:
        out.append(
            f"no count up to {2 * padded} meets p{q:g} ≤ {target:g} ms: the stages outside the GPU alone "
            f"take {nap['outside_gpu_p50_ms']:.1f} ms at the median"
        )
        return out
    m = rows["minimum meeting the SLA"]
    out.append(
        f"the fewest workers meeting p{q:g} ≤ {target:g} ms is {minimum} (load {m['load_of_peak']:.0%} of the "
        f"full-batch peak, p{q:g} {m['sla_ms']:.1f} ms): "
        + (
            f"{bare - minimum} fewer than the napkin, because batches grow under load "
            f"(mean {m['mean_batch']:.1f} > {b}) and each batch is cheaper per request"
            if minimum < bare
            else f"{minimum - bare} more than the napkin, because queueing grows like 1/(1 − ρ) near saturation"
            if minimum > bare
            else "the napkin's count"
        )
    )
    out.append(
        f"queueing at {bare} workers: p99 {nap['queue_p99_ms']:.1f} ms in the batch queue (of which the "
        f"batching window holds each request up to {s.batching.max_queue_delay_ms:g} ms); at {minimum}: "
        f"{m['queue_p99_ms']:.1f} ms; the stages outside the GPU take {m['outside_gpu_p50_ms']:.1f} ms at the median"
    )
    pad = rows["napkin + headroom"]
    if padded >= minimum:
        out.append(
            f"the headroom's {padded} workers cost ${pad['cost_per_hour_usd']:,.2f}/h against "
            f"${m['cost_per_hour_usd']:,.2f}/h for {minimum} ({padded - minimum} workers of margin); the "
            "margin buys tolerance of traffic growth and failures that this run does not contain"
        )
    else:
        out.append(
            f"even the headroom's {padded} workers fall {minimum - padded} short: the napkin's per-worker "
            "throughput is more than the fleet delivers under this traffic"
        )
    if m["load_of_peak"] > 0.95:
        out.append("the minimum runs within 5% of saturation: its verdict depends on the run's duration")
    if not check["monotone"]:
        out.append(f"warning: the verdict was not monotone in the worker count ({check['violations'][:3]})")
    return out
