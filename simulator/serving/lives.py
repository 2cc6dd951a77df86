"""A fleet's log: each worker's life (requested, serving, draining, gone) and the control
plane's events, which the summary bills and the timeline draws. Kept apart from the pools
that write it (:mod:`simulator.serving.fleet`'s SimPy fleet, an LLM pool's autoscaler in
:mod:`simulator.serving.continuous`), so that neither imports the other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from simulator.serving.workers import Feed

INF = math.inf


class FleetEvent(StrEnum):
    """What the fleet log records, for reports and the timeline."""

    READY = "ready"
    CRASH = "crash"
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"


class WorkerState(StrEnum):
    """The spans of a worker's life that :meth:`FleetLog.intervals` measures."""

    WARMING = "warming"  # requested, not yet serving (cold start)
    ACTIVE = "active"  # serving
    DRAINING = "draining"  # taking no new requests, finishing its queue
    BILLED = "billed"  # from request to gone: what the fleet pays for


@dataclass
class Worker:
    """One GPU worker's life, in ms."""

    wid: int
    requested_at: float
    ready_at: float
    feed: Feed | None  # its batch queue (None for an LLM replica, which holds its own)
    drain_at: float = INF
    gone_at: float = INF
    crashed_at: float = INF
    pool: str = ""  # prefill and decode apart (an LLM fleet): the replica's pool
    gpu: str = ""  # an LLM fleet's: the replica's GPU type (a mixed fleet bills each type its price)

    def serving(self, t: float) -> bool:
        return self.ready_at <= t < min(self.drain_at, self.crashed_at, self.gone_at)


@dataclass
class FleetLog:
    """What the fleet did: each worker's life and the control-plane events."""

    workers: list[Worker]
    events: list[tuple[float, FleetEvent, str]] = field(default_factory=list)

    def intervals(self, state: WorkerState | str) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) ms of every worker's stay in ``state``: warming, active, draining, billed."""
        w = self.workers
        req = np.array([x.requested_at for x in w])
        ready = np.array([x.ready_at for x in w])
        drain = np.array([x.drain_at for x in w])
        gone = np.array([min(x.gone_at, x.crashed_at) for x in w])
        match WorkerState(state):
            case WorkerState.WARMING:
                return req, np.minimum(ready, gone)
            case WorkerState.ACTIVE:
                return ready, np.minimum(drain, gone)
            case WorkerState.DRAINING:
                return np.minimum(drain, gone), gone
            case WorkerState.BILLED:
                return req, gone
        raise ValueError(state)


__all__ = ["FleetEvent", "FleetLog", "Worker", "WorkerState"]
