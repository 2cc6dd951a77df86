"""servesim's simulator: a discrete-event model of an ML inference serving system.

Public API::

    from simulator import load_scenario, simulate, summarize
    run = simulate(load_scenario("scenarios/inference_platform.yaml"))
    print(summarize(run)["latency_ms"]["e2e"])
"""

from simulator.engine import simulate
from simulator.results.metrics import summarize
from simulator.results.run import Run
from simulator.scenario.config import Scenario
from simulator.scenario.loader import ScenarioError, load_scenario, scenario_hash

__all__ = ["Run", "Scenario", "ScenarioError", "load_scenario", "scenario_hash", "simulate", "summarize"]
