"""The front end as one event loop (``preprocess.event_loop``, simulator/serving/event_loop.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from simulator.engine import simulate
from simulator.scenario.config import Scenario
from simulator.scenario.loader import load_scenario
from tests.helpers import SCENARIO_HEAD, assert_refused_at_the_door


def _doc(rate: float, loop: dict | None, **extra) -> dict:
    d = {
        "name": "loop",
        "seed": 3,
        "duration_s": 40,
        "warmup_s": 1,
        "sla": {"percentile": 99, "target_ms": 100},
        "traffic": {"rate_rps": rate},
        "preprocess": {"service": {"kind": "exponential", "mean_ms": 0.4}, "cpu_workers": 1},
        "batching": {"max_batch_size": 8, "max_queue_delay_ms": 2},
        "workers": {
            "count": 1,
            "instances": 1,
            "service_time": {"kind": "table", "batch_ms": {"1": 6, "8": 11}, "noise_cv": 0.05},
        },
        "cost": {"price_per_hour_usd": 1},
        **extra,
    }
    if loop is not None:
        d["preprocess"]["event_loop"] = loop
    return d


def test_an_isolated_request_goes_through_each_job_in_turn(tmp_path):
    """Requests 100 ms apart never meet: each is admitted, waits the window, is computed,
    taken back and answered, each job's time exactly after the last."""
    times = np.arange(1, 40) * 0.1
    path = tmp_path / "arrivals.txt"
    np.savetxt(path, times, fmt="%.6f")
    loop = {"return_ms": 0.15, "respond_per_batch_ms": 0.2, "respond_per_request_ms": 0.1}
    doc = _doc(1.0, loop, router={"overhead": {"kind": "deterministic", "value_ms": 1.0}})
    doc["traffic"] = {"arrivals_file": str(path)}
    doc["preprocess"]["service"] = {"kind": "deterministic", "value_ms": 0.4}
    doc["workers"]["service_time"]["noise_cv"] = 0.0
    rec = simulate(Scenario.model_validate(doc)).records
    np.testing.assert_allclose(rec.t_preprocessed - rec.arrival, 1.4, atol=1e-9)
    np.testing.assert_allclose(rec.t_dispatch - rec.t_preprocessed, 2.0, atol=1e-9)
    np.testing.assert_allclose(rec.t_inferred - rec.t_dispatch, 6.0 + 0.15, atol=1e-9)  # computed, then taken back
    np.testing.assert_allclose(rec.t_response - rec.t_inferred, 0.2 + 0.1, atol=1e-9)
    assert (rec.batch_size == 1).all()


def _phase(rec, batches) -> np.ndarray:
    """Share of queue arrivals in each tenth of the batch then running (busy instance)."""
    start, end = batches.start, batches.end
    enq = np.sort(rec.t_preprocessed[~np.isnan(rec.t_preprocessed)])
    k = np.searchsorted(start, enq, side="right") - 1
    busy = (k >= 0) & (enq < end[np.maximum(k, 0)])
    frac = (enq[busy] - start[k[busy]]) / (end[k[busy]] - start[k[busy]])
    counts = np.histogram(frac, bins=10, range=(0, 1))[0]
    return counts / counts.mean()


def test_the_responses_couple_arrivals_to_the_batch_cycle():
    """The measured signature (calibrate/README, "The light-load gap"): with the responses on
    the loop, requests reach the queue rarely right after a batch begins (the loop writes
    the last batch's responses) and often just before it ends (the batch waits for the
    loop to take it back); a loop that costs nothing after the batch is nearly uniform."""
    plain = simulate(Scenario.model_validate(_doc(330, {"return_ms": 0.0})))
    busy = simulate(
        Scenario.model_validate(
            _doc(330, {"return_ms": 0.15, "respond_per_batch_ms": 0.2, "respond_per_request_ms": 0.25})
        )
    )
    p0, p1 = _phase(plain.records, plain.batches), _phase(busy.records, busy.batches)
    assert 0.8 < p0[0] < 1.2
    assert p1[0] < 0.7
    assert p1[-1] > 1.15
    assert p1[0] < p0[0]
    assert p1[-1] > p0[-1]


def test_the_loop_queue_is_an_m_m_1_when_nothing_else_runs_on_it():
    """Admissions alone on the loop (nothing after the batch costs it time, batches short
    and unbatched): the time to the queue is the M/M/1 sojourn 1/(μ − λ) within its
    replications' 99% interval."""
    lam, mean = 1.0, 0.5  # per ms, ms: ρ = 0.5
    got = []
    for seed in range(8):
        doc = _doc(lam * 1000, {}, seed=seed, duration_s=20)
        doc["preprocess"]["service"] = {"kind": "exponential", "mean_ms": mean}
        doc["batching"] = {"max_batch_size": 64, "max_queue_delay_ms": 0}
        doc["workers"]["service_time"] = {"kind": "table", "batch_ms": {"1": 0.001, "64": 0.001}, "noise_cv": 0.0}
        doc["workers"]["instances"] = 4
        rec = simulate(Scenario.model_validate(doc)).records
        keep = rec.arrival > 1000
        got.append(np.mean((rec.t_preprocessed - rec.arrival)[keep]))
    theory = 1 / (1 / mean - lam)
    half = 2.998 * np.std(got, ddof=1) / np.sqrt(len(got))  # t(7), 99%
    assert abs(np.mean(got) - theory) < half + 0.01 * theory, (np.mean(got), theory, half)


def test_same_seed_same_records():
    loop = {"return_ms": 0.1, "respond_per_batch_ms": 0.1, "respond_per_request_ms": 0.1}
    s = Scenario.model_validate(_doc(400, loop, platform={"speed": {"kind": "log_ar1", "components": [
        {"sigma": 0.1, "correlation_time_s": 1.0}]}}))  # fmt: skip
    a, b = simulate(s).records, simulate(s).records
    for col in ("t_preprocessed", "t_dispatch", "t_inferred", "t_response"):
        np.testing.assert_array_equal(getattr(a, col), getattr(b, col))


def test_a_full_queue_refuses_at_the_door():
    doc = _doc(2000, {"respond_per_request_ms": 0.05})
    doc["preprocess"]["service"] = {"kind": "exponential", "mean_ms": 0.1}
    doc["batching"]["max_queue_size"] = 16
    rec = simulate(Scenario.model_validate(doc)).records
    assert_refused_at_the_door(rec)


BASE = SCENARIO_HEAD
LOOP = "preprocess:\n  service: {kind: deterministic, value_ms: 0.3}\n  cpu_workers: %d\n  event_loop: {}\n"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (LOOP % 2 + "workers: {service_time: {kind: deterministic, value_ms: 5}}\n",
         "line 8: preprocess.event_loop: .*cpu_workers: 1"),
        (LOOP % 1 + "workers: {count: 2, service_time: {kind: deterministic, value_ms: 5}}\n"
         "router: {balancing: round_robin}\n", "a batch queue per worker"),
        ("preprocess:\n  service: {kind: deterministic, value_ms: 0.3}\n  dispatch: round_robin\n"
         "workers: {count: 1, service_time: {kind: deterministic, value_ms: 5}}\n",
         "line 7: preprocess.dispatch: .*round_robin .*set cpu_workers"),
        (LOOP % 1 + "  hub: {kind: deterministic, value_ms: 0.2}\n"
         "workers: {count: 1, service_time: {kind: deterministic, value_ms: 5}}\n",
         "line 9: preprocess.hub: .*preprocess.hub and preprocess.event_loop: the event loop is the one process"),
        ("preprocess:\n  service: {kind: deterministic, value_ms: 0.3}\n  cpu_workers: 2\n  dispatch: in_turn\n"
         "workers: {count: 1, service_time: {kind: deterministic, value_ms: 5}}\n", "preprocess.dispatch"),
    ],
)  # fmt: skip
def test_what_it_does_not_combine_with_is_said_before_the_run(text, words):
    from simulator.scenario.loader import ScenarioError

    with pytest.raises(ScenarioError, match=words):
        load_scenario("x.yaml", text=BASE + text)


def test_the_loop_runs_in_chunks_holding_only_what_is_not_answered():
    """A run of the loop in 1-s chunks hands out its records as it goes
    (the ledger holds about a chunk's worth), the same records as one chunk, and the loop
    itself keeps only the requests and batches not answered yet."""
    from simulator.engine import _Run, stream

    s = Scenario.model_validate(_doc(400, {"return_ms": 0.3, "respond_per_batch_ms": 0.1}))
    whole = simulate(s).records
    pieces = list(stream(s, chunk_s=1.0))
    assert len(pieces) == 40
    assert max(len(p.records) for p in pieces) < 0.05 * len(whole)  # ~400 of 16,000 a chunk
    got = np.concatenate([p.records.t_response for p in pieces])
    np.testing.assert_array_equal(got, whole.t_response)
    run = _Run(s, s.seed)  # the loop itself, between chunks: only what it has not answered
    in_loop = []
    for k in range(1, 41):
        run.chunk(k * 1000.0, k == 40)
        in_loop.append(run.loop.server.n)
    assert max(in_loop) < 50
    assert in_loop[-1] == 0


def test_the_fit_recovers_the_loop_from_the_server_clocks():
    """Synthetic clocks with a known loop: after the batch, per_batch + per_request (k − 1)/2;
    the hand-back's light-load median; the loop's CPU per request kept, the hand-back
    counted once (it was twice: in the admission and in its own job)."""
    from calibrate.fit import fit_event_loop
    from simulator.scenario.path import Preprocess

    rng = np.random.default_rng(0)
    rows = []
    for lv, n in ((1, 3000), (3, 3000)):
        for b in range(n // 3):
            k = int(rng.integers(1, 6))
            back = 150 + rng.exponential(20)
            for j in range(k):
                recv = b * 20_000_000 + j * 10_000
                rows.append({
                    "level": lv, "slice": lv, "batch_size": k, "received_at_ns": recv,
                    "enqueued_at_ns": recv + 300_000, "dispatched_at_ns": b * 20_000_000 + 5_000_000,
                    "queue_us": 1000.0, "compute_infer_us": 6000.0, "handoff_us": 100 + back, "handoff_in_us": 100.0,
                    "request_us": 300 + 1000 + 6000 + 100 + back + 200 + 250 * j,
                })  # fmt: skip
    df = pd.DataFrame(rows)
    lowest = df[df["level"] == 1]
    service = 0.4 + rng.exponential(0.3, len(lowest))
    loop = fit_event_loop(df, lowest, service, 1.0 + rng.exponential(0.5, len(lowest)), rng=rng)
    assert loop["respond_per_batch_ms"] == pytest.approx(0.2, abs=0.01)
    assert loop["respond_per_request_ms"] == pytest.approx(0.25, abs=0.01)
    assert loop["return_ms"] == pytest.approx(0.15 + 20 * np.log(2) / 1e3, abs=0.005)
    # and the light level's hand-backs whole, for the draws (mean 0.17 ms, the median below it)
    drawn = Preprocess(service={k: v for k, v in loop["return_time"].items() if k != "fit"}).service
    assert drawn.mean == pytest.approx(0.17, abs=0.004)
    per_request_batches = df.drop_duplicates(["slice", "dispatched_at_ns"]).shape[0] / len(df)

    admit = Preprocess(service={k: v for k, v in loop["admit"].items() if k != "fit"}).service.mean
    # the loop's CPU kept: admissions, responses, and each batch's resumption and hand-back
    jobs = admit + 0.25 + (0.2 + loop["return_ms"]) * per_request_batches
    assert jobs == pytest.approx(service.mean(), rel=0.02)
    assert fit_event_loop(df.drop(columns=["received_at_ns"]), lowest, service, service, rng=rng) is None


def _awaiting(rate: float, fetch: dict, resume_ms: float = 0.05) -> dict:
    """The loop with a handler that awaits its feature fetch mid-way (``resume_ms``)."""
    doc = _doc(rate, {"return_ms": 0.1, "respond_per_batch_ms": 0.1, "respond_per_request_ms": 0.05,
                      "resume_ms": resume_ms})  # fmt: skip
    doc["features"] = {"lookups_per_request": 26, "batch_size": 26, "round_trip": fetch}
    return doc


def test_a_handler_that_awaits_its_fetch_leaves_the_loop_to_the_others_meanwhile(tmp_path):
    """Two requests 0.1 ms apart, each read in 0.3 ms of loop work, then a 0.5 ms fetch off
    the loop, then 0.05 ms to resume and queue: the second is read while the first's fetch
    runs, and each is queued when its own reply is handled (100.85 and 101.15 ms), where a
    fetch before the admission queues them at 100.85 and 101.2."""
    path = tmp_path / "arrivals.txt"
    np.savetxt(path, [0.1, 0.1001, 0.5], fmt="%.6f")
    doc = _awaiting(1.0, {"kind": "deterministic", "value_ms": 0.5})
    doc["traffic"] = {"arrivals_file": str(path)}
    doc["preprocess"]["service"] = {"kind": "deterministic", "value_ms": 0.3}
    doc["warmup_s"] = 0
    rec = simulate(Scenario.model_validate(doc)).records
    np.testing.assert_allclose(rec.t_preprocessed, [100.85, 101.15, 500.85], atol=1e-9)
    np.testing.assert_allclose(rec.t_features, [100.8, 101.1, 500.8], atol=1e-9)  # when each fetch was back
    assert list(rec.batch_size) == [2, 2, 1]
    doc["preprocess"]["event_loop"]["resume_ms"] = None  # the fetch first, then one admission job
    doc["preprocess"]["service"]["value_ms"] = 0.35
    rec = simulate(Scenario.model_validate(doc)).records
    np.testing.assert_allclose(rec.t_preprocessed, [100.85, 101.2, 500.85], atol=1e-9)


def test_awaited_fetches_answer_in_order_and_clump_at_the_queue():
    """Fetches of random length (Redis answers one connection's commands in order): the
    requests reach the batch queue in the order they were read, and the short resumptions
    bunch them there (queue-arrival gaps under 0.05 ms) where one admission job after the
    fetch spaces them by its own length."""
    doc = _awaiting(1500.0, {"kind": "exponential", "mean_ms": 0.3})
    doc["preprocess"]["service"] = {"kind": "deterministic", "value_ms": 0.3}
    rec = simulate(Scenario.model_validate(doc)).records
    done = ~np.isnan(rec.t_preprocessed)
    order = np.argsort(rec.arrival[done], kind="stable")
    assert (np.diff(rec.t_preprocessed[done][order]) >= 0).all()
    gaps = np.diff(np.sort(rec.t_preprocessed[done]))
    doc["preprocess"]["event_loop"]["resume_ms"] = None  # the same loop work in one job after the fetch
    doc["preprocess"]["service"]["value_ms"] = 0.35
    before = simulate(Scenario.model_validate(doc)).records
    gaps_before = np.diff(np.sort(before.t_preprocessed[~np.isnan(before.t_preprocessed)]))
    assert (gaps < 0.05).mean() > 0.05
    assert (gaps_before < 0.05).mean() < 0.01


def test_a_run_cut_in_chunks_awaits_its_fetches_as_one_run():
    from simulator.engine import stream

    s = Scenario.model_validate(_awaiting(1500.0, {"kind": "exponential", "mean_ms": 0.3}))
    whole = simulate(s).records
    got = np.concatenate([p.records.t_response for p in stream(s, chunk_s=0.7)])
    np.testing.assert_array_equal(got, whole.t_response)


@pytest.mark.parametrize(
    ("features", "found"),
    [
        ({"lookups_per_request": 0}, "features.lookups_per_request above 0"),
        ({"lookups_per_request": 4, "store": {"threads": 1, "per_op_ms": 0.1}}, "no features.store"),
        (
            {
                "lookups_per_request": 4,
                "round_trip": {"kind": "deterministic", "value_ms": 1},
                "timeout_ms": 5,
                "on_timeout": "fail",
            },
            "features.on_timeout: default",
        ),
    ],
)
def test_a_handler_awaiting_a_fetch_needs_one_it_can_await(features, found):
    doc = _awaiting(100.0, {"kind": "deterministic", "value_ms": 0.5})
    doc["features"] = features
    with pytest.raises(ValueError, match=rf"preprocess.event_loop.resume_ms awaits .*{found}"):
        Scenario.model_validate(doc)


def _late_timer(late: dict | None, times: list[float], tmp_path) -> pd.DataFrame:
    """Requests at ``times`` (s) through a 2 ms window whose timer fires ``late``."""
    return _at(_doc(1.0, {"return_ms": 0.1, "timer_late": late}), times, 0.4, tmp_path)


def _at(doc: dict, times: list[float], read_ms: float, tmp_path):
    """``doc`` run on requests at ``times`` (s), each read in ``read_ms``, batches without noise."""
    path = tmp_path / "arrivals.txt"
    np.savetxt(path, times, fmt="%.6f")
    doc["traffic"] = {"arrivals_file": str(path)}
    doc["preprocess"]["service"] = {"kind": "deterministic", "value_ms": read_ms}
    doc["workers"]["service_time"]["noise_cv"] = 0.0
    doc["warmup_s"] = 0
    return simulate(Scenario.model_validate(doc)).records


def test_the_window_timer_fires_late_but_a_later_request_closes_the_window_at_once(tmp_path):
    """A lone request waits the window and the timer's lateness (2 + 0.3 ms); a second one
    queued after the window's due time but before the late timer fires wakes the batcher,
    which sends both at once (the reference server's batcher checks the clock on every
    arrival); one queued before the due time waits for the timer with the first."""
    late = {"kind": "deterministic", "value_ms": 0.3}
    rec = _late_timer(late, [0.1, 0.2], tmp_path)
    np.testing.assert_allclose(rec.t_dispatch - rec.t_preprocessed, 2.3, atol=1e-9)
    rec = _late_timer(late, [0.1, 0.1021, 0.5], tmp_path)  # the second queued 2.1 ms after the first
    np.testing.assert_allclose(rec.t_dispatch[:2], rec.t_preprocessed[1], atol=1e-9)
    assert list(rec.batch_size) == [2, 2, 1]
    rec = _late_timer(late, [0.1, 0.1015, 0.5], tmp_path)  # queued 1.5 ms after: both wait for the timer
    np.testing.assert_allclose(rec.t_dispatch[:2], rec.t_preprocessed[0] + 2.3, atol=1e-9)
    rec = _late_timer(None, [0.1, 0.2], tmp_path)
    np.testing.assert_allclose(rec.t_dispatch - rec.t_preprocessed, 2.0, atol=1e-9)


def test_the_timer_lateness_is_drawn_per_window_and_a_chunked_run_draws_the_same():
    """A fast instance, so that a lone request's window is closed by its timer: its wait
    past the 2 ms window is the draw, an exponential of mean 0.4 ms (on time: none)."""
    from simulator.engine import stream

    doc = _doc(50.0, {"return_ms": 0.1, "timer_late": {"kind": "exponential", "mean_ms": 0.4}})
    doc["workers"]["service_time"] = {"kind": "deterministic", "value_ms": 0.5}
    s = Scenario.model_validate(doc)
    rec = simulate(s).records
    wait = rec.t_dispatch - rec.t_preprocessed
    lone = (rec.batch_size == 1) & (wait >= 2.0)
    assert np.mean(wait[lone] - 2.0) == pytest.approx(0.4, rel=0.1)
    assert np.percentile(wait[lone] - 2.0, 99) > 1.2  # the exponential's tail, not a constant
    doc["preprocess"]["event_loop"].pop("timer_late")
    on_time = simulate(Scenario.model_validate(doc)).records
    on_wait = on_time.t_dispatch - on_time.t_preprocessed
    assert np.nanmean(wait) > np.nanmean(on_wait) + 0.1
    assert np.percentile(on_wait[(on_time.batch_size == 1) & (on_wait >= 2.0)] - 2.0, 99) < 0.5
    got = np.concatenate([p.records.t_response for p in stream(s, chunk_s=0.7)])
    np.testing.assert_array_equal(got, rec.t_response)


def test_the_hand_back_is_drawn_per_batch_and_a_chunked_run_draws_the_same():
    """Requests 100 ms apart: each batch of one is taken back in a draw of ``return_time``
    (an exponential of mean 0.3 ms: its mean and its tail, not a constant), the draws
    follow the seed, and a run cut in chunks draws the same; a deterministic draw is
    ``return_ms`` to the bit."""
    from simulator.engine import stream

    doc = _doc(1.0, {"return_time": {"kind": "exponential", "mean_ms": 0.3}, "respond_per_batch_ms": 0.2})
    doc["traffic"] = {"rate_rps": 10.0}
    doc["duration_s"] = 200
    doc["workers"]["service_time"] = {"kind": "deterministic", "value_ms": 5.0}
    s = Scenario.model_validate(doc)
    rec = simulate(s).records
    lone = rec.batch_size == 1
    back = (rec.t_inferred - rec.t_dispatch)[lone] - 5.0
    assert back.mean() == pytest.approx(0.3, rel=0.1)
    assert np.percentile(back, 99) > 1.0
    assert back.min() < 0.05
    got = np.concatenate([p.records.t_response for p in stream(s, chunk_s=3.0)])
    np.testing.assert_array_equal(got, rec.t_response)
    other = simulate(s, seed=4).records
    assert not np.array_equal(other.t_inferred - other.t_dispatch, rec.t_inferred - rec.t_dispatch)
    fixed = {"return_time": {"kind": "deterministic", "value_ms": 0.3}, "respond_per_batch_ms": 0.2}
    const = {"return_ms": 0.3, "respond_per_batch_ms": 0.2}
    a = simulate(Scenario.model_validate({**doc, "preprocess": {**doc["preprocess"], "event_loop": fixed}})).records
    b = simulate(Scenario.model_validate({**doc, "preprocess": {**doc["preprocess"], "event_loop": const}})).records
    np.testing.assert_array_equal(a.t_response, b.t_response)


def test_a_drawn_hand_back_and_a_constant_one_are_refused_together_naming_the_line(tmp_path):
    import yaml

    from simulator.scenario.loader import ScenarioError

    path = tmp_path / "s.yaml"
    loop = {"return_ms": 0.1, "return_time": {"kind": "exponential", "mean_ms": 0.3}}
    path.write_text(yaml.safe_dump(_doc(100.0, loop), sort_keys=False))
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    text = str(err.value)
    assert "preprocess.event_loop.return_time" in text
    assert "set one of them" in text
    assert "line " in text


def test_a_late_timer_needs_a_window():
    doc = _doc(100.0, {"timer_late": {"kind": "deterministic", "value_ms": 0.3}})
    doc["batching"]["max_queue_delay_ms"] = 0
    with pytest.raises(ValueError, match=r"preprocess.event_loop.timer_late .* needs a window"):
        Scenario.model_validate(doc)


def _three_awaiting(reads_first: bool, tmp_path) -> pd.DataFrame:
    """A read at 100 ms, a second request at 100.45 (while the first's fetch is out), a
    third at 100.6: 0.3 ms reads, 0.2 ms fetches, 0.05 ms resumptions."""
    path = tmp_path / "arrivals.txt"
    np.savetxt(path, [0.1, 0.10045, 0.1006], fmt="%.7f")
    doc = _awaiting(1.0, {"kind": "deterministic", "value_ms": 0.2})
    doc["preprocess"]["event_loop"]["reads_first"] = reads_first
    doc["traffic"] = {"arrivals_file": str(path)}
    doc["preprocess"]["service"] = {"kind": "deterministic", "value_ms": 0.3}
    doc["warmup_s"] = 0
    return simulate(Scenario.model_validate(doc)).records


def test_reads_first_holds_a_resumption_while_a_request_waits_to_be_read(tmp_path):
    """In the order jobs became ready, the first request's resumption (its fetch back at
    100.5) goes before the third's read (ready at 100.6) when the second's read ends at
    100.75: queued at 100.8, 101.15, 101.35. With reads first the third is read first
    (100.75-101.05), then the resumptions in the order their fetches came back: 101.1,
    101.15, and the third's at 101.3."""
    rec = _three_awaiting(False, tmp_path)
    np.testing.assert_allclose(rec.t_preprocessed, [100.8, 101.15, 101.35], atol=1e-9)
    rec = _three_awaiting(True, tmp_path)
    np.testing.assert_allclose(rec.t_preprocessed, [101.1, 101.15, 101.3], atol=1e-9)
    np.testing.assert_allclose(rec.t_features, [100.5, 100.95, 101.25], atol=1e-9)  # the fetches as before


def test_reads_first_lengthens_the_wait_of_a_bursts_first_requests_and_runs_in_chunks():
    from simulator.engine import stream

    doc = _awaiting(1500.0, {"kind": "exponential", "mean_ms": 0.3})
    doc["preprocess"]["service"] = {"kind": "deterministic", "value_ms": 0.3}
    fifo = simulate(Scenario.model_validate(doc)).records
    doc["preprocess"]["event_loop"]["reads_first"] = True
    s = Scenario.model_validate(doc)
    first = simulate(s).records

    def waited(r) -> float:  # from the fetch back to the request queued, p99
        return float(np.nanpercentile(r.t_preprocessed - r.t_features, 99))

    assert waited(first) > 1.5 * waited(fifo)
    got = np.concatenate([p.records.t_response for p in stream(s, chunk_s=0.7)])
    np.testing.assert_array_equal(got, first.t_response)


def test_reads_first_ms_bounds_how_long_reads_go_before_a_resumption(tmp_path):
    """Requests at 100, 100.3, 100.55, 100.65 and 100.75 ms, 0.3 ms reads, 0.2 ms fetches:
    the first's fetch is back at 100.5, while the second is read (to 100.6). In the order
    jobs became ready it resumes at 100.6 (queued 100.65); with reads first only after the
    three later reads (101.5, queued 101.55); with reads first for 0.45 ms, the reads that
    start before 100.95 go first (100.6 and 100.9), then it resumes at 101.2."""
    path = tmp_path / "arrivals.txt"
    np.savetxt(path, [0.1, 0.1003, 0.10055, 0.10065, 0.10075], fmt="%.7f")

    def first_queued(**loop) -> float:
        doc = _awaiting(1.0, {"kind": "deterministic", "value_ms": 0.2})
        doc["preprocess"]["event_loop"].update(loop)
        doc["traffic"] = {"arrivals_file": str(path)}
        doc["preprocess"]["service"] = {"kind": "deterministic", "value_ms": 0.3}
        doc["warmup_s"] = 0
        return float(simulate(Scenario.model_validate(doc)).records.t_preprocessed[0])

    assert first_queued() == pytest.approx(100.65, abs=1e-9)
    assert first_queued(reads_first=True) == pytest.approx(101.55, abs=1e-9)
    assert first_queued(reads_first=True, reads_first_ms=0.45) == pytest.approx(101.25, abs=1e-9)
    assert first_queued(reads_first=True, reads_first_ms=0.05) == pytest.approx(100.65, abs=1e-9)


def test_reads_first_ms_needs_reads_first():
    doc = _awaiting(100.0, {"kind": "deterministic", "value_ms": 0.2})
    doc["preprocess"]["event_loop"]["reads_first_ms"] = 0.5
    with pytest.raises(ValueError, match=r"reads_first_ms .* needs preprocess.event_loop.reads_first: true"):
        Scenario.model_validate(doc)


def test_reads_first_needs_a_handler_that_awaits_its_fetch():
    doc = _doc(100.0, {"reads_first": True})
    with pytest.raises(ValueError, match=r"preprocess.event_loop.reads_first .* needs preprocess.event_loop.resume_ms"):
        Scenario.model_validate(doc)


def test_a_read_whose_fetch_is_out_does_not_close_the_window(tmp_path):
    """The server's batcher looks at its queue when a request is queued, an instance frees
    or its timer fires. The first request is queued at 100.55 ms (0.3 ms read, 0.2 ms fetch,
    0.05 ms resumption), its window due at 102.55 and its timer 0.5 ms late; the second's
    read ends at 102.9, after the due time, with its fetch still out: the first goes when the
    timer fires (103.05), alone, and not when that read ends."""
    path = tmp_path / "arrivals.txt"
    np.savetxt(path, [0.1, 0.1026], fmt="%.7f")
    doc = _awaiting(1.0, {"kind": "deterministic", "value_ms": 0.2})
    doc["preprocess"]["event_loop"]["timer_late"] = {"kind": "deterministic", "value_ms": 0.5}
    doc["traffic"] = {"arrivals_file": str(path)}
    doc["preprocess"]["service"] = {"kind": "deterministic", "value_ms": 0.3}
    doc["warmup_s"] = 0
    rec = simulate(Scenario.model_validate(doc)).records
    np.testing.assert_allclose(rec.t_preprocessed, [100.55, 103.15], atol=1e-9)
    np.testing.assert_allclose(rec.t_dispatch[0], 103.05, atol=1e-9)
    assert list(rec.batch_size) == [1, 1]


def test_the_loops_work_grows_with_the_requests_it_holds(tmp_path):
    """Five requests at once, 0.4 ms reads, each job's time × (1 + 0.1 × the others read and
    held, ``held_counts: read``):
    the k-th is queued 0.4 × (k + 0.1 k(k−1)/2) ms after it came (the batch comes back
    after all five are read); with 0, 0.4 k. Requests 100 ms apart never meet: unchanged.
    The count of requests held carries from one chunk of a run to the next."""
    from simulator.engine import stream

    path = tmp_path / "arrivals.txt"
    np.savetxt(path, [0.1] * 5, fmt="%.6f")
    got = {}
    for k in (0.0, 0.1):
        loop = {"return_ms": 0.15, "respond_per_batch_ms": 0.2, "cost_per_in_flight": k, "held_counts": "read"}
        doc = _doc(1.0, loop)
        doc["traffic"] = {"arrivals_file": str(path)}
        doc["preprocess"]["service"] = {"kind": "deterministic", "value_ms": 0.4}
        doc["warmup_s"] = 0
        got[k] = simulate(Scenario.model_validate(doc)).records
    n = np.arange(1, 6)
    np.testing.assert_allclose(np.sort(got[0.0].t_preprocessed - got[0.0].arrival), 0.4 * n, atol=1e-9)
    np.testing.assert_allclose(np.sort(got[0.1].t_preprocessed - got[0.1].arrival), 0.4 * (n + 0.05 * n * (n - 1)))
    apart = tmp_path / "apart.txt"
    np.savetxt(apart, np.arange(1, 40) * 0.1, fmt="%.6f")
    recs = []
    for k in (0.0, 0.5):
        doc = _doc(1.0, {"return_ms": 0.15, "respond_per_batch_ms": 0.2, "cost_per_in_flight": k})
        doc["traffic"] = {"arrivals_file": str(apart)}
        recs.append(simulate(Scenario.model_validate(doc)).records)
    np.testing.assert_array_equal(recs[0].t_response, recs[1].t_response)
    loop = {"return_ms": 0.15, "respond_per_request_ms": 0.1}
    plain = simulate(Scenario.model_validate(_doc(150.0, loop))).records
    s = Scenario.model_validate(_doc(150.0, {**loop, "cost_per_in_flight": 0.05}))
    more = simulate(s).records
    assert np.nanmean(more.t_response - more.arrival) > np.nanmean(plain.t_response - plain.arrival)
    chunked = np.concatenate([p.records.t_response for p in stream(s, chunk_s=0.7)])
    np.testing.assert_array_equal(chunked, more.t_response)


def test_the_loops_work_follows_a_measured_factor_by_the_count_held(tmp_path):
    """Five requests at once, 0.4 ms reads, ``cost_by_held`` {2: 1, 4: 1.5} over the requests
    read (``held_counts: read``): the k-th read
    starts with k held (itself counted), so it takes 0.4 × the factor at k (1 at 1 and 2,
    1.25 at 3, 1.5 at 4 and 5: flat beyond the counts given); a table of ones changes nothing."""
    path = tmp_path / "arrivals.txt"
    np.savetxt(path, [0.1] * 5, fmt="%.6f")
    got = {}
    for name, by in (("ones", {2: 1.0, 4: 1.0}), ("rise", {2: 1.0, 4: 1.5})):
        doc = _doc(1.0, {"return_ms": 0.15, "respond_per_batch_ms": 0.2, "cost_by_held": by, "held_counts": "read"})
        doc["traffic"] = {"arrivals_file": str(path)}
        doc["preprocess"]["service"] = {"kind": "deterministic", "value_ms": 0.4}
        doc["warmup_s"] = 0
        got[name] = simulate(Scenario.model_validate(doc)).records
    np.testing.assert_allclose(np.sort(got["ones"].t_preprocessed - got["ones"].arrival), 0.4 * np.arange(1, 6))
    reads = 0.4 * np.cumsum([1.0, 1.0, 1.25, 1.5, 1.5])
    np.testing.assert_allclose(np.sort(got["rise"].t_preprocessed - got["rise"].arrival), reads)


@pytest.mark.parametrize(
    ("by", "extra", "message"),
    [
        ({32: 1.0}, {}, "at least two counts"),
        ({0: 1.0, 32: 1.1}, {}, "1 or more"),
        ({32: 1.0, 64: 0.0}, {}, "above 0 and at most 10"),
        ({32: 1.0, 64: 1.1}, {"cost_per_in_flight": 0.001}, "not both"),
    ],
)
def test_a_bad_factor_by_held_is_refused_naming_its_line(tmp_path, by, extra, message):
    import yaml

    from simulator.scenario.loader import ScenarioError

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_doc(100.0, {"return_ms": 0.1, "cost_by_held": by, **extra}), sort_keys=False))
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    text = str(err.value)
    assert message in text
    assert "preprocess.event_loop" in text
    assert "line " in text


def test_the_requests_waiting_to_be_read_count_as_held_when_asked(tmp_path):
    """``held_counts: arrived``: five requests at once, 0.4 ms reads, 0.1 a request held:
    every read starts with all five in the server (read or waiting to be read), so each
    takes 0.4 × 1.4 ms; with ``read`` the k-th sees k (0.4 × (1 + 0.1 (k − 1)))."""
    path = tmp_path / "arrivals.txt"
    np.savetxt(path, [0.1] * 5, fmt="%.6f")
    got = {}
    for counts in ("read", "arrived"):
        loop = {"return_ms": 0.15, "respond_per_batch_ms": 0.2, "cost_per_in_flight": 0.1, "held_counts": counts}
        doc = _doc(1.0, loop)
        doc["traffic"] = {"arrivals_file": str(path)}
        doc["preprocess"]["service"] = {"kind": "deterministic", "value_ms": 0.4}
        doc["warmup_s"] = 0
        rec = simulate(Scenario.model_validate(doc)).records
        got[counts] = np.sort(rec.t_preprocessed - rec.arrival)
    k = np.arange(1, 6)
    np.testing.assert_allclose(got["read"], 0.4 * np.cumsum(1 + 0.1 * (k - 1)))
    np.testing.assert_allclose(got["arrived"], 0.4 * 1.4 * k)


def test_a_batchs_responses_go_before_the_reads_ready_while_it_came_back_when_asked(tmp_path):
    """One request's batch is computed at 108.4 ms and taken back by 108.55; a second request
    arrives at 108.45, while the loop takes the batch back. In the order jobs became ready
    the second is read first (108.55-108.95) and the first answered after (109.25); with
    ``responds_first`` the first is answered at once (108.85), the second read after."""
    path = tmp_path / "arrivals.txt"
    np.savetxt(path, [0.1, 0.10845], fmt="%.6f")
    got = {}
    for first in (False, True):
        loop = {"return_ms": 0.15, "respond_per_batch_ms": 0.2, "respond_per_request_ms": 0.1, "responds_first": first}
        doc = _doc(1.0, loop)
        doc["traffic"] = {"arrivals_file": str(path)}
        doc["preprocess"]["service"] = {"kind": "deterministic", "value_ms": 0.4}
        doc["workers"]["service_time"]["noise_cv"] = 0.0
        doc["warmup_s"] = 0
        rec = simulate(Scenario.model_validate(doc)).records
        got[first] = (rec.t_response[0], rec.t_preprocessed[1])
    np.testing.assert_allclose(got[False], (109.25, 108.95))
    np.testing.assert_allclose(got[True], (108.85, 109.25))


def _yields(times: list[float], yields: bool, tmp_path, late_ms: float = 0.0) -> object:
    """Requests at ``times`` (s): read in 0.3 ms, a 0.5 ms fetch off the loop, 0.05 ms to
    resume and queue, a 2 ms window whose timer fires ``late_ms`` late."""
    doc = _awaiting(1.0, {"kind": "deterministic", "value_ms": 0.5})
    doc["preprocess"]["event_loop"]["batcher_yields"] = yields
    if late_ms:
        doc["preprocess"]["event_loop"]["timer_late"] = {"kind": "deterministic", "value_ms": late_ms}
    return _at(doc, times, 0.3, tmp_path)


def test_the_batcher_sends_after_the_jobs_ready_at_its_turn_when_asked(tmp_path):
    """A is queued at 100.85 ms, its window due at 102.85; C's read holds the loop from 102.8
    to 103.1, and B's fetch is back at 102.9 meanwhile. In the order jobs became ready the
    timer goes first at 103.1 and sends A alone, B queued after it (103.15); with
    ``batcher_yields`` B's resumption, ready at the timer's turn, goes first and joins A's
    batch, sent at 103.15."""
    times = [0.1, 0.1021, 0.1028]
    rec = _yields(times, False, tmp_path)
    np.testing.assert_allclose(rec.t_preprocessed[:2], [100.85, 103.15], atol=1e-9)
    np.testing.assert_allclose(rec.t_dispatch[0], 103.1, atol=1e-9)
    assert rec.batch_size[0] == 1
    rec = _yields(times, True, tmp_path)
    np.testing.assert_allclose(rec.t_dispatch[:2], 103.15, atol=1e-9)
    assert list(rec.batch_size[:2]) == [2, 2]


def test_a_request_queued_past_the_window_wakes_the_batcher_after_the_ready_jobs_when_asked(tmp_path):
    """A's window is due at 102.85 ms and its timer fires 0.5 ms late; B is queued past the due
    time, at 102.95, and E arrived at 102.92, during B's resumption. Sent at once, the batch
    (A and B) leaves at 102.95 and E is read after it; the batcher woken as a task reads E
    first (102.95-103.25) and sends A and B after it."""
    times = [0.1, 0.1021, 0.10292]
    rec = _yields(times, False, tmp_path, late_ms=0.5)
    np.testing.assert_allclose(rec.t_preprocessed[1], 102.95, atol=1e-9)
    np.testing.assert_allclose(rec.t_dispatch[:2], 102.95, atol=1e-9)
    rec = _yields(times, True, tmp_path, late_ms=0.5)
    np.testing.assert_allclose(rec.t_dispatch[:2], 103.25, atol=1e-9)
    assert list(rec.batch_size[:2]) == [2, 2]


def test_a_yielding_batcher_runs_in_chunks_as_one_run():
    from simulator.engine import stream

    doc = _awaiting(1000.0, {"kind": "exponential", "mean_ms": 0.3})
    doc["workers"]["service_time"]["batch_ms"] = {"1": 0.3, "8": 0.6}  # windows, not full batches, close them
    doc["preprocess"]["event_loop"]["batcher_yields"] = True
    doc["preprocess"]["event_loop"]["timer_late"] = {"kind": "exponential", "mean_ms": 0.2}
    s = Scenario.model_validate(doc)
    whole = simulate(s).records
    got = np.concatenate([p.records.t_response for p in stream(s, chunk_s=0.7)])
    np.testing.assert_array_equal(got, whole.t_response)
    plain = simulate(Scenario.model_validate({**doc, "preprocess": {**doc["preprocess"], "event_loop": {
        **doc["preprocess"]["event_loop"], "batcher_yields": False}}})).records  # fmt: skip
    done, done_plain = ~np.isnan(whole.t_dispatch), ~np.isnan(plain.t_dispatch)
    # the requests ready at the batcher's turn join its batch: bigger batches
    assert whole.batch_size[done].mean() > plain.batch_size[done_plain].mean()


def test_a_calibrated_loop_draws_its_hand_back_from_the_light_level():
    """The committed EPYC run's profile carries the light level's hand-backs: its scenario
    draws them per batch (scaled with the slice's speed) in place of their median, the
    report says so, and a profile fitted before them keeps the median."""
    import copy
    import json
    from pathlib import Path

    from calibrate import report_model
    from calibrate.scenario import scenario_dict
    from calibrate.specs import spec_mean

    profile = json.loads((Path(__file__).parents[1] / "calibrate/profiles/cpu-resnet64-epyc/profile.json").read_text())
    loop = profile["frontend"]["event_loop"]
    doc = scenario_dict(profile, 100.0, duration_s=2.0, warmup_s=0.25, speed=1.1)
    drawn = doc["preprocess"]["event_loop"]
    assert "return_ms" not in drawn
    assert spec_mean(drawn["return_time"]) == pytest.approx(1.1 * spec_mean(loop["return_time"]), rel=1e-3)
    assert spec_mean(loop["return_time"]) > loop["return_ms"]  # the tail above the median
    Scenario.model_validate(doc)
    assert "drawn per batch from the light level's hand-backs" in report_model._hand_back(loop)
    older = copy.deepcopy(profile)
    del older["frontend"]["event_loop"]["return_time"]
    kept = scenario_dict(older, 100.0, duration_s=2.0, warmup_s=0.25)["preprocess"]["event_loop"]
    assert kept["return_ms"] == pytest.approx(loop["return_ms"])
    assert "return_time" not in kept
