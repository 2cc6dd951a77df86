"""``servesim sweep`` and ``servesim cluster start``."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table as RichTable

from servesim.console import check_output, err, fail, out

cluster_app = typer.Typer(help="A local Dask cluster to try `sweep --cluster` on.", no_args_is_help=True)


def sweep(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML file.", show_default=False)],
    grid: Annotated[
        list[str], typer.Option(help="A swept field: path=v1,v2,... (repeatable; the cells are their product).")
    ],
    replications: Annotated[int, typer.Option(help="Replications per cell.", min=1)] = 3,
    jobs: Annotated[int, typer.Option(help="Local worker processes (1: in this process).", min=1)] = 1,
    cluster: Annotated[
        str | None, typer.Option(help="Dask scheduler address, e.g. tcp://127.0.0.1:8786 (see `cluster start`).")
    ] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a field first: path=value.")] = None,
    out_path: Annotated[
        Path, typer.Option("--out", help="Tidy results: one row per (cell, replication) plus summaries.")
    ] = Path("sweep.parquet"),
) -> None:
    """A Cartesian sweep with replications, to a tidy table.

    Seeds derive from the cell and the replication, so the results are the same
    in-process, on a process pool or on a Dask cluster."""
    from simulator.planning.sweep import execute, parse_grid, tasks, tidy
    from simulator.scenario.loader import ScenarioError

    check_output(out_path, "--out", (".parquet", ".csv"))
    if jobs > 1 and cluster:
        raise fail("--jobs and --cluster: pick one executor")
    try:
        g = parse_grid(grid)
        work = tasks(scenario, set_ or [], g, replications)
    except (ScenarioError, ValueError) as e:  # a bad cell, or one too big to run (BudgetError)
        raise fail(str(e)) from None
    where = f"on {cluster}" if cluster else f"on {jobs} processes" if jobs > 1 else "in this process"
    err.print(f"{len(work) // replications} cells × {replications} replications = {len(work)} runs {where}")
    t0 = time.perf_counter()
    columns = [TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=err, transient=True) as progress:
        bar = progress.add_task("sweep", total=len(work))
        try:
            rows = execute(work, jobs=jobs, cluster=cluster, progress=lambda: progress.advance(bar))
        except OSError as e:
            raise fail(f"cannot reach the cluster at {cluster}: {e}") from None
    wall = time.perf_counter() - t0
    table = tidy(rows, sorted(g))
    try:
        table.to_parquet(out_path, index=False) if out_path.suffix == ".parquet" else table.to_csv(
            out_path, index=False
        )
    except OSError as e:
        raise fail(f"cannot write {e.filename}: {e.strerror}") from None
    _print_summary(table, sorted(g))
    n = int(rows["requests"].sum())
    out.print(f"{len(work)} runs, {n:,} requests in {wall:.1f} s ({n / max(wall, 1e-9):,.0f} req/s) → {out_path}")


def _print_summary(table, params: list[str]) -> None:
    summary = table[table["kind"] == "summary"]
    t = RichTable(title="per cell: mean [95% CI] over replications")
    for col in (*params, "p50 ms", "p99 ms", "pooled p99 ms", "SLA met", "$/M req"):
        t.add_column(col, justify="right")
    for _, r in summary.iterrows():
        ci = f"{r['p99_ms']:.1f} [{r['p99_ms_ci_lo']:.1f}, {r['p99_ms_ci_hi']:.1f}]"
        t.add_row(
            *(str(r[p]) for p in params),
            f"{r['p50_ms']:.1f}",
            ci,
            f"{r['pooled_p99_ms']:.1f}",
            f"{r['met_fraction']:.0%}",
            f"{r['cost_per_million_usd']:.4f}",
        )
    out.print(t)


def _interrupt(_signum, _frame) -> None:
    raise KeyboardInterrupt


@cluster_app.command("start")
def cluster_start(
    workers: Annotated[int, typer.Option(help="Worker processes (one thread each).", min=1)] = 2,
    port: Annotated[int, typer.Option(help="Scheduler port on 127.0.0.1.", min=1, max=65535)] = 8786,
    dashboard_port: Annotated[int, typer.Option(help="Dask dashboard port (0: none).", min=0, max=65535)] = 0,
) -> None:
    """Start a local Dask cluster and wait (Ctrl-C or SIGTERM stops it). Point `servesim sweep
    --cluster tcp://127.0.0.1:PORT` at it; on a real cluster, start `dask scheduler` and
    `dask worker` with servesim installed on every machine instead."""
    try:
        from distributed import LocalCluster
    except ModuleNotFoundError:
        raise fail("the cluster needs dask: pip install -e '.[cluster]'") from None
    import socket

    try:  # taken: Dask's own start would fail with a traceback and its log
        socket.create_server(("127.0.0.1", port)).close()
    except OSError as e:
        raise fail(f"cannot start the scheduler on port {port}: {e.strerror or e}") from None
    address = f":{dashboard_port}" if dashboard_port else None
    # Ctrl-C and SIGTERM stop the cluster and its workers. Installed by hand: a process started
    # in the background by a non-interactive shell inherits SIGINT ignored, and Python then
    # leaves it ignored (a test's SIGINT once left this command and its worker running)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    try:
        cluster = LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            scheduler_port=port,
            dashboard_address=address,
        )
    except (OSError, RuntimeError) as e:  # RuntimeError: "Cluster failed to start"
        raise fail(f"cannot start the scheduler on port {port}: {e}") from None
    out.print(f"Dask scheduler at {cluster.scheduler_address} with {workers} workers; Ctrl-C stops it")
    out.print(f"  servesim sweep SCENARIO --grid ... --cluster {cluster.scheduler_address}")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.close()
