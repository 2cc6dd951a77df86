"""What a pool, the traffic classes and the versions leave: their requests' columns
(:class:`~simulator.ledger.Served`) with their batch logs and fleet, by name."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from simulator.ledger import BatchLog, Served

if TYPE_CHECKING:
    from simulator.serving.lives import FleetLog


class PoolRun(NamedTuple):
    """One pool's run: its requests (in the order it was given them), its batch log, and
    its fleet log (None for a fixed pool)."""

    served: Served
    batches: BatchLog
    fleet: FleetLog | None = None


class TokensServed(NamedTuple):
    """What an LLM engine adds to a settled request's columns: when its first output token
    was produced (ms), how often it was preempted, its prompt tokens served from the
    prefix cache, and its worst inter-token latency (ms)."""

    t_first_token: np.ndarray
    preemptions: np.ndarray
    cached_tokens: np.ndarray
    max_itl_ms: np.ndarray  # its worst gap between two output tokens


class Settled(NamedTuple):
    """What a scheduler hands out: the requests settled since its last call (their ids as
    given to it, and their serving columns) and the batches that started; an LLM engine's
    steps are its batches, and it adds each request's :class:`TokensServed`."""

    ids: np.ndarray
    served: Served
    batches: BatchLog
    tokens: TokensServed | None = None


class ClassesRun(NamedTuple):
    """The traffic classes' run: the requests, the shared pool's batch log, and each
    class's batch log by name."""

    served: Served
    batches: BatchLog
    pools: dict[str, BatchLog]
