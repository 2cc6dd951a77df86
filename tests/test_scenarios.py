"""Every shipped scenario loads and runs, its documented variants too, and each reproduces
the effect its header claims (directions and rough sizes from the seed articles)."""

from __future__ import annotations

import itertools
import shlex
from pathlib import Path

import pandas as pd
import pytest

from simulator.engine import simulate
from simulator.results.reduce import summarize
from simulator.scenario.loader import load_scenario

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((ROOT / "scenarios").rglob("*.yaml"))


def documented_commands(path: Path) -> list[list[str]]:
    """The ``servesim run`` lines in a scenario's header comment, continuation lines joined."""
    lines, cur = [], None
    for raw in path.read_text().splitlines():
        if not raw.startswith("#"):
            break
        text = raw.lstrip("#").strip()
        if cur is not None:
            cur += " " + text
        elif text.startswith("servesim run"):
            cur = text
        else:
            continue
        if cur.endswith("\\"):
            cur = cur[:-1]
            continue
        lines.append(shlex.split(cur.split("  #")[0]))
        cur = None
    return lines


def overrides(cmd: list[str]) -> list[str]:
    sets = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]
    if "--duration-s" in cmd:
        sets.append(f"duration_s={cmd[cmd.index('--duration-s') + 1]}")
    return sets


def p(path, sets=(), stat="p99", **short):
    s = load_scenario(path, list(sets) + [f"{k}={v}" for k, v in short.items()])
    return summarize(simulate(s))["latency_ms"]["e2e"][stat]


def test_every_scenario_is_documented():
    assert len(SCENARIOS) >= 7
    for path in SCENARIOS:
        head = path.read_text().splitlines()[0]
        assert head.startswith("# Question:"), f"{path.name} must open with the question it answers"


SHORT_RUN_S = {"llm_concurrency.yaml": 6.0}  # its first answers come after 2-3 s (no request before them)


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: str(p.relative_to(ROOT / "scenarios")))
def test_scenario_and_its_variants_run_short(path):
    commands = documented_commands(path) or [["servesim", "run", str(path)]]
    for cmd in commands:
        assert cmd[:2] == ["servesim", "run"]
        sets = [x for x in overrides(cmd) if not x.startswith("duration_s=")]
        s = load_scenario(path, [*sets, f"duration_s={SHORT_RUN_S.get(path.name, 1.5)}", "warmup_s=0.5"])
        out = summarize(simulate(s))
        assert out["requests"]["completed"] > 0, cmd


def test_recsys_feature_fetch_claims():
    path = ROOT / "scenarios/recsys_feature_fetch.yaml"
    base, halved, batched = (p(path, overrides(c)) for c in documented_commands(path))
    assert 300 < base < 500  # ~400 ms p99
    assert 5 < base - halved < 25  # halving model time saves ~10 ms
    assert batched < 0.4 * base  # batching the lookups removes most of it


def test_vision_gpu_decode_claim():
    path = ROOT / "scenarios/vision_preprocessing.yaml"
    cpu, gpu = (p(path, overrides(c), stat="p95") for c in documented_commands(path))
    assert gpu < 0.6 * cpu


def test_cv_degradation_claims():
    path = ROOT / "scenarios/cv_degradation.yaml"
    before, after, fixed, overload, shedding = (
        summarize(simulate(load_scenario(path, overrides(c)))) for c in documented_commands(path)
    )
    p95 = [r["latency_ms"]["e2e"]["p95"] for r in (before, after, fixed, overload, shedding)]
    assert 150 < p95[0] < 300
    assert p95[1] > 2.5 * p95[0]  # ~200 ms -> ~800 ms
    assert p95[2] < p95[0]
    assert p95[3] > 5_000  # unbounded queue growth
    assert p95[4] < 1_000  # the deadline bounds it: 500 ms in the queue at most, plus the batch
    shed = shedding["requests"]["timed_out"] / shedding["requests"]["arrived"]
    assert 0.03 < shed < 0.15  # ~9% over capacity is shed


def test_platform_headroom_claim():
    path = ROOT / "scenarios/inference_platform.yaml"
    sla = load_scenario(path).sla.target_ms
    assert p(path, duration_s=4, warmup_s=1) <= sla


def test_cache_ttl_claims():
    path = ROOT / "scenarios/cache_ttl.yaml"
    runs = {}
    for cmd in documented_commands(path):
        s = load_scenario(path, overrides(cmd))
        run = simulate(s)
        runs[s.caches.result.ttl_s] = (summarize(run), run)
    ttls = sorted(runs)
    hit = [runs[t][0]["caches"]["result"]["hit_ratio"] for t in ttls]
    p99 = [runs[t][0]["latency_ms"]["e2e"]["p99"] for t in ttls]
    assert ttls[0] == 1
    assert ttls[-1] == 3600
    assert all(b >= a - 0.005 for a, b in itertools.pairwise(hit))  # longer TTL, more hits
    assert hit[-1] > hit[0] + 0.3
    assert p99[-1] < p99[0]
    # the deploy at 300 s flushes the cache: the hit ratio in that second collapses
    tl = pd.DataFrame(runs[60][0]["timeline"]).set_index("t_s")
    assert tl.loc[300.0, "result_hit_ratio"] < 0.7 * tl.loc[290.0:299.0, "result_hit_ratio"].mean()


def test_autoscaling_claims():
    path = ROOT / "scenarios/autoscaling.yaml"
    base, warm, over = (summarize(simulate(load_scenario(path, overrides(c)))) for c in documented_commands(path))
    # during the cold-start lag the queue builds and requests are shed
    tl = pd.DataFrame(base["timeline"]).set_index("t_s")
    assert tl.loc[150.0:200.0, "queue_depth"].mean() > 100
    assert tl.loc[150.0:200.0, "warming_workers"].mean() > 5
    assert base["requests"]["rejected"] > 0
    assert warm["requests"]["rejected"] < 0.6 * base["requests"]["rejected"]  # the warm pool shortens the lag
    assert over["requests"]["rejected"] == 0  # capacity for the peak all along
    assert over["sla"]["met"]
    assert not base["sla"]["met"]


def test_canary_claims():
    path = ROOT / "scenarios/canary.yaml"
    own, shared, plain, rollout = (
        summarize(simulate(load_scenario(path, overrides(c)))) for c in documented_commands(path)
    )
    v2 = own["experiments"]["versions"]["ranker-v2"]
    assert 0.03 < v2["share"] < 0.05  # 5% of users until the rollback at 240 s
    assert v2["errors"] > 0
    assert own["experiments"]["shadow"]["gpu_cost_per_hour_usd"] > 0
    assert own["cost"]["per_hour_usd"] > plain["cost"]["per_hour_usd"]
    assert "primary_p99_ms" in shared["experiments"]["shadow"]
    assert rollout["experiments"]["versions"]["ranker-v2"]["share"] > 0.3


def test_noisy_neighbour_claims():
    path = ROOT / "scenarios/noisy_neighbour.yaml"
    runs = [summarize(simulate(load_scenario(path, overrides(c))))["classes"] for c in documented_commands(path)]
    base, quota, priority, dedicated, per_worker = runs
    assert not base["ranker"]["sla"]["met"]
    assert base["ranker"]["latency_ms"]["p99"] > 50
    for fixed in (quota, priority, dedicated):
        assert fixed["ranker"]["sla"]["met"]
        assert fixed["ranker"]["latency_ms"]["p99"] < 0.6 * base["ranker"]["latency_ms"]["p99"]
    assert quota["tagger"]["rejected"] > 2 * base["tagger"]["rejected"] > 0  # the quota sheds the tagger's excess
    assert priority["tagger"]["rejected"] < 0.5 * quota["tagger"]["rejected"]  # work-conserving
    assert per_worker["ranker"]["latency_ms"]["p99"] > 4 * quota["ranker"]["latency_ms"]["p99"]


def test_scale_to_zero_claims():
    path = ROOT / "scenarios/scale_to_zero.yaml"
    zero, warm, no_activator = (
        summarize(simulate(load_scenario(path, overrides(c)))) for c in documented_commands(path)
    )
    assert zero["requests"]["rejected"] == 0
    assert zero["latency_ms"]["e2e"]["p99"] > 10_000  # the wave's first requests wait out a cold start
    assert zero["cost"]["per_hour_usd"] < 0.8 * warm["cost"]["per_hour_usd"]  # nothing billed in the gap
    assert warm["sla"]["met"]
    assert no_activator["requests"]["rejected"] > 0.3 * no_activator["requests"]["arrived"]
    assert not any(e["event"] == "scale_up" for e in no_activator["fleet"]["events"])  # it never wakes up


def test_calibrated_cpu_resnet_claims():
    path = ROOT / "scenarios/calibrated_cpu_resnet.yaml"
    assert load_scenario(path).workers.service_time.kind in ("affine", "table")  # the profile, resolved
    six, eight, window = (summarize(simulate(load_scenario(path, overrides(c)))) for c in documented_commands(path))
    assert not six["sla"]["met"]
    assert eight["sla"]["met"]
    assert window["batch_size"]["mean"] > six["batch_size"]["mean"]
    assert not window["sla"]["met"]
