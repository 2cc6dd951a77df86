"""``servesim calibrate watch``: a live twin of a running server, as a command.

The twins themselves are :mod:`calibrate.watch` (a Triton or one of ours: batch time and
overheads from its counters) and :mod:`calibrate.watch_llm` (a vLLM-compatible server:
the step time's speed from its histograms). Here is what a user sees of them: the options
and their refusals (exit 2 before anything is scraped), the table printed every interval,
the JSON lines, and the loop that keeps a twin's last fit through a failed scrape or update.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from calibrate.cli_shared import server_url


def _sla(text: str) -> tuple[float, float]:
    import re

    m = re.fullmatch(r"\s*p(\d+(?:\.\d+)?)\s*<=\s*(\d+(?:\.\d+)?)\s*ms\s*", text)
    if m is None or not 0 < float(m.group(1)) < 100 or float(m.group(2)) <= 0:
        raise typer.BadParameter(f"expected like p99<=100ms; got {text!r}", param_hint="--sla")
    return float(m.group(1)), float(m.group(2))


def watch(
    url: Annotated[str, typer.Option(help="The server, e.g. http://127.0.0.1:8000 (ours or a Triton).")],
    model: Annotated[str | None, typer.Option(help="Model to watch (default: the repository's only one).")] = None,
    interval_s: Annotated[float, typer.Option(help="Seconds between scrapes.", min=0.5)] = 10.0,
    sla: Annotated[str, typer.Option(help="Objective on the server's latency, e.g. p99<=100ms.")] = "p99<=100ms",
    json_path: Annotated[Path | None, typer.Option("--json", help="Append one JSON line per interval here.")] = None,
    duration_s: Annotated[float, typer.Option(help="Stop after this many seconds (0: until Ctrl-C).", min=0)] = 0.0,
    window: Annotated[int, typer.Option(help="Intervals in the rolling fit.", min=1)] = 6,
    profile: Annotated[
        Path | None,
        typer.Option(help="A `calibrate run` folder: its noise, speed process and front end in the twin's model."),
    ] = None,
    openai: Annotated[
        bool, typer.Option("--openai", help="Watch a vLLM-compatible LLM server (its vllm: metrics).")
    ] = False,
    scenario: Annotated[
        Path | None,
        typer.Option(help="With --openai: the LLM scenario whose step time the twin scales (calibrate llm's)."),
    ] = None,
    tpot_sla: Annotated[
        str | None, typer.Option(help="With --openai: an objective on TPOT too, e.g. p99<=50ms.")
    ] = None,
    sla_window_s: Annotated[
        float | None,
        typer.Option(help="With --openai: the SLA's percentile over windows this long (default: the interval).", min=1),
    ] = None,
    seeds: Annotated[
        int | None,
        typer.Option(
            help="With --openai: simulations pooled in a prediction (default 2; 1 updates in about half the time, "
            "3 is steadier).",
            min=1,
            max=10,
        ),
    ] = None,
) -> None:
    """A live twin of a running server: fits the batch time and overheads from its counters
    every interval, simulates the current rate, and says how much traffic can grow before
    the SLA breaks (the headroom). With --openai, a vLLM-compatible server: the SLA is on
    TTFT, and the twin fits the step time's speed from the inter-token latency."""
    import time

    from calibrate.watch import Twin, WatchError, connect, scrape

    q, target = _sla(sla)
    url = server_url(url)
    if openai:
        sla_w = sla_window_s or interval_s
        _watch_openai(url, interval_s, (q, target), tpot_sla, json_path, duration_s, window, scenario, sla_w, seeds)
        return
    if scenario is not None or tpot_sla is not None or sla_window_s is not None or seeds is not None:
        typer.echo("error: --scenario, --tpot-sla, --sla-window-s and --seeds go with --openai", err=True)
        raise typer.Exit(code=2)
    prof = None
    if profile is not None:
        try:
            prof = json.loads((profile / "profile.json").read_text())
            if prof.get("schema_version") != 1 or "service_time" not in prof:
                raise ValueError("not a servesim calibration profile (schema_version 1)")
        except (OSError, ValueError) as err:
            typer.echo(f"error: --profile {profile}: {err}", err=True)
            raise typer.Exit(code=2) from None
    _check_json(json_path)
    try:
        name, config = connect(url, model)
    except WatchError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=2) from None
    twin = Twin(config, name, percentile=q, target_ms=target, window=window, profile=prof)
    out = json_path.open("a") if json_path is not None else None
    key = f"p{q:g}"
    typer.echo(f"watching {name} at {url} every {interval_s:g} s; SLA {key} <= {target:g} ms (server latency)")
    typer.echo(
        f"{'time':>8} {'req/s':>8} {'meas p50':>9} {'meas ' + key:>9} {'pred p50':>9} {'pred ' + key:>9} "
        f"{'breaks at':>10} {'headroom':>9}"
    )

    def line(row: dict) -> str:
        return (
            f"{time.strftime('%H:%M:%S'):>8} {_fmt(row['rate_rps'], '.1f'):>8} "
            f"{_fmt(row['measured_p50_ms'], '.1f'):>9} {_fmt(row[f'measured_{key}_ms'], '.1f'):>9} "
            f"{_fmt(row.get('predicted_p50_ms'), '.1f'):>9} {_fmt(row.get(f'predicted_{key}_ms'), '.1f'):>9} "
            f"{_fmt(row.get('breaking_rate_rps'), '.1f'):>10} {_fmt(row.get('headroom_pct'), '+.0f'):>8}%"
        )

    _watch_loop(lambda: scrape(url, name), twin.update, line, out, interval_s, duration_s)


def _fmt(v, spec: str) -> str:
    """A number of the twin's table, a dash where there is none."""
    import math

    return "—" if v is None or not math.isfinite(v) else format(v, spec)


def _check_json(json_path: Path | None) -> None:
    if json_path is not None and not json_path.parent.is_dir():
        typer.echo(f"error: --json {json_path}: folder {json_path.parent} does not exist", err=True)
        raise typer.Exit(code=2)


def _watch_loop(fetch, update, line, out, interval_s: float, duration_s: float) -> None:
    """Every ``interval_s`` (until ``duration_s``, 0: until Ctrl-C): ``fetch()`` scrapes the
    server and ``update(scrape)`` gives the twin's row (None for the first scrape); print
    ``line(row)`` and append the row to ``out`` as a JSON line. A scrape or an update that
    fails is reported as which of the two it was, and the twin keeps its fit."""
    import math
    import time
    import urllib.error

    from calibrate.watch import WatchError

    failures = (WatchError, urllib.error.URLError, OSError, ValueError, KeyError, ArithmeticError)

    def report(msg: str) -> None:
        typer.echo(f"{time.strftime('%H:%M:%S')} {msg}")
        if out is not None:
            out.write(json.dumps({"time": round(time.time(), 3), "error": msg}) + "\n")
            out.flush()

    start = time.monotonic()
    try:
        while not duration_s or time.monotonic() - start < duration_s:
            t0 = time.monotonic()
            row = None
            try:
                got = fetch()
            except failures as err:
                report(f"scrape failed ({type(err).__name__}: {getattr(err, 'reason', err)}); keeping the last fit")
            else:
                try:
                    row = update(got)
                except failures as err:
                    report(f"the twin's update failed ({type(err).__name__}: {err}); keeping the last fit")
            if row is not None:
                typer.echo(line(row) + (f"  {row['note']}" if "note" in row else ""))
                if out is not None:
                    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
                    out.write(json.dumps(clean) + "\n")
                    out.flush()
            time.sleep(max(0.0, interval_s - (time.monotonic() - t0)))
    except KeyboardInterrupt:
        pass
    finally:
        if out is not None:
            out.close()


def _watch_openai(
    url: str,
    interval_s: float,
    ttft_sla: tuple[float, float],
    tpot_sla: str | None,
    json_path: Path | None,
    duration_s: float,
    window: int,
    scenario: Path | None,
    sla_window_s: float,
    seeds: int | None,
) -> None:
    """``calibrate watch --openai`` (see :mod:`calibrate.watch_llm`)."""
    import time

    import yaml

    from calibrate.vllm_metrics import connect, scrape
    from calibrate.watch import WatchError
    from calibrate.watch_llm import LLMTwin
    from calibrate.watch_rolling import Rolling
    from simulator.scenario.loader import ScenarioError, load_scenario

    tpot = _sla(tpot_sla) if tpot_sla is not None else None
    path = scenario or Path("calibrate/profiles/cpu-tiny-llm/scenario.yaml")
    if not path.is_file():
        typer.echo(f"error: --scenario {path}: no such file (an LLM scenario: calibrate llm writes one)", err=True)
        raise typer.Exit(code=2)
    try:
        load_scenario(path)
        base = yaml.safe_load(path.read_text())
    except ScenarioError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=2) from None
    _check_json(json_path)
    try:
        info = connect(url)
        twin = LLMTwin(
            base,
            info,
            ttft_sla=ttft_sla,
            tpot_sla=tpot,
            window=window,
            sla_window_s=sla_window_s,
            **({"seeds": tuple(range(1, seeds + 1))} if seeds else {}),  # None: the twin's own (two)
        )
    except WatchError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=2) from None
    qt = ttft_sla[0]
    qp = tpot[0] if tpot else 99.0
    out = json_path.open("a") if json_path is not None else None
    typer.echo(
        f"watching {url} every {interval_s:g} s; SLA TTFT p{qt:g} <= {ttft_sla[1]:g} ms"
        + (f", TPOT p{qp:g} <= {tpot[1]:g} ms" if tpot else "")
        + f" (over {sla_window_s:g} s windows); KV {info['num_gpu_blocks']} blocks of {info['block_size']}; "
        + f"model {path}"
    )
    typer.echo(
        f"{'time':>8} {'req/s':>7} {'run':>4} {'wait':>4} {'kv':>5} {'TTFT p50':>9} {'p' + format(qt, 'g'):>7} "
        f"{'pred':>7} {'TPOT p50':>9} {'pred':>6} {'speed':>6} {'breaks at':>10} {'headroom':>9} {'replicas':>8}"
    )

    def line(row: dict) -> str:
        return (
            f"{time.strftime('%H:%M:%S'):>8} {_fmt(row['rate_rps'], '.2f'):>7} {_fmt(row['running'], '.0f'):>4} "
            f"{_fmt(row['waiting'], '.0f'):>4} {_fmt(row['kv_usage'], '.0%'):>5} "
            f"{_fmt(row['measured_ttft_p50_ms'], '.1f'):>9} {_fmt(row[f'measured_ttft_p{qt:g}_ms'], '.1f'):>7} "
            f"{_fmt(row.get(f'predicted_ttft_p{qt:g}_ms'), '.1f'):>7} "
            f"{_fmt(row['measured_tpot_p50_ms'], '.2f'):>9} {_fmt(row.get('predicted_tpot_p50_ms'), '.2f'):>6} "
            f"{_fmt(row.get('speed_factor'), '.2f'):>6} {_fmt(row.get('breaking_rate_rps'), '.2f'):>10} "
            f"{_fmt(row.get('headroom_pct'), '+.0f'):>8}% {row.get('replicas_needed') or '—':>8}"
        )

    rolling = Rolling(twin)

    scraped_at = 0.0

    def fetch():
        nonlocal scraped_at
        scraped_at = time.monotonic()
        return scrape(url)

    def update(got) -> dict | None:  # the row waits for its window's fit until 90% of the interval
        return rolling.row(got, scraped_at + 0.9 * interval_s)

    try:
        _watch_loop(fetch, update, line, out, interval_s, duration_s)
    finally:
        rolling.close()


__all__ = ["watch"]
