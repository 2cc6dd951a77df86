"""The napkin's prefix-cache estimate (``simulator/planning/prefix_cache.py``): Che's
approximation of an LRU cache against its closed form where there is one, its limits, the
napkin that uses it, and (slow) the simulated replicas' hit rates."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator import load_scenario
from simulator.planning.llm_napkin import llm_napkin, mean_tokens
from simulator.planning.prefix_cache import PrefixCache
from tests.test_bad_input import ROOT

RAG = ROOT / "scenarios/llm_rag_prefix.yaml"
MULTI = ROOT / "scenarios/llm_multiturn.yaml"


@pytest.mark.parametrize("routing", ["prefix_affinity", "round_robin"])
def test_equally_popular_prefixes_are_found_as_often_as_the_memory_holds_them(routing):
    """g prefixes of equal popularity, each asked for as a Poisson stream: in Che's
    approximation every one is held with the same probability, 1 − e^(−λT), and the
    held ones fill the free memory K, so a request finds its prefix with probability
    K / (g × tokens) (each replica its own copies at 1/R of the rate where the routing
    does not send a prefix back: K / R a replica for R × g copies, the same share)."""
    s = load_scenario(
        RAG,
        [
            "traffic.tokens.prefix={share: 1.0, groups: 100, tokens: 3000, zipf_s: 0}",
            f"router.balancing={routing}",
            "batching.num_blocks=6000",  # 96,000 tokens a replica: room for a third of the documents
        ],
    )
    cache = PrefixCache(s)
    replicas = 2
    est = cache.at(replicas, 60.0, 0.0, 0.0, 0.0)
    free = replicas * 6000 * 16
    assert est.free_tokens == free
    copies = 1 if routing == "prefix_affinity" else replicas
    assert est.reused / cache.shared_mean == pytest.approx(free / (100 * 3000 * copies), rel=1e-4)
    lam_g = 60.0 / 1000.0 / 100 / copies  # each copy's requests a ms
    assert 1 - math.exp(-lam_g * est.horizon_s * 1000.0) == pytest.approx(free / (100 * 3000 * copies), rel=1e-4)


def test_ample_memory_finds_everything_and_a_scattered_conversation_one_time_in_r():
    """With memory for hours of blocks (a conversation's last ones wait out T for
    nobody, so T stays finite) a request finds its shared prefix and its conversation so
    far where the router sends turns back to their replica, and its conversation on one
    replica in R where it scatters them; with the prefix cache off, nothing."""
    sets = ["batching.num_blocks=10000000"]
    back = PrefixCache(load_scenario(MULTI, sets))  # scored, with a prefix weight
    est = back.at(4, 50.0, 0.0, 0.0, 0.0)
    assert est.horizon_s > 3600
    assert est.reused == pytest.approx(back.shared_mean + back.history_mean, rel=1e-3)
    scattered = PrefixCache(load_scenario(MULTI, [*sets, "router.balancing=round_robin"]))
    est = scattered.at(4, 50.0, 0.0, 0.0, 0.0)
    assert est.reused == pytest.approx(scattered.shared_mean + scattered.history_mean / 4, rel=1e-3)
    off = PrefixCache(load_scenario(MULTI, [*sets, "batching.enable_prefix_caching=false"]))
    assert off.at(4, 50.0, 0.0, 0.0, 0.0).reused == 0.0


def test_less_memory_or_longer_gaps_find_less():
    """T shrinks as the running sequences take the memory, and a conversation whose next
    turn comes later finds less of itself."""
    s = load_scenario(MULTI)
    cache = PrefixCache(s)
    e_s, e_o = mean_tokens(s)
    footprint = e_s - cache.shared_mean + e_o / 2
    hits = [cache.at(4, 50.0, running, footprint, 5000.0).reused for running in (0, 50, 100, 150)]
    assert np.all(np.diff(hits) < 0)
    slower = PrefixCache(load_scenario(MULTI, ["traffic.tokens.sessions.turn_gap={kind: exponential, mean_ms: 90000}"]))
    assert slower.at(4, 50.0, 50, footprint, 5000.0).reused < hits[1]


def test_the_napkin_counts_the_prefix_caches_hits_and_needs_fewer_replicas_for_them():
    """RAG's 3,000-token documents: the napkin's prefill computes what the cache leaves,
    attending to the cached tokens, and it takes the fewest replicas whose memory keeps the
    hits that carry the rate; with the cache off it computes every token and needs more."""
    s = load_scenario(RAG)
    lines, k = llm_napkin(s, 6.88)
    got = {ln.quantity: ln for ln in lines}
    e_s, _ = mean_tokens(s)
    hit = got["prompt tokens from the prefix cache"]
    assert 0.5 * 3000 < hit.value < 3000
    assert "Che's approximation" in hit.formula
    assert got["prefill of a mean prompt"].formula.startswith(f"{e_s - hit.value:,.0f} tokens'")
    off_lines, off = llm_napkin(load_scenario(RAG, ["batching.enable_prefix_caching=false"]), 6.88)
    assert {ln.quantity: ln for ln in off_lines}["prompt tokens from the prefix cache"].value == 0
    assert k.bare < off.bare
    assert k.per_replica_rps > off.per_replica_rps


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "sets", "within"),
    [(MULTI, [], 0.03), (ROOT / "scenarios/llm_users.yaml", ["workers.count=4"], 0.03), (RAG, [], 0.08)],
)
def test_the_estimate_lands_near_the_simulated_hit_rate(path, sets, within):
    """Given the simulation's rate and sequences a step, Che's share of prompt tokens from
    the cache is within 3 points of the simulated replicas' for the conversations (51.0%
    against 51.7%; 36.1% against 37.3% on four replicas of the users) and 8 for RAG's
    documents (88.2% against 81.8%: calibrate/experiments/prefix_cache_che.py)."""
    from simulator.engine import simulate
    from simulator.results.reduce import summarize

    s = load_scenario(path, sets)
    out = summarize(simulate(s))
    e_s, e_o = mean_tokens(s)
    cache = PrefixCache(s)
    est = cache.at(
        s.workers.count,
        out["requests"]["throughput_rps"],
        out["batch_size"]["mean"],
        e_s - cache.shared_mean + e_o / 2,
        e_o * 20.0,
    )
    assert est.reused / e_s == pytest.approx(out["llm"]["tokens"]["prefix_hit_rate"], abs=within)
