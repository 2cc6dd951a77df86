"""``servesim calibrate refit | replay | cycle | target``: a calibration's folder read again.
Its fit and report redone from its own measurements, its held-out slices replayed at the
speeds the server's timings give, its requests lined up against its batches, and how often
a correct model would pass its target. An LLM folder (``calibrate llm``'s) goes to its own
refit and target (:mod:`calibrate.cli_llm`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from calibrate.cli_llm import is_llm_profile, llm_refit, llm_target
from calibrate.cli_shared import MET, need, unreadable


def refit(
    folder: Annotated[
        Path,
        typer.Argument(
            help="A `calibrate run` folder (profile.json, measurements.csv.gz, slices.csv) or a `calibrate llm` "
            "one (measured.json, steps.csv.gz)."
        ),
    ],
    draws: Annotated[
        int | None,
        typer.Option(help="Simulated designs a held-out level (default 200; an LLM folder: 20).", min=20),
    ] = None,
    seed: int = 0,
) -> None:
    """Fit again from a run's own measurements and rewrite profile.json, scenario.yaml and
    the validation report. A `calibrate run` folder: the platform-speed process from its
    fitted levels. A `calibrate llm` folder (one measured with --measure-only on a lent GPU,
    say): the step time, the knee and every held-out level's prediction."""
    if (folder / "measured.json").is_file():
        llm_refit(folder, replications=draws or 20)
        return
    try:
        import numpy as np

        from calibrate.refit import refit_run
    except ImportError as err:
        raise need("calibrate refit")(err) from None
    try:
        report = refit_run(folder, draws=draws or 200, rng=np.random.default_rng(seed))
    except (OSError, ValueError, KeyError) as err:
        raise unreadable(folder, err) from None
    typer.echo((folder / "validation.md").read_text())
    judged = [r for r in report["validation"] if r["percentile"] in ("p50", "p99")]
    met = sum(r["verdict"] in MET for r in judged)
    typer.echo(f"held-out p50/p99: {met} of {len(judged)} meet the target  ->  {folder}")


def replay(
    folder: Annotated[
        Path, typer.Argument(help="A `calibrate run` folder: profile.json, measurements.csv.gz, slices.csv.")
    ],
    modes: Annotated[
        str, typer.Option(help="Comma-separated: fitted, frontend, both, windowed.")
    ] = "fitted,frontend,both,windowed",
    seeds: Annotated[int, typer.Option(help="Simulations per slice and mode.", min=1)] = 3,
) -> None:
    """Replay every held-out slice with its exact arrivals at speeds read from the server's
    own timings in it: which mechanism the measured tail needs (calibrate/README)."""
    try:
        import pandas as pd

        from calibrate.replay import MODES
        from calibrate.replay import replay as replay_slices
    except ImportError as err:
        raise need("calibrate replay")(err) from None
    chosen = tuple(m.strip() for m in modes.split(",") if m.strip())
    if not chosen or set(chosen) - set(MODES):
        typer.echo(f"error: --modes takes {', '.join(MODES)}", err=True)
        raise typer.Exit(code=2)
    try:
        prof = json.loads((folder / "profile.json").read_text())
        requests = pd.read_csv(folder / "measurements.csv.gz")
        slices = pd.read_csv(folder / "slices.csv")
        per_slice, levels = replay_slices(prof, requests, slices, modes=chosen, seeds=seeds)
    except (OSError, ValueError, KeyError) as err:
        raise unreadable(folder, err) from None
    rho = per_slice.groupby(["level", "mode"]).apply(
        lambda g: g["replayed_p99"].corr(g["measured_p99"], method="spearman"), include_groups=False
    )
    med = per_slice.groupby(["level", "mode"])["error_p99_pct"].median()
    table = levels.set_index(["level", "mode"]).assign(spearman_p99=rho, median_slice_error_p99_pct=med)
    cols = ["measured_p50", "replayed_p50", "error_p50_pct", "measured_p99", "replayed_p99", "error_p99_pct"]
    typer.echo(
        table[[*cols, "spearman_p99", "median_slice_error_p99_pct"]].to_string(float_format=lambda x: f"{x:.2f}")
    )


def cycle(
    folder: Annotated[Path, typer.Argument(help="A `calibrate run` folder: profile.json, measurements.csv.gz.")],
) -> None:
    """Line every request up against the batches of its slice, by the server's own clocks:
    the batcher's rule, where in a batch requests reach the queue, their waits by what they
    found, and the model's batcher fed the measured queue arrivals (calibrate/README)."""
    try:
        import pandas as pd

        from calibrate.cycle import PHASE_BINS
        from calibrate.cycle import cycle as batch_cycle
    except ImportError as err:
        raise need("calibrate cycle")(err) from None
    try:
        prof = json.loads((folder / "profile.json").read_text())
        table = batch_cycle(pd.read_csv(folder / "measurements.csv.gz"), prof)
    except (OSError, ValueError, KeyError) as err:
        raise unreadable(folder, err) from None
    capacity = prof.get("capacity_rps")
    typer.echo(
        f"queue arrivals in the batch's first and last tenth, over a uniform {1 / PHASE_BINS:.0%}; "
        "queue wait measured and replayed (the model's batcher, the measured arrivals and batch times)"
    )
    cats = [c[len("wait ms: ") :] for c in table.columns if c.startswith("wait ms: ")]
    for _, r in table.iterrows():
        name = f"{r.offered_rps / capacity:.0%}" if capacity else f"{r.offered_rps:.0f} req/s"
        typer.echo(
            f"{name:>10}: {int(r.batches)} batches, {r.early_share:.1%} before the rule, window-bound ones "
            f"{r.window_late_median_ms:+.3f} ms late (median); phase first {r.phase_first_tenth:.2f}, "
            f"last {r.phase_last_tenth:.2f}; wait mean {r.measured_wait_mean_ms:.2f} measured, "
            f"{r.replayed_wait_mean_ms:.2f} replayed ({r.replayed_wait_mean_ms - r.measured_wait_mean_ms:+.2f} ms)"
        )
        typer.echo(
            "            " + "; ".join(f"{c} {r['share: ' + c]:.0%} waiting {r['wait ms: ' + c]:.2f} ms" for c in cats)
        )


def target(
    folder: Annotated[Path, typer.Argument(help="A calibrated folder whose profile.json has a speed process.")],
    runs: Annotated[int, typer.Option(help="Virtual calibration runs of the profile's model.", min=6)] = 100,
    designs: Annotated[int, typer.Option(help="Simulated designs per cell for the predictors.", min=20)] = 200,
    seed: int = 0,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the whole result here.")] = None,
    rounds: Annotated[
        int | None,
        typer.Option(help="LLM profiles: judge this many rounds of slices (default: the profile's).", min=1),
    ] = None,
) -> None:
    """How often a correct model, and one without the speed process, passes the three-run
    calibration target, the truth being the profile's own model (calibrate/README); of an
    LLM profile (`calibrate llm`'s), its 18 cells at 30-70% of the knee."""
    if (folder / "profile.json").is_file() and is_llm_profile(folder / "profile.json"):
        llm_target(folder, runs=runs, seed=seed, json_out=json_out, rounds=rounds)
        return
    if rounds is not None:
        typer.echo("error: --rounds applies to an LLM profile (calibrate llm's), not the image server's", err=True)
        raise typer.Exit(code=2)
    try:
        from calibrate.target import ISSUE_BOUNDS as ISSUE
        from calibrate.target import target_report
    except ImportError as err:
        raise need("calibrate target")(err) from None
    try:
        prof = json.loads((folder / "profile.json").read_text())
        report = target_report(prof, runs=runs, designs=designs, seed=seed)
    except (OSError, ValueError, KeyError) as err:
        raise unreadable(folder, err) from None
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=2) + "\n")
    rules = list(next(iter(report["pass_rates"].values())))
    models = list(report["pass_rates"])
    typer.echo(f"pass rate over {report['triples']:,} triples of {report['runs']} virtual runs")
    typer.echo(f"{'rule':<28}" + "".join(f"{m + ', issue':>22}{m + ', widened':>22}" for m in models))
    for rule in rules:
        cells = "".join(
            f"{report['pass_rates'][m][rule]:>22.1%}{report['pass_rates_widened'][m][rule]:>22.1%}" for m in models
        )
        typer.echo(f"{rule:<28}" + cells)
    typer.echo(f"{'bound':<20}{'issue':>8}{'correct passes 90%':>20}{'widened':>10}")
    for k, v in report["widened_bounds"].items():
        typer.echo(f"{k:<20}{ISSUE[k]:>8g}{report['passable_bounds'][k]:>20.1f}{v:>10.1f}")
