"""servesim's simulator: a discrete-event model of an ML inference serving system.

Public API::

    from simulator import load_scenario, simulate, summarize
    run = simulate(load_scenario("scenarios/inference_platform.yaml"))
    print(summarize(run)["latency_ms"]["e2e"])
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.engine import simulate
    from simulator.results.metrics import summarize
    from simulator.results.run import Run
    from simulator.scenario.config import Scenario
    from simulator.scenario.loader import ScenarioError, load_scenario, scenario_hash

# loaded when first used, so that reading a scenario does not load the engine (numba,
# SimPy, pandas): ``servesim check`` and ``--help`` start in a fraction of a second
_WHERE = {
    "Run": "simulator.results.run",
    "Scenario": "simulator.scenario.config",
    "ScenarioError": "simulator.scenario.loader",
    "load_scenario": "simulator.scenario.loader",
    "scenario_hash": "simulator.scenario.loader",
    "simulate": "simulator.engine",
    "summarize": "simulator.results.metrics",
}

__all__ = ["Run", "Scenario", "ScenarioError", "load_scenario", "scenario_hash", "simulate", "summarize"]


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'simulator' has no attribute {name!r}")
