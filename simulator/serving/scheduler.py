"""The scheduler seam: who joins a batch, and when it runs, on which instance.

A fixed pool's batch queues are driven through one :class:`Scheduler`, whatever decides
the batches: the engine feeds it chunk by chunk (a whole run is one chunk) and closes it
after the last. What a batch costs on the GPU is the
:class:`~simulator.serving.workers.ServiceModel`'s business, kept apart: a scheduler asks
it for batch times and never draws its own.

:func:`build` makes the scheduler from the scenario's ``batching`` section, a union
discriminated by ``kind`` (:data:`simulator.scenario.fleet.Batching`).
``triton`` (:mod:`simulator.serving.triton`) is run by one of three strategies with the
same results: the exact FCFS recursion when batching is off, the compiled loop where it
covers the batching, or the SimPy scheduler. ``continuous`` (:mod:`simulator.serving.continuous`)
is a pool of LLM replicas stepping token by token. A new kind is one module here and one
union member there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from simulator.scenario.fleet import TritonBatching
from simulator.scenario.llm import ContinuousBatching

if TYPE_CHECKING:
    import numpy as np

    from simulator.scenario.fleet import Batching
    from simulator.serving.batcher import BatchQueue
    from simulator.serving.served import Settled


class Scheduler(Protocol):
    """A fixed pool's batch queues and the model instances each feeds.

    Requests come in time order (ties in request order) with an id, a queue (the worker
    the router picked; None when the pool shares one queue) and an end-to-end deadline
    where ``deadline_ms`` is set. :meth:`run` advances to the horizon of what is known
    and hands out what has settled since its last call.
    """

    def extend(
        self,
        t: np.ndarray,
        rid: np.ndarray,
        queue: np.ndarray | None,
        deadlines: np.ndarray | None,
        horizon: float,
        work: tuple[np.ndarray, ...] | None = None,
    ) -> None:
        """Requests reaching the batching stage at times ``t``; every request before
        ``horizon`` is now known. ``work``: what each request asks of the model where the
        kind needs it (an LLM's tokens: prompt, output, prefix group, shared tokens)."""

    def close(self) -> None:
        """No more requests will come."""

    def run(self) -> Settled:
        """Schedule up to the horizon (to the end once closed): the requests settled since
        the last call (ids and serving columns) and the batches that started."""


def batch_queue(batching: Batching, arrivals: np.ndarray, *, closed: bool = True, deadlines=None) -> BatchQueue:
    """The batch decisions of one queue, for the pools that drive their queues with SimPy
    processes of their own (a dynamic fleet's workers, traffic classes sharing a pool):
    for ``kind: triton``, a :class:`~simulator.serving.batcher.BatchQueue`."""
    from simulator.serving.batcher import BatchQueue

    match batching:
        case TritonBatching():
            return BatchQueue(arrivals, batching, closed=closed, deadlines=deadlines)
    raise ValueError(f"no batch queue for batching.kind {getattr(batching, 'kind', None)!r}")  # pragma: no cover


def queues_of(count: int, per_worker: int, *, shared: bool) -> list[list[int]]:
    """The model instances (global ids) each queue of a fixed pool feeds: one queue per
    worker over its ``per_worker`` instances, or one shared by all of them."""
    if shared:
        return [list(range(count * per_worker))]
    return [list(range(w * per_worker, (w + 1) * per_worker)) for w in range(count)]


def build(batching: Batching, instances: list[list[int]], service, *, compiled: bool | None = None):
    """The scheduler of a fixed pool whose queue ``k`` feeds the model instances
    ``instances[k]`` (global ids) and draws its batch times from ``service.feed(k)`` (a
    :class:`~simulator.serving.workers.ServiceModel`; for ``kind: continuous`` an
    :class:`~simulator.serving.continuous.LLMService`, its replicas' step time).

    ``compiled`` picks the triton strategy (default: the compiled loop where it covers the
    batching; False: the SimPy scheduler, the reference).
    """
    from simulator.serving import triton

    match batching:
        case TritonBatching():
            return triton.scheduler(batching, instances, service, compiled=compiled)
        case ContinuousBatching():
            from simulator.serving.continuous import Replicas

            return Replicas(batching, instances, service)
    raise ValueError(f"no scheduler for batching.kind {getattr(batching, 'kind', None)!r}")  # pragma: no cover


__all__ = ["Scheduler", "batch_queue", "build", "queues_of"]
