"""Cartesian sweeps with replications, on one process, a process pool, or a Dask cluster.

A task is one (cell, replication): the scenario's YAML text with the cell's overrides and
a seed derived from the root seed, the cell's key and the replication number
(:func:`simulator.planning.replicate.derive_seed`). Tasks carry everything they need, so any
executor gives the same rows; only ``wall_s`` differs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.chunks import prefer_streaming
from simulator.planning.budget import check as check_budget
from simulator.planning.replicate import derive_seed, headline, interval
from simulator.results.sketch import LatencySketch
from simulator.scenario.loader import ScenarioError, load_scenario, parse_set, read_scenario_text

POOLED = {"p50": 0.50, "p95": 0.95, "p99": 0.99, "p999": 0.999}
SUMMARY_METRICS = ("p50_ms", "p95_ms", "p99_ms", "sla_ms", "attainment", "completed_rps", "cost_per_million_usd")


@dataclass(frozen=True)
class Task:
    """One replication of one cell, self-contained (picklable)."""

    source: str  # the scenario's path: names errors and anchors relative files
    text: str  # its YAML
    overrides: tuple[str, ...]  # --set and the cell's values, as path=value
    cell: tuple[tuple[str, object], ...]  # the cell's (path, value) pairs
    cell_key: str
    replication: int


def parse_grid(exprs: list[str]) -> dict[str, list]:
    """``path=v1,v2,...`` options → {path: [values]} (values read as YAML scalars)."""
    grid: dict[str, list] = {}
    for expr in exprs:
        if "=" not in expr:
            raise ScenarioError(f"--grid {expr!r}: expected dotted.path=v1,v2,...")
        path, raw = (x.strip() for x in expr.split("=", 1))
        if not path or not all(path.split(".")):
            raise ScenarioError(f"--grid {expr!r}: empty path component")
        values = [parse_set(f"x={v.strip()}")[1] for v in raw.split(",") if v.strip()]
        if not values:
            raise ScenarioError(f"--grid {expr!r}: no values")
        if path in grid:
            raise ScenarioError(f"--grid {path}: given twice")
        grid[path] = values
    return grid


def cells(grid: dict[str, list]) -> list[tuple[tuple[str, object], ...]]:
    """Every combination, paths in sorted order (so the option order does not matter)."""
    paths = sorted(grid)
    return [tuple(zip(paths, vals, strict=True)) for vals in itertools.product(*(grid[p] for p in paths))]


def cell_key(cell: tuple[tuple[str, object], ...]) -> str:
    return "|".join(f"{p}={v}" for p, v in cell)


def tasks(source: Path, sets: list[str], grid: dict[str, list], replications: int) -> list[Task]:
    """Every task of the sweep; each cell is validated here, before anything runs."""
    text = read_scenario_text(source)
    out = []
    for cell in cells(grid):
        overrides = (*sets, *(f"{p}={v}" for p, v in cell))
        s = load_scenario(source, list(overrides), text=text)  # a bad cell fails now, with its line
        # and one too big to run, now too (a long run is streamed: priced by its chunk)
        check_budget(s, what=f"cell {cell_key(cell) or '(no grid)'}", streamed=prefer_streaming(s))
        out += [Task(str(source), text, overrides, cell, cell_key(cell), r) for r in range(replications)]
    return out


def run_task(task: Task) -> dict:
    """One row: the cell's values, the replication, its seed and headline numbers, and the
    sketch of its end-to-end latencies (``e2e_sketch``), which the cell's summary pools."""
    s = load_scenario(task.source, list(task.overrides), text=task.text)
    s = s.model_copy(update={"seed": derive_seed(s.seed, task.cell_key, task.replication)})
    sketch = LatencySketch()
    row = headline(s, sketch=sketch)
    return {"cell": task.cell_key, **dict(task.cell), "replication": task.replication, **row, "e2e_sketch": sketch}


def execute(
    all_tasks: list[Task], *, jobs: int = 1, cluster: str | None = None, progress: Callable[[], None] | None = None
) -> pd.DataFrame:
    """Run the tasks in-process (jobs 1), on a process pool, or on the Dask scheduler at
    ``cluster``; rows come back in task order whatever the executor."""
    tick = progress or (lambda: None)
    if cluster is not None:
        rows = list(_dask(all_tasks, cluster, tick))
    elif jobs > 1:
        rows = [None] * len(all_tasks)
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(run_task, t): i for i, t in enumerate(all_tasks)}
            for f in as_completed(futures):
                rows[futures[f]] = f.result()
                tick()
    else:
        rows = []
        for t in all_tasks:
            rows.append(run_task(t))
            tick()
    return pd.DataFrame(rows)


def _dask(all_tasks: list[Task], address: str, tick) -> Iterator[dict]:
    from distributed import Client
    from distributed import as_completed as dask_completed

    with Client(address, timeout="20s") as client:
        futures = client.map(run_task, all_tasks, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        rows = [None] * len(all_tasks)
        for f in dask_completed(futures):
            rows[index[f.key]] = f.result()
            tick()
    yield from rows


def summarize_cells(rows: pd.DataFrame, params: list[str]) -> pd.DataFrame:
    """One summary row per cell: the mean and 95% t-interval of each metric over
    replications, and the pooled percentiles (``pooled_p50_ms`` …): of every request of
    every replication, from their merged sketches."""
    out = []
    for key, g in rows.groupby("cell", sort=False):
        row = {"cell": key, **{p: g[p].iloc[0] for p in params}, "replication": -1, "kind": "summary"}
        for m in SUMMARY_METRICS:
            mean, lo, hi = interval(g[m].to_numpy())
            row.update({m: mean, f"{m}_ci_lo": lo, f"{m}_ci_hi": hi})
        if "e2e_sketch" in g:
            pooled = LatencySketch()
            for sketch in g["e2e_sketch"]:
                pooled.merge(sketch)
            row.update({f"pooled_{k}_ms": pooled.quantile(q) for k, q in POOLED.items()})
        row["met_fraction"] = float(np.mean(g["met"]))
        row["requests"] = int(g["requests"].sum())
        out.append(row)
    return pd.DataFrame(out)


def tidy(rows: pd.DataFrame, params: list[str]) -> pd.DataFrame:
    """The replication rows (kind ``replication``) followed by the per-cell summaries
    (replication -1), the grid's ``params`` as columns."""
    reps = rows.drop(columns="e2e_sketch", errors="ignore").assign(kind="replication")
    return pd.concat([reps, summarize_cells(rows, params)], ignore_index=True)
