"""The engine's block manager: which KV blocks each sequence holds, and the prefix cache.

As vLLM V1's ``KVCacheManager`` does it:

- every block is in exactly one state: held by one or more sequences (reference counted),
  or in the *free queue*, least recently freed first (blocks never used come first, in
  order);
- a block full of computed tokens gets a *hash* chained over the tokens before it (the hash
  of block ``i`` is ``hash((hash of block i - 1, its tokens))``), so equal hashes mean equal
  prefixes; a freed block keeps its hash and content until it is taken for new content
  (evicted);
- a new sequence takes the longest run of cached blocks its prompt begins with, leaving at
  least its last prompt token to compute (the model must run to give the first output).

Nothing here knows about time or the model: :mod:`.engine` asks for blocks before each
step and preempts when there are not enough.
"""

from __future__ import annotations

from collections import OrderedDict


def block_hashes(tokens: list[int], block_size: int, parent: int | None = None, start: int = 0) -> list[int]:
    """The chained hashes of the full blocks of ``tokens`` from block ``start`` (``parent``:
    the hash of block ``start - 1``)."""
    out = []
    for i in range(start, len(tokens) // block_size):
        parent = hash((parent, tuple(tokens[i * block_size : (i + 1) * block_size])))
        out.append(parent)
    return out


class BlockManager:
    """``num_blocks`` blocks of ``block_size`` tokens for sequences named by id."""

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be at least 1, not {num_blocks} and {block_size}")
        self.num_blocks, self.block_size, self.prefix_caching = num_blocks, block_size, prefix_caching
        self.ref = [0] * num_blocks
        self.hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # block hash -> the block holding that content
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.tables: dict[object, list[int]] = {}
        self.queries = 0  # prompt tokens looked up in the prefix cache (vLLM's prefix_cache_queries)
        self.hits = 0  # of them, tokens found cached

    @property
    def free(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        """Share of the blocks sequences hold (vLLM's ``kv_cache_usage_perc``)."""
        return 1.0 - len(self.free_queue) / self.num_blocks

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def lookup(self, hashes: list[int], prompt_len: int) -> list[int]:
        """The cached blocks a new sequence with these full-block ``hashes`` would share (its
        last prompt token is always computed)."""
        if not self.prefix_caching:
            return []
        usable = min(len(hashes), max(prompt_len - 1, 0) // self.block_size)
        hit = []
        for h in hashes[:usable]:
            b = self.cached.get(h)
            if b is None:
                break
            hit.append(b)
        return hit

    def admit(self, seq, hashes: list[int], prompt_len: int, tokens: int) -> int | None:
        """Blocks for a new (or preempted) sequence to hold ``tokens`` tokens, sharing its
        cached prefix. Returns the tokens the cache serves, or None (nothing changes) when
        the free blocks do not suffice."""
        hit = self.lookup(hashes, prompt_len)
        tokens = max(tokens, len(hit) * self.block_size)
        in_queue = sum(1 for b in hit if self.ref[b] == 0)
        if self.blocks_for(tokens) - len(hit) > self.free - in_queue:
            return None
        table = self.tables[seq] = []
        for b in hit:
            if self.ref[b] == 0:
                del self.free_queue[b]
            self.ref[b] += 1
            table.append(b)
        self.queries += prompt_len
        self.hits += len(hit) * self.block_size
        self._take(table, self.blocks_for(tokens) - len(hit))
        return len(hit) * self.block_size

    def grow(self, seq, tokens: int) -> bool:
        """Blocks for ``seq`` to hold ``tokens`` tokens in all; False (nothing changes) when
        the free blocks do not suffice."""
        table = self.tables[seq]
        need = self.blocks_for(tokens) - len(table)
        if need > self.free:
            return False
        self._take(table, need)
        return True

    def _take(self, table: list[int], n: int) -> None:
        for _ in range(n):
            b, _ = self.free_queue.popitem(last=False)
            h = self.hash[b]
            if h is not None:  # its cached content is evicted
                self.hash[b] = None
                if self.cached.get(h) == b:
                    del self.cached[h]
            self.ref[b] = 1
            table.append(b)

    def commit(self, seq, hashes: list[int], start: int) -> None:
        """``seq``'s blocks ``start, start + 1, ...`` are full and computed, with these
        hashes: cached for later sequences (a content cached elsewhere keeps its block)."""
        if not self.prefix_caching:
            return
        table = self.tables[seq]
        for i, h in enumerate(hashes, start):
            b = table[i]
            if self.hash[b] is None and h not in self.cached:
                self.hash[b] = h
                self.cached[h] = b

    def release(self, seq) -> None:
        """``seq`` finished or was preempted: its blocks, last first, go to the back of the
        free queue once nobody holds them (their content still cached)."""
        for b in reversed(self.tables.pop(seq)):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free_queue[b] = None

    def check(self) -> None:
        """Raise AssertionError unless every block is held or free, never both, and the
        cache's map and the blocks' hashes agree."""
        held: dict[int, int] = {}
        for table in self.tables.values():
            for b in table:
                held[b] = held.get(b, 0) + 1
        for b in range(self.num_blocks):
            assert self.ref[b] == held.get(b, 0), f"block {b}: ref {self.ref[b]}, held {held.get(b, 0)}"
            assert (self.ref[b] == 0) == (b in self.free_queue), f"block {b}: ref {self.ref[b]}"
        for h, b in self.cached.items():
            assert self.hash[b] == h
