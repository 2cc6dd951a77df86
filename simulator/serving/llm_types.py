"""What an LLM replica holds and hands out: its limits, its sequences and their block keys,
the requests it settles and the steps it runs.

These sit below the replica (:mod:`simulator.serving.llm_replica`) and its schedulers
(:mod:`simulator.serving.replica_scheduler`), which all read and write them. A sequence's
blocks carry content keys (:class:`Keys`) so the prefix cache
(:mod:`simulator.serving.kv_cache`) can find what other requests, or the same request
before a preemption, already computed.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from simulator.serving.kv_cache import KVCache


@dataclass(frozen=True)
class Limits:
    """The engine's limits (vLLM's flags of the same names)."""

    num_blocks: int
    block_size: int = 16
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    watermark: float = 0.01  # of the blocks, kept free at admission (prefill_first)
    long_prefill_token_threshold: int = 0  # most tokens of one prompt in a step (0: no cap)
    prefix_caching: bool = False


class Seq:
    """One request on the replica."""

    __slots__ = (
        "arrival",
        "cached",
        "computed",
        "eager",
        "first",
        "keys",
        "last",
        "made",
        "named",
        "nkeys",
        "output",
        "preempted",
        "prompt",
        "ready",
        "rid",
        "stall",
        "start",
    )

    def __init__(self, rid: int, arrival: float, prompt: int, output: int, keys: Sequence[Hashable], eager: int = -1):
        self.rid, self.arrival, self.prompt, self.output, self.keys = rid, arrival, prompt, output, keys
        self.nkeys = len(keys)  # read every step: kept, not asked of the keys
        # its first blocks to name as they fill (the rest when it is preempted: see Replica.push)
        self.eager = self.nkeys if eager < 0 else eager
        self.computed = 0  # tokens whose KV is computed (or served from the cache)
        self.made = 0  # output tokens produced
        self.first = math.nan  # when the first output token was produced
        self.start = math.nan  # when its first step started
        self.preempted = 0
        self.cached = 0  # prompt tokens served from the prefix cache, first admission
        self.named = 0  # full blocks named in the prefix cache
        self.last = math.nan  # when its latest output token was produced
        self.stall = 0.0  # its longest gap between two output tokens (its worst inter-token latency)
        self.ready = 0  # prompt tokens whose KV arrives with it (prefilled on another replica)


BLOCKS = 1 << 24  # most blocks of one sequence: a key is an owner's number x BLOCKS + a block


def group_key(group: int, block: int) -> int:
    """The content key of block ``block`` of prefix group ``group``'s shared prefix (negative:
    apart from every request's own)."""
    return -(group * BLOCKS + block) - 1


GROUP_KEYS_ABOVE = -(1 << 40) * BLOCKS  # every prefix group's key is above it (and below 0), every session's below


def session_owner(session: int) -> int:
    """The owner number of session ``session``'s blocks (block ``j`` of any of its turns is
    ``owner x BLOCKS + j``: every turn's sequence begins with the one before it, so their
    full blocks hold the same tokens); far below every prefix group's keys."""
    return -((1 << 40) + session)


class Keys(Sequence):
    """A request's block keys: ``shared`` blocks of a prefix group's, then its owner's (the
    request itself: ``rid x BLOCKS + block``; a session's turns share theirs,
    :func:`session_owner`). Keys are ints (a group's: :func:`group_key`), small for a
    replica's cache to hold by the ten thousand."""

    def __init__(self, rid: int, group: Hashable | None, shared_blocks: int, total_blocks: int, owner: int = -1):
        self.rid, self.group, self.shared, self.total = rid, group, shared_blocks, total_blocks
        self.own = (rid if owner == -1 else owner) * BLOCKS

    def __len__(self) -> int:
        return self.total

    def __getitem__(self, i):
        if isinstance(i, slice):
            g, own, shared = self.group, self.own, self.shared
            return [group_key(g, j) if j < shared else own + j for j in range(*i.indices(self.total))]
        if not 0 <= i < self.total:
            raise IndexError(i)
        return group_key(self.group, i) if i < self.shared else self.own + i


@dataclass
class Finished:
    """Requests settled by a replica, in the order they settled: ids, when their first
    step started, first token and last token (ms), preemptions, prompt tokens served from
    the prefix cache, whether it was dropped (a preempted sequence grown past any
    prefill, vLLM's ``ignored``), and its worst inter-token latency (ms)."""

    rid: np.ndarray
    start: np.ndarray
    first_token: np.ndarray
    done: np.ndarray
    preemptions: np.ndarray
    cached_tokens: np.ndarray
    ignored: np.ndarray
    max_itl: np.ndarray  # the longest gap between two of its output tokens (0 with one token)


@dataclass
class Steps:
    """One row per step: start and end (ms), prefill tokens, decoding sequences, sequences
    in the step, sequences running during it (admitted, not finished before it), requests
    waiting after it, KV blocks in use after it (share), and the share of its time its
    prompt tokens took (what they added to the step without them)."""

    start: np.ndarray
    end: np.ndarray
    prefill_tokens: np.ndarray
    decodes: np.ndarray
    seqs: np.ndarray
    running: np.ndarray
    waiting: np.ndarray
    kv_usage: np.ndarray
    prefill_share: np.ndarray  # of the step's time, what its prompt tokens added to the rest


def name_blocks(kv: KVCache, s: Seq, full: int) -> None:
    """Name ``s``'s blocks from the first not named yet up to ``full`` (most often the one
    block a step filled)."""
    if full == s.named + 1:
        kv.name_block(s.rid, s.named, s.keys[s.named])
    else:
        kv.cache_full_blocks(s.rid, s.keys[s.named : full], s.named)
    s.named = full


__all__ = [
    "BLOCKS",
    "GROUP_KEYS_ABOVE",
    "Finished",
    "Keys",
    "Limits",
    "Seq",
    "Steps",
    "group_key",
    "name_blocks",
    "session_owner",
]
