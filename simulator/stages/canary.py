"""Where a request goes among model versions: the sticky canary and shadow (mirror)
traffic of :mod:`simulator.scenario.versions`.

Every request carries a user drawn from a population. A user's bucket is a fixed hash
of the user id into 0..9999, so the canary share at time t takes the users whose
bucket is below share(t) × 10,000: a user stays on its version while the share only
grows, and everyone returns to the primary at a rollback.

The canary runs on its own pool (``workers`` of the primary's instance type) with its own
service time and error rate. A shadow copies a share of requests to a shadow version;
the caller never waits for the copy, which either runs on its own pool or joins the
primary's queues, where it competes with real traffic.
"""

from __future__ import annotations

import numpy as np

from simulator.scenario.versions import Canary

BUCKETS = 10_000


def bucket(user: np.ndarray) -> np.ndarray:
    """A fixed hash (SplitMix64 finaliser) of each user id into 0..BUCKETS-1."""
    z = user.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(BUCKETS)).astype(np.int64)


def on_canary(canary: Canary, users: np.ndarray, t_ms: np.ndarray) -> np.ndarray:
    """Whether each request (user, routing time) goes to the canary."""
    return bucket(users) < canary.share(t_ms / 1000.0) * BUCKETS
