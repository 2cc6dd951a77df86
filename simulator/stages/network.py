"""Network: the client ↔ API hops, each a latency drawn per request plus the payload's
transfer time over the connection's bandwidth.

A stage of the request path, called as every stage is (:mod:`simulator.stages`): built
from the scenario and its random streams, it draws each request's inputs in request order
(the same numbers for any chunk length) and says when requests
leave it. Nothing contends on the network, so it keeps no state between chunks.
"""

from __future__ import annotations

import numpy as np

from simulator.rng import Streams
from simulator.scenario.config import Scenario, Traffic
from simulator.scenario.distributions import Distribution, Sampler


def delay(dist: Distribution | None, rng: np.random.Generator) -> Sampler | None:
    """The sampler of a per-request delay, or None when the scenario has none."""
    return None if dist is None else Sampler(dist, rng)


def draw(sampler: Sampler | None, n: int) -> np.ndarray | float:
    """``n`` draws of a per-request delay in request order (0 when there is none)."""
    return 0.0 if sampler is None else sampler.draw(n)


def later(t: np.ndarray, *delays) -> np.ndarray:
    """``t`` plus each delay (a scalar or one per request), leaving out those that are 0
    for every request (the scalar 0, or 0 broadcast): ``t + 0`` is ``t`` to the bit, so a
    stage the scenario leaves out returns its input and makes no column of its own."""
    for d in delays:
        if isinstance(d, np.ndarray) and d.ndim == 1 and d.strides == (0,) and len(d):
            d = d[0]  # one value broadcast to every request
        if np.ndim(d) or d != 0:
            t = t + d
    return t


def per_class(traffic: Traffic, field: str, klass: np.ndarray | None):
    """A payload size per request: its traffic class's, else the traffic section's."""
    default = getattr(traffic, field)
    if not traffic.classes or klass is None:
        return default
    sizes = [default if getattr(c, field) is None else getattr(c, field) for c in traffic.classes.values()]
    return np.asarray(sizes)[klass]


def transfer_ms(kb, bandwidth_gbps: float | None):
    """Time to send ``kb`` kilobytes at ``bandwidth_gbps`` (0 without a bandwidth)."""
    # 1 KB = 8,000 bits; 1 Gbit/s = 1e6 bits per ms
    return 0.0 if bandwidth_gbps is None else kb * 8000.0 / (bandwidth_gbps * 1e6)


class Network:
    """The hops in (client → API, with the request's payload) and back (API → client,
    with the response)."""

    def __init__(self, s: Scenario, rng: Streams):
        self.traffic, self.bandwidth = s.traffic, s.network.bandwidth_gbps
        self.inbound_delay = delay(s.network.client_to_api, rng.network_in)
        self.back_delay = delay(s.network.api_to_client, rng.network_out)

    def inbound(self, t0: np.ndarray, klass: np.ndarray | None = None) -> np.ndarray:
        """When each request, sent at ``t0``, reaches the API."""
        payload = per_class(self.traffic, "payload_kb", klass)
        return later(t0, draw(self.inbound_delay, len(t0)), transfer_ms(payload, self.bandwidth))

    def back_ms(self, n: int, klass: np.ndarray | None = None):
        """Each response's way back to the client, ms (a scalar when nothing varies)."""
        response = per_class(self.traffic, "response_kb", klass)
        return draw(self.back_delay, n) + transfer_ms(response, self.bandwidth)


__all__ = ["Network", "delay", "draw", "later", "per_class", "transfer_ms"]
