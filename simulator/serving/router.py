"""Load balancing: which worker of a pool each request goes to.

One router for every pool, fixed or dynamic (``router.balancing``): ``round_robin`` goes
around the workers in turn, carrying its position from one chunk of requests to the
next; ``random`` draws a worker uniformly (kube-proxy's iptables mode); ``shared`` has no
per-worker queues (one queue feeds every instance), so there is nothing to pick. The
balancing that reads LLM replicas' state (``least_loaded``, ``prefix_affinity``,
``scored``) picks when the request reaches them (:class:`~simulator.serving.continuous.Replicas`),
so nothing is picked here either.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Balancing = Literal["random", "round_robin", "shared", "least_loaded", "prefix_affinity", "scored"]


class Router:
    """Picks workers for successive chunks of requests; draws come from ``rng``."""

    def __init__(self, balancing: Balancing, rng: np.random.Generator):
        self.balancing = balancing
        self.rng = rng
        self.next = 0  # round robin: the worker the next request goes to

    def pick(self, n: int, workers: int) -> np.ndarray | None:
        """The worker (0 … ``workers`` − 1) of each of ``n`` requests, or None for a shared queue."""
        match self.balancing:
            case "shared" | "least_loaded" | "prefix_affinity" | "scored":
                return None
            case "round_robin":
                pick = (self.next + np.arange(n)) % workers
                self.next = (self.next + n) % workers
                return pick
            case "random":
                return self.rng.integers(0, workers, n)
        raise ValueError(self.balancing)
