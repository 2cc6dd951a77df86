"""Paged KV memory of one LLM replica, with a prefix cache (vLLM V1's block manager).

The replica's KV memory is ``num_blocks`` blocks of ``block_size`` tokens. A sequence
holds a table of blocks, enough for the tokens it has computed; a block is shared by every
sequence whose prompt begins with the same tokens, and counted by reference.

The prefix cache works as vLLM's does:

- a *full* block whose content can recur (a shared system prompt, an earlier turn of the
  same session) carries a key, chained like vLLM's block hashes: the key of block ``i``
  stands for the first ``(i + 1) · block_size`` tokens, so a hit on it implies hits on the
  blocks before it;
- a new sequence looks its keys up in order and takes the longest run of cached blocks;
  at least its last prompt token is always computed (a model must run to give the first
  output token), so a prompt cached whole still recomputes its last block;
- a block whose last reference goes joins the *free queue* with its content kept: a later
  sequence may still hit it, until it is taken for new content, least recently freed
  first. A sequence's blocks are freed from its last to its first, so the tail of a shared
  prefix is evicted before its head.

The simulator has no token ids: keys are whatever the workload says identifies content
(a prefix group and a block index, a session and a turn), any hashable.

Nothing here is timed: the replica's scheduler (``batching.kind: continuous``) asks for
blocks at each step and preempts a sequence when :meth:`KVCache.allocate` says there are
not enough.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

from simulator.scenario.llm import blocks_from_memory, bytes_per_token


class FreeQueue:
    """Freed blocks in the order they were freed, taken from the front, as a list with a
    head: a sequence's blocks join it in one ``extend`` and a step's are taken in one slice
    (an ``OrderedDict`` took them one ``popitem`` at a time). A block taken out of the
    middle (a prefix hit on freed content) leaves its entry behind, skipped where it stands:
    a block is queued at most once at a time, so its left entries are always its earliest,
    and it keeps a count of them."""

    __slots__ = ("_dead", "_gone", "_head", "_q")

    def __init__(self, num_blocks: int):
        self._q: list[int] = []
        self._head = 0  # entries before it were taken
        self._dead = [0] * num_blocks  # each block's left entries, ahead of its live one
        self._gone = 0  # left entries from the head on

    def __len__(self) -> int:
        return len(self._q) - self._head - self._gone

    def __iter__(self):
        dead = self._dead.copy()
        for b in self._q[self._head :]:
            if dead[b]:
                dead[b] -= 1
            else:
                yield b

    def append(self, b: int) -> None:
        self._q.append(b)

    def extend(self, blocks: list[int]) -> None:
        self._q.extend(blocks)

    def remove(self, b: int) -> None:
        """``b``, queued, leaves the queue from where it stands."""
        self._dead[b] += 1
        self._gone += 1

    def take(self, n: int) -> list[int]:
        """The first ``n`` blocks (at most ``len(self)``), out of the queue."""
        q, head = self._q, self._head
        if not self._gone:
            got = q[head : head + n]
            head += n
        else:
            got, dead = [], self._dead
            while len(got) < n:
                b = q[head]
                head += 1
                if dead[b]:
                    dead[b] -= 1
                    self._gone -= 1
                else:
                    got.append(b)
        if head > 4096 and 2 * head > len(q):  # drop what was taken, now and then
            del q[:head]
            head = 0
        self._head = head
        return got


class KVCache:
    """``num_blocks`` blocks of ``block_size`` tokens, handed to sequences by id.

    Parameters
    ----------
    num_blocks : int
        Blocks of KV memory (at least 1).
    block_size : int
        Tokens a block holds (at least 1).
    prefix_caching : bool
        Keep freed blocks' content for later hits (vLLM's ``enable_prefix_caching``).
    """

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = True):
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a whole number of at least 1, not {num_blocks!r}")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a whole number of tokens of at least 1, not {block_size!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.ref = [0] * num_blocks  # sequences holding each block
        self.shared = 0  # references beyond a block's first (prefix hits): 0, every held block has one holder
        self.key: list[Hashable | None] = [None] * num_blocks  # the content a block holds, where it can recur
        self.cached: dict[Hashable, int] = {}  # content key -> the block holding it
        # the free queue, taken from the front: the blocks never used yet (fresh, lowest
        # first), then those freed, least recently freed first; only the freed ones are kept
        self.fresh = 0  # blocks fresh..num_blocks-1 were never used
        self.free_queue = FreeQueue(num_blocks)
        self.tables: dict[Hashable, list[int]] = {}  # sequence -> its blocks, in token order
        self.hits = 0  # tokens served from the cache, over the run
        self.lookups = 0  # prompt tokens looked up
        # where watched: each time a cached int key in (watch_above, 0) comes or goes, one more
        # (the prefix groups' keys, so a router may keep what it read of them until it changes)
        self.watch_above: int | None = None
        self.watched = 0

    # --- what a scheduler asks -------------------------------------------------
    def blocks_for(self, tokens: int) -> int:
        """Blocks that ``tokens`` tokens need."""
        return -(-tokens // self.block_size)

    @property
    def free_blocks(self) -> int:
        """Blocks no sequence holds (cached content or empty): what an allocation can take."""
        return self.num_blocks - self.fresh + len(self.free_queue)

    @property
    def usage(self) -> float:
        """Share of the blocks that sequences hold (vLLM's ``kv_cache_usage_perc``)."""
        return 1.0 - self.free_blocks / self.num_blocks

    def holds(self, seq: Hashable) -> bool:
        return seq in self.tables

    def cached_prefix(self, keys: Sequence[Hashable], prompt_tokens: int) -> int:
        """Tokens of a new sequence's prompt that the cache would serve (whole blocks,
        leaving its last token to compute), without taking them."""
        return len(self._hit_blocks(keys, prompt_tokens)) * self.block_size

    def _hit_blocks(self, keys: Sequence[Hashable], prompt_tokens: int) -> list[int]:
        if not self.prefix_caching:
            return []
        usable = min(len(keys), max(prompt_tokens - 1, 0) // self.block_size)  # the last token is computed
        hit = []
        for key in keys[:usable]:
            block = self.cached.get(key)
            if block is None:
                break
            hit.append(block)
        return hit

    def allocate(self, seq: Hashable, tokens: int, keys: Sequence[Hashable] = ()) -> int | None:
        """Blocks for sequence ``seq`` to hold ``tokens`` tokens in all (its computed ones
        and those of this step). On its first allocation, ``keys`` name the content of its
        prompt's full blocks, in order, and the longest cached run of them is shared.

        Returns the tokens served from the cache (0 after the first allocation), or None
        when the free blocks do not suffice; then nothing changes (the scheduler preempts
        or waits)."""
        if tokens < 0:
            raise ValueError(f"tokens must be at least 0, not {tokens}")
        table = self.tables.get(seq)
        if table is not None and -(-tokens // self.block_size) <= len(table):
            return 0  # its blocks hold them already (most steps of a decode)
        first = table is None
        hit = self._hit_blocks(keys, tokens) if first else []
        have = len(hit) if first else len(table)
        need = self.blocks_for(tokens) - have
        # a hit block that sits in the free queue is taken from it too
        free_after_hits = self.free_blocks - sum(1 for b in hit if self.ref[b] == 0)
        if need > free_after_hits:
            return None
        if first:
            table = self.tables[seq] = []
            for b in hit:
                if self.ref[b] == 0:
                    self.free_queue.remove(b)
                else:
                    self.shared += 1
                self.ref[b] += 1
                table.append(b)
            self.lookups += tokens
            self.hits += len(hit) * self.block_size
        if need > 0:
            self._take(table, need)
        return len(hit) * self.block_size if first else 0

    def grow(self, seq: Hashable, tokens: int) -> None:
        """:meth:`allocate` for a sequence that holds blocks already, when the caller knows
        the free blocks suffice (a decode stretch counts them first): the same blocks in
        the same order, without the checks."""
        table = self.tables[seq]
        need = -(-tokens // self.block_size) - len(table)
        if need > 0:
            self._take(table, need)

    def grow_each(self, seqs: Sequence[Hashable]) -> None:
        """One more block for each of ``seqs``, in that order (a sequence may come more than
        once), when the caller knows the free blocks suffice: the blocks :meth:`grow` would
        hand them one call at a time (a decode stretch's, taken at once)."""
        tables = self.tables
        for seq, b in zip(seqs, self._next(len(seqs)), strict=True):
            tables[seq].append(b)

    def _take(self, table: list[int], n: int) -> None:
        """The next ``n`` free blocks onto ``table``."""
        table.extend(self._next(n))

    def _next(self, n: int) -> list[int]:
        """The next ``n`` free blocks, held once each from now: the never-used ones first
        (they hold no content), then the least recently freed (their cached content
        evicted)."""
        fresh = self.fresh
        m = min(n, self.num_blocks - fresh)
        blocks = list(range(fresh, fresh + m))
        if m:
            self.ref[fresh : fresh + m] = [1] * m
            self.fresh = fresh + m
        if n > m:
            ref = self.ref
            reused = self.free_queue.take(n - m)
            for b in reused:
                ref[b] = 1
            if self.cached:  # content to evict (none while no block was ever named)
                key, cached, above = self.key, self.cached, self.watch_above
                for b in reused:
                    k = key[b]
                    if k is not None:
                        del cached[k]
                        key[b] = None
                        if above is not None and type(k) is int and above < k < 0:
                            self.watched += 1
            blocks += reused
        return blocks

    def name_block(self, seq: Hashable, index: int, key: Hashable) -> None:
        """:meth:`cache_full_blocks` for one block: ``seq``'s block ``index`` holds ``key``."""
        if not self.prefix_caching:
            return
        b = self.tables[seq][index]
        if self.key[b] is None and key not in self.cached:
            self.key[b] = key
            self.cached[key] = b
            above = self.watch_above
            if above is not None and type(key) is int and above < key < 0:
                self.watched += 1

    def cache_full_blocks(self, seq: Hashable, keys: Sequence[Hashable], start: int = 0) -> None:
        """Name the content of ``seq``'s blocks ``start``, ``start + 1``, ... (full ones, as
        many as ``keys``), so later sequences can hit them; a block whose content is cached
        elsewhere already keeps the block that has it. Like vLLM V1, a scheduler names each
        block once, when it becomes full (``start``: the blocks named before)."""
        if not self.prefix_caching:
            return
        table = self.tables[seq]
        if start + len(keys) > len(table):
            raise ValueError(f"{len(keys)} keys from block {start} for a sequence of {len(table)} blocks")
        for i, key in enumerate(keys, start):
            self.name_block(seq, i, key)

    def free(self, seq: Hashable) -> None:
        """Sequence ``seq`` finished or was preempted: its blocks go, last first, to the
        back of the free queue once nobody holds them (their content still cached)."""
        ref, queue = self.ref, self.free_queue
        table = self.tables.pop(seq)
        table.reverse()
        if not self.shared:  # every block has this one holder: all go
            for b in table:
                ref[b] = 0
            queue.extend(table)
            return
        for b in table:
            left = ref[b] - 1
            ref[b] = left
            if left:
                self.shared -= 1
            else:
                queue.append(b)

    def _forget(self, b: int) -> None:
        if self.key[b] is not None:
            del self.cached[self.key[b]]
            self.key[b] = None
            self.watched += 1  # rare (a reset): counted whatever the key

    def reset_prefix_cache(self) -> None:
        """Forget every cached content (the blocks stay where they are)."""
        for b in range(self.num_blocks):
            if self.ref[b] == 0:
                self._forget(b)

    @property
    def hit_rate(self) -> float:
        """Prompt tokens served from the cache over prompt tokens looked up."""
        return self.hits / self.lookups if self.lookups else math.nan

    def check(self) -> None:
        """Raise AssertionError unless the books balance: every block either held (by as
        many sequences as count it) or free, never both; cached keys point both ways."""
        held: dict[int, int] = {}
        for table in self.tables.values():
            for b in table:
                held[b] = held.get(b, 0) + 1
        queued = list(self.free_queue)
        assert len(queued) == len(set(queued)) == len(self.free_queue), "a block queued twice"
        queued = set(queued)
        for b in range(self.num_blocks):
            assert self.ref[b] == held.get(b, 0), f"block {b}: ref {self.ref[b]}, held by {held.get(b, 0)}"
            free = b in queued or b >= self.fresh
            assert (self.ref[b] == 0) == free, f"block {b}: ref {self.ref[b]}, free"
        for key, b in self.cached.items():
            assert self.key[b] == key, f"key {key!r} -> block {b}, which holds {self.key[b]!r}"
        assert sum(k is not None for k in self.key) == len(self.cached)
        assert self.shared == sum(max(r - 1, 0) for r in self.ref), f"{self.shared} shared references"


__all__ = ["KVCache", "blocks_from_memory", "bytes_per_token"]
