"""``servesim plan``: the cheapest configuration that meets the SLA, and ``--max-rate``."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table as RichTable

from servesim.console import budget, check_output, err, fail, out

if TYPE_CHECKING:
    import pandas as pd

    from simulator.planning.plan import Planner
    from simulator.scenario.config import Scenario


def parse_sla(text: str) -> list[str]:
    """``p99<=150ms`` → overrides of sla.percentile and sla.target_ms."""
    from simulator.scenario.loader import ScenarioError

    m = re.fullmatch(r"\s*p(\d+(?:\.\d+)?)\s*<=\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*", text)
    if not m:
        raise ScenarioError(f"--sla {text!r}: expected like p99<=150ms")
    q, target = float(m[1]), float(m[2]) * (1000.0 if m[3] == "s" else 1.0)
    if not 0 < q < 100 or target <= 0:
        raise ScenarioError(f"--sla {text!r}: the percentile lies in (0, 100) and the target is > 0")
    return [f"sla.percentile={q:g}", f"sla.target_ms={target:g}"]


def _ms(x: float) -> str:
    return "—" if not math.isfinite(x) else f"{x:,.1f}"


def _ci(r: dict) -> str:
    if not math.isfinite(r["sla_ci_lo"]):
        return _ms(r["sla_ms"])
    return f"{_ms(r['sla_ms'])} [{_ms(r['sla_ci_lo'])}, {_ms(r['sla_ci_hi'])}]"


def _sampling_note(s: Scenario, planner: Planner) -> str:
    from simulator.planning.sampling import sampling_refusal

    if planner.sample == "off":
        return "fleet sampling off: every worker simulated"
    why = sampling_refusal(s)
    if why:
        return f"fleet sampling refused ({why}): every worker simulated"
    return (
        "fleet sampling on: k of N workers with k/N of the traffic (exact in law under random routing; "
        "see `simulator/planning/sampling.py`)"
    )


def chosen_yaml(path: Path, sets: list[str], combo: dict, s: Scenario, workers: int) -> str:
    """The chosen configuration as a ready-to-run scenario (validated before it is written)."""
    import yaml

    from simulator.planning.plan import label
    from simulator.scenario.loader import apply_overrides, load_scenario, parse_set

    data = yaml.safe_load(path.read_text())
    overrides = [parse_set(o) for o in sets] + [
        (tuple(k.split(".")), v) for k, v in combo.items() if k != "workers.instance_type"
    ]
    data = apply_overrides(data, overrides)
    data["workers"]["count"] = workers
    if "workers.instance_type" in combo:
        data["workers"]["instance_type"] = s.workers.instance_type
        if s.workers.service_time is not None:  # rescaled to the type (an LLM's roofline follows it)
            data["workers"]["service_time"] = s.workers.service_time.model_dump(mode="json")
    data["name"] = f"{data.get('name', path.stem)}_planned"
    head = (
        f"# Chosen by `servesim plan {path.name}`: the cheapest configuration meeting "
        f"p{s.sla.percentile:g} <= {s.sla.target_ms:g} ms\n# ({label(combo)}, {workers} workers).\n"
    )
    text = head + yaml.safe_dump(data, sort_keys=False)
    load_scenario(path, text=text)  # what is written runs
    return text


def plan(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML file.", show_default=False)],
    sla: Annotated[str | None, typer.Option(help="Objective, e.g. p99<=150ms (default: the scenario's sla).")] = None,
    vary: Annotated[
        list[str] | None,
        typer.Option(
            help="A knob to vary: path=v1,v2,... or workers.count=lo..hi (the bisected range; default "
            "1..4× the scenario's count). workers.instance_type=t4,l4,a100,h100 rescales the batch time "
            "by the catalog's relative throughput. Repeatable."
        ),
    ] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a field first: path=value.")] = None,
    replications: Annotated[int, typer.Option(help="Replications per point (more when undecided).", min=2)] = 3,
    max_replications: Annotated[int, typer.Option(help="Cap for undecided points.", min=2)] = 10,
    sample: Annotated[
        str, typer.Option(help="Fleet sampling: auto (~100k requests per run), off, or a worker count.")
    ] = "auto",
    max_rate: Annotated[
        bool, typer.Option("--max-rate", help="For each fixed fleet, bisect the highest rate meeting the SLA.")
    ] = False,
    out_path: Annotated[
        Path | None, typer.Option("--out", help="Write the chosen scenario here (default: NAME_planned.yaml).")
    ] = None,
    table: Annotated[Path | None, typer.Option(help="Write every evaluated point here (.csv or .parquet).")] = None,
) -> None:
    """The cheapest configuration that meets the SLA.

    Bisects the worker count for each combination of the varied knobs, deciding "meets" from
    a confidence interval over replications; prints the ranked table and the cost/latency
    Pareto frontier, and writes the chosen configuration as a scenario."""
    import pandas as pd

    from simulator.chunks import prefer_streaming
    from simulator.planning.plan import Planner

    if sample not in ("auto", "off") and not sample.isdigit():
        raise fail(f"--sample {sample!r}: auto, off, or a number of workers")
    check_output(table, "--table", (".csv", ".parquet"))
    check_output(out_path, "--out")
    if max_rate and out_path is not None:
        raise fail(
            "--out writes the cheapest fleet meeting the SLA; --max-rate keeps each fleet and finds its highest "
            "rate instead, so there is no one scenario to write: use --table for every point"
        )
    sets, base, configs, (lo, hi) = _configs(scenario, set_ or [], sla, vary or [], max_rate)
    planner = Planner(replications, max(max_replications, replications), int(sample) if sample.isdigit() else sample)
    if planner.sample == "off":  # every worker simulated: the largest fleet bisected must fit
        for _, s in configs:
            point = s.model_copy(update={"workers": s.workers.model_copy(update={"count": hi})})
            budget(point, what="a plan point", streamed=prefer_streaming(point))
    err.print(f"{_sampling_note(base, planner)}")
    t0 = time.perf_counter()
    rows, best_rows, checks = _evaluate(planner, configs, lo, hi, max_rate)
    wall = time.perf_counter() - t0
    points = pd.DataFrame(rows)
    _print_ranked(best_rows, base, max_rate)
    if not max_rate:
        _print_frontier(points)
        _print_checks(checks)
    out.print(
        f"{planner.evaluated} points, {planner.requests:,} requests simulated in {wall:.1f} s "
        f"({planner.requests / max(wall, 1e-9):,.0f} req/s)"
    )
    feasible = [r for r in best_rows if r.get("met")]
    try:
        if table is not None:
            frame = points.drop(columns=[c for c in points.columns if c == "s"])
            frame.to_parquet(table) if table.suffix == ".parquet" else frame.to_csv(table, index=False)
            err.print(f"{len(frame)} evaluated points written to {table}")
        if not max_rate and feasible:
            pick = min(feasible, key=lambda r: (r["cost_per_hour_usd"], r["sla_ms"]))
            target = out_path or Path(f"{base.name}_planned.yaml")
            target.write_text(chosen_yaml(scenario, sets, pick["combo"], pick["s"], pick["workers"]))
            out.print(
                f"[bold]chosen:[/] {pick['config']}, {pick['workers']} workers · "
                f"${pick['cost_per_hour_usd']:,.2f}/h → {target}"
            )
    except OSError as e:
        raise fail(f"cannot write {e.filename}: {e.strerror}") from None
    if not max_rate and not feasible:
        raise fail(f"no configuration meets the SLA with workers.count in {lo}..{hi}")


def _configs(
    scenario: Path, set_: list[str], sla: str | None, vary: list[str], max_rate: bool
) -> tuple[list[str], Scenario, list[tuple[dict, Scenario]], tuple[int, int]]:
    """The overrides (--set, then --sla), the base scenario, one scenario per combination of
    the varied knobs, and the worker counts to bisect; a scenario, --sla or --vary that plan
    cannot take exits 2."""
    from simulator.planning.plan import Vary, combos, on_instance_type
    from simulator.scenario.loader import ScenarioError, load_scenario

    try:
        sets = set_ + (parse_sla(sla) if sla else [])
        base = load_scenario(scenario, sets)
        if base.autoscaled or base.traffic.classes:
            raise ScenarioError(
                "plan bisects workers.count of one fixed fleet; this scenario has "
                + (" and ".join(base.autoscaled) or "traffic.classes")
                + " (remove it with --set, e.g. "
                + (" ".join(f"--set {a}=null" for a in base.autoscaled) or "--set workers.autoscaler=null")
                + ")"
            )
        if max_rate and base.traffic.rate_rps is None:
            raise ScenarioError(
                "--max-rate varies traffic.rate_rps; this scenario has none (its rate comes from "
                + ("its users" if base.traffic.users is not None else "its shape or arrivals file")
                + ")"
            )
        varies = [Vary.parse(v) for v in vary]
        ranges = [v for v in varies if v.lo is not None]
        if any(v.path != "workers.count" for v in ranges):
            raise ScenarioError("a lo..hi range is for workers.count only; list other values with commas")
        if max_rate and ranges:
            raise ScenarioError("--max-rate keeps the fleet fixed: list worker counts as values, not a range")
        lo, hi = (ranges[0].lo, ranges[0].hi) if ranges else (1, 4 * base.workers.count)
        configs = []
        for combo in combos(varies):
            plain = [f"{k}={v}" for k, v in combo.items() if k != "workers.instance_type"]
            s = load_scenario(scenario, sets + plain)
            if "workers.instance_type" in combo:
                s = on_instance_type(s, str(combo["workers.instance_type"]))
            configs.append((combo, s))
    except ScenarioError as e:
        raise fail(str(e)) from None
    return sets, base, configs, (lo, hi)


def _evaluate(
    planner: Planner, configs: list[tuple[dict, Scenario]], lo: int, hi: int, max_rate: bool
) -> tuple[list[dict], list[dict], dict]:
    """Every configuration's search (fewest workers, or with --max-rate the highest rate):
    every point evaluated, the best per configuration, and the monotonicity checks."""
    from simulator.planning.plan import label

    rows, best_rows, checks = [], [], {}
    with err.status("planning …") as status:
        for i, (combo, s) in enumerate(configs):
            status.update(f"planning {label(combo)} ({i + 1}/{len(configs)}) …")
            key = label(combo)
            if max_rate:
                best, evals = planner.max_rate(s, key)
            else:
                best, evals, checks[key] = planner.min_workers(s, lo, hi, key)
            for ev in evals:
                rows.append({"config": key, **combo, **ev.row(), "chosen": ev is best})
            best_rows.append(
                {"config": key, **(best.row() if best else {"workers": None, "met": False}), "combo": combo, "s": s}
            )
    return rows, best_rows, checks


def _print_checks(checks: dict) -> None:
    """Whether the verdict was monotone in the worker count, per configuration."""
    for key, check in checks.items():
        if not check["monotone"]:
            err.print(
                f"[yellow]warning:[/] {key}: the verdict is not monotone in the worker count "
                f"(met at fewer but missed at more: {check['violations'][:3]}); the bisection's answer is suspect"
            )
        elif check["within_noise"]:
            n_noise = len(check["within_noise"])
            err.print(
                f"note: {key}: {n_noise} pair(s) of counts got opposite verdicts with no significant "
                f"difference between them (e.g. {check['within_noise'][0]}): the SLA percentile sits at the "
                "target over that range, so the minimum is uncertain by a few workers"
            )
    verified = sum(c["monotone"] for c in checks.values())
    out.print(f"monotone in the worker count: verified for {verified} of {len(checks)} configurations")


def _print_ranked(best_rows: list[dict], s: Scenario, max_rate: bool) -> None:
    what = "highest rate meeting" if max_rate else "fewest workers meeting"
    p = f"p{s.sla.percentile:g}"
    tokens = [
        (col, name, t) for col, name, t in (("ttft_ms", "TTFT", s.sla.ttft_ms), ("tpot_ms", "TPOT", s.sla.tpot_ms)) if t
    ]
    goal = f"{p} ≤ {s.sla.target_ms:g} ms" + "".join(f", {name} {p} ≤ {t:g} ms" for _, name, t in tokens)
    t = RichTable(title=f"{what} {goal}, cheapest first")
    llm = s.traffic.tokens is not None  # an LLM replica has no full-batch peak to read a load from
    cols = ["config", "workers"]
    cols += ["rate req/s"] if max_rate else ([] if llm else ["load of peak"])
    cols += [f"{p} ms [95% CI]", *(f"{name} {p} ms" for _, name, _ in tokens), "reps", "$/h", "$/M req"]
    for col in cols:
        t.add_column(col, justify="left" if col == "config" else "right")
    order = sorted(best_rows, key=lambda r: (not r.get("met"), r.get("cost_per_hour_usd", math.inf)))
    for r in order:
        if not r.get("met"):
            after = len(tokens) + 3
            t.add_row(r["config"], *(["—"] * (len(cols) - 2 - after)), "not met in range", *(["—"] * after))
            continue
        load = [f"{r['rate_rps']:,.0f}"] if max_rate else ([] if llm else [f"{r['load_of_peak']:.0%}"])
        t.add_row(
            r["config"],
            str(r["workers"]),
            *load,
            _ci(r),
            *(_ms(r[col]) for col, _, _ in tokens),
            str(r["replications"]),
            f"{r['cost_per_hour_usd']:,.2f}",
            f"{r['cost_per_million_usd']:.4f}",
        )
    out.print(t)
    near = [r for r in best_rows if r.get("met") and r.get("load_of_peak", 0) > 0.95]
    if near and not max_rate:
        out.print(
            "note: some answers run above 95% of peak capacity; so close to saturation the queue has not "
            "settled within the run, and a longer duration_s may need more workers"
        )


def _print_frontier(points: pd.DataFrame) -> None:
    from simulator.planning.plan import pareto

    met = points[points["met"]]
    if met.empty:
        return
    front = pareto(met)
    t = RichTable(title="Pareto frontier: cost against SLA percentile (points meeting the SLA)")
    for col in ("config", "workers", "SLA ms", "$/h"):
        t.add_column(col, justify="left" if col == "config" else "right")
    for _, r in front.iterrows():
        t.add_row(r["config"], str(int(r["workers"])), _ms(r["sla_ms"]), f"{r['cost_per_hour_usd']:,.2f}")
    out.print(t)
