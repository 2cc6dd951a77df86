"""How much of a prompt an LLM fleet's prefix cache serves, on the napkin: Che's
approximation of an LRU cache (Che, Tung and Wang, 2002), as vLLM evicts the blocks freed
longest ago.

A block nobody uses stays cached for a characteristic time T, the same for every block: T
is where the blocks freed and not yet reused fill the KV memory the running sequences leave
free. A shared prefix (``traffic.tokens.prefix``) requested as a Poisson stream of rate λ
is then found with probability 1 − e^(−λT); a conversation's blocks, freed when a turn's
answer ends, are found by its next turn when the gap before it is under T, and a
conversation's last blocks wait out T for nobody. Routing decides where the blocks are:
``prefix_affinity`` (or ``scored`` with a prefix weight) sends a prefix group and a
conversation back to the replica that holds them, so the fleet is one cache; otherwise
each replica keeps its own copy of a shared prefix at its share of the rate, and a
conversation's next turn finds its blocks only on the replica it lands on, one in R.

Given what a simulation ran (its rate and its sequences a step), it lands near the share of
prompt tokens the simulated replicas served from their caches
(``calibrate/experiments/prefix_cache_che.py``): ``llm_multiturn.yaml`` 51.0% against
51.7%, ``llm_users.yaml`` 65.9% against 67.8%, ``llm_rag_prefix.yaml`` 88.2% against 81.8%
(an over-estimate not from the documents' first misses: with 240 s of warm-up the simulation
serves 82.1%).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq

from simulator.scenario.config import Scenario
from simulator.scenario.distributions import Sampler


@dataclass(frozen=True)
class CacheEstimate:
    """A mean request's prompt tokens the prefix cache serves, at a fleet's size."""

    reused: float  # tokens found cached
    reusable: float  # tokens it could find: its shared prefix, its conversation so far
    horizon_s: float  # T: how long an unused block stays (inf: everything fits)
    free_tokens: float  # the fleet's KV memory the running sequences leave to the cache


class PrefixCache:
    """The traffic's reusable tokens, sampled once; :meth:`at` estimates the hits at a size."""

    def __init__(self, s: Scenario, draws: int = 50_000):
        t = s.traffic.tokens
        b, r = s.batching, s.router
        self.on = b.enable_prefix_caching
        self.kv_tokens = b.blocks(s.workers.instance_type) * b.block_size
        self.routed_back = r.balancing == "prefix_affinity" or (r.balancing == "scored" and r.weights.prefix > 0)
        self.prefix = t.prefix
        self.p_group = np.zeros(0)
        if t.prefix is not None:
            w = np.arange(1, t.prefix.groups + 1, dtype=float) ** -t.prefix.zipf_s
            self.p_group = w / w.sum()
        self.turns = None
        if t.sessions is not None:
            from simulator.rng import streams
            from simulator.stages.tokens import TokenDraws

            turns = TokenDraws(s, streams(0)).sessions._start(np.zeros(max(draws // 5, 1)))[1]
            self.turns = turns
            self.gap_ms = Sampler(t.sessions.turn_gap, np.random.default_rng(1)).draw(len(turns.prompt))
            self.from_answer = t.sessions.turn_gap_from == "answer"
            # a turn's own blocks after it ends: its prompt past the shared prefix, and its answer
            self.own = (turns.prompt - turns.shared + turns.output).astype(float)
            self.last = np.r_[turns.session[1:] != turns.session[:-1], True]  # no next turn comes
            self.shared_mean = float(turns.shared.mean())
            self.history_mean = float(turns.history.mean())
        else:
            self.shared_mean = t.prefix.share * t.prefix.tokens if t.prefix is not None else 0.0
            self.history_mean = 0.0

    def at(self, replicas: int, rate_rps: float, running: float, footprint: float, answer_ms: float) -> CacheEstimate:
        """The hits at ``replicas`` replicas serving ``rate_rps``, each running ``running``
        sequences of ``footprint`` KV tokens apart from their shared prefix; a turn's answer
        takes ``answer_ms`` (an open loop's gap runs from its turn's arrival)."""
        reusable = self.shared_mean + self.history_mean
        if not self.on or reusable <= 0:
            return CacheEstimate(0.0, reusable, 0.0, 0.0)
        free = max(replicas * (self.kv_tokens - running * footprint), 0.0)
        lam = rate_rps / 1000.0  # per ms
        copies = 1 if self.routed_back else replicas  # each replica its own copy, at its share of the rate
        lam_g = lam * (self.prefix.share if self.prefix is not None else 0.0) * self.p_group / copies
        tokens_g = self.prefix.tokens if self.prefix is not None else 0
        reuse = None
        if self.turns is not None:  # from a turn's answer to its next turn, when its blocks are used again
            reuse = self.gap_ms if self.from_answer else np.maximum(self.gap_ms - answer_ms, 0.0)

        def held(horizon: float) -> float:  # the tokens freed and not yet reused, at a horizon T
            out = copies * float(np.sum(tokens_g * -np.expm1(-lam_g * horizon)))
            if reuse is not None:
                out += lam * float(np.mean(self.own * np.where(self.last, horizon, np.minimum(reuse, horizon))))
            return out

        horizon = math.inf if held(1e12) <= free else brentq(lambda h: held(h) - free, 0.0, 1e12, xtol=1e-3)
        hit_g = float(np.sum(self.p_group * -np.expm1(-lam_g * horizon))) if len(self.p_group) else 0.0
        reused = self.shared_mean * hit_g
        if reuse is not None:
            back = 1.0 if self.routed_back else 1.0 / replicas
            reused += float(np.mean(self.turns.history * (reuse < horizon))) * back
        return CacheEstimate(reused, reusable, horizon / 1000.0, free)


__all__ = ["CacheEstimate", "PrefixCache"]
