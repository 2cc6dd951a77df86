"""Shared helpers: build scenarios in code."""

from __future__ import annotations

from pathlib import Path

from simulator.scenario.config import Scenario

ROOT = Path(__file__).resolve().parent.parent


def scenario(**sections) -> Scenario:
    """A minimal valid scenario (M/M/1-like) with whole sections replaced."""
    base = {
        "name": "test",
        "seed": 1,
        "duration_s": 10.0,
        "sla": {"percentile": 99, "target_ms": 100},
        "traffic": {"rate_rps": 100},
        "router": {"balancing": "shared"},
        "workers": {"count": 1, "service_time": {"kind": "exponential", "mean_ms": 5.0}},
    }
    base.update(sections)
    return Scenario.model_validate(base)


def random_fleet(**sections) -> Scenario:
    """24 batching workers under random routing at 19,200 req/s (a fleet that sampling
    may stand for), with whole sections replaced."""
    base = {
        "duration_s": 10.0,
        "warmup_s": 1.0,
        "traffic": {"rate_rps": 19_200},
        "router": {"balancing": "random"},
        "batching": {"max_batch_size": 8, "max_queue_delay_ms": 1.0},
        "workers": {"count": 24, "service_time": {"kind": "affine", "base_ms": 2.0, "per_item_ms": 0.5}},
        "cost": {"price_per_hour_usd": 1.0},
    }
    return scenario(**{**base, **sections})
