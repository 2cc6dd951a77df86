"""simulator.run: the one way to run a scenario. Its parts agree with the engine and the
summary they compose, and what it refuses is refused before anything runs."""

from __future__ import annotations

import json

import pytest

import simulator
from simulator.engine import simulate
from simulator.planning.runner import prepare
from simulator.planning.sampling import sample_fleet, scale_summary
from simulator.results.reduce import summarize
from tests.helpers import ROOT, random_fleet

TIMINGS = ("wall_s", "requests_per_wall_s", "start_s", "simulate_s")


def _without_wall(x):
    """The summary less its wall times and numba's start, as text (NaN equal to NaN)."""

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in TIMINGS}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return json.dumps(strip(x), sort_keys=True, default=repr)


def _fleet(**kw):
    return random_fleet(**{"duration_s": 4.0, "warmup_s": 0.5, "traffic": {"rate_rps": 9_600}, **kw})


def test_a_whole_run_is_simulate_then_summarize():
    s = _fleet()
    got = simulator.run(s, sample=None, seed=7)
    assert got.sampled is None
    assert not got.streamed
    assert got.scenario.seed == 7
    want = summarize(simulate(s.model_copy(update={"seed": 7})))  # the seed is the scenario's: in its hash
    assert _without_wall(got.summary) == _without_wall(want)
    assert len(got.records) == got.summary["sim"]["requests"]
    assert len(got.timeline) == len(want["timeline"])


def test_a_sampled_run_is_the_samples_summary_restated_for_the_fleet():
    s = _fleet()
    got = simulator.run(s, sample=6)
    assert got.sampled == 6
    assert got.simulated.workers.count == 6
    want = scale_summary(summarize(simulate(sample_fleet(s, 6))), 24, 6)
    assert _without_wall(got.summary) == _without_wall(want)
    row = got.headline(workers_billed=24)
    assert row["cost_per_hour_usd"] == pytest.approx(24.0)
    assert row["completed_rps"] == pytest.approx(got.summary["requests"]["throughput_rps"])


def test_auto_samples_only_where_exact():
    s = _fleet(duration_s=30.0)  # 280k requests in the window: auto samples
    assert prepare(s).simulated.workers.count < 24
    shared = _fleet(duration_s=30.0, router={"balancing": "shared"})
    assert prepare(shared).simulated.workers.count == 24  # one shared queue: never sampled


def test_the_streamed_engine_gives_the_same_counts():
    s = simulator.load_scenario(ROOT / "scenarios/inference_platform.yaml", ["duration_s=1", "warmup_s=0.2"])
    whole = simulator.run(s, sample=None, chunk_s="whole", interval_s=None)
    streamed = simulator.run(s, sample=None, chunk_s=0.3)
    assert streamed.streamed
    assert streamed.run is None
    assert streamed.records is None
    assert streamed.summary["requests"] == whole.summary["requests"]
    assert whole.summary["timeline"] == []
    assert len(streamed.summary["timeline"]) > 0


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"sample": 5}, "fleet sampling would be wrong"),
        ({"sample": "some"}, "sample must be"),
        ({"chunk_s": "fast"}, "chunk_s must be"),
        ({"chunk_s": 0.0}, "chunk_s must be"),
    ],
)
def test_what_run_refuses_it_refuses_before_running(kw, words):
    s = simulator.load_scenario(ROOT / "scenarios/noisy_neighbour.yaml")
    with pytest.raises(ValueError, match=words):
        prepare(s, **kw)
