"""``servesim run`` in chunks: a progress bar with the time left, and
``--records`` written chunk by chunk (a Parquet row group per chunk, or CSV appended), so
the records file is the only thing that grows with the run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from servesim.console import err
from simulator.planning.runner import prepare, run
from simulator.results.records import Records
from simulator.scenario.config import Scenario
from simulator.streaming import Piece

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow.parquet as pq

# pandas and pyarrow load only when records are written: a run that writes none skips
# their import (0.25 s of every ``servesim run``)


def records_frame(records: Records, scenario: Scenario, first: int = 0) -> pd.DataFrame:
    """Requests for --records: times in ms from the start of the simulation (the unit in
    each name), a ``warmup`` flag for arrivals before ``warmup_s`` (left out of every
    metric), and the version and traffic class by name; indexed by request id from ``first``."""
    import pandas as pd

    s = scenario
    df = records.to_frame()
    df.index = pd.RangeIndex(first, first + len(df), name="request")
    df = df.rename(columns={c: f"{c}_ms" for c in df.columns if c == "arrival" or c.startswith("t_")})
    df.insert(1, "warmup", df["arrival_ms"] < s.warmup_s * 1000.0)
    canary = s.router.canary
    versions = ["primary", getattr(canary, "name", None) or "canary"]
    df["version"] = pd.Categorical.from_codes(df["version"].astype(int), versions)
    classes = list(s.traffic.classes) or ["default"]
    df["traffic_class"] = pd.Categorical.from_codes(df["traffic_class"].astype(int), classes)
    return df


class RecordsWriter:
    """Appends each piece's records to ``path``: one Parquet row group per piece, or CSV rows."""

    def __init__(self, path: Path, scenario: Scenario):
        self.path, self.scenario = path, scenario
        self.rows = 0
        self._parquet: pq.ParquetWriter | None = None
        self._csv_header = True

    def __call__(self, piece: Piece) -> None:
        if not len(piece.records):
            return
        df = records_frame(piece.records, self.scenario, piece.first)
        if self.path.suffix == ".parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pa.Table.from_pandas(df, preserve_index=True)
            if self._parquet is None:
                self._parquet = pq.ParquetWriter(self.path, table.schema)
            self._parquet.write_table(table)
        else:
            df.to_csv(self.path, mode="w" if self._csv_header else "a", header=self._csv_header)
            self._csv_header = False
        self.rows += len(df)

    def close(self) -> None:
        if self._parquet is not None:
            self._parquet.close()
        elif self.rows == 0 and self.path.suffix == ".parquet":  # an empty run still leaves a file
            records_frame(Records(*([] for _ in Records.__dataclass_fields__)), self.scenario).to_parquet(self.path)


def run_streamed(
    s: Scenario,
    *,
    sample: int | None = None,
    interval_s: float,
    records: Path | None,
    show_progress: bool,
    chunk_s: float | str = "auto",
):
    """Stream ``s`` (fleet-sampled to ``sample`` workers) with a progress bar over
    simulated time; the summary, restated for the whole fleet."""
    sim = prepare(s, sample=sample, chunk_s=chunk_s).simulated
    writer = RecordsWriter(records, sim) if records is not None else None
    columns = (
        TextColumn("simulating {task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f} of {task.total:,.0f} simulated s"),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
    )
    try:
        with Progress(*columns, console=err, transient=True, disable=not show_progress) as bar:
            task = bar.add_task(s.name, total=s.duration_s)
            summary = run(
                s,
                sample=sample,
                interval_s=interval_s,
                chunk_s=chunk_s,
                on_piece=writer,
                progress=lambda t: bar.update(task, completed=t),
            ).summary
    finally:
        if writer is not None:
            writer.close()
    if writer is not None:
        err.print(f"{writer.rows:,} records written to {records}, chunk by chunk")
    return summary
