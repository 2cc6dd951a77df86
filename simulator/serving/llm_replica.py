"""One LLM replica stepping over its paged KV cache, as vLLM's engines do.

Each iteration of the engine is one *step* on the GPU: the scheduler picks which sequences
compute how many tokens, the model runs once over all of them, and every sequence whose
known tokens are then all computed samples one more output token. Three policies
(``batching.policy``):

- ``continuous``, vLLM V1's scheduler (chunked prefill, prefill and decode mixed in one
  step). A step's token budget is ``max_num_batched_tokens``. The *running* sequences go
  first, in the order they were admitted: each takes the tokens it still has to compute
  (one for a decode; a prompt's next chunk, capped by ``long_prefill_token_threshold``)
  within the budget. A sequence that needs a KV block when none is free preempts the last
  running sequence (or itself, when it is the last), by recompute: its blocks are freed
  (their content kept in the prefix cache while it lasts) and it goes to the front of the
  waiting queue. Then, if nobody was preempted, *waiting* requests are admitted first
  come, first served while the budget, ``max_num_seqs`` and the free blocks last; the
  first that does not fit stops admission. A prompt longer than what is left of the
  budget is prefilled in chunks over several steps.
- ``prefill_first``, vLLM v0 (0.1.7, as in DistServe's runs): a step either prefills
  whole prompts of admitted requests (FCFS, above a 1% watermark of free blocks) or
  decodes every running sequence one token, never both; prefills go first. A decode that
  needs a block preempts the latest arrival not yet given its slot in the step.
- ``static``: request-level batching, as FasterTransformer serves: up to ``max_num_seqs``
  requests are admitted only when the replica is empty, prefilled together, then decoded
  until the *last* of them is done; a finished sequence keeps its slot (the batch is
  computed at its full width) until then. It is here to teach what continuous batching
  buys.

A step's time is a function of its work (:mod:`simulator.serving.step_time`: a fitted
linear form, DistServe's, or a roofline), times the replica's noise. With nothing running and
nothing waiting the replica idles until the next arrival; the first steps after it idled
cost a fitted ``wake_ms`` more each (a fitted step time's). The output length is not the
scheduler's to know: a sequence stops when it has produced it.

:class:`Replica` steps incrementally: requests are pushed as they become known and
:meth:`Replica.advance` runs every step that starts before the horizon of what is known,
so a run in chunks takes the same steps as a run in one.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from simulator.serving.kv_cache import KVCache
from simulator.serving.step_time import StepModel, Work, decode_series

Policy = Literal["continuous", "prefill_first", "static"]
POLICIES: tuple[str, ...] = ("continuous", "prefill_first", "static")


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


class _Seq:
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


class Replica:
    """One replica serving requests pushed in arrival order.

    Parameters
    ----------
    policy : {"continuous", "prefill_first", "static"}
    step : StepModel
        The step time (ms) of a step's work.
    limits : Limits
    noise : callable, optional
        ``noise()`` gives the next step's multiplicative factor (default: 1).
    skip : bool
        Take decode-only stretches in one go (:meth:`_decode_stretch`; the same steps).
    speed : SpeedPath, optional
        The host's speed (``platform.speed``): a step of ``ms`` nominal work started at
        ``t`` ends at ``speed.finish_at(t, ms)``.
    """

    def __init__(self, policy: Policy, step: StepModel, limits: Limits, noise=None, *, skip: bool = True, speed=None):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        self.policy, self.step, self.limits, self.noise = policy, step, limits, noise
        self.skip = skip  # take decode-only stretches in one go (the same steps, exactly)
        self.speed = speed  # the host's speed path (platform.speed): a step's work as a time change
        self.kv = KVCache(limits.num_blocks, limits.block_size, prefix_caching=limits.prefix_caching)
        self.keep_free = int(limits.watermark * limits.num_blocks) if policy == "prefill_first" else 0
        self.pending: deque[_Seq] = deque()  # pushed, not yet arrived at the replica's clock
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self.batch_width = 0  # static: the batch's width while it lasts
        self.t = 0.0
        self.wake = tuple(getattr(step, "wake_ms", ()))  # extra ms of the first steps after an idle
        self.woke = 0  # steps since the replica last idled (it starts idle; len(wake) or more: awake)
        self.steps = 0
        self.tokens_out = 0  # output tokens produced
        self.tokens_computed = 0  # tokens whose KV a step computed (recomputes included, cache hits not)
        self._done: list[tuple] = []
        self._log: list[tuple] = []
        self._gaps: list[tuple[float, float, int]] = []  # (when, gap, tokens): each token's gap after the one before
        self._seen = 0  # of _done, the rows just_finished() has handed out

    # --- input ----------------------------------------------------------------
    def push(
        self,
        rid: int,
        arrival: float,
        prompt: int,
        output: int,
        group: Hashable | None = None,
        shared_tokens: int = 0,
        session: int = -1,
        first_token: float | None = None,
    ) -> None:
        """A request arriving at ``arrival`` (not before the last pushed) with ``prompt`` and
        ``output`` tokens; its first ``shared_tokens`` prompt tokens are prefix group
        ``group``'s (content other requests of the group share), and the rest of its
        blocks are session ``session``'s (-1: its own), which its session's other turns
        share as far as their sequences agree. With ``first_token`` (its time) the request
        was prefilled on another replica: its prompt's KV arrives with it and it decodes
        from its second token on (a preemption here recomputes it all)."""
        bs = self.limits.block_size
        keys: Sequence[Hashable] = ()
        eager = -1
        if self.limits.prefix_caching and first_token is None:
            shared = min(shared_tokens, prompt) // bs if group is not None else 0
            owner = -1 if session < 0 else session_owner(session)
            keys = Keys(rid, group, shared, (prompt + output) // bs, owner)
            # Blocks keyed by the request alone (not a group's, not a session's) can only be
            # hit by the request itself, after a preemption: they are named when it is
            # preempted, not as they fill (the same names: held blocks are never evicted and
            # nobody else looks them up), and never when it finishes unpreempted
            if session < 0:
                eager = shared
        s = _Seq(rid, arrival, int(prompt), int(output), keys, eager)
        if first_token is not None:
            s.made, s.ready, s.first = 1, s.prompt, first_token
            s.last = first_token
        self.pending.append(s)

    @property
    def busy(self) -> bool:
        return bool(self.pending or self.waiting or self.running)

    # --- time -----------------------------------------------------------------
    def advance(self, horizon: float = math.inf) -> None:
        """Run every step that starts before ``horizon``: every request arriving before it
        has been pushed."""
        while True:
            pending, waiting = self.pending, self.waiting
            while pending and pending[0].arrival <= self.t:
                waiting.append(pending.popleft())
            if not waiting and not self.running:
                if not pending:
                    return
                self.t = pending[0].arrival
                self.woke = 0
                continue
            if self.t >= horizon:
                return
            if self.skip and self._decode_stretch(horizon):
                continue
            if self.policy == "continuous":
                self._continuous()
            elif self.policy == "prefill_first":
                self._prefill_first()
            else:
                self._static()

    def just_finished(self) -> list[int]:
        """The ids of the requests settled since the last call (of this method; what
        :meth:`finished` hands out is kept for it)."""
        new = [row[0] for row in self._done[self._seen :]]
        self._seen = len(self._done)
        return new

    def finished(self) -> Finished:
        """The requests settled since the last call."""
        rows, self._done, self._seen = self._done, [], 0
        cols = list(zip(*rows, strict=True)) if rows else [()] * 8
        return Finished(
            np.array(cols[0], dtype=np.int64),
            np.array(cols[1], dtype=float),
            np.array(cols[2], dtype=float),
            np.array(cols[3], dtype=float),
            np.array(cols[4], dtype=np.int64),
            np.array(cols[5], dtype=np.int64),
            np.array(cols[6], dtype=bool),
            np.array(cols[7], dtype=float),
        )

    def token_gaps(self) -> list[tuple[float, float, int]]:
        """The gaps between consecutive output tokens made since the last call: (when, gap
        ms, tokens that came that long after the token before them)."""
        rows, self._gaps = self._gaps, []
        return rows

    def step_log(self) -> Steps:
        """The steps run since the last call."""
        rows, self._log = self._log, []
        cols = list(zip(*rows, strict=True)) if rows else [()] * 9
        ints = {2, 3, 4, 5, 6}
        return Steps(*(np.array(c, dtype=np.int64 if k in ints else float) for k, c in enumerate(cols)))

    # --- the policies ---------------------------------------------------------
    def _continuous(self) -> None:
        lim, kv = self.limits, self.kv
        budget = lim.max_num_batched_tokens
        cap = lim.long_prefill_token_threshold
        running, waiting = self.running, self.waiting
        scheduled: list[tuple[_Seq, int]] = []
        preempted = False
        tables, bs = kv.tables, lim.block_size
        i = 0
        while i < len(running) and budget > 0:
            s = running[i]
            n = s.prompt + s.made - s.computed
            if cap and n > cap:
                n = cap
            if n > budget:
                n = budget
            if -(-(s.computed + n) // bs) <= len(tables[s.rid]):  # its blocks hold them (most decodes)
                scheduled.append((s, n))
                budget -= n
                i += 1
                continue
            while kv.allocate(s.rid, s.computed + n) is None:
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is s:
                    break
            else:
                scheduled.append((s, n))
                budget -= n
                i += 1
                continue
            break
        if not preempted:
            while waiting and budget > 0 and len(running) < lim.max_num_seqs:
                s = waiting[0]
                total = s.prompt + s.made
                hit = s.ready or (kv.cached_prefix(s.keys, total) if s.eager else 0)
                n = total - hit
                if cap and n > cap:
                    n = cap
                n = min(n, budget)
                if self._admit(s, hit + n) is None:
                    break
                running.append(s)
                scheduled.append((s, n))
                budget -= n
        if not scheduled:
            if not preempted:  # nothing fits an empty replica (validation refuses such requests)
                self._idle_or_fail()
            return  # everything running was preempted: admission comes next
        self._run(scheduled)

    def _prefill_first(self) -> None:
        lim, kv = self.limits, self.kv
        running, waiting = self.running, self.waiting
        batch: list[tuple[_Seq, int]] = []
        tokens = 0
        while waiting:
            s = waiting[0]
            length = s.prompt + s.made
            if length > lim.max_num_batched_tokens:  # a preempted sequence grown past any prefill
                waiting.popleft()
                self._settle(s, ignored=True)
                continue
            if tokens + length > lim.max_num_batched_tokens or len(running) + len(batch) >= lim.max_num_seqs:
                break
            hit = kv.cached_prefix(s.keys, length) if s.eager else 0
            if kv.blocks_for(length) - hit // lim.block_size > kv.free_blocks - self.keep_free:
                break
            got = self._admit(s, length)
            if got is None:
                break
            batch.append((s, length - got))
            tokens += length
        if batch:
            running.extend(s for s, _ in batch)
            self._run(batch)
            return
        if not running:  # the head does not fit an empty replica above the watermark
            self._idle_or_fail()
            return
        self._decode_all()

    def _static(self) -> None:
        lim = self.limits
        running, waiting = self.running, self.waiting
        if not running:  # a new batch: as many as fit the KV cache, prefilled together
            batch: list[tuple[_Seq, int]] = []
            while waiting and len(batch) < lim.max_num_seqs:
                s = waiting[0]
                length = s.prompt + s.made
                got = self._admit(s, length)
                if got is None:
                    break
                batch.append((s, length - got))
            if not batch:
                self._idle_or_fail()
                return
            self.batch_width = len(batch)
            running.extend(s for s, _ in batch)
            self._run(batch, width=self.batch_width)
            return
        self._decode_all(width=self.batch_width)

    def _decode_all(self, width: int = 0) -> None:
        """One token for every running sequence, in arrival order (prefill_first, static);
        each needs its block: without one, the latest arrival not yet given its slot is
        preempted, or the sequence itself."""
        kv = self.kv
        order = sorted(self.running, key=lambda s: (s.arrival, s.rid))
        kept: list[_Seq] = []
        while order:
            s = order.pop(0)
            while kv.allocate(s.rid, s.computed + 1) is None:
                victim = order.pop() if order else s
                self._preempt(victim)
                if victim is s:
                    break
            else:
                kept.append(s)
        self.running = kept
        if not kept:
            if width:
                self.batch_width = 0
            return
        self._run([(s, 1) for s in kept], width=width)

    def _decode_stretch(self, horizon: float) -> bool:
        """Take, in one go, the decode-only steps that come next, when nothing can change
        between them: nobody waits to be admitted (static batching admits nobody while its
        batch runs), every running sequence decodes, none finishes (under continuous
        batching the last step may be the one in which the first do), every block they need
        is free, and each step starts before the next arrival and the horizon. Between such
        steps the context grows by the batch each step, so their times follow in closed
        form (:func:`decode_series`); the blocks are taken in the order the single steps
        take them, so the cache ends as it would have, and the clock adds the steps up one
        by one as they would. Returns whether it took any (at least two steps)."""
        lim, kv = self.limits, self.kv
        running = self.running
        d = len(running)
        if d < 1 or (self.waiting and self.policy != "static"):
            return False
        if self.policy == "continuous" and d > lim.max_num_batched_tokens:
            return False
        if self.noise is not None and not hasattr(self.noise, "peek"):
            return False
        if self.woke < len(self.wake):  # the steps just after an idle cost more: singly
            return False
        left, context = math.inf, 0
        for s in running:
            if s.made < 1 or s.computed != s.prompt + s.made - 1:
                return False
            left = min(left, s.output - s.made)
            context += s.computed + 1
        # the steps in which nobody finishes, and under continuous batching the one after,
        # in which the first finish: with nobody waiting it is a decode step like the others,
        # and its finished sequences leave at its end (the other policies take it singly)
        ends_batch = self.policy == "continuous"
        k = int(left) if ends_batch else int(left) - 1
        if k < 2:
            return False
        if self.policy != "continuous":  # prefill first and static decode in arrival order
            running = sorted(running, key=lambda s: (s.arrival, s.rid))
        width = self.batch_width if self.policy == "static" else d
        # a stretch is about ten steps of twenty sequences: plain floats, one by one, in the
        # order numpy's arrays computed them (the same bits), without numpy's cost a call
        ms = decode_series(self.step, width, context, d, k)
        if self.noise is not None:
            ms = [m * f for m, f in zip(ms, self.noise.peek(k).tolist(), strict=True)]
        # the clock as the single steps add it up, over the steps that start before the
        # next arrival and the horizon (their starts never decrease)
        limit = min(horizon, self.pending[0].arrival if self.pending else math.inf)
        ends, t = [], self.t
        begin = t  # the first step's start
        for work in ms:
            if t >= limit:
                break
            t = t + work if self.speed is None else self.speed.finish_at(t, work)
            ends.append(t)
        taken = len(ends)
        if taken < 2:
            return False
        # the blocks: sequence i needs one at step j (1-based) when c_i + j opens a block
        # (those of the steps that could be taken: a later step's block never limits them)
        bs = lim.block_size
        events = sorted(
            (j, pos) for pos, s in enumerate(running) for j in range((1 - s.computed) % bs or bs, taken + 1, bs)
        )
        free = kv.free_blocks
        if len(events) > free:
            taken = min(taken, events[free][0] - 1)  # the step whose block is not free: singly
        if taken < 2:
            return False
        if self.noise is not None:
            self.noise.consume(taken)
        # each step's blocks, then each step's newly full blocks named (as the single steps
        # do: naming after an eviction differs from naming before it)
        names = []
        if any(s.eager > s.named for s in running):
            names = [
                (j, pos)
                for pos, s in enumerate(running)
                if s.eager > s.named
                for j in range(bs - s.computed % bs, taken + 1, bs)
            ]
        todo = sorted([(j, 0, pos) for j, pos in events if j <= taken] + [(j, 1, pos) for j, pos in names])
        for j, naming, pos in todo:
            s = running[pos]
            if naming:
                full = min((s.computed + j) // bs, s.eager)
                if full > s.named:
                    _name(kv, s, full)
            else:
                kv.grow(s.rid, s.computed + j)  # its free blocks counted above
        del ends[taken:]
        end, first_end = ends[-1], ends[0]
        self.t = end
        self.steps += taken
        self.tokens_out += taken * d
        self.tokens_computed += taken * d
        diffs = [b - a for a, b in itertools.pairwise(ends)]
        gap = max(diffs)  # every sequence's gaps after the first step's
        first: dict[float, int] = {}  # the first step's gaps: each sequence's after its last token
        for s in running:
            g = first_end - s.last
            first[g] = first.get(g, 0) + 1
            s.computed += taken
            s.made += taken
            s.stall = max(s.stall, g, gap)
            s.last = end
        self._gaps.extend((first_end, g, n) for g, n in first.items())
        self._gaps.extend(zip(ends[1:], diffs, [d] * (taken - 1), strict=True))
        if self.policy != "continuous":
            self.running = running
        finished = ends_batch and taken == k
        if finished:  # as the single step ends: each finished sequence's blocks go, in batch order
            for s in [s for s in running if s.made >= s.output]:
                kv.free(s.rid)
                running.remove(s)
                self._settle(s)
        opened = [0] * (taken + 1)  # blocks taken at each step
        for j, _ in events:
            if j > taken:
                break
            opened[j] += 1
        waiting, blocks, held = len(self.waiting), kv.num_blocks, 0
        for j, t1 in enumerate(ends, start=1):
            held += opened[j]
            usage = 1.0 - (free - held) / blocks  # KVCache.usage's expression
            if finished and j == taken:
                usage = kv.usage  # after the finished sequences' blocks went
            self._log.append((begin, t1, 0, width, d, d, waiting, usage, 0.0))
            begin = t1
        return True

    # --- mechanics ------------------------------------------------------------
    def _admit(self, s: _Seq, tokens: int) -> int | None:
        """Blocks for ``s``, the head of the waiting queue, to hold ``tokens`` (sharing its
        cached prefix); on success it leaves the queue. Returns the tokens the cache
        served, or None when the blocks are not free (nothing changes)."""
        # (keys none of which can be cached yet are not looked up: see push)
        got = self.kv.allocate(s.rid, tokens, s.keys if s.eager else ())
        if got is None:
            return None
        self.waiting.popleft()
        got = max(got, s.ready)  # a prompt prefilled elsewhere: its KV is here
        s.computed = got
        if s.made == 0 and s.preempted == 0:
            s.cached = got
        return got

    def _preempt(self, s: _Seq) -> None:
        full = min(s.computed // self.limits.block_size, s.nkeys)
        if full > s.named:  # the blocks named lazily (push): named now, before they are freed
            _name(self.kv, s, full)
        s.eager = s.nkeys  # named as they fill from now on
        self.kv.free(s.rid)
        s.computed = 0
        s.ready = 0
        s.named = 0
        s.preempted += 1
        self.waiting.appendleft(s)
        if s in self.running:
            self.running.remove(s)

    def _idle_or_fail(self) -> None:
        """No step could be formed although requests wait: the head of the queue can never
        be served here (validation refuses such requests, so this is a guard)."""
        s = self.waiting.popleft()
        self._settle(s, ignored=True)

    def _run(self, scheduled: list[tuple[_Seq, int]], width: int = 0) -> None:
        """Run one step over ``scheduled`` (sequence, tokens it computes): its time, then
        the tokens it produced."""
        lim = self.limits
        during = len(self.running)
        prefill = chunks = decodes = context = 0
        attention = 0.0
        for s, n in scheduled:
            if s.made and s.computed == s.prompt + s.made - 1 and n == 1:
                decodes += 1
                context += s.computed + 1  # the new token attends to its context and itself
            else:
                prefill += n
                chunks += 1
                attention += n * (s.computed + n / 2.0)
        if width > decodes and not chunks:  # static: the finished keep their slots
            decodes = width
        work = Work(prefill, attention, chunks, decodes, context)
        ms = self.step.ms(work)
        # the prompt tokens' share of the step: what they add to the step without them
        share = 0.0
        if prefill and ms > 0:
            share = min(max(ms - self.step.ms(Work(decodes=decodes, decode_context=context)), 0.0), ms) / ms
        if self.woke < len(self.wake):
            ms += self.wake[self.woke]
            self.woke += 1
        if self.noise is not None:
            ms *= self.noise()
        start = self.t
        self.t = end = start + ms if self.speed is None else self.speed.finish_at(start, ms)
        self.steps += 1
        keep = self.policy == "static"
        gaps: dict[float, int] = {}
        bs, made_here = lim.block_size, 0
        for s, n in scheduled:
            if s.start != s.start:  # NaN: its first step
                s.start = start
            s.computed += n
            if s.eager and s.computed // bs > s.named:  # a block filled: named, as far as it has keys
                full = min(s.computed // bs, s.eager)
                if full > s.named:
                    _name(self.kv, s, full)
            if s.computed == s.prompt + s.made:  # every known token computed: one more token
                s.made += 1
                made_here += 1
                if s.made == 1:
                    s.first = end
                else:
                    g = end - s.last
                    gaps[g] = gaps.get(g, 0) + 1
                    if g > s.stall:
                        s.stall = g
                s.last = end
                if s.made >= s.output:
                    self.kv.free(s.rid)
                    if not keep:
                        self.running.remove(s)
                    self._settle(s)
        self.tokens_computed += sum(n for _, n in scheduled)
        self.tokens_out += made_here
        if keep:
            self.running = [s for s in self.running if s.made < s.output]
            if not self.running:
                self.batch_width = 0
        self._log.append(
            (start, end, prefill, decodes, len(scheduled), during, len(self.waiting), self.kv.usage, share)
        )
        self._gaps.extend((end, g, n) for g, n in gaps.items())

    def _settle(self, s: _Seq, ignored: bool = False) -> None:
        done = math.nan if ignored else self.t
        self._done.append((s.rid, s.start, s.first, done, s.preempted, s.cached, ignored, s.stall))


@dataclass
class Served:
    """What became of each request (request order): when its first token and its last were
    produced (ms, NaN if never), and how often it was preempted."""

    first_token: np.ndarray
    done: np.ndarray
    preemptions: np.ndarray
    ignored: np.ndarray  # dropped: preempted with more tokens than a prefill may hold (vLLM's "ignored")
    steps: int  # steps the engine ran
    start: np.ndarray | None = None  # when its first step started
    cached_tokens: np.ndarray | None = None
    log: Steps | None = None
    max_itl: np.ndarray | None = None  # its worst inter-token latency (ms)
    gaps: list[tuple[float, float, int]] | None = None  # (when, gap, tokens): every token's gap after its last


def _name(kv: KVCache, s: _Seq, full: int) -> None:
    """Name ``s``'s blocks from the first not named yet up to ``full`` (most often the one
    block a step filled)."""
    if full == s.named + 1:
        kv.name_block(s.rid, s.named, s.keys[s.named])
    else:
        kv.cache_full_blocks(s.rid, s.keys[s.named : full], s.named)
    s.named = full


def refuse(prompt: np.ndarray, output: np.ndarray, limits: Limits, policy: Policy) -> None:
    """Raise ValueError, naming the first such request, for one a replica can never serve:
    no output token, more tokens than the KV cache holds, or (prefill first, whole prompts)
    a prompt over ``max_num_batched_tokens``."""
    if len(output) and output.min() < 1:
        raise ValueError(f"request {int(np.argmin(output))} asks for {int(output.min())} output tokens; at least 1")
    capacity = limits.num_blocks * limits.block_size
    too_long = np.flatnonzero(prompt + output > capacity)
    if len(too_long):
        i = int(too_long[0])
        raise ValueError(
            f"request {i}: {int(prompt[i])} prompt + {int(output[i])} output tokens can never fit the "
            f"KV cache ({limits.num_blocks} blocks of {limits.block_size} = {capacity} tokens)"
        )
    if policy == "prefill_first":
        over = np.flatnonzero(prompt > limits.max_num_batched_tokens)
        if len(over):
            i = int(over[0])
            raise ValueError(
                f"request {i}: a {int(prompt[i])}-token prompt is over max_num_batched_tokens "
                f"{limits.max_num_batched_tokens}: it can never be prefilled"
            )


def serve(
    arrival_ms: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    step: StepModel,
    limits: Limits,
    policy: Policy = "continuous",
    *,
    groups: np.ndarray | None = None,
    shared_tokens: np.ndarray | None = None,
    noise=None,
    skip: bool = True,
    speed=None,
) -> Served:
    """Serve requests arriving at ``arrival_ms`` (sorted) with ``prompt`` and ``output``
    token counts on one replica under ``policy``; ``groups`` (a prefix group per request,
    -1 for none) with ``shared_tokens`` name shared prompt prefixes; ``skip`` takes
    decode-only stretches in one go (the same steps exactly). Raises ValueError,
    before serving, for a request the replica can never serve (:func:`refuse`)."""
    n = len(arrival_ms)
    prompt = np.asarray(prompt, dtype=np.int64)
    output = np.asarray(output, dtype=np.int64)
    refuse(prompt, output, limits, policy)
    rep = Replica(policy, step, limits, noise, skip=skip, speed=speed)
    for i in range(n):
        g = None if groups is None or groups[i] < 0 else int(groups[i])
        rep.push(
            i,
            float(arrival_ms[i]),
            int(prompt[i]),
            int(output[i]),
            g,
            0 if shared_tokens is None else int(shared_tokens[i]),
        )
    rep.advance()
    f = rep.finished()
    out = {k: np.full(n, np.nan) for k in ("first", "done", "start", "itl")}
    pre, cached = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    ign = np.zeros(n, dtype=bool)
    out["first"][f.rid], out["done"][f.rid], out["start"][f.rid] = f.first_token, f.done, f.start
    out["itl"][f.rid] = f.max_itl
    pre[f.rid], cached[f.rid], ign[f.rid] = f.preemptions, f.cached_tokens, f.ignored
    log, gaps = rep.step_log(), rep.token_gaps()
    return Served(out["first"], out["done"], pre, ign, rep.steps, out["start"], cached, log, out["itl"], gaps)


def serve_prefill_first(arrival_ms, prompt, output, step: StepModel, limits: Limits) -> Served:
    """:func:`serve` with vLLM 0.1.7's policy (DistServe's runs)."""
    return serve(arrival_ms, prompt, output, step, limits, "prefill_first")


__all__ = [
    "POLICIES",
    "Finished",
    "Limits",
    "Replica",
    "Served",
    "Steps",
    "refuse",
    "serve",
    "serve_prefill_first",
    "session_owner",
]
