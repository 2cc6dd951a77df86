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
