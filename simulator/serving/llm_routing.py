"""How an LLM pool's router picks a replica (``router.balancing``): round robin or random
among the serving replicas, the least loaded, the one holding the request's prefix
(``prefix_affinity``), or a score of prefix hit, load and free KV (``scored``, llm-d's
weights). It keeps the router's own view of each replica: the prefix groups and sessions
sent there and not finished yet, whose KV will be cached there (llm-d's index of routed
prefixes), and the runs of a group's cached blocks, read again only when the replica's
cache changed. :class:`~simulator.serving.continuous.Replicas` holds one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.rng import child
from simulator.serving.llm_replica import Replica
from simulator.serving.llm_types import BLOCKS, group_key, session_owner

if TYPE_CHECKING:
    from simulator.serving.continuous import LLMService


class PrefixRouter:
    """The router of an LLM pool of ``n`` replicas, as ``service`` configures it."""

    def __init__(self, service: LLMService, n: int):
        self.route = child(service.rng, 1 << 20)  # random routing among the serving replicas
        self.turn = 0  # round robin over the serving replicas, where the pool decides
        self.balancing, self.weights = service.balancing, service.weights
        self.block_size = service.limits.block_size
        # the prefix groups and sessions each replica has been sent and not yet finished
        # (llm-d's index of routed prefixes: a prefix in flight there will be cached there);
        # a group g is g, a session s is -s - 1
        self.in_flight: list[dict[int, int]] = [{} for _ in range(n)]
        self.group_runs: dict[int, dict] = {}  # replica -> (group, blocks) -> (its KV's watched, run): hit
        self.group_of: dict[int, tuple[int, tuple[int, ...]]] = {}  # request -> (replica, prefixes) in flight

    def sent(self, k: int, rid: int, group: int, session: int) -> None:
        """Request ``rid`` of prefix ``group`` and ``session`` (-1: none) went to replica ``k``."""
        prefixes = (group,) * (group >= 0) + (-session - 1,) * (session >= 0)
        if prefixes:
            held = self.in_flight[k]
            for key in prefixes:
                held[key] = held.get(key, 0) + 1
            self.group_of[rid] = (k, prefixes)

    def pick(
        self,
        ks: list[int],
        replicas: list[Replica],
        t: float,
        group: int,
        shared: int,
        prompt: int,
        session: int = -1,
        history: int = 0,
    ) -> int:
        """The replica of ``ks`` (those serving at ``t``) a request reaching the pool at ``t``
        goes to, by ``balancing``, from each replica's state after the steps it started before ``t``."""
        if self.balancing in ("round_robin", "random"):  # an autoscaled pool routes by itself
            if self.balancing == "random":
                return ks[int(self.route.random() * len(ks))]
            self.turn += 1
            return ks[(self.turn - 1) % len(ks)]
        if self.balancing == "least_loaded":  # the load alone: a replica is stepped only where it may change
            load = {k: replicas[k].load_at(t) for k in ks}
            return min(ks, key=lambda k: (load[k], k))
        for k in ks:
            replicas[k].advance(t)
        self.forget(replicas)
        load = {k: len(r.pending) + len(r.waiting) + len(r.running) for k in ks for r in (replicas[k],)}
        k_least = min(ks, key=lambda k: (load[k], k))
        known = group >= 0 or session >= 0
        hit = None
        if known:
            hit = {k: self.hit(replicas[k], k, group, shared, session, history, prompt) / prompt for k in ks}
        if self.balancing == "prefix_affinity":
            if hit is None:
                return k_least
            return min(ks, key=lambda k: (-hit[k], load[k], k))
        wp, wq, wk = self.weights
        top = max(load.values()) or 1
        score = {
            k: (wp * hit[k] if hit is not None else 0.0)
            + wq * (1.0 - load[k] / top)
            + wk * (1.0 - replicas[k].kv.usage)
            for k in ks
        }
        return max(ks, key=lambda k: (score[k], -k))

    def hit(
        self, replica: Replica, k: int, group: int, shared: int, session: int = -1, history: int = 0, prompt: int = 0
    ) -> int:
        """Prompt tokens of the request's prefix (its group's, then its session's earlier
        turns) replica ``k`` (``replica``) holds or will hold: the whole of it while a request of the
        session (or, for the group's part, of the group) is in flight there, else its
        cached blocks: the run of them from the first, the group's read again only after
        one of the groups' keys came or went in that replica's cache (``kv.watched``: a
        shared system prompt is walked once, not at every request on every replica)."""
        held = self.in_flight[k]
        if session >= 0 and held.get(-session - 1):
            return shared + history
        known = shared if group >= 0 and held.get(group) else 0
        kv = replica.kv
        cached = kv.cached
        bs = self.block_size
        blocks = (shared if session < 0 else min(shared + history, max(prompt - 1, 0))) // bs
        grouped = min(shared // bs if group >= 0 else 0, blocks)
        j = 0
        if grouped:  # the group's run, read again only once a group's cached block came or went
            memo = self.group_runs.setdefault(k, {})
            seen = memo.get((group, grouped))
            if seen is not None and seen[0] == kv.watched:
                j = seen[1]
            else:
                while j < grouped and group_key(group, j) in cached:
                    j += 1
                memo[group, grouped] = (kv.watched, j)
        if j == grouped and session >= 0:
            owner = session_owner(session) * BLOCKS
            while j < blocks and owner + j in cached:
                j += 1
        return max(known, j * bs)

    def forget(self, replicas: list[Replica]) -> None:
        """The requests ``replicas`` finished since: their prefixes no longer in flight."""
        for rep in replicas:
            for rid in rep.just_finished():
                held = self.group_of.pop(rid, None)
                if held is not None:
                    k, prefixes = held
                    for key in prefixes:
                        left = self.in_flight[k][key] - 1
                        if left:
                            self.in_flight[k][key] = left
                        else:
                            del self.in_flight[k][key]
