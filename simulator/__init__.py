"""servesim's simulator: a discrete-event model of an ML inference serving system.

Public API::

    import simulator
    result = simulator.run(simulator.load_scenario("scenarios/inference_platform.yaml"))
    print(result.summary["latency_ms"]["e2e"])

:func:`run` is the one way to run a scenario (fleet sampling, the engine's choice, the
summary restated for the whole fleet); :func:`simulate` and :func:`summarize` are its
parts, for a caller that wants the records of one whole run.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.engine import simulate
    from simulator.planning.runner import Result, run
    from simulator.results.reduce import summarize
    from simulator.results.run import Run
    from simulator.scenario.config import Scenario
    from simulator.scenario.loader import ScenarioError, load_scenario, scenario_hash

# loaded when first used, so that reading a scenario does not load the engine (numba,
# SimPy, pandas): ``servesim check`` and ``--help`` start in a fraction of a second
_WHERE = {
    "Result": "simulator.planning.runner",
    "Run": "simulator.results.run",
    "Scenario": "simulator.scenario.config",
    "ScenarioError": "simulator.scenario.loader",
    "load_scenario": "simulator.scenario.loader",
    "scenario_hash": "simulator.scenario.loader",
    "run": "simulator.planning.runner",
    "simulate": "simulator.engine",
    "summarize": "simulator.results.reduce",
}

__all__ = [
    "Result",
    "Run",
    "Scenario",
    "ScenarioError",
    "load_scenario",
    "run",
    "scenario_hash",
    "simulate",
    "summarize",
]


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'simulator' has no attribute {name!r}")
