"""Back-of-envelope capacity math from a scenario's own numbers, each line with its formula.

This is the interview-style estimate (``rate / per-worker throughput × (1 + headroom)``)
written out so that ``servesim explain`` can set the simulator's verdict beside it. An LLM
fleet's napkin (tokens, KV bytes, decode steps) is :mod:`simulator.planning.llm_napkin`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.scenario.config import Scenario
from simulator.scenario.shapes import rate_bound
from simulator.serving.workers import mean_service_ms


@dataclass(frozen=True)
class Line:
    """One napkin quantity: what, how (the formula with the values put in), how much."""

    quantity: str
    formula: str
    value: float
    unit: str


def peak_rate(s: Scenario) -> float:
    """The highest arrival rate the traffic reaches, req/s."""
    if s.traffic.classes:
        return sum(rate_bound(c.shape, c.rate_rps) for c in s.traffic.classes.values())
    if s.traffic.arrivals_file is not None:
        raise ValueError("explain needs a rate: this scenario replays traffic.arrivals_file")
    if s.traffic.users is not None:  # a population: its rate were every answer instant
        return s.traffic.tokens.sessions.users_rps()
    return rate_bound(s.traffic.shape, s.traffic.rate_rps)


def napkin_batch(s: Scenario) -> int:
    """The batch size the napkin assumes."""
    return s.napkin.batch_size or s.batching.max_batch_size


def per_worker_rps(s: Scenario, batch: int) -> float:
    """Requests per second one worker completes with back-to-back batches of ``batch``."""
    return s.workers.instances * batch / mean_service_ms(s.workers, batch) * 1000.0


def workers_needed(s: Scenario) -> tuple[int, int]:
    """The napkin's worker count, bare and with headroom."""
    bare = math.ceil(peak_rate(s) / per_worker_rps(s, napkin_batch(s)) - 1e-9)
    return bare, math.ceil(bare * (1 + s.napkin.headroom) - 1e-9)


def napkin(s: Scenario, price_per_worker_hour: float) -> list[Line]:
    """Every napkin line for ``s``."""
    lam = peak_rate(s)
    b = napkin_batch(s)
    t_b = mean_service_ms(s.workers, b)
    mu = per_worker_rps(s, b)
    bare, padded = workers_needed(s)
    tr = s.traffic
    lines = [
        Line("peak request rate", "from traffic (rate × the shape's peak)", lam, "req/s"),
        Line(
            "ingress bandwidth",
            f"{lam:,.0f} req/s × {tr.payload_kb:g} KB × 8",
            lam * tr.payload_kb * 8e3 / 1e9,
            "Gbit/s",
        ),
        Line(
            "egress bandwidth",
            f"{lam:,.0f} req/s × {tr.response_kb:g} KB × 8",
            lam * tr.response_kb * 8e3 / 1e9,
            "Gbit/s",
        ),
        Line("batch service time", f"service time at B = {b}", t_b, "ms"),
        Line("batches per second", f"{lam:,.0f} req/s / B = {b}", lam / b, "batches/s"),
        Line(
            "per-worker throughput",
            f"{s.workers.instances} instance(s) × {b} / {t_b:.3g} ms",
            mu,
            "req/s",
        ),
        Line("workers", f"⌈{lam:,.0f} / {mu:,.0f}⌉", bare, "workers"),
        Line("workers with headroom", f"⌈{bare} × (1 + {s.napkin.headroom:g})⌉", padded, "workers"),
        Line(
            "cost with headroom",
            f"{padded} × ${price_per_worker_hour:.4g}/h",
            padded * price_per_worker_hour,
            "USD/h",
        ),
    ]
    f = s.features
    if f.lookups_per_request:
        trips = math.ceil(f.lookups_per_request / f.batch_size)
        lines += [
            Line(
                "feature-store keys read",
                f"{lam:,.0f} × {f.lookups_per_request} keys",
                lam * f.lookups_per_request,
                "keys/s",
            ),
            Line(
                "feature-store round trips",
                f"{lam:,.0f} × ⌈{f.lookups_per_request} / {f.batch_size}⌉",
                lam * trips,
                "trips/s",
            ),
        ]
    if s.logging is not None:
        per_s = lam * s.logging.record_kb * 1e3
        lines += [
            Line("prediction-log volume", f"{lam:,.0f} × {s.logging.record_kb:g} KB", per_s / 1e9, "GB/s"),
            Line("prediction-log volume per day", f"{per_s / 1e9:.3g} GB/s × 86,400 s", per_s * 86400 / 1e12, "TB/day"),
        ]
    return lines
