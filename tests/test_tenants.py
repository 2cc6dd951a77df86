"""Traffic classes: priority against queueing theory, quotas and dedicated pools exactly,
and the per-class report."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.engine import simulate
from simulator.ledger import Outcome
from simulator.results.metrics import window
from simulator.results.reduce import summarize
from simulator.rng import streams
from simulator.scenario.config import Scenario
from simulator.serving.classes import serve_classes
from tests.helpers import ROOT, scenario
from tests.test_theory import check
from tests.theory import mg1_priority_waits, mmc_mean_wait, mmc_priority_waits


def _exp(mean_ms: float) -> dict:
    return {"kind": "exponential", "mean_ms": mean_ms}


def _class_waits(s: Scenario, reps: int, first_seed: int) -> list[list[float]]:
    """Mean queue wait of each class in each replication."""
    out = []
    for seed in range(first_seed, first_seed + reps):
        run = simulate(s, seed=seed)
        rec = run.records
        mask = window(rec, s) & rec.completed
        wait = rec.stage_ms("queue")
        out.append([wait[mask & (rec.traffic_class == c)].mean() for c in range(len(s.traffic.classes))])
    return out


def _duration(lam_per_ms: float, n: int) -> dict:
    d = n / (lam_per_ms * 1000)
    return {"duration_s": d, "warmup_s": d * 0.1}


def test_priority_classes_match_cobham_mg1():
    """Realtime before bulk on one instance: each class's mean wait is Cobham's formula."""
    lams, means = [0.3, 0.2], [1.0, 2.0]  # per ms, ms: rho 0.3 + 0.4
    s = scenario(
        traffic={
            "classes": {
                "rt": {"rate_rps": lams[0] * 1000, "service_time": _exp(means[0])},
                "bulk": {"rate_rps": lams[1] * 1000, "service_time": _exp(means[1]), "priority": "bulk"},
            }
        },
        **_duration(sum(lams), 120_000),
    )
    waits = np.array(_class_waits(s, reps=8, first_seed=4100))
    expected = mg1_priority_waits(lams, means, [2 * m * m for m in means])
    for c, name in enumerate(("realtime", "bulk")):
        check(waits[:, c], expected[c], f"M/G/1 priority, {name} mean wait")
    assert expected[1] > 3 * expected[0]  # the check has teeth: the classes differ a lot


def test_priority_classes_match_mmc_priority_formula():
    """Three priority levels would need more kinds; two on four instances sharing a queue."""
    lams, mu, c = [0.12, 0.2], 0.1, 4  # rho = 0.8
    s = scenario(
        traffic={
            "classes": {
                "rt": {"rate_rps": lams[0] * 1000},
                "bulk": {"rate_rps": lams[1] * 1000, "priority": "bulk"},
            }
        },
        workers={"count": 1, "instances": c, "service_time": _exp(1 / mu)},
        **_duration(sum(lams), 100_000),
    )
    waits = np.array(_class_waits(s, reps=8, first_seed=4200))
    expected = mmc_priority_waits(c, lams, mu)
    for k, name in enumerate(("realtime", "bulk")):
        check(waits[:, k], expected[k], f"M/M/4 priority, {name} mean wait")


def test_equal_priority_classes_share_one_fcfs_queue():
    """Two realtime classes with the same model on a shared queue are one M/M/4: FCFS
    across the per-class queues (oldest head first) gives Erlang C's mean wait to both."""
    lams, mu, c = [0.2, 0.12], 0.1, 4
    s = scenario(
        traffic={"classes": {"a": {"rate_rps": lams[0] * 1000}, "b": {"rate_rps": lams[1] * 1000}}},
        workers={"count": 1, "instances": c, "service_time": _exp(1 / mu)},
        **_duration(sum(lams), 100_000),
    )
    waits = np.array(_class_waits(s, reps=8, first_seed=4300))
    expected = mmc_mean_wait(c, sum(lams), mu)
    check(waits[:, 0], expected, "class a wait, M/M/4 FCFS")
    check(waits[:, 1], expected, "class b wait, M/M/4 FCFS")


def _micro(a: dict, b: dict) -> Scenario:
    return scenario(
        traffic={"classes": {"a": {"rate_rps": 1, **a}, "b": {"rate_rps": 1, **b}}},
        workers={"count": 1, "instances": 2, "service_time": {"kind": "deterministic", "value_ms": 10.0}},
    )


T_PRE = np.array([0.0, 0.0, 0.0, 0.0, 0.5])  # four of class a at once, one of class b just after
KLASS = np.array([0, 0, 0, 0, 1], dtype=np.int8)


@pytest.mark.parametrize(
    ("a", "b", "dispatch"),
    [
        ({}, {}, [0, 0, 10, 10, 20]),  # FCFS: b waits behind the whole burst
        ({"priority": "bulk"}, {}, [0, 0, 10, 20, 10]),  # realtime b jumps the bulk queue
        ({"max_instances": 1}, {}, [0, 10, 20, 30, 0.5]),  # a holds one instance; b gets the other
    ],
    ids=["fcfs", "priority", "quota"],
)
def test_exact_dispatch_log(a, b, dispatch):
    s = _micro(a, b)
    cols, log, logs = serve_classes(s, T_PRE, KLASS, None, streams(0))
    assert cols[0].tolist() == dispatch
    assert cols[1].tolist() == [t + 10 for t in dispatch]
    assert (cols[4] == Outcome.COMPLETED).all()
    assert len(logs["a"].start) == 4
    assert len(logs["b"].start) == 1
    assert sorted(log.start.tolist()) == sorted(dispatch)


def _concurrency(start: np.ndarray, end: np.ndarray) -> int:
    t = np.concatenate([start, end])
    step = np.concatenate([np.ones(len(start)), -np.ones(len(end))])
    order = np.lexsort((step, t))  # at equal times, leave before arriving
    return int(np.cumsum(step[order]).max()) if len(t) else 0


@pytest.mark.parametrize("balancing", ["shared", "random"])
def test_quota_caps_instances_and_batches_hold_one_class(balancing):
    s = scenario(
        duration_s=20.0,
        router={"balancing": balancing},
        traffic={
            "classes": {
                "spiky": {"rate_rps": 3000, "max_instances": 3},
                "steady": {"rate_rps": 600, "service_time": {"kind": "affine", "base_ms": 3.0, "per_item_ms": 0.4}},
            }
        },
        batching={"max_batch_size": 8, "max_queue_delay_ms": 2.0, "max_queue_size": 64},
        workers={"count": 4, "instances": 2, "service_time": {"kind": "affine", "base_ms": 4.0, "per_item_ms": 0.5}},
    )
    run = simulate(s)
    spiky = run.pools["spiky"]
    assert _concurrency(spiky.start, spiky.end) == 3  # the quota binds, and holds
    rec = run.records
    done = rec.completed
    # a batch never mixes classes: each (instance, dispatch time) holds one class
    key = rec.instance[done] * 1e9 + rec.t_dispatch[done]
    _, first = np.unique(key, return_index=True)
    per_batch = np.unique(np.stack([key, rec.traffic_class[done]]), axis=1)
    assert per_batch.shape[1] == len(first)
    # conservation: every arrival completed or was shed, counted once
    assert set(np.unique(rec.outcome)) <= {Outcome.COMPLETED, Outcome.REJECTED}
    assert done.sum() == sum(log.size.sum() for log in run.pools.values())
    assert (rec.outcome[rec.traffic_class == 0] == Outcome.REJECTED).any()  # the spike overflows its quota


def test_dedicated_pool_isolates_a_class_exactly():
    """A class on its own pool sees the same requests and the same times whatever its
    neighbour does: its arrivals and service draws come from its own streams."""

    def run(rate_a: float):
        s = scenario(
            duration_s=5.0,
            router={"balancing": "random"},
            traffic={"classes": {"a": {"rate_rps": rate_a}, "b": {"rate_rps": 300, "workers": 2}}},
            batching={"max_batch_size": 4, "max_queue_delay_ms": 1.0},
            workers={"count": 2, "service_time": {"kind": "affine", "base_ms": 2.0, "per_item_ms": 0.5}},
        )
        rec = simulate(s).records
        b = rec.traffic_class == 1
        return rec.arrival[b], rec.t_response[b], rec.instance[b]

    quiet, busy = run(100.0), run(900.0)
    for x, y in zip(quiet, busy, strict=True):
        np.testing.assert_array_equal(x, y)


def test_summary_per_class_sla_and_gpu_shares():
    s = scenario(
        duration_s=20.0,
        warmup_s=2.0,
        router={"balancing": "random"},
        sla={"percentile": 99, "target_ms": 25},
        traffic={
            "classes": {
                "ranker": {"rate_rps": 800},
                "embed": {
                    "rate_rps": 400,
                    "priority": "bulk",
                    "sla": {"percentile": 95, "target_ms": 500},
                    "service_time": {"kind": "affine", "base_ms": 6.0, "per_item_ms": 1.0},
                },
                "batch": {"rate_rps": 100, "workers": 1},
            }
        },
        batching={"max_batch_size": 8, "max_queue_delay_ms": 2.0},
        workers={"count": 4, "service_time": {"kind": "affine", "base_ms": 4.0, "per_item_ms": 0.5}},
        cost={"price_per_hour_usd": 2.0},
    )
    out = summarize(simulate(s))
    cl = out["classes"]
    assert list(cl) == ["ranker", "embed", "batch"]
    assert cl["embed"]["sla"]["target_ms"] == 500
    assert cl["ranker"]["sla"]["target_ms"] == 25
    assert cl["batch"]["pool"] == "own"
    assert cl["batch"]["cost_per_hour_usd"] == 2.0
    shared = cl["ranker"]["gpu_share"] + cl["embed"]["gpu_share"]
    assert shared == pytest.approx(out["utilization"]["workers"], rel=1e-9)
    assert cl["ranker"]["cost_per_hour_usd"] + cl["embed"]["cost_per_hour_usd"] == pytest.approx(4 * 2.0)
    assert out["cost"]["per_hour_usd"] == pytest.approx(5 * 2.0)  # the shared pool plus batch's own worker
    assert sum(c["requests"] for c in cl.values()) == out["requests"]["arrived"]
    assert cl["ranker"]["throughput_rps"] == pytest.approx(800, rel=0.1)


@pytest.mark.parametrize(
    ("traffic", "workers", "message"),
    [
        ({"rate_rps": 10, "classes": {"a": {"rate_rps": 1}}}, {}, "drop traffic.rate_rps"),
        ({"classes": {"a": {}}}, {}, "needs rate_rps"),
        ({"classes": {"a": {"rate_rps": 1, "max_instances": 3}}}, {"instances": 2}, "exceeds the shared pool"),
        ({"classes": {"a": {"rate_rps": 1, "workers": 2}}}, {}, "leave one on the shared pool"),
        ({"classes": {"a": {"rate_rps": 1, "workers": 2, "max_instances": 1}}}, {}, "own workers has none"),
        ({"classes": {"a": {"rate_rps": 1, "priority": "urgent"}}}, {}, "realtime"),
    ],
)
def test_bad_classes_are_refused(traffic, workers, message):
    with pytest.raises(ValueError, match=message):
        scenario(traffic=traffic, workers={"count": 1, "service_time": _exp(1.0), **workers})


def test_a_bad_quota_names_its_field_and_line(tmp_path):
    from simulator.scenario.loader import ScenarioError, load_scenario

    text = (ROOT / "scenarios/noisy_neighbour.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("      payload_kb: 16\n", "      payload_kb: 16\n      max_instances: 12\n"))
    line = bad.read_text().splitlines().index("      max_instances: 12") + 1
    with pytest.raises(ScenarioError, match=rf"line {line}: traffic\.classes\.tagger\.max_instances: .*exceeds"):
        load_scenario(bad)
