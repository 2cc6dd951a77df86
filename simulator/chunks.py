"""How a run is cut: the chunk length, and when ``chunk_s="auto"`` runs in chunks. Kept
apart from :mod:`simulator.engine` so that deciding loads no engine (``servesim check``
answers before numba or SimPy are loaded)."""

from __future__ import annotations

from simulator.scenario.config import Scenario, expected_requests

TARGET_CHUNK_REQUESTS = 250_000  # requests per chunk, by default


def chunk_ms(s: Scenario, requests_per_chunk: int = TARGET_CHUNK_REQUESTS) -> float:
    """A chunk length (ms) holding about ``requests_per_chunk`` arrivals at the peak rate."""
    rate = max(expected_requests(s) / s.duration_s, 1.0)
    return float(min(max(requests_per_chunk / rate * 1000.0, 50.0), 60_000.0))


STREAM_ABOVE_REQUESTS = 5_000_000  # "auto" streams runs expected to be larger than this


def prefer_streaming(s: Scenario) -> bool:
    """Whether ``chunk_s="auto"`` runs ``s`` in chunks: the run is large (over
    :data:`STREAM_ABOVE_REQUESTS` arrivals, about 1.2 GB held whole). Smaller runs are one
    chunk, with exact percentiles."""
    return expected_requests(s) > STREAM_ABOVE_REQUESTS
