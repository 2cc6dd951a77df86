"""The API layer and router: auth, schema normalisation and the version's choice, a
per-request processing time (``router.overhead``). Which worker or version a request goes
to is decided elsewhere: load balancing in :mod:`simulator.serving.router`, the canary in
:mod:`simulator.stages.canary`.

Called as every stage is: built from the scenario and its streams, it draws each
request's time in request order and says when requests leave.
"""

from __future__ import annotations

import numpy as np

from simulator.rng import Streams
from simulator.scenario.config import Scenario
from simulator.stages.network import delay, draw, later


class RouterStage:
    """The router's processing time: nothing queues, so no state between chunks."""

    def __init__(self, s: Scenario, rng: Streams):
        self.overhead = delay(s.router.overhead, rng.router)

    def leave(self, t_api: np.ndarray) -> np.ndarray:
        """When each request, at the API at ``t_api``, leaves the router."""
        return later(t_api, draw(self.overhead, len(t_api)))


__all__ = ["RouterStage"]
