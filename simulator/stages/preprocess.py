"""CPU preprocessing (decode, resize, tokenise): a per-request CPU time, spent at once
(``cpu_workers`` unset), on an FCFS pool of ``cpu_workers`` shared by all traffic
(``dispatch: shared``), or on ``cpu_workers`` single-server queues that take the requests
in turn (``dispatch: round_robin``: front-end processes each dealt every N-th request, as
``servesim serve --frontends N`` deals its connections and a client uses them in turn).
With ``hub``, every request then passes one more single server, FCFS in the order it
leaves the pool: the process between N front ends and the one batcher (their hub).

Called as every stage is: built from the scenario and its streams, it draws each
request's CPU time in request order (for every request, whether it reaches the stage or
not) and says when requests leave. The pool keeps its servers' free times
(:class:`~simulator.stages.stations.FcfsStation`), so the engine feeds it chunk
by chunk, in time order, with the same results as one whole run. With the host's speed
(``platform.speed``), the station runs in the clock of the work the host does
(:mod:`simulator.stages.speed`; exact, as that clock is increasing).
"""

from __future__ import annotations

import numpy as np

from simulator.rng import Streams, child
from simulator.scenario.config import Scenario
from simulator.stages.network import delay, draw, later
from simulator.stages.speed import SpeedPath
from simulator.stages.stations import FcfsStation, Lindley


class Preprocessing:
    """The CPU stage: its per-request times, and its pool's state when it has one."""

    def __init__(self, s: Scenario, rng: Streams, path: SpeedPath | None = None):
        self.service = delay(s.preprocess.service, rng.preprocess)
        self.workers = s.preprocess.cpu_workers
        dealt = self.workers is not None and s.preprocess.dispatch == "round_robin"
        self.station = None if self.workers is None or dealt else FcfsStation(self.workers)
        self.queues = [Lindley() for _ in range(self.workers)] if dealt else None  # one per worker
        self.turn = 0  # the worker the next request goes to (round_robin)
        self.path = path
        # the hub's CPU times, drawn in the order requests reach it (a child stream: the
        # pool's draws stay as they were)
        self.hub = None if s.preprocess.hub is None else delay(s.preprocess.hub, child(rng.preprocess, 0))
        self.hub_station = Lindley()

    @property
    def pooled(self) -> bool:
        """Whether requests queue here (a pool or dealt queues), so they come in time order."""
        return self.workers is not None

    def draw(self, n: int) -> np.ndarray:
        """The next ``n`` requests' CPU times, ms (one draw each, in request order)."""
        return np.broadcast_to(draw(self.service, n), (n,))

    def leave_sorted(self, t: np.ndarray, svc: np.ndarray) -> np.ndarray:
        """When requests arriving at ``t`` (sorted; ties in request order) with CPU times
        ``svc`` leave; the pool carries its state to the next call."""
        if self.queues is not None:
            return self._dealt(t, svc)
        if self.station is None:
            return later(t, svc) if self.path is None else self.path.time(self.path.work(t) + svc)
        if self.path is None:
            return self.station.run(t, svc)[0] + svc
        return self.path.time(self.station.run(self.path.work(t), svc)[0] + svc)

    def through_hub(self, t: np.ndarray) -> np.ndarray:
        """When requests reaching the hub at ``t`` (sorted; ties in request order) leave it,
        one at a time; its state carried to the next call."""
        svc = self.hub.draw(len(t))
        at = t if self.path is None else self.path.work(t)
        leave = self.hub_station.run(at, svc) + svc
        return leave if self.path is None else self.path.time(leave)

    def _dealt(self, t: np.ndarray, svc: np.ndarray) -> np.ndarray:
        """Round robin: the i-th request to arrive (ties in request order) joins queue
        ``i mod cpu_workers``; each queue is one FCFS server, its state carried."""
        n, w = len(t), len(self.queues)
        svc = np.asarray(svc, dtype=float)
        at = t if self.path is None else self.path.work(t)
        which = (self.turn + np.arange(n)) % w
        self.turn = int((self.turn + n) % w)
        start = np.empty(n)
        for k, queue in enumerate(self.queues):
            mine = which == k
            if mine.any():
                start[mine] = queue.run(at[mine], svc[mine])
        leave = start + svc
        return leave if self.path is None else self.path.time(leave)


__all__ = ["Preprocessing"]
