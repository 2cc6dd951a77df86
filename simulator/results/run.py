"""What one simulation run leaves: :class:`Run`, the engine's output and every summary's input."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simulator.ledger import BatchLog
from simulator.results.records import Records
from simulator.scenario.config import Scenario
from simulator.serving.lives import FleetLog


@dataclass
class Run:
    """One simulation run: its inputs, per-request records, batch log and cost of running.

    Attributes
    ----------
    scenario : Scenario
        The scenario simulated.
    seed : int
        The seed it ran with.
    records : Records
        One row per arrival: the time (ms) each stage ended, outcome, batch and instance.
    batches : BatchLog
        One row per batch of the primary pool: start and end (ms), size, instance.
    wall_s : float
        Wall-clock time the simulation took, s.
    fleet : FleetLog or None
        The workers' life cycle, when the fleet changes during the run (autoscaler,
        failures); None for a fixed fleet.
    pools : dict of str to BatchLog
        Batch logs of the other pools: the canary's, a shadow's own, or each traffic class's.
    shadow : dict of str to ndarray or None
        The shadow copies: source request, times (ms) and outcome; None without a shadow.
    response_without_shadow : ndarray or None
        Primary response times (ms) of the same run without shared-pool shadow copies,
        when ``router.shadow.measure_impact`` asks for them.
    """

    scenario: Scenario
    seed: int
    records: Records
    batches: BatchLog
    wall_s: float
    fleet: FleetLog | None = None  # when the fleet changes during the run
    pools: dict[str, BatchLog] = field(default_factory=dict)  # batch logs: canary, own shadow, or each class
    shadow: dict[str, np.ndarray] | None = None  # the shadow copies: source request, times, outcome
    response_without_shadow: np.ndarray | None = None  # primary responses in a run without shared shadow copies
