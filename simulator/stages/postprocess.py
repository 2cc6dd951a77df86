"""Postprocessing and response serialisation: a per-request time after the model
(``postprocess.service``), on the way back to the client.

Called as every stage is: built from the scenario and its streams, it draws each
request's time in request order (drawn for every request, served or not, so that one
request's draws do not depend on what became of the others).
"""

from __future__ import annotations

import numpy as np

from simulator.rng import Streams
from simulator.scenario.config import Scenario
from simulator.stages.network import delay, draw


class Postprocessing:
    """Postprocessing's time per request: nothing queues, so no state between chunks."""

    def __init__(self, s: Scenario, rng: Streams):
        self.service = delay(s.postprocess.service, rng.postprocess)

    def draw(self, n: int) -> np.ndarray | float:
        """The next ``n`` requests' postprocessing times, ms (0 when there is none)."""
        return draw(self.service, n)


__all__ = ["Postprocessing"]
