"""Per-request records, columnar: one numpy array per timestamp, indexed by request id.

Each request's timestamps (ms) mark the end of each stage, so its latency splits
exactly into stages. Dropped requests (rejected, timed out) carry NaN from the point
they left, and the time they left in ``t_dropped``. The recorder never computes metrics;
:mod:`simulator.results.metrics` does.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np

from simulator.ledger import BatchLog, Outcome

if TYPE_CHECKING:
    import pandas as pd

# stage name, timestamp it starts from, timestamp it ends at
STAGES: tuple[tuple[str, str, str], ...] = (
    ("network_in", "arrival", "t_api"),
    ("router", "t_api", "t_router"),
    ("cache", "t_router", "t_cache"),
    ("features", "t_cache", "t_features"),
    ("preprocess", "t_features", "t_preprocessed"),
    ("queue", "t_preprocessed", "t_dispatch"),
    ("inference", "t_dispatch", "t_inferred"),
    ("postprocess", "t_inferred", "t_postprocessed"),
    ("network_out", "t_postprocessed", "t_response"),
)


@dataclass
class Records:
    """Columnar per-request records; every array has one entry per arrival."""

    arrival: np.ndarray
    t_api: np.ndarray
    t_router: np.ndarray
    t_cache: np.ndarray
    t_features: np.ndarray
    t_preprocessed: np.ndarray
    t_dispatch: np.ndarray
    t_inferred: np.ndarray
    t_postprocessed: np.ndarray
    t_response: np.ndarray
    t_dropped: np.ndarray
    t_logged: np.ndarray
    outcome: np.ndarray
    degraded: np.ndarray
    result_hit: np.ndarray
    feature_hit: np.ndarray
    batch_size: np.ndarray
    instance: np.ndarray  # within the request's version's pool
    version: np.ndarray  # 0: primary, 1: canary
    traffic_class: np.ndarray  # index into traffic.classes (0 without classes)
    # LLM requests (batching.kind continuous); None otherwise
    t_first_token: np.ndarray | None = None  # its first output token was produced (ms)
    prompt_tokens: np.ndarray | None = None  # with its shared prefix
    output_tokens: np.ndarray | None = None
    preemptions: np.ndarray | None = None
    cached_tokens: np.ndarray | None = None  # prompt tokens served from the prefix cache
    max_itl_ms: np.ndarray | None = None  # its worst gap between two output tokens (0 with one token)
    session: np.ndarray | None = None  # its conversation (traffic.tokens.sessions; -1: none)
    turn: np.ndarray | None = None  # its turn in the conversation (0: the first)

    def __len__(self) -> int:
        return len(self.arrival)

    @property
    def completed(self) -> np.ndarray:
        return self.outcome == Outcome.COMPLETED

    def stage_ms(self, stage: str) -> np.ndarray:
        """Per-request duration of ``stage`` in ms (NaN where the request never got there)."""
        _, a, b = next(s for s in STAGES if s[0] == stage)
        return getattr(self, b) - getattr(self, a)

    def to_frame(self) -> pd.DataFrame:
        """A tidy table: one row per request, times in ms, outcome as a category."""
        import pandas as pd

        df = pd.DataFrame({f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None})
        df["outcome"] = pd.Categorical.from_codes(df["outcome"], [o.name.lower() for o in Outcome])
        df.index.name = "request"
        return df


def batch_frame(log: BatchLog) -> pd.DataFrame:
    """The batch log as a table: start_ms, end_ms, size, instance (and, for a batch on an
    event loop, computed_ms: when its instance finished it, before the loop took it back)."""
    import pandas as pd

    df = pd.DataFrame({"start_ms": log.start, "end_ms": log.end, "size": log.size, "instance": log.instance})
    if log.computed is not None:
        df["computed_ms"] = log.computed
    return df
