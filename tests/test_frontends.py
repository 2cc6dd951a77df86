"""Several front ends, each an event loop, and their hub (``preprocess.relay``,
simulator/serving/frontends.py)."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.engine import simulate
from simulator.scenario.config import Scenario
from simulator.scenario.loader import ScenarioError, load_scenario
from tests.helpers import SCENARIO_HEAD, assert_refused_at_the_door

RELAY = {"respond_ms": 0.3, "hub_return_ms": 0.05, "hub_answer_ms": 0.1}


def _doc(rate: float, relay: dict | None = RELAY, *, fronts: int = 2, batch: int = 8, window: float = 2.0,
         service: dict | None = None, **extra) -> dict:  # fmt: skip
    d = {
        "name": "relay",
        "seed": 3,
        "duration_s": 40,
        "warmup_s": 1,
        "sla": {"percentile": 99, "target_ms": 100},
        "traffic": {"rate_rps": rate},
        "preprocess": {
            "service": service or {"kind": "exponential", "mean_ms": 1.0},
            "cpu_workers": fronts,
            "dispatch": "round_robin",
            "hub": {"kind": "deterministic", "value_ms": 0.1},
        },
        "batching": {"max_batch_size": batch, "max_queue_delay_ms": window},
        "workers": {
            "count": 1,
            "instances": 1,
            "service_time": {"kind": "table", "batch_ms": {"1": 3, "8": 5}, "noise_cv": 0.05},
        },
        "cost": {"price_per_hour_usd": 1},
        **extra,
    }
    if relay is not None:
        d["preprocess"]["relay"] = relay
    return d


def _replay(tmp_path, times_s, **kw):
    path = tmp_path / "arrivals.txt"
    np.savetxt(path, np.asarray(times_s), fmt="%.6f")
    doc = _doc(1.0, **kw)
    doc["traffic"] = {"arrivals_file": str(path)}
    doc["workers"]["service_time"]["noise_cv"] = 0.0
    doc["warmup_s"] = 0
    return simulate(Scenario.model_validate(doc)).records


def test_an_isolated_request_goes_through_each_job_in_turn(tmp_path):
    """Requests 100 ms apart never meet: read on their front end, taken in by the hub, the
    window, computed, its outputs taken in and answered by the hub, written by the front
    end."""
    rec = _replay(tmp_path, np.arange(1, 30) * 0.1, service={"kind": "deterministic", "value_ms": 1.0})
    np.testing.assert_allclose(rec.t_preprocessed - rec.arrival, 1.0 + 0.1, atol=1e-9)
    np.testing.assert_allclose(rec.t_dispatch - rec.t_preprocessed, 2.0, atol=1e-9)
    np.testing.assert_allclose(rec.t_inferred - rec.t_dispatch, 3.0, atol=1e-9)
    np.testing.assert_allclose(
        rec.t_response - rec.t_inferred, 0.05 + 0.1 + 0.3, atol=1e-9
    )  # taken in, answered, written
    assert (rec.batch_size == 1).all()


def test_an_answer_waits_for_its_front_end_busy_with_another_request(tmp_path):
    """Two front ends, requests dealt in turn, 1 ms to read each: requests 0 and 2 share
    front end 0. Request 0 (at 100 ms) is queued at 101.1, its batch of one goes at once
    (no window) and is computed at 104.1, answered by the hub at 104.25. Request 2 came at
    103.5: its front end reads it until 104.5, so request 0's response is written from
    104.5 to 104.8, where alone (or with four front ends) it is written by 104.55."""
    times = [0.1, 0.1005, 0.1035]
    one = {"kind": "deterministic", "value_ms": 1.0}
    alone = _replay(tmp_path, times[:1], window=0.0, service=one)
    assert alone.t_response[0] - alone.arrival[0] == pytest.approx(104.55 - 100.0)
    rec = _replay(tmp_path, times, window=0.0, service=one)
    assert rec.t_inferred[0] == pytest.approx(104.1)
    assert rec.t_response[0] == pytest.approx(104.8)
    apart = _replay(tmp_path, times, window=0.0, fronts=4, service=one)
    assert apart.t_response[0] == pytest.approx(104.55)  # on a front end of its own, request 2 leaves it alone


def test_a_batchs_answers_leave_the_hub_in_its_order(tmp_path):
    """Eight requests at once on eight front ends make one batch (full at eight): the
    hub takes its outputs in, then sends the answers one after the other, 0.1 ms each."""
    rec = _replay(tmp_path, [0.1] * 8, fronts=8, service={"kind": "deterministic", "value_ms": 1.0})
    assert (rec.batch_size == 8).all()
    back = rec.t_inferred[0]
    np.testing.assert_allclose(np.sort(rec.t_response - back), 0.05 + 0.1 * np.arange(1, 9) + 0.3, atol=1e-9)


def test_the_way_in_is_the_stations_model_and_the_way_back_waits_for_busy_front_ends():
    """With a hub that takes no time and nothing to do on the way back, the way in is the
    stations' model request for request (the dealt queues, the same draws, the same
    batches), and a response waits only when its answer finds its front end reading
    another request: about as often as a front end is busy (900 req/s over three, 1 ms
    each: 30%)."""
    free = {"respond_ms": 0.0, "hub_return_ms": 0.0, "hub_answer_ms": 0.0}
    docs = [_doc(900, r, fronts=3) for r in (free, None)]
    for d in docs:
        d["preprocess"]["hub"] = {"kind": "deterministic", "value_ms": 0.0}
    a, b = (simulate(Scenario.model_validate(d)).records for d in docs)
    for col in ("t_preprocessed", "t_dispatch", "t_inferred", "batch_size"):
        np.testing.assert_allclose(getattr(a, col), getattr(b, col), rtol=1e-12, atol=1e-9)
    np.testing.assert_array_equal(b.t_response, b.t_inferred)
    wait = a.t_response - a.t_inferred
    assert (wait >= 0).all()
    assert 0.25 < np.mean(wait > 1e-9) < 0.35
    waited = wait > 1e-9  # each is written the moment the read in progress ends (a request queued then)
    assert np.isin(np.round(a.t_response[waited], 9), np.round(a.t_preprocessed, 9)).all()


def test_the_way_back_adds_its_wait_at_load_and_not_when_alone():
    """At load, answers wait for busy front ends and for each other: the time from a
    batch's end to its response grows with the load, beyond the work on the way back."""
    after = []
    for rate in (100, 1200):
        rec = simulate(Scenario.model_validate(_doc(rate, fronts=4))).records
        ok = rec.completed
        after.append(np.mean((rec.t_response - rec.t_inferred)[ok]))
    assert after[0] < 0.3 + 0.1 * 2.0  # alone: the write and an answer or two
    assert after[1] > after[0] + 0.2


def test_same_seed_same_records_and_chunks_as_one_run():
    """The same seed gives the same records; a run in 0.7-s chunks hands out the same
    records as one chunk, the server keeping only what it has not answered."""
    from simulator.engine import _Run, stream

    doc = _doc(900, fronts=3, platform={"speed": {"kind": "log_ar1", "components": [
        {"sigma": 0.1, "correlation_time_s": 1.0}]}})  # fmt: skip
    doc["batching"]["max_queue_size"] = 64
    s = Scenario.model_validate(doc)
    whole = simulate(s).records
    again = simulate(s).records
    for col in ("t_preprocessed", "t_dispatch", "t_inferred", "t_response"):
        np.testing.assert_array_equal(getattr(whole, col), getattr(again, col))
    got = np.concatenate([p.records.t_response for p in stream(s, chunk_s=0.7)])
    np.testing.assert_array_equal(got, whole.t_response)
    run = _Run(s, s.seed)
    held = []
    for k in range(1, 41):
        run.chunk(k * 1000.0, k == 40)
        held.append(run.loop.server.n)
    assert max(held) < 60
    assert held[-1] == 0


def test_a_full_queue_refuses_at_the_hub():
    doc = _doc(3000, fronts=4, service={"kind": "exponential", "mean_ms": 0.5})
    doc["batching"]["max_queue_size"] = 8
    rec = simulate(Scenario.model_validate(doc)).records
    assert_refused_at_the_door(rec)


BASE = SCENARIO_HEAD
WORKERS = "workers: {count: 1, service_time: {kind: deterministic, value_ms: 5}}\n"


@pytest.mark.parametrize(
    ("pre", "words"),
    [
        ("  cpu_workers: 4\n  dispatch: round_robin\n  relay: {respond_ms: 0.2}\n",
         "line 9: preprocess.relay: .*needs preprocess.hub"),
        ("  cpu_workers: 4\n  hub: {kind: deterministic, value_ms: 0.1}\n  relay: {respond_ms: 0.2}\n",
         "preprocess.relay: .*dispatch: round_robin"),
        ("  cpu_workers: 4\n  dispatch: round_robin\n  hub: {kind: deterministic, value_ms: 0.1}\n"
         "  relay: {respond_ms: -1}\n", "line 10: preprocess.relay.respond_ms"),
    ],
)  # fmt: skip
def test_a_relay_it_cannot_run_is_refused_naming_its_line(pre, words):
    text = BASE + "preprocess:\n  service: {kind: deterministic, value_ms: 0.3}\n" + pre + WORKERS
    with pytest.raises(ScenarioError, match=words):
        load_scenario("x.yaml", text=text)


def test_a_relay_with_a_queue_per_worker_is_refused():
    text = (BASE + "preprocess:\n  service: {kind: deterministic, value_ms: 0.3}\n  cpu_workers: 2\n"
            "  dispatch: round_robin\n  hub: {kind: deterministic, value_ms: 0.1}\n  relay: {}\n"
            "workers: {count: 2, service_time: {kind: deterministic, value_ms: 5}}\n"
            "router: {balancing: random}\n")  # fmt: skip
    with pytest.raises(ScenarioError, match=r"preprocess.relay models front ends .*a batch queue per worker"):
        load_scenario("x.yaml", text=text)
