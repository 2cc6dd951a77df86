"""The ``servesim`` command line: run, check and describe scenarios; plan, sweep and explain
(:mod:`servesim.plan`, :mod:`servesim.sweep`, :mod:`servesim.explain`); serve, calibrate and
the dashboard from their own packages.

Bad input never produces a traceback: scenario problems print one message naming the
YAML line and field and exit with status 2.
"""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from calibrate.cli import app as calibrate_app
from reference_server.llm.serve import serve_llm
from reference_server.serve import serve
from servesim.console import budget, check_output, err, fail, keep_freed_memory, out
from servesim.explain import explain
from servesim.plan import plan
from servesim.practice import practice
from servesim.sweep import cluster_app, sweep

if TYPE_CHECKING:
    import pandas as pd

    from simulator.scenario.config import Scenario

# The simulator, pandas and the rest load inside the commands that use them, so that
# ``servesim --help`` and ``servesim check`` answer in a fraction of a second.


app = typer.Typer(
    name="servesim",
    help="Discrete-event capacity and SLA simulator for ML inference serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("servesim")
        except PackageNotFoundError:  # run from a checkout without installing
            v = "0.1.0 (not installed)"
        typer.echo(f"servesim {v}")
        raise typer.Exit()


@app.callback()
def _main(
    _show_version: Annotated[
        bool | None,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = None,
) -> None:
    """Discrete-event capacity and SLA simulator for ML inference serving."""


ScenarioArg = Annotated[Path, typer.Argument(help="Scenario YAML file.", show_default=False)]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a field: dotted.path=value (repeatable), e.g. --set workers.count=120."),
]


def _load(path: Path, sets: list[str] | None, extra: list[str], *, warn: bool = True) -> Scenario:
    from simulator.planning.budget import warnings as budget_warnings
    from simulator.scenario.loader import ScenarioError, load_scenario

    try:
        s = load_scenario(path, (sets or []) + extra)
    except ScenarioError as e:
        raise fail(str(e)) from None
    if warn:
        for w in budget_warnings(s):
            err.print(f"[yellow]warning:[/] {w}", highlight=False, soft_wrap=True)
    return s


def _clean(obj):
    """JSON-safe: NaN/inf become null."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


@app.command()
def run(
    scenario: ScenarioArg,
    set_: SetOpt = None,
    seed: Annotated[int | None, typer.Option(help="Override the scenario's seed.")] = None,
    duration_s: Annotated[float | None, typer.Option(help="Override duration_s (simulated seconds).")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the summary as JSON here.")] = None,
    records: Annotated[Path | None, typer.Option(help="Write per-request records here (.parquet or .csv).")] = None,
    timeline: Annotated[
        Path | None, typer.Option(help="Write the per-interval timeline here (.parquet or .csv).")
    ] = None,
    interval_s: Annotated[float, typer.Option(help="Timeline interval, s.", min=0.001)] = 1.0,
    sample_workers: Annotated[
        int | None,
        typer.Option(
            help="Fleet sampling: simulate this many of the workers with their share of the traffic "
            "(exact in law under random routing; refused where it is not).",
            min=1,
        ),
    ] = None,
    chunk_s: Annotated[
        str,
        typer.Option(
            "--chunk-s",
            help="How the run is cut (one engine, the same records): whole = one chunk, every request held "
            "(exact percentiles); SECONDS = chunks of that many simulated seconds in bounded memory "
            "(percentiles within 0.5%); auto = whole up to 5M requests, chunks of about 250,000 requests beyond.",
            metavar="auto|whole|SECONDS",
        ),
    ] = "auto",
    engine: Annotated[str | None, typer.Option(hidden=True)] = None,
) -> None:
    """Simulate a scenario and print per-stage latency, the SLA verdict, utilization and cost."""
    from servesim.report import render
    from servesim.streamed import records_frame, run_streamed
    from simulator.planning.runner import prepare
    from simulator.planning.runner import run as simulate_run

    if engine is not None:
        raise fail(
            "--engine is gone (there is one engine): --chunk-s whole holds the run, --chunk-s SECONDS streams it"
        )
    keep_freed_memory()
    chunks = _chunks(chunk_s)
    extra = []
    if seed is not None:
        extra.append(f"seed={seed}")
    if duration_s is not None:
        extra.append(f"duration_s={duration_s}")
    check_output(records, "--records", (".parquet", ".csv"))
    check_output(timeline, "--timeline", (".parquet", ".csv"))
    check_output(json_path, "--json")
    s = _load(
        scenario,
        set_,
        extra if duration_s is None else [e for e in extra if not e.startswith("duration_s")],
        warn=False,
    )
    if duration_s is not None and 0 < duration_s <= s.warmup_s:  # (a duration below 0: its own error)
        extra.append(f"warmup_s={duration_s * 0.1:g}")
        err.print(
            f"note: warmup_s {s.warmup_s:g} is not shorter than --duration-s {duration_s:g}; "
            f"using warmup_s {duration_s * 0.1:g}"
        )
    s = _load(scenario, set_, extra)
    n = s.workers.count
    sample = sample_workers if sample_workers is not None and sample_workers < n else None
    try:
        prepared = prepare(s, sample=sample, chunk_s=chunks)
    except ValueError as e:
        raise fail(str(e)) from None
    sim = prepared.simulated
    if sample is not None:
        err.print(
            f"fleet sampling: {sample} of {n} workers with {sample}/{n} of the traffic; "
            "latency and utilization stand for the whole fleet, throughput and cost are scaled to it"
            + (" (the prediction log is not simulated)" if s.logging is not None else "")
            + (
                f"; its HPA decides from the sample's own metric, {a.min_replicas}..{a.max_replicas} replicas "
                "(close to the full fleet, not exact: see README, fleet sampling)"
                if (a := sim.workers.autoscaler) is not None
                else ""
            )
        )
    streamed = prepared.streamed
    b = budget(sim, streamed=streamed, records=records is not None, interval_s=interval_s)
    if streamed:
        summary = run_streamed(
            s, sample=sample, interval_s=interval_s, records=records, show_progress=b.wall_s > 5, chunk_s=chunks
        )
        records = None  # written chunk by chunk
    else:
        with err.status(f"simulating {s.name} …"):
            try:
                result = simulate_run(s, sample=sample, chunk_s="whole", interval_s=interval_s)
            except ValueError as e:
                raise fail(str(e)) from None
        summary = result.summary
    out.print(render(summary))
    try:
        if json_path is not None:
            json_path.write_text(json.dumps(_clean(summary), indent=2) + "\n")
            err.print(f"summary written to {json_path}")
        if records is not None:
            _write_table(records_frame(result.records, sim), records, "records")
        if timeline is not None:
            import pandas as pd

            _write_table(pd.DataFrame(summary["timeline"]), timeline, "timeline rows", index=False)
    except OSError as e:
        raise fail(f"cannot write {e.filename}: {e.strerror}") from None


def _write_table(frame: pd.DataFrame, path: Path, what: str, *, index: bool = True) -> None:
    if path.suffix == ".parquet":
        frame.to_parquet(path, index=index)
    else:
        frame.to_csv(path, index=index)
    err.print(f"{len(frame):,} {what} written to {path}")


def _chunks(value: str) -> str | float:
    """``--chunk-s``: auto, whole, or a number of simulated seconds over zero."""
    if value in ("auto", "whole"):
        return value
    try:
        x = float(value)
    except ValueError:
        x = float("nan")
    if not (x > 0 and math.isfinite(x)):
        raise fail(f"--chunk-s: expected auto, whole or a number of simulated seconds over 0, not {value!r}")
    return x


@app.command()
def check(scenario: ScenarioArg, set_: SetOpt = None) -> None:
    """Validate a scenario without running it."""
    from simulator.chunks import prefer_streaming

    s = _load(scenario, set_, [])
    b = budget(s, quiet=True, streamed=prefer_streaming(s))
    out.print(
        f"[green]ok[/]: {scenario} ({s.name}; {s.duration_s:g} s of traffic, {s.workers.count} workers; "
        f"a run: {b.describe()})"
    )


@app.command()
def schema() -> None:
    """Print the scenario JSON Schema (point your editor's YAML plugin at it)."""
    from simulator.scenario.config import Scenario

    typer.echo(json.dumps(Scenario.model_json_schema(), indent=2))


app.command(name="explain")(explain)
app.command(name="practice")(practice)
app.command(name="plan")(plan)
app.command(name="sweep")(sweep)
app.add_typer(cluster_app, name="cluster")
app.command(name="serve")(serve)
app.command(name="serve-llm")(serve_llm)


@app.command()
def dashboard(
    port: Annotated[
        int | None, typer.Option(help="Port (default: STREAMLIT_SERVER_PORT, else 8501).", show_default=False)
    ] = None,
    headless: Annotated[
        bool | None,
        typer.Option(
            "--headless/--browser",
            help="Do not open a browser window (default: STREAMLIT_SERVER_HEADLESS, else open one).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Open the Streamlit dashboard (results, compare, load curve, timeline, plan, ...).

    Pick and edit scenarios, see where latency lives, compare variants, the load curve, the
    timeline, plans, calibration and practice. Streamlit's own settings from the
    environment (STREAMLIT_SERVER_PORT, STREAMLIT_SERVER_HEADLESS,
    STREAMLIT_SERVER_ADDRESS, ...) hold unless an option here says otherwise; the address
    is 127.0.0.1 unless STREAMLIT_SERVER_ADDRESS names another."""
    import importlib.util
    import os
    import sys

    if importlib.util.find_spec("streamlit") is None:
        raise fail("the dashboard needs streamlit: pip install -e '.[dashboard]'")
    spec = importlib.util.find_spec("dashboards.app")
    if spec is None or spec.origin is None:
        raise fail("the dashboard is not installed with this servesim (dashboards/app.py)")
    cmd = [sys.executable, "-m", "streamlit", "run", str(spec.origin), "--browser.gatherUsageStats", "false"]
    cmd += dashboard_flags(os.environ, port, headless)
    # become Streamlit (no child left behind): SIGTERM and Ctrl-C reach the server itself
    os.execv(sys.executable, cmd)


def dashboard_flags(env, port: int | None, headless: bool | None) -> list[str]:
    """Streamlit flags for what the command line says, leaving what the environment says
    (``STREAMLIT_SERVER_*``) to Streamlit."""
    flags = []
    if port is not None or "STREAMLIT_SERVER_PORT" not in env:
        flags += ["--server.port", str(8501 if port is None else port)]
    if headless is not None:
        flags += ["--server.headless", str(headless).lower()]
    if "STREAMLIT_SERVER_ADDRESS" not in env:
        flags += ["--server.address", "127.0.0.1"]
    return flags


app.add_typer(calibrate_app, name="calibrate")


def _one_line_summaries(group: typer.Typer) -> None:
    """Each command's line in a command list is its docstring's first paragraph on one line
    (typer's rich mode keeps the docstring's line breaks there, mid-sentence)."""
    for cmd in group.registered_commands:
        doc = cmd.help or (cmd.callback.__doc__ if cmd.callback else None)
        if cmd.short_help is None and doc:
            cmd.short_help = " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _one_line_summaries(sub.typer_instance)


_one_line_summaries(app)


def main() -> None:  # pragma: no cover - console-script entry
    app()
