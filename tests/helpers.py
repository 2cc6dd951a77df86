"""Shared helpers: build scenarios in code."""

from __future__ import annotations

from pathlib import Path

import numpy as np

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


def chunked_against_plain(tmp_path: Path, doc: dict, factor: str):
    """``doc`` (an idle-test scenario with a ``workers.service_time`` factor named
    ``factor``) made busy: 3,000 requests at random gaps (mean 4 ms), two instances, 12 s.
    Asserts a run in 0.7 s chunks gives the whole run's responses; returns the batch times
    (ms) of the whole run and of the same arrivals without the factor."""
    import copy

    from simulator.engine import simulate, stream

    gaps = np.random.default_rng(5).exponential(4.0, 3000)
    np.savetxt(tmp_path / "arrivals.txt", np.cumsum(gaps) / 1000, fmt="%.6f")
    doc["workers"]["instances"] = 2
    doc["duration_s"] = 12
    s = Scenario.model_validate(doc)
    whole = simulate(s).records
    got = np.concatenate([p.records.t_response for p in stream(s, chunk_s=0.7)])
    np.testing.assert_array_equal(got, whole.t_response)
    plain = copy.deepcopy(doc)
    del plain["workers"]["service_time"][factor]
    if factor == "by_rate":  # and what it counts
        plain["workers"]["service_time"].pop("rate_of", None)
    alike = simulate(Scenario.model_validate(plain)).records
    assert np.array_equal(alike.arrival, whole.arrival)
    return whole.t_inferred - whole.t_dispatch, alike.t_inferred - alike.t_dispatch


def refusal(tmp_path: Path, doc: dict) -> str:
    """The one-line error that loading ``doc``, written as a YAML file, raises (it must
    raise :class:`~simulator.scenario.loader.ScenarioError`)."""
    import pytest
    import yaml

    from simulator.scenario.loader import ScenarioError, load_scenario

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    return str(err.value)


# a batch-time factor table that the scenario refuses, and a word of the reason (the tables
# share their check: simulator.scenario.servicetime.check_after_idle)
BAD_FACTOR_TABLES = [
    ("{1: 1.0}", "at least two"),
    ("{1: 1.0, 5: -1}", "factors must be finite and > 0"),
    ("{1: 1.0, 5: 0}", "factors must be finite and > 0"),
    ("{-1: 1, 5: 1}", ">= 0"),
]


def factor_table_refusal(field: str, value: str) -> str:
    """The error that ``scenarios/validation/mmc.yaml`` with a table batch time whose factor
    table ``field`` is ``value`` (YAML) raises (it must raise
    :class:`~simulator.scenario.loader.ScenarioError`)."""
    import pytest

    from simulator.scenario.loader import ScenarioError, load_scenario

    override = f"workers.service_time={{kind: table, batch_ms: {{1: 5}}, {field}: {value}}}"
    with pytest.raises(ScenarioError) as err:
        load_scenario(ROOT / "scenarios/validation/mmc.yaml", [override])
    return str(err.value)


# the head of a small scenario written as text (its lines numbered from 1 in refusals)
SCENARIO_HEAD = "name: x\nduration_s: 10\nsla: {percentile: 99, target_ms: 100}\ntraffic: {rate_rps: 10}\n"


def assert_refused_at_the_door(records) -> None:
    """Some requests refused (a full queue) and some not; a refused one has no response
    and a drop time."""
    refused = records.outcome == 1
    assert refused.any()
    assert (~refused).any()
    assert np.isnan(records.t_response[refused]).all()
    assert not np.isnan(records.t_dropped[refused]).any()
