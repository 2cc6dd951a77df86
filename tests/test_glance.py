"""The dashboard's words and numbers (``dashboards/glance.py``): compact units, the SLA
verdict with its margin, drops, the overload flag, where latency lives, per-class verdicts."""

from __future__ import annotations

import pandas as pd
import pytest

from dashboards import glance
from simulator import load_scenario, simulate
from simulator.results.anatomy import stage_bands
from simulator.results.metrics import window
from simulator.results.reduce import summarize
from tests.helpers import ROOT


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.42, "0.42 ms"), (31.19, "31.2 ms"), (905.4, "905 ms"), (1057.0, "1.06 s"), (150_000.0, "2.5 min")],
)
def test_latencies_read_as_people_write_them(value, text):
    assert glance.ms(value) == text


def test_counts_money_and_changes_are_compact():
    assert [glance.count(x) for x in (940, 54_737, 1_200_000)] == ["940", "54.7k", "1.2M"]
    assert [glance.usd(x) for x in (0.739, 532.6, 12_800.0)] == ["$0.74", "$533", "$12.8k"]
    assert glance.change(0.0, glance.ms) is None  # no change: nothing to colour
    assert glance.change(12.5, glance.ms) == "+12.5 ms"
    assert glance.change(-3, lambda x: f"{x:,.0f}", unit=" workers") == "−3 workers"


def _summary(**sla) -> dict:
    return {
        "sla": {"percentile": 99.0, "target_ms": 150.0, "attained_ms": 31.0, "met": True, "attainment": 1.0, **sla},
        "requests": {"arrived": 449_930, "rejected": 0, "timed_out": 0, "failed": 0, "crashed": 0, "errors": 0},
        "utilization": {"of_peak_capacity": 0.6},
    }


def test_the_verdict_names_its_margin_and_the_drops():
    v = glance.verdict(_summary())
    assert v.headline == "SLA p99 ≤ 150 ms: met with 119 ms to spare"
    assert v.drops_text == "no requests dropped"
    s = _summary(attained_ms=1055.0, met=False, attainment=0.60)
    s["requests"]["rejected"] = 54_737
    v = glance.verdict(s)
    assert v.headline == "SLA p99 ≤ 150 ms: missed by 905 ms"
    assert v.drops_text == "54.7k rejected (12.2%)"
    # the percentile is within target, the drops are not
    v = glance.verdict(_summary(attained_ms=95.0, met=False, attainment=0.932))
    assert v.headline == "SLA p99 ≤ 150 ms: missed: 93.20% within target, drops included, short of the 99% needed"


def test_an_overloaded_fleet_is_flagged_unstable():
    """At 100% of peak capacity the p99 is finite only because the run ends."""
    s = _summary()
    s["utilization"]["of_peak_capacity"] = 1.0
    assert "100% of the fleet's peak capacity" in glance.verdict(s).unstable
    assert glance.verdict(_summary()).unstable is None
    # a queue that keeps growing through the window, below the peak-capacity line
    s = _summary()
    s["requests"]["window_s"] = 10.0
    s["workers"] = {"count": 4}
    s["batch_size"] = {"mean": 8.0}
    t = pd.DataFrame({"t_s": range(12), "queue_depth": [0, 0, *range(0, 1000, 100)]})
    assert "the queue grew from" in glance.instability(s, t)
    flat = t.assign(queue_depth=50.0)
    assert glance.instability(s, flat) is None


def test_a_real_overloaded_platform_is_flagged_and_a_healthy_one_is_not():
    def flag(workers: int):
        s = load_scenario(
            ROOT / "scenarios/inference_platform.yaml", ["duration_s=4", "warmup_s=1", f"workers.count={workers}"]
        )
        m = summarize(simulate(s))
        return glance.verdict(m, pd.DataFrame(m["timeline"])).unstable

    assert flag(130) is None
    assert flag(70) is not None  # 200k req/s need ~75 workers at their largest batch


def test_where_latency_lives_in_words():
    s = load_scenario(ROOT / "scenarios/inference_platform.yaml", ["duration_s=3", "warmup_s=1", "workers.count=76"])
    run = simulate(s)
    words = glance.latency_home(stage_bands(run.records, window(run.records, s)))
    assert words.startswith("Queueing is ")
    assert " of p99 (" in words


def test_each_traffic_class_gets_its_own_verdict():
    s = load_scenario(ROOT / "scenarios/noisy_neighbour.yaml", ["duration_s=20", "warmup_s=5"])
    table = glance.classes_table(summarize(simulate(s)))
    assert list(table["class"]) == ["ranker", "tagger"]
    assert list(table["SLA"]) == ["p99 ≤ 50 ms", "p99 ≤ 150 ms"]
    assert table["verdict"].str.match(r"^(met, .* to spare|missed.*)$").all()
    assert glance.classes_table(_summary()) is None
