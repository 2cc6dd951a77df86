"""``service_time.rate_of: arrivals``: ``by_rate``'s average counts the requests that reached
the batch queue (each instance its share), not the batches taken. By formula on each
scheduler from the simulated enqueue times, the same whole or in chunks, blind to the
instance's own speed, and refused without ``by_rate``."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest

from simulator.engine import simulate
from simulator.scenario.config import Scenario
from tests.helpers import chunked_against_plain, refusal
from tests.test_after_idle import _doc as idle_doc

TABLE = {"0": 1.4, "100": 1.0, "400": 0.8}
TAU = 50.0
SCHEDULERS = [
    (True, None),  # the event loop's dispatch
    (False, {"max_batch_size": 8, "max_queue_delay_ms": 2}),  # the compiled batcher
    (False, {"max_batch_size": 8, "max_queue_delay_ms": 2, "deadline_ms": 500}),  # the SimPy scheduler
]


def _doc(tmp_path, loop: bool, batching: dict | None, instances: int = 1, scale: float = 1.0) -> dict:
    """Bursts: 400 requests at random gaps (mean 5 ms, some 80 ms lulls), batch times
    ``scale`` × 6 ms (one) to 11 ms (eight), by_rate on arrivals over TAU ms."""
    d = idle_doc(tmp_path, loop, None, batching)
    rng = np.random.default_rng(7)
    gaps = np.where(rng.random(400) < 0.05, 80.0, rng.exponential(5.0, 400))
    np.savetxt(tmp_path / "arrivals.txt", np.cumsum(gaps) / 1000, fmt="%.6f")
    d["duration_s"] = 10
    d["workers"]["instances"] = instances
    d["workers"]["service_time"] = {
        "kind": "table",
        "batch_ms": {"1": 6 * scale, "8": 11 * scale},
        "by_rate": TABLE,
        "rate_window_ms": TAU,
        "rate_of": "arrivals",
    }
    return d


def _factor(rate_rps: np.ndarray) -> np.ndarray:
    knots = sorted(TABLE, key=float)
    return np.interp(rate_rps, [float(k) for k in knots], [TABLE[k] for k in knots])


def _batches(doc: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each batch's time (its instance's, before a loop takes it back), the time the
    table gives its size (6 ms for one to 11 for eight) and the factor by formula: the
    table at the average of the enqueue times up to its dispatch, requests a second over
    TAU ms, over the instances."""
    got = simulate(Scenario.model_validate(doc))
    rec, log = got.records, got.batches
    assert rec.completed.sum() == 400
    enq = np.sort(rec.t_preprocessed[rec.completed])
    assert np.isfinite(enq).all()
    ran = (log.end if log.computed is None else log.computed) - log.start
    nominal = 6 + (log.size - 1) * 5 / 7
    instances = doc["workers"]["instances"]
    rate = np.array([np.exp(-(t - enq[enq <= t]) / TAU).sum() / TAU * 1000 / instances for t in log.start])
    return ran, nominal, _factor(rate)


@pytest.mark.parametrize(("loop", "batching"), SCHEDULERS)
@pytest.mark.parametrize("instances", [1, 2])
def test_each_batch_runs_at_the_factor_of_the_arrivals_before_it(tmp_path, loop, batching, instances):
    ran, nominal, factor = _batches(_doc(tmp_path, loop, batching, instances))
    np.testing.assert_allclose(ran, nominal * factor, rtol=1e-9, atol=1e-9)
    assert factor.max() - factor.min() > 0.15  # the bursts run fast, the lulls slow


@pytest.mark.parametrize(("loop", "batching"), SCHEDULERS)
def test_the_average_does_not_read_the_hosts_own_speed(tmp_path, loop, batching):
    """Batches twice as long take fewer, larger batches from the same arrivals; counting
    arrivals, each batch reads the arrivals' average at its dispatch in both runs
    (counting batches, the slower host would read its own lower throughput)."""
    for scale in (1.0, 2.0):
        ran, nominal, factor = _batches(_doc(tmp_path, loop, batching, scale=scale))
        np.testing.assert_allclose(ran, scale * nominal * factor, rtol=1e-9, atol=1e-9)


def test_a_run_cut_in_chunks_is_the_whole_run(tmp_path):
    doc = idle_doc(tmp_path, True, None)
    doc["workers"]["service_time"] |= {"by_rate": {"0": 1.3, "50": 1.0, "300": 0.9}, "rate_of": "arrivals"}
    took, plain = chunked_against_plain(tmp_path, doc, "by_rate")
    assert np.nanmean(took) < np.nanmean(plain)


def test_a_run_can_start_from_a_rate(tmp_path):
    """``rate_initial_rps`` is each instance's share as of time 0: the first batch reads it
    decayed to its dispatch, its own arrival added."""
    doc = _doc(tmp_path, False, {"max_batch_size": 8, "max_queue_delay_ms": 2})
    doc["workers"]["service_time"]["rate_initial_rps"] = 300.0
    rec = simulate(Scenario.model_validate(doc)).records
    first = int(np.argmin(rec.t_dispatch))
    t, e = rec.t_dispatch[first], rec.t_preprocessed[first]
    rate = 300.0 * math.exp(-t / TAU) + 1000 / TAU * math.exp(-(t - e) / TAU)
    want = 6 * np.interp(rate, [0, 100, 400], [1.4, 1.0, 0.8])
    assert rec.t_inferred[first] - t == pytest.approx(want, rel=1e-9)


def test_rate_of_without_by_rate_or_unknown_is_refused(tmp_path):
    doc = _doc(tmp_path, False, None)
    bare = copy.deepcopy(doc)
    del bare["workers"]["service_time"]["by_rate"]
    msg = refusal(tmp_path, bare)
    assert "rate_of" in msg
    assert "by_rate" in msg
    doc["workers"]["service_time"]["rate_of"] = "requests"
    msg = refusal(tmp_path, doc)
    assert "rate_of" in msg
    assert "arrivals" in msg


def test_traffic_classes_share_one_average_of_their_arrivals():
    """Two priority classes on one instance (the SimPy class scheduler): each batch runs at
    the factor of both classes' arrivals before it."""
    from tests.helpers import scenario

    s = scenario(
        duration_s=4.0,
        warmup_s=0.0,
        traffic={
            "classes": {"hi": {"rate_rps": 60, "priority": "realtime"}, "lo": {"rate_rps": 90, "priority": "bulk"}}
        },
        batching={"max_batch_size": 8, "max_queue_delay_ms": 2.0},
        workers={
            "count": 1,
            "instances": 1,
            "service_time": {
                "kind": "table",
                "batch_ms": {"1": 6, "8": 11},
                "by_rate": TABLE,
                "rate_window_ms": TAU,
                "rate_of": "arrivals",
            },
        },
    )
    rec = simulate(s).records
    done = rec.completed
    assert set(np.unique(rec.traffic_class[done])) == {0, 1}
    enq = np.sort(rec.t_preprocessed[done])
    disp, size = rec.t_dispatch[done], rec.batch_size[done]
    rate = np.array([np.exp(-(t - enq[enq <= t]) / TAU).sum() / TAU * 1000 for t in disp])
    want = (6 + (size - 1) * 5 / 7) * _factor(rate)
    np.testing.assert_allclose((rec.t_inferred - rec.t_dispatch)[done], want, rtol=1e-9, atol=1e-9)


def test_the_calibrations_average_is_the_simulators(tmp_path):
    """calibrate.idle.arrival_rate over a run's enqueue times, read at its batches'
    dispatch, is the rate the simulated batches ran at."""
    from calibrate.idle import arrival_rate

    got = simulate(Scenario.model_validate(_doc(tmp_path, False, {"max_batch_size": 8, "max_queue_delay_ms": 2})))
    rec, log = got.records, got.batches
    rate = arrival_rate(rec.t_preprocessed[rec.completed], log.start, TAU)
    np.testing.assert_allclose(log.end - log.start, (6 + (log.size - 1) * 5 / 7) * _factor(rate), rtol=1e-9)


def test_the_fit_reads_each_slice_from_none_and_carries_the_run_between_them():
    """Two slices of a server's log, two instances: within a slice, each batch's rate is
    its instance's share of the requests enqueued in the slice up to its dispatch; as a
    slice begins, the share of every request enqueued before, decayed."""
    import pandas as pd

    from calibrate.idle import rate_before, slice_start_rates

    enq = np.array([0.0, 10.0, 20.0, 1000.0, 1010.0])  # ms
    disp = np.array([5.0, 25.0, 25.0, 1012.0, 1012.0])
    df = pd.DataFrame(
        {
            "slice": [0, 0, 0, 1, 1],
            "enqueued_at_ns": enq * 1e6,
            "dispatched_at_ns": disp * 1e6,
            "batch_size": [1, 2, 2, 2, 2],
            "instance": [0, 1, 1, 0, 0],
        }
    )
    rate, since = rate_before(df, 100.0, kind="arrivals")

    def share(t, before):
        return sum(np.exp(-(t - a) / 100.0) for a in before) / 100.0 * 1000 / 2

    want = [share(5, [0]), share(25, [0, 10, 20]), share(25, [0, 10, 20]), share(1012, [1000, 1010])]
    np.testing.assert_allclose(rate, [*want, want[-1]], rtol=1e-12)
    np.testing.assert_allclose(since, [0, 20, 20, 0, 0])
    starts = slice_start_rates(df, 100.0, "arrivals")
    assert starts[0] == pytest.approx(share(5, [0]))
    assert starts[1] == pytest.approx(share(1012, [0, 10, 20, 1000, 1010]))
    assert rate_before(df.drop(columns="enqueued_at_ns"), 100.0, kind="arrivals") is None  # no enqueue clock


EPYC = Path(__file__).resolve().parent.parent / "calibrate/profiles/cpu-resnet64-epyc"


def test_the_fit_counts_arrivals_when_told_and_batches_by_default(monkeypatch):
    """On the committed EPYC run's fitted levels: by default the batch time's by_rate counts
    batches over 500 ms, as the profile was fitted; with calibrate.idle.RATE_OF = "arrivals"
    it counts the enqueued requests over 125 ms, its bands at the fitted levels' arrival
    rates, and the scenario it makes runs."""
    import json

    import pandas as pd

    from calibrate import fit, idle
    from calibrate.scenario import scenario_dict

    profile = json.loads((EPYC / "profile.json").read_text())
    requests = pd.read_csv(EPYC / "measurements.csv.gz")
    fit_levels = [f["level"] for f in profile["fit_levels"]]
    service, _ = fit.fit_batch_time(fit.fitted_requests(requests, fit_levels))
    assert "rate_of" not in service
    assert service["rate_window_ms"] == 500.0
    assert service["by_rate"] == {float(k): v for k, v in profile["service_time"]["by_rate"].items()}
    monkeypatch.setattr(idle, "RATE_OF", "arrivals")
    service, _ = fit.fit_batch_time(fit.fitted_requests(requests, fit_levels))
    assert service["rate_of"] == "arrivals"
    assert service["rate_window_ms"] == idle.ARRIVALS_WINDOW_MS
    rates = sorted(float(k) for k in service["by_rate"])
    assert 0.3 * min(p["rate_rps"] for p in profile["fit_levels"]) < rates[0] < rates[-1]
    assert rates[-1] < 1.5 * max(p["rate_rps"] for p in profile["fit_levels"])
    fitted = {**profile, "service_time": {**profile["service_time"], **service}}
    doc = scenario_dict(fitted, 200.0, duration_s=2.0, warmup_s=0.5)
    assert doc["workers"]["service_time"]["rate_of"] == "arrivals"
    rec = simulate(Scenario.model_validate(doc)).records
    assert rec.completed.sum() > 300


def test_the_experiment_reads_every_candidate_on_a_committed_run():
    """calibrate/experiments/rate_source.py on the committed EPYC run: the share of time
    computing by formula, and every candidate judged at every held-out load."""
    from calibrate.experiments import rate_source

    busy = rate_source.busy_share(np.array([0.0, 10.0, 30.0]), np.array([10.0, 20.0, 40.0]), 10.0)
    first = 1 - math.exp(-1)  # busy for one time constant, read as it ends
    np.testing.assert_allclose(busy, [0.0, first, (first * math.exp(-1) + first) * math.exp(-1)])
    b = rate_source.batches(EPYC)
    assert b is not None
    rows = rate_source.judge(b)
    got = {(r["candidate"], r["load"]) for r in rows}
    assert {c for c, _ in got} == {f"{k} {t:.0f}" for k, t in rate_source.CANDIDATES}
    assert {0.2, 0.5, 0.7, 0.85} <= {ld for _, ld in got}
    assert all(np.isfinite(r["within"]) for r in rows)
