"""The LLM engine's side of ``servesim calibrate``: ``llm`` (profile, fit, knee, held-out
levels), ``judge`` (GuideLLM, a load generator nobody here wrote) and what ``refit`` and
``target`` do with a ``calibrate llm`` folder.

The work is :mod:`calibrate.llm_run`, :mod:`calibrate.judge` and
:mod:`calibrate.llm_target`; here are the options, their refusals (exit 2, before any
server starts) and the lines printed.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Annotated

import typer

from calibrate.cli_shared import need, terminated


def llm_refit(folder: Path, *, replications: int) -> None:
    """``calibrate refit`` of a ``calibrate llm`` folder: every held-out level predicted again
    from its measurements (``measured.json``, ``steps.csv.gz``), the profile and report rewritten."""
    try:
        from calibrate.llm_run import predict_llm
    except ImportError as err:
        raise need("calibrate refit")(err) from None
    if not (folder / "steps.csv.gz").is_file():
        typer.echo(f"error: {folder}: measured.json without steps.csv.gz (calibrate llm writes both)", err=True)
        raise typer.Exit(code=2)
    try:
        got = predict_llm(folder, replications=replications)
    except (OSError, EOFError) as err:  # a steps.csv.gz cut short or not gzip
        typer.echo(f"error: {folder}/steps.csv.gz: {err}", err=True)
        raise typer.Exit(code=2) from None
    except (ValueError, KeyError) as err:
        typer.echo(f"error: {folder}/measured.json: {err}", err=True)
        raise typer.Exit(code=2) from None
    _llm_summary(folder, got)


def _llm_summary(folder: Path, got: dict) -> None:
    """The lines a calibration ends with: what it wrote, the knee, the cells met."""
    table = got["table"]
    typer.echo(f"wrote {folder}/profile.json, validation.md, scenario.yaml")
    typer.echo(f"knee: measured {got['knee']['completed_rps']:.2f} req/s, simulated error {got['knee']['error']:+.1%}")
    typer.echo(f"{int(table['ok'].sum())} of {len(table)} percentiles within their bound or interval")


def is_llm_profile(path: Path) -> bool:
    """Whether ``path`` is a ``calibrate llm`` profile (a knee and a fitted step time)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and "knee" in doc and "c0_ms" in (doc.get("step_time") or {})


def llm_target(folder: Path, *, runs: int, seed: int, json_out: Path | None, rounds: int | None = None) -> None:
    """``calibrate target`` of an LLM profile: how often a correct model, and one without the
    speed process, passes the three-run calibration rule (:mod:`calibrate.llm_target`)."""
    from calibrate.llm_target import target_report

    try:
        prof = json.loads((folder / "profile.json").read_text())
        report = target_report(prof, runs=runs, seed=seed, rounds=rounds)
    except (OSError, ValueError, KeyError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=2) from None
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=2) + "\n")
    rule = report["passable_rule"]
    typer.echo(
        f"{report['runs']} virtual runs of the LLM calibration ({report['rounds']} rounds of slices), "
        f"{report['triples']:,} triples; a pool of "
        f"{report['pool_size']} slices a level and model; minute drift sigma {report['minute_sigma']:g}"
    )
    head = f"{'truth':<14}{'predictor':<14}{'18 of 18':>9}{'>=17':>7}{'24 of 24':>9}{'3 runs 18/18':>13}"
    head += f"{'met in 90%':>11}{'every run >=' + str(rule['every_run_at_least']):>17}"
    head += f"{'3 runs >=' + str(rule['three_runs_total_at_least']):>12}"
    typer.echo(head)
    for p in report["pairs"]:
        typer.echo(
            f"{p['truth']:<14}{p['predictor']:<14}{p['all_judged']:>9.1%}{p['at_least_one_less']:>7.1%}"
            f"{p['all_24']:>9.1%}{p['three_runs_all_judged']:>13.1%}{p['judged_met_in_90pct']:>11d}"
            f"{p['passes_least_rule']:>17.1%}{p['passes_total_rule']:>12.1%}"
        )
    typer.echo(
        f"a correct model meets, in 90% of triples of runs: at least {rule['every_run_at_least']} of 18 in every run, "
        f"and {rule['three_runs_total_at_least']} of {rule['of']} over the three"
    )
    typer.echo(f"{'truth':<14}{'predictor':<14}{'knee within 5%':>15}{'in 3 runs':>10}{'3-run |error| in 90%':>22}")
    for p in report["pairs"]:
        typer.echo(
            f"{p['truth']:<14}{p['predictor']:<14}{p['knee_within_5pct']:>15.1%}"
            f"{p['three_runs_knee_within_5pct']:>10.1%}{p['knee_bound_three_runs_90pct']:>22.1%}"
        )


def llm(
    out: Annotated[
        Path | None,
        typer.Option(
            help="Folder for profile.json, validation.md/.png/.csv, scenario.yaml (default: calibrate/profiles/"
            "cpu-tiny-llm, or gpu-NAME-llm on --device cuda, NAME the GPU's: h100)."
        ),
    ] = None,
    slice_s: Annotated[float, typer.Option(help="Seconds of one slice of a held-out level's open-loop load.")] = 20.0,
    rounds: Annotated[int, typer.Option(help="Rounds of slices, one slice a level each, in a random order.")] = 3,
    knee_s: Annotated[
        float, typer.Option(help="Seconds of one overload slice (one first, then one a round) that measure the knee.")
    ] = 25.0,
    replications: Annotated[int, typer.Option(help="Simulated replications of each level's design.")] = 20,
    age_s: Annotated[
        float,
        typer.Option(
            help="Seconds of overload that age the engine after its profile, before the knee and the levels "
            "(then drained; 0: none): an engine process minutes into its load runs 7-12% slower than a fresh one."
        ),
    ] = 90.0,
    seed: Annotated[int, typer.Option(help="Seed of the profile's order and the load's draws.")] = 0,
    device: Annotated[str, typer.Option(help="The engine's device: cpu, or cuda when a GPU is there.")] = "cpu",
    idle: Annotated[
        str,
        typer.Option(
            help="The engine's idle while measured: spin (it polls its pipe, its core busy at every load) or sleep "
            "(its core halts between bursts, and some hosts then run its steps 18-33% faster under sustained load)."
        ),
    ] = "spin",
    measure_only: Annotated[
        bool,
        typer.Option(
            "--measure-only",
            help="Measure and write measured.json, steps.csv.gz and requests.csv.gz only; predict later, on any "
            "machine, with `servesim calibrate refit OUT` (a lent GPU's minutes go to measuring).",
        ),
    ] = False,
) -> None:
    """Calibrate the LLM model against the tiny real engine (servesim serve-llm): profile
    and fit its step time, measure its knee, validate TTFT and TPOT on held-out levels."""
    if slice_s <= 5 or rounds < 1 or knee_s <= 20 or replications < 2 or not 0 <= age_s <= 3600:
        typer.echo(
            "error: --slice-s must be above 5, --rounds at least 1, --knee-s above 20, --replications at least 2 "
            "and --age-s from 0 to 3600",
            err=True,
        )
        raise typer.Exit(code=2)
    if device not in ("cpu", "cuda"):
        typer.echo(f"error: --device must be cpu or cuda, not {device!r}", err=True)
        raise typer.Exit(code=2)
    if idle not in ("spin", "sleep"):
        typer.echo(f"error: --idle must be spin or sleep, not {idle!r}", err=True)
        raise typer.Exit(code=2)
    try:
        from calibrate.llm_run import calibrate_llm, default_folder, measure_llm
    except ImportError as err:
        raise need("calibrate llm")(err) from None
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            typer.echo("error: --device cuda: no CUDA device is visible (torch.cuda.is_available() is false)", err=True)
            raise typer.Exit(code=2)
    out = out or default_folder(device)
    signal.signal(signal.SIGTERM, terminated)
    design = {"slice_s": slice_s, "rounds": rounds, "knee_s": knee_s, "age_s": age_s, "seed": seed}
    design |= {"device": device, "idle": idle}
    if measure_only:
        got = measure_llm(out, **design)
        typer.echo(f"wrote {out}/measured.json, steps.csv.gz, requests.csv.gz: `servesim calibrate refit {out}`")
        typer.echo(f"knee: measured {got['knee']['completed_rps']:.2f} req/s")
        return
    _llm_summary(out, calibrate_llm(out, replications=replications, **design))


def judge(
    profile: Annotated[Path, typer.Option(help="A calibrate llm folder (its profile.json).")] = Path(
        "calibrate/profiles/cpu-tiny-llm"
    ),
    out: Annotated[Path, typer.Option(help="Folder for judge.md/.csv and GuideLLM's reports.")] = Path(
        "calibrate/profiles/cpu-tiny-llm/judge"
    ),
    shares: Annotated[str, typer.Option(help="Rates as shares of the profile's knee, comma-separated.")] = "0.3,0.6",
    duration_s: Annotated[float, typer.Option(help="Seconds of GuideLLM's load at each rate.")] = 60.0,
    replications: Annotated[int, typer.Option(help="Simulated replications of each run.")] = 20,
    seed: Annotated[int, typer.Option(help="GuideLLM's seed (its prompts, lengths and arrivals).")] = 0,
    age_s: Annotated[
        float | None,
        typer.Option(
            help="Seconds of overload that age the engine before GuideLLM drives it (default: as long as the "
            "profile's calibration aged it; 0: none)."
        ),
    ] = None,
    streams: Annotated[
        str,
        typer.Option(
            help="Then GuideLLM's concurrent profile at these many requests in flight, comma-separated (none: '')."
        ),
    ] = "2,4",
) -> None:
    """Drive the tiny engine with GuideLLM (a load generator nobody here wrote) at two
    rates, then at fixed concurrencies, and compare its TTFT, ITL and TPOT percentiles (and
    a concurrency's rate) with the calibrated scenario's."""
    try:
        got = [float(x) for x in shares.split(",") if x.strip()]
    except ValueError:
        got = []
    if not got or any(not 0 < x < 1 for x in got):
        typer.echo(f"error: --shares must be shares of the knee in (0, 1), comma-separated; got {shares!r}", err=True)
        raise typer.Exit(code=2)
    try:
        flights = [int(x) for x in streams.split(",") if x.strip()]
    except ValueError:
        flights = [0]
    if any(not 1 <= n <= 256 for n in flights):
        typer.echo(f"error: --streams must be whole numbers from 1 to 256, comma-separated; got {streams!r}", err=True)
        raise typer.Exit(code=2)
    if duration_s < 10 or replications < 2 or (age_s is not None and not 0 <= age_s <= 3600):
        typer.echo(
            "error: --duration-s must be at least 10, --replications at least 2 and --age-s from 0 to 3600", err=True
        )
        raise typer.Exit(code=2)
    if not (profile / "profile.json").is_file():
        typer.echo(f"error: --profile {profile}: no profile.json there (servesim calibrate llm writes one)", err=True)
        raise typer.Exit(code=2)
    try:
        measured_on = json.loads((profile / "profile.json").read_text()).get("device", "cpu")
    except ValueError as err:
        typer.echo(f"error: --profile {profile}/profile.json: not JSON ({err})", err=True)
        raise typer.Exit(code=2) from None
    if measured_on == "cuda":
        import torch

        if not torch.cuda.is_available():
            typer.echo(
                f"error: --profile {profile}: measured on CUDA: judge it where a GPU is (torch sees none)",
                err=True,
            )
            raise typer.Exit(code=2)
    try:
        from calibrate.guidellm import JudgeMissing, guidellm_command
        from calibrate.judge import judge as run_judge

        guidellm_command()
    except (ImportError, JudgeMissing) as err:
        typer.echo(f"error: {err}; install it with pip install -e '.[judge]'", err=True)
        raise typer.Exit(code=2) from None
    signal.signal(signal.SIGTERM, terminated)
    table = run_judge(
        profile,
        out,
        shares=tuple(got),
        duration_s=duration_s,
        replications=replications,
        seed=seed,
        age_s=age_s,
        streams=tuple(flights),
    )
    typer.echo(f"wrote {out}/judge.md, judge.csv")
    typer.echo(f"{int(table['ok'].sum())} of {len(table)} percentiles within their bound or interval")


__all__ = ["is_llm_profile", "judge", "llm", "llm_refit", "llm_target"]
