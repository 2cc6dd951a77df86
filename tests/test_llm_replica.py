"""One LLM replica stepping as vLLM 0.1.7 (prefill first) over the paged KV cache: exact
steps on a small trace (M/G/1 for every policy: tests/test_llm_policies.py), no request
lost under heavy preemption, bad input refused before serving, DistServe's step-time fits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simulator.serving.llm_serve import serve_prefill_first
from simulator.serving.llm_types import Limits
from simulator.serving.step_time import StepTime

FLAT = StepTime(prefill=(10.0, 0.0, 0.0), decode_small=(5.0, 0.0, 0.0), decode_large=(5.0, 0.0, 0.0), threshold=95)
DISTSERVE = Path(__file__).resolve().parents[2] / "shared/data/distserve/profile/profiler-a100-80g.vllm.4c68ed9.json"


def test_a_small_trace_steps_exactly():
    """Request 0 (4 prompt, 3 output tokens) at 0, request 1 (4, 2) at 12 ms; prefill 10 ms,
    decode 5 ms: 0's prefill ends at 10 (first token), a decode at 15; then 1 has arrived
    and its prefill goes first (10 ms: 25), and one decode ends both at 30."""
    got = serve_prefill_first(np.array([0.0, 12.0]), np.array([4, 4]), np.array([3, 2]), FLAT, Limits(num_blocks=8))
    assert got.first_token.tolist() == [10.0, 25.0]
    assert got.done.tolist() == [30.0, 30.0]
    assert got.steps == 4
    assert got.preemptions.tolist() == [0, 0]


def test_heavy_preemption_loses_no_request():
    """Long answers on a cache that holds few of them: sequences are preempted and
    recomputed again and again, and every request still finishes, in order of its tokens."""
    rng = np.random.default_rng(3)
    n = 300
    arrival = np.sort(rng.uniform(0, 2000, n))
    prompt, output = rng.integers(8, 64, n), rng.integers(20, 200, n)
    step = StepTime((5.0, 0.01, 0.0), (3.0, 1e-4, 0.01), (3.0, 1e-4, 0.01), 95)
    got = serve_prefill_first(arrival, prompt, output, step, Limits(num_blocks=40, block_size=16))
    assert got.preemptions.sum() > 50
    assert not got.ignored.any()
    assert np.isfinite(got.done).all()
    assert (got.first_token >= arrival).all()
    assert (got.done >= got.first_token).all()


@pytest.mark.parametrize(
    ("prompt", "output", "blocks", "words"),
    [
        (10, 0, 40, "at least 1"),
        (600, 100, 40, "can never fit the KV cache"),
        (3000, 10, 400, "over max_num_batched_tokens"),
    ],
)
def test_a_request_it_can_never_serve_is_refused_before_serving(prompt, output, blocks, words):
    limits = Limits(num_blocks=blocks, block_size=16, max_num_batched_tokens=2048)
    with pytest.raises(ValueError, match=words):
        serve_prefill_first(np.array([0.0, 1.0]), np.array([8, prompt]), np.array([4, output]), FLAT, limits)


@pytest.mark.skipif(not DISTSERVE.exists(), reason="the shared DistServe data is not beside this checkout")
def test_distserve_step_time_fits_are_read_as_published():
    step = StepTime.distserve(DISTSERVE, "facebook/opt-13b")
    assert step.prefill == pytest.approx((22.05, 0.1405, 8.08e-6), rel=1e-3)
    assert step.threshold == 95
    # a 1,000-token prompt alone, then 64 sequences of 800 tokens of context
    assert step.prefill_ms([1000]) == pytest.approx(22.05 + 140.5 + 8.08, rel=1e-3)
    assert step.decode_ms(64 * 800, 64) == pytest.approx(23.475 + 5.929e-4 * 51_200 + 0.06073 * 64, rel=1e-3)
    with pytest.raises(ValueError, match="no profile"):
        StepTime.distserve(DISTSERVE, "facebook/opt-13b", tensor_parallel=3)


@pytest.mark.skipif(not DISTSERVE.exists(), reason="the shared DistServe data is not beside this checkout")
def test_distserve_runs_are_predicted_from_the_profile_alone():
    """Each of DistServe's eight vLLM runs replayed through a prefill-first replica with the
    profile's step time: the measured knee (TTFT p90 jumps) lies at 3 req/s, and the
    prediction puts it within one step of the rates run (calibrate/README gives the table)."""
    from calibrate.distserve import knee, table

    rows = table(DISTSERVE.parents[1])
    assert len(rows) == 8
    assert knee(rows, 0) == 3.0
    assert knee(rows, 1) in (3.0, 3.5)
    low = [r for r in rows if r["rate"] <= 2.5]
    for r in low:  # below the knee, TTFT p50 from the profile alone within 20% of the run's
        measured, predicted = r["ttft_p50"]
        assert abs(predicted - measured) / measured < 0.2, r


@pytest.mark.parametrize("skip", [True, False])
def test_the_first_steps_after_an_idle_replica_cost_their_wake(skip):
    """A fitted step time with ``wake_ms`` (2, 1, 0.5): a lone request (16-token prompt, 6
    tokens) arriving to an idle replica prefills in c0 + 16·c_prefill + 2 ms, decodes in
    c0 + c_decode + 1, + 0.5, then plain; a second request after the first is done pays the
    wake again; one arriving while the replica is busy does not add one. With decode-only
    stretches taken in one go the steps are the same."""
    from simulator.serving.llm_serve import serve
    from simulator.serving.step_time import LinearStepTime

    step = LinearStepTime(c0_ms=1.0, prefill_ms_per_token=0.25, decode_ms_per_seq=0.5, wake_ms=(2.0, 1.0, 0.5))
    lim = Limits(num_blocks=64, block_size=16, max_num_batched_tokens=64, max_num_seqs=8)
    got = serve(np.array([0.0, 100.0]), np.array([16, 16]), np.array([6, 6]), step, lim, skip=skip)
    prefill, decode = 1.0 + 16 * 0.25, 1.0 + 0.5
    ends = np.cumsum([prefill + 2.0, decode + 1.0, decode + 0.5, decode, decode, decode])
    assert got.first_token.tolist() == pytest.approx([ends[0], 100.0 + ends[0]])
    assert got.done.tolist() == pytest.approx([ends[-1], 100.0 + ends[-1]])
    # the second arrives during the first's prefill: the same steps as without a wake, each
    # request done 3.5 ms later (the three wake steps), none for the second's own prefill
    busy = serve(np.array([0.0, 1.0]), np.array([16, 16]), np.array([6, 6]), step, lim, skip=skip)
    plain = LinearStepTime(c0_ms=1.0, prefill_ms_per_token=0.25, decode_ms_per_seq=0.5)
    base = serve(np.array([0.0, 1.0]), np.array([16, 16]), np.array([6, 6]), plain, lim, skip=skip)
    assert busy.steps == base.steps
    assert (busy.done - base.done).tolist() == pytest.approx([3.5, 3.5])


def test_a_negative_wake_cost_is_refused_naming_the_field():
    from pydantic import ValidationError

    from simulator.scenario.llm import LinearStep

    with pytest.raises(ValidationError, match="wake_ms"):
        LinearStep(c0_ms=1.0, wake_ms=(1.0, -0.5))
