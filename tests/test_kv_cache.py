"""The paged KV cache of an LLM replica (issue 29's block manager): sizing from memory,
blocks exactly at block boundaries, failed allocations that change nothing, shared
prefixes counted by reference, freed content hit until evicted least recently freed
first, and the books balanced through a long random workload."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from simulator.serving.kv_cache import KVCache, blocks_from_memory, bytes_per_token

GiB = 2**30


def test_sizing_follows_the_model_and_the_memory():
    # Llama-3-8B: 32 layers, 8 KV heads of 128, bf16: 128 KiB a token
    per_token = bytes_per_token(layers=32, kv_heads=8, head_dim=128, dtype_bytes=2)
    assert per_token == 128 * 1024
    # an 80 GiB GPU at 0.9, 16 GiB of weights, 4 GiB of activations: 52 GiB of blocks of 16 tokens (2 MiB)
    blocks = blocks_from_memory(80 * GiB, 0.9, 16 * GiB, 4 * GiB, 16, per_token)
    assert blocks == int((80 * 0.9 - 20) * GiB // (16 * per_token))
    assert blocks * 16 == 425_984  # tokens of KV the replica holds
    with pytest.raises(ValueError, match="no room for the KV cache"):
        blocks_from_memory(24 * GiB, 0.9, 16 * GiB, 8 * GiB, 16, per_token)
    with pytest.raises(ValueError, match="utilization"):
        blocks_from_memory(80 * GiB, 1.5, 16 * GiB, 0, 16, per_token)


@pytest.mark.parametrize(("blocks", "size"), [(0, 16), (8, 0), (8, -1), (2.5, 16)])
def test_a_cache_of_no_blocks_or_empty_blocks_is_refused(blocks, size):
    with pytest.raises(ValueError, match=r"num_blocks|block_size"):
        KVCache(blocks, size)


def test_a_sequence_takes_a_block_at_each_boundary_and_gives_them_all_back():
    kv = KVCache(8, 4)
    taken = []
    for tokens in range(1, 17):
        assert kv.allocate("a", tokens) == 0
        taken.append(len(kv.tables["a"]))
        kv.check()
    assert taken == [-(-t // 4) for t in range(1, 17)]
    assert kv.usage == 0.5
    kv.free("a")
    kv.check()
    assert kv.free_blocks == 8
    assert not kv.holds("a")


def test_an_allocation_that_does_not_fit_changes_nothing():
    kv = KVCache(4, 4)
    kv.allocate("a", 12, keys=["p0", "p1"])
    kv.cache_full_blocks("a", ["p0", "p1"])
    before = copy.deepcopy((kv.ref, kv.key, kv.cached, list(kv.free_queue), kv.tables, kv.hits, kv.lookups))
    assert kv.allocate("b", 8) is None  # two blocks, one free
    assert kv.allocate("a", 20) is None  # five blocks for "a", four in all
    after = (kv.ref, kv.key, kv.cached, list(kv.free_queue), kv.tables, kv.hits, kv.lookups)
    assert after == before
    assert kv.allocate("a", 16) == 0  # the last free block
    assert kv.free_blocks == 0


def test_a_shared_prefix_is_held_once_and_counted_by_reference():
    kv = KVCache(16, 4)
    system = [("sys", i) for i in range(3)]  # a 12-token system prompt, 3 full blocks
    assert kv.allocate("a", 14, keys=system) == 0  # nothing cached yet
    kv.cache_full_blocks("a", system)
    assert kv.cached_prefix(system, 14) == 12
    assert kv.allocate("b", 14, keys=system) == 12  # three blocks shared, two tokens computed
    kv.check()
    shared = kv.tables["a"][:3]
    assert kv.tables["b"][:3] == shared
    assert all(kv.ref[b] == 2 for b in shared)
    assert kv.usage == (3 + 1 + 1) / 16  # the prefix once, each its own last block
    # a prompt that is the prefix exactly still computes its last token: two blocks hit, not three
    assert kv.allocate("c", 12, keys=system) == 8
    kv.free("a")
    kv.check()
    assert all(kv.ref[b] == 2 for b in shared[:2])
    assert kv.ref[shared[2]] == 1
    assert kv.hit_rate == (12 + 8) / (14 + 14 + 12)


def test_freed_content_is_hit_until_evicted_least_recently_freed_first():
    kv = KVCache(6, 4)
    keys = [("doc", i) for i in range(3)]
    kv.allocate("a", 13, keys=keys)  # 4 blocks: 3 full and cacheable, 1 partial
    kv.cache_full_blocks("a", keys)
    head, mid, tail = kv.tables["a"][:3]
    kv.free("a")  # last first: the partial block, then tail, mid, head at the back
    kv.check()
    assert list(kv.free_queue)[-3:] == [tail, mid, head]
    assert kv.cached_prefix(keys, 13) == 12  # kept after the free
    kv.allocate("x", 12)  # 3 blocks: the 2 never used, then the partial one: no cached content lost
    assert kv.cached_prefix(keys, 13) == 12
    kv.allocate("y", 4)  # 1 more: the tail block goes first
    assert ("doc", 2) not in kv.cached
    assert kv.cached_prefix(keys, 13) == 8  # the head and middle still hit
    assert kv.allocate("z", 13, keys=keys) is None  # the two hits leave no block for the rest
    kv.free("x")
    assert kv.allocate("z", 13, keys=keys) == 8
    kv.check()


def test_without_prefix_caching_nothing_is_hit():
    kv = KVCache(8, 4, prefix_caching=False)
    keys = [("sys", 0), ("sys", 1)]
    kv.allocate("a", 10, keys=keys)
    kv.cache_full_blocks("a", keys)
    assert kv.allocate("b", 10, keys=keys) == 0
    assert not kv.cached
    kv.check()


def test_the_books_balance_through_a_random_workload():
    """Sequences of ten prefix groups arrive, grow token by token, finish or are preempted
    (freed and later recomputed) while blocks last: after every step each block is held by
    as many tables as count it, or free, never both; the hits are the groups' prefixes."""
    rng = np.random.default_rng(7)
    kv = KVCache(64, 8)
    running: dict[int, list] = {}  # seq -> [tokens, target, keys]
    waiting: list[tuple[int, int, int, list]] = []
    nxt = preempted = 0
    for _step in range(4000):
        if len(waiting) < 5:
            group = int(rng.integers(0, 10))
            prompt = int(rng.integers(1, 80))
            keys = [(group, i) for i in range(min(prompt, 40) // 8)]  # a group shares up to 40 tokens
            waiting.append((nxt, prompt, prompt + int(rng.integers(1, 60)), keys))
            nxt += 1
        seq, prompt, target, keys = waiting[0]
        got = kv.allocate(seq, prompt, keys)
        if got is not None:
            waiting.pop(0)
            assert got % 8 == 0
            assert got <= max(prompt - 1, 0)
            kv.cache_full_blocks(seq, keys[: len(kv.tables[seq])])
            running[seq] = [prompt, target, keys]
        for s in list(running):
            if s not in running:  # preempted this step
                continue
            tokens, target, keys = running[s]
            if tokens == target:
                kv.free(s)
                del running[s]
            elif kv.allocate(s, tokens + 1) is None:  # no block for its next token: preempt the newest
                victim = max(running)
                preempted += 1
                kv.free(victim)
                t, tg, k = running.pop(victim)
                waiting.insert(0, (victim, t, tg, k))  # recomputed from its tokens so far
            else:
                running[s][0] = tokens + 1
        kv.check()
    assert preempted > 50  # memory ran short, often
    assert kv.hits > 0
    assert 0 < kv.hit_rate < 1


def test_blocks_for_many_sequences_at_once_are_those_one_at_a_time():
    """A decode stretch takes its blocks at once (``grow_each``): the same blocks to the same
    tables, the same content evicted and the same free queue as ``grow`` one sequence at a
    time, fresh blocks, freed ones and named ones alike; sharing is counted through it."""
    rng = np.random.default_rng(11)
    one, many = KVCache(20, 4), KVCache(20, 4)
    for kv in (one, many):  # a shared prefix, named content freed, a few fresh blocks left
        kv.allocate("p", 16, keys=["g0", "g1", "g2"])
        kv.cache_full_blocks("p", ["g0", "g1", "g2"])
        kv.allocate("q", 16, keys=["g0", "g1", "g2"])  # shares p's first three blocks
        assert kv.shared == 3
        kv.allocate("r", 8, keys=["r0", "r1"])
        kv.cache_full_blocks("r", ["r0", "r1"])
        for s in range(4):
            kv.allocate(s, 6)
        kv.free("p")
        kv.free("r")  # its named blocks wait in the free queue, content kept
        kv.check()
    assert one.shared == 0
    assert len(one.cached) == 5
    for _round in range(12):
        live = [s for s in range(4) if one.holds(s)] + ["q"]
        seqs = [live[i] for i in rng.integers(0, len(live), size=int(rng.integers(1, 5)))]
        if len(seqs) > one.free_blocks:
            break
        for s in seqs:
            one.grow(s, len(one.tables[s]) * 4 + 1)  # one more block
        many.grow_each(seqs)
        for kv in (one, many):
            kv.check()
        assert (one.tables, one.ref, one.key, one.cached, list(one.free_queue), one.fresh) == (
            many.tables,
            many.ref,
            many.key,
            many.cached,
            list(many.free_queue),
            many.fresh,
        )
        if _round % 4 == 3:  # one finishes: its blocks join the free queue
            one.free(live[0])
            many.free(live[0])
    assert one.fresh == 20  # every block was handed out once
    assert "r0" not in one.cached  # r's named blocks were taken again, their content evicted


def test_the_free_queue_keeps_an_ordered_dicts_order_through_removals_and_retakes():
    """The free queue (a list with a head, blocks taken out of the middle left behind as
    entries to skip) hands out the blocks an ``OrderedDict`` would: random frees, prefix
    hits taking a freed block from the middle, a block freed again after such a hit, takes
    of several at once, and enough traffic to drop the taken front of the list."""
    from collections import OrderedDict

    from simulator.serving.kv_cache import FreeQueue

    rng = np.random.default_rng(4)
    n = 300
    queue, ref = FreeQueue(n), OrderedDict()
    held = list(range(n))  # every block held at first
    removed = 0
    for _ in range(20_000):
        op = rng.random()
        if op < 0.4 and held:  # a sequence frees a few blocks, last first
            k = int(rng.integers(1, 6))
            freed = [held.pop(int(rng.integers(len(held)))) for _ in range(min(k, len(held)))]
            queue.extend(freed) if rng.random() < 0.5 else [queue.append(b) for b in freed]
            ref.update(dict.fromkeys(freed))
        elif op < 0.6 and ref:  # a prefix hit takes a freed block from wherever it stands
            b = list(ref)[int(rng.integers(len(ref)))]
            queue.remove(b)
            del ref[b]
            held.append(b)
            removed += 1
        elif ref:  # a step takes the next few from the front
            k = min(int(rng.integers(1, 8)), len(ref))
            want = [ref.popitem(last=False)[0] for _ in range(k)]
            assert queue.take(k) == want
            held += want
        assert len(queue) == len(ref)
    assert list(queue) == list(ref)
    assert removed > 3000


def test_a_watched_range_of_keys_counts_each_of_its_keys_named_or_evicted():
    """A router keeps what it read of a prefix group's cached run until one of the groups'
    keys comes or goes (``watch_above``: ints between it and 0): naming or evicting such a
    key counts once, other keys (a session's, a request's own) never, a key already cached
    elsewhere not at all."""
    from simulator.serving.llm_types import BLOCKS, GROUP_KEYS_ABOVE, group_key, session_owner

    kv = KVCache(4, 4)
    kv.watch_above = GROUP_KEYS_ABOVE
    group = [group_key(3, j) for j in range(2)]
    own = [session_owner(7) * BLOCKS + j for j in range(2)]
    kv.allocate("a", 16, keys=[*group, *own])
    kv.cache_full_blocks("a", [*group, *own])
    assert kv.watched == 2  # the group's two, not the session's
    kv.free("a")
    kv.allocate("b", 8, keys=[5 * BLOCKS, 5 * BLOCKS + 1])  # the session's blocks go first (freed last first)
    assert kv.watched == 2
    kv.allocate("c", 4)  # then the group's second
    assert group[1] not in kv.cached
    assert kv.watched == 3
    kv.free("c")
    assert kv.allocate("d", 8, keys=group) == 4  # a hit on the first, cached already: not counted again
    kv.cache_full_blocks("d", group)
    assert kv.watched == 4  # the second named anew
    kv.check()
