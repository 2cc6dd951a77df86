"""Prefill and decode on separate replicas (``batching.disaggregation``): a request's first
token comes from a prefill replica, its prompt's KV crosses to a decode replica in
``kv_transfer_ms + prompt x KV bytes a token / kv_transfer_gb_s``, and the decode replica
makes the rest; exact times on isolated requests, the transfer inside every request's
decode phase, a one-token answer settled where it was prefilled, DistServe's trade on the
same requests (decodes without prefill pauses, prefills on fewer GPUs), and bad input
refused before the run with the field and its line."""

from __future__ import annotations

import numpy as np
import pytest

from simulator import load_scenario
from simulator.engine import simulate
from simulator.results.tokens import tpot_ms, ttft_ms
from simulator.scenario.llm import MODELS
from tests.test_bad_input import ROOT, cli, one_error

SPLIT = ROOT / "scenarios/llm_disaggregated.yaml"
KV_BYTES = MODELS["llama-3-8b"].kv_bytes_per_token  # 131,072


def _isolated(extra: list[str]):
    """Requests 10 s apart on average through one prefill and one decode replica whose
    step is a fixed 10 ms plus 0.01 ms a prompt token: nobody waits for anybody."""
    s = load_scenario(
        SPLIT,
        [
            "duration_s=200",
            "warmup_s=0",
            "traffic.rate_rps=0.1",
            "workers.count=2",
            "batching.noise_cv=0",
            "batching.step_time={c0_ms: 10, prefill_ms_per_token: 0.01}",
            "batching.disaggregation={prefill_replicas: 1, kv_transfer_gb_s: 50, kv_transfer_ms: 1}",
            "network.client_to_api=null",
            "network.api_to_client=null",
            *extra,
        ],
    )
    return s, simulate(s).records


def test_an_isolated_request_takes_its_prefill_its_transfer_and_its_decodes_exactly():
    """Prefill: one step of 10 + 0.01 x prompt ms gives the first token; then the KV
    crosses in 1 ms + prompt x 131,072 B / 50 GB/s, and each later token is one 10 ms
    decode step on the decode replica."""
    _, r = _isolated(["traffic.tokens.prompt={fixed: 1000}", "traffic.tokens.output={fixed: 4}"])
    assert len(r) > 5
    assert np.all(r.completed)
    transfer = 1.0 + 1000 * KV_BYTES / 50e9 * 1000.0
    np.testing.assert_allclose(r.t_first_token - r.t_dispatch, 10 + 0.01 * 1000, atol=1e-9)
    np.testing.assert_allclose(r.t_inferred - r.t_first_token, transfer + 3 * 10.0, atol=1e-9)
    np.testing.assert_allclose(r.max_itl_ms, transfer + 10.0, atol=1e-9)
    assert np.all(r.instance == 1)  # the last token is the decode replica's


def test_a_one_token_answer_settles_where_it_was_prefilled():
    _, r = _isolated(["traffic.tokens.output={fixed: 1}"])
    assert len(r) > 5
    assert np.all(r.completed)
    assert np.all(r.instance == 0)
    np.testing.assert_array_equal(r.t_inferred, r.t_first_token)


def test_every_decode_phase_holds_its_transfer():
    """On a loaded pool over a slow link (1 GB/s: 131 ms for 1,000 prompt tokens), each
    request's time from its first token to its last is at least its transfer and its
    decode steps, and the slow link's TPOT exceeds the fast link's on the same requests."""
    base = ["duration_s=30", "warmup_s=5", "traffic.rate_rps=30", "batching.step_time={c0_ms: 8}"]
    base.append("batching.noise_cv=0")
    slow = simulate(load_scenario(SPLIT, [*base, "batching.disaggregation.kv_transfer_gb_s=1"])).records
    fast = simulate(load_scenario(SPLIT, base)).records
    np.testing.assert_array_equal(slow.prompt_tokens, fast.prompt_tokens)  # the same requests
    many = slow.completed & (slow.output_tokens > 1)
    transfer = slow.prompt_tokens * KV_BYTES / 1e9 * 1000.0
    decode = slow.t_inferred - slow.t_first_token
    assert np.all(decode[many] >= transfer[many] + 8.0 * (slow.output_tokens[many] - 1) - 1e-6)
    assert np.nanmean(tpot_ms(slow)[many]) > np.nanmean(tpot_ms(fast)[many])


def test_split_replicas_trade_first_token_time_for_steady_tokens():
    """DistServe's trade on the same requests and five H100s: with prefill and decode apart
    the decode replicas never pause for a prompt, so the worst gap between tokens and the
    TPOT tail fall far below the colocated fleet's; the three prefill replicas carry every
    prompt, so the first token comes later."""
    base = ["duration_s=40", "warmup_s=10"]
    split = simulate(load_scenario(SPLIT, base)).records
    both = simulate(load_scenario(SPLIT, [*base, "batching.disaggregation=null"])).records
    done = split.completed & both.completed & (split.arrival >= 10_000)
    p99 = lambda x: np.nanpercentile(x[done], 99)  # noqa: E731
    assert p99(split.max_itl_ms) < p99(both.max_itl_ms) / 3
    assert p99(tpot_ms(split)) < p99(tpot_ms(both))
    assert np.nanmedian(ttft_ms(split)[done]) > np.nanmedian(ttft_ms(both)[done])


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (
            ["--set", "batching.disaggregation.prefill_replicas=5"],
            ["batching.disaggregation.prefill_replicas", "leaves no decode replica"],
        ),
        (["--set", "batching.policy=prefill_first"], ["batching.disaggregation", "policy continuous"]),
        (["--set", "batching.disaggregation.kv_transfer_gb_s=0"], ["kv_transfer_gb_s", "greater than 0"]),
        (
            ["--set", "workers.autoscaler={policy: hpa, metric: in_flight, target: 8, max_replicas: 9}"],
            ["batching.disaggregation", "workers.autoscaler"],
        ),
    ],
)
def test_bad_disaggregation_is_refused_before_the_run(args, needles):
    text = one_error(cli("run", SPLIT, *args), *needles)
    assert "line " in text


def test_the_napkin_counts_prefill_and_decode_replicas_apart():
    """DistServe's planning: prefill replicas from a prefill replica's throughput (full steps
    sharing their fixed cost), decode replicas from a decode replica's (the widest batch
    within the TPOT target), each side with its headroom; a fleet of another size keeps the
    scenario's share of prefill replicas."""
    import math

    from simulator.planning.napkin import llm_napkin
    from simulator.planning.plan import with_workers

    s = load_scenario(SPLIT, [])
    lines, k = llm_napkin(s, 6.88)
    got = {ln.quantity: ln.value for ln in lines}
    lam = s.traffic.rate_rps
    assert got["prefill replicas"] == math.ceil(lam / got["prefill replica throughput"])
    assert got["decode replicas"] == math.ceil(lam / got["decode replica throughput"])
    assert k.bare == got["prefill replicas"] + got["decode replicas"]
    assert got["replicas with headroom"] == k.padded
    assert got["decode step at the napkin's batch"] <= s.sla.tpot_ms
    assert "per-replica throughput" not in got  # the colocated replica's lines are gone
    for n, p in ((5, 3), (8, 5), (4, 2), (2, 1)):
        assert with_workers(s, n).batching.disaggregation.prefill_replicas == p
    assert with_workers(s, 1).batching.disaggregation is None  # one GPU does both


@pytest.mark.parametrize("link", ["per_prefill_replica", "unlimited"])
def test_a_prefill_replicas_link_sends_one_prompt_at_a_time(tmp_path, link):
    """Two 1,000-token prompts arrive together and are prefilled in one 30 ms step. Over one
    link the second's KV leaves when the first's has crossed (2.62 ms each at 50 GB/s, then
    1 ms of latency): it reaches the decode replica during the first's 10 ms decode step and
    gets its second token one step later; with unlimited links both cross at once and
    decode together."""
    from tests.test_llm_scenario import _trace

    path = _trace(tmp_path, "0.0,1000,3\n0.0,1000,3\n")
    s = load_scenario(
        path,
        [
            "duration_s=5",
            "warmup_s=0",
            "workers.count=2",
            "batching.noise_cv=0",
            "batching.step_time={c0_ms: 10, prefill_ms_per_token: 0.01}",
            "batching.disaggregation={prefill_replicas: 1, kv_transfer_gb_s: 50, kv_transfer_ms: 1}",
            f"batching.disaggregation.kv_link={link}",
            "network.client_to_api=null",
            "network.api_to_client=null",
        ],
    )
    r = simulate(s).records
    b = 1000 * KV_BYTES / 50e9 * 1000.0  # one prompt's KV on the link, ms
    np.testing.assert_allclose(r.t_first_token, 30.0, atol=1e-9)
    queued = link == "per_prefill_replica"
    np.testing.assert_allclose(r.max_itl_ms, [b + 1 + 10, b + 1 + (20 if queued else 10)], atol=1e-9)
