"""``servesim calibrate …``: microbench, load, fit, validate, run, and Triton importers.

Heavy imports (torch, aiohttp, altair) happen inside the commands, so ``servesim run``
stays light.
"""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path
from typing import Annotated

import typer

from calibrate.cli_folder import cycle, refit, replay, target
from calibrate.cli_llm import judge, llm
from calibrate.cli_shared import MET, need, server_url, terminated
from calibrate.cli_watch import watch

app = typer.Typer(help="Measure a real inference server and fit the simulator's models to it.", no_args_is_help=True)

ServerArgs = Annotated[
    str, typer.Option(help="Options for `servesim serve`, quoted, e.g. '--resolution 64 --max-batch-size 8'.")
]


def _levels(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected level numbers like 0,2,4; got {text!r}") from None


@app.command()
def run(
    out: Annotated[Path, typer.Option(help="Folder for profile.json, measurements.csv and the validation report.")],
    server_args: ServerArgs = "--resolution 64 --width 48 --max-batch-size 8 --max-queue-delay-ms 2",
    rounds: Annotated[int, typer.Option(help="Rounds of interleaved slices (one slice per level each).", min=2)] = 10,
    slice_s: Annotated[float, typer.Option(help="Shortest slice, s (lengthened for --min-requests).", min=1)] = 4.0,
    min_requests: Annotated[
        int, typer.Option(help="Requests the lightest level needs after warm-up (its p99's footing).", min=0)
    ] = 2000,
    reps: Annotated[
        int, typer.Option(help="Simulated replications per held-out level (profiles without a speed process).", min=2)
    ] = 5,
    draws: Annotated[
        int, typer.Option(help="Simulated designs per held-out level for the 90% prediction intervals.", min=20)
    ] = 200,
    seed: Annotated[int, typer.Option(help="Seed of the load schedules and payloads.")] = 0,
    pin: Annotated[
        bool,
        typer.Option(
            help="Give each model instance a core of its own (the server's --instance-cores auto); the front end "
            "and this load generator share the rest."
        ),
    ] = True,
) -> None:
    """Start the reference server, find its capacity, measure 7 load levels in interleaved
    slices, fit the profile on 30/60/80% and validate it on 20/50/70/85% (held out), then
    stop the server. Writes profile.json, scenario.yaml and the report under --out."""
    try:
        from calibrate.run import Design, calibrate_run
    except ImportError as err:
        raise need("calibrate run")(err) from None
    design = Design(rounds=rounds, slice_s=slice_s, min_requests=min_requests)
    # SIGTERM ends the run like Ctrl-C: the context managers stop the server, its instances,
    # redis-server and the meters (Python's default for SIGTERM would skip them)
    signal.signal(signal.SIGTERM, terminated)
    try:
        report = calibrate_run(
            server_args.split(), out, design=design, seed=seed, pin=pin, reps=reps, draws=draws, log=typer.echo
        )
    except (ValueError, RuntimeError, TimeoutError, FileNotFoundError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=2) from None
    except KeyboardInterrupt:
        typer.echo("calibrate run: stopped; the server and its children are stopped too", err=True)
        raise typer.Exit(code=130) from None
    judged = [r for r in report["validation"] if r["percentile"] in ("p50", "p99")]
    met = sum(r["verdict"] in MET for r in judged)
    typer.echo((out / "validation.md").read_text())
    worst = max(abs(r["error_pct"]) for r in judged)
    typer.echo(f"held-out p50/p99: {met} of {len(judged)} meet the target; largest |error| {worst:.1f}%  ->  {out}")


@app.command()
def load(
    url: Annotated[str, typer.Option(help="Server base URL, e.g. http://127.0.0.1:8000.")],
    rates: Annotated[str, typer.Option(help="Offered rates, req/s, comma-separated.")],
    out: Annotated[Path, typer.Option(help="CSV of every request (client latency and server stage timings).")],
    model: Annotated[str, typer.Option(help="Model name (resnet).")] = "resnet",
    duration_s: Annotated[float, typer.Option(help="Minimum seconds per level.", min=0.5)] = 10.0,
    min_queries: Annotated[int, typer.Option(help="Minimum requests per level.", min=1)] = 200,
    image_side: Annotated[int, typer.Option(help="Side of the JPEGs sent, pixels.")] = 96,
    connections: Annotated[
        int,
        typer.Option(
            help="Connections this client keeps; beyond, requests wait here. More than the server's queue "
            "to see it shed load.",
            min=1,
        ),
    ] = 256,
    nice: Annotated[
        int,
        typer.Option(
            help="Lower this client's CPU priority (0-19). Seldom needed: the client costs about 90 us of CPU "
            "a request, and niced on a machine it shares with a saturated server it waits out the server's "
            "time slices and sends late (see send_lag_p99_ms).",
            min=0,
            max=19,
        ),
    ] = 0,
    seed: int = 0,
) -> None:
    """Open-loop Poisson load at each rate; latency from the scheduled send time."""
    if nice:
        os.nice(nice)
    try:
        import numpy as np

        from calibrate.loadgen import sweep
        from calibrate.payloads import image_payloads
        from calibrate.stats import level_summary
    except ImportError as err:
        raise need("calibrate load")(err) from None
    try:
        levels = [float(r) for r in rates.split(",")]
    except ValueError:
        raise typer.BadParameter(f"--rates: expected numbers like 20,50,80; got {rates!r}") from None
    if not all(math.isfinite(r) and r > 0 for r in levels):
        raise typer.BadParameter(f"--rates: each rate is above 0 req/s; got {rates!r}")
    url = server_url(url)
    from calibrate.watch import WatchError, connect

    if not out.parent.is_dir():
        typer.echo(f"error: --out {out}: folder {out.parent} does not exist", err=True)
        raise typer.Exit(code=2)
    try:  # a server that is down, not v2, or without the model: refused before any load
        _, config = connect(url, model)
    except WatchError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=2) from None
    payloads = image_payloads(32, image_side, np.random.default_rng(seed))
    out.with_suffix(".config.json").write_text(json.dumps(config))  # for `calibrate fit`
    df = sweep(
        url.rstrip("/"),
        model,
        levels,
        payloads,
        duration_s=duration_s,
        min_queries=min_queries,
        seed=seed,
        connections=connections,
    )
    df.to_csv(out, index=False)
    typer.echo(level_summary(df).to_string(index=False))


@app.command()
def microbench(
    model: Annotated[str, typer.Option(help="resnet or ranker.")] = "resnet",
    resolution: int = 64,
    width: int = 32,
    precisions: Annotated[str, typer.Option(help="Comma-separated: fp32,fp16,bf16,int8.")] = "fp32",
    max_batch_size: int = 8,
    repeats: int = 30,
    out: Annotated[Path | None, typer.Option(help="CSV of the table.")] = None,
) -> None:
    """Forward time per batch size (1 to max) per precision, in-process after warm-up."""
    try:
        import torch

        from calibrate.microbench import microbench as bench
        from reference_server.models import ModelConfig
    except ImportError as err:
        raise need("calibrate microbench")(err) from None
    torch.set_num_threads(1)
    cfg = ModelConfig(kind=model, resolution=resolution, width=width)
    try:
        df = bench(cfg, precisions.split(","), max_batch_size, repeats=repeats)
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=2) from None
    if out:
        df.to_csv(out, index=False)
    typer.echo(df.to_string(index=False, float_format=lambda x: f"{x:.3f}"))


@app.command()
def fit(
    measurements: Annotated[Path, typer.Argument(help="measurements.csv from `calibrate load`.")],
    config: Annotated[
        Path, typer.Option(help="The server's GET /v2/models/{m}/config (load writes it beside the CSV).")
    ],
    fit_levels: Annotated[str, typer.Option(help="Levels to fit on, e.g. 0,2,4; validate on the others.")],
    out: Annotated[Path, typer.Option(help="Where to write profile.json (scenario.yaml goes beside it).")],
    slices: Annotated[
        Path | None, typer.Option(help="slices.csv from `calibrate run`: the front end's CPU, for its station.")
    ] = None,
    seed: int = 0,
) -> None:
    """Fit a versioned calibration profile from measured levels, and write it as a scenario too."""
    try:
        import numpy as np
        import pandas as pd

        from calibrate.profile import build_profile
        from calibrate.scenario import write_scenario
    except ImportError as err:
        raise need("calibrate fit")(err) from None
    try:
        cfg = json.loads(config.read_text())
        cpu = pd.read_csv(slices) if slices is not None else None
        rng = np.random.default_rng(seed)
        profile = build_profile(cfg, pd.read_csv(measurements), _levels(fit_levels), rng=rng, slices=cpu)
    except (OSError, ValueError, KeyError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=2) from None
    out.write_text(json.dumps(profile, indent=2) + "\n")
    write_scenario(profile, out.with_name("scenario.yaml"))
    st = profile["service_time"]
    typer.echo(
        f"{out}: batch service time {st['kind']} (R² {st['r2']:.3f}, robust noise CV {st['noise_cv_robust']:.2f}); "
        f"scenario: {out.with_name('scenario.yaml')}"
    )


# a run folder read again: its fit (refit), its slices replayed, its batches lined up, its target
app.command()(refit)
app.command()(replay)
app.command()(cycle)
app.command()(target)


@app.command()
def validate(
    profile: Annotated[Path, typer.Argument(help="profile.json from `calibrate run` or `fit`.")],
    measurements: Annotated[Path, typer.Argument(help="measurements.csv from `calibrate load` or `run`.")],
    levels: Annotated[str, typer.Option(help="Levels to validate on, e.g. 0,2,4 (default: all).")] = "",
) -> None:
    """Simulate the measured levels with the profile: predicted against measured per percentile."""
    import numpy as np
    import pandas as pd

    from calibrate.stats import level_summary
    from calibrate.validate import compare

    prof = json.loads(profile.read_text())
    requests = pd.read_csv(measurements)
    summary = level_summary(requests)
    if levels:
        summary = summary[summary["level"].isin(_levels(levels))]
    table = compare(prof, requests, summary, rng=np.random.default_rng(0))
    cols = ["level", "offered_rps", "requests", "percentile", "measured_ms", "measured_lo", "measured_hi"]
    cols += ["predicted_ms", "error_pct", "verdict"]
    typer.echo(table[cols].to_string(index=False, float_format=lambda x: f"{x:.2f}"))


# the LLM engine's calibration and judge: their commands in their own module, in this order
app.command()(llm)
app.command()(judge)


@app.command(name="import-triton-stats")
def import_triton_stats(
    stats: Annotated[Path, typer.Argument(help="JSON from GET /v2/models/{model}/stats (Triton or servesim serve).")],
    model: Annotated[str | None, typer.Option(help="Model name, when the file holds several.")] = None,
) -> None:
    """The affine batch service time fitted to a Triton server's batch statistics."""
    from calibrate.importers import affine_from_triton, load_stats, triton_batch_times

    try:
        data = load_stats(stats)
        typer.echo(triton_batch_times(data, model).to_string(index=False))
        typer.echo(json.dumps(affine_from_triton(data, model)))
    except (ValueError, KeyError, OSError) as err:
        typer.echo(f"error: {stats}: {err}", err=True)
        raise typer.Exit(code=2) from None


@app.command(name="import-perf-analyzer")
def import_perf_analyzer(
    csv: Annotated[Path, typer.Argument(help="perf_analyzer -f output.")],
) -> None:
    """Measured levels (throughput, p50/p95/p99) from perf_analyzer's CSV."""
    from calibrate.importers import perf_analyzer_levels

    try:
        typer.echo(perf_analyzer_levels(csv).to_string(index=False))
    except (ValueError, OSError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=2) from None


# the live twin: its command in its own module, registered here in this order
app.command()(watch)
