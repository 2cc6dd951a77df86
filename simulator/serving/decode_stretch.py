"""A replica's decode-only stretches taken in one go: the same steps, exactly, at a
fraction of the cost.

Most of an LLM replica's steps, once its requests are admitted, decode one token for every
running sequence and change nothing else: nobody is admitted, nobody finishes, every block
needed is free. Their times then follow in closed form from the growing context
(:func:`~simulator.serving.step_time.decode_series`), and their blocks, clock, token gaps
and step log can be written for the whole stretch at once. What the scheduler would do
instead is its own to say (:meth:`ReplicaScheduler.decodes_all
<simulator.serving.replica_scheduler.ReplicaScheduler.decodes_all>`), so a stretch is taken
only where it and the single steps agree; ``benchmarks/record_hashes.py`` and the tests
hold the two to the same bits.
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING

from simulator.serving.llm_types import name_blocks
from simulator.serving.step_time import decode_series

if TYPE_CHECKING:
    from simulator.serving.llm_replica import Replica


def decode_stretch(rep: Replica, horizon: float) -> bool:
    """Take, in one go, the decode-only steps that come next on ``rep``, when nothing can
    change between them: its scheduler would decode every running sequence
    (:meth:`ReplicaScheduler.decodes_all`: nobody waits to be admitted, the budget holds
    them all), none finishes (where the scheduler lets it, the last step may be the one in which
    the first do), every block they need is free, and each step starts before the next
    arrival and ``horizon``. Between such steps the context grows by the batch each step,
    so their times follow in closed form (:func:`decode_series`); the blocks are taken in
    the order the single steps take them, so the cache ends as it would have, and the clock
    adds the steps up one by one as they would. Returns whether it took any (at least two
    steps)."""
    lim, kv = rep.limits, rep.kv
    running, scheduler = rep.running, rep.scheduler
    d = len(running)
    if d < 1 or not scheduler.decodes_all(rep):
        return False
    if rep.noise is not None and not hasattr(rep.noise, "peek"):
        return False
    if rep.woke < len(rep.wake):  # the steps just after an idle cost more: singly
        return False
    left, context = math.inf, 0
    for s in running:
        if s.made < 1 or s.computed != s.prompt + s.made - 1:
            return False
        r = s.output - s.made
        if r < left:
            left = r
        context += s.computed + 1
    # the steps in which nobody finishes, and where the scheduler lets it (vLLM V1's) the
    # one after, in which the first finish: with nobody waiting it is a decode step like
    # the others, and its finished sequences leave at its end (the others take it singly)
    ends_batch = scheduler.finishes_in_stretch
    k = int(left) if ends_batch else int(left) - 1
    if k < 2:
        return False
    if scheduler.in_arrival_order:
        running = sorted(running, key=lambda s: (s.arrival, s.rid))
    width = scheduler.width(d)
    # a stretch is about ten steps of twenty sequences: plain floats, one by one, in the
    # order numpy's arrays computed them (the same bits), without numpy's cost a call
    ms = decode_series(rep.step, width, context, d, k)
    if rep.noise is not None:
        ms = [m * f for m, f in zip(ms, rep.noise.peek(k).tolist(), strict=True)]
    # the clock as the single steps add it up, over the steps that start before the
    # next arrival and the horizon (their starts never decrease)
    limit = min(horizon, rep.pending[0].arrival if rep.pending else math.inf)
    ends, t = [], rep.t
    begin = t  # the first step's start
    for work in ms:
        if t >= limit:
            break
        t = t + work if rep.speed is None else rep.speed.finish_at(t, work)
        ends.append(t)
    taken = len(ends)
    # the blocks: sequence i needs one at step j (1-based) when c_i + j opens a block
    # (over all k steps: the first step short of a block also bounds the quiet time below)
    bs = lim.block_size
    events = [(j, pos) for pos, s in enumerate(running) for j in range((1 - s.computed) % bs or bs, k + 1, bs)]
    events.sort()
    free = kv.free_blocks
    short = events[free][0] if len(events) > free else k + 1  # the first step whose block is not free
    if short <= taken:
        taken = short - 1  # that step: singly
    # (said even when too few steps are taken here: the single steps take the same ones)
    _quiet_until(rep, ms, ends, taken, min(int(left), short))
    if taken < 2:
        return False
    if rep.noise is not None:
        rep.noise.consume(taken)
    # each step's blocks, then each step's newly full blocks named (as the single steps
    # do: naming after an eviction differs from naming before it)
    names = [
        (j, pos)
        for pos, s in enumerate(running)
        if s.eager > s.named
        for j in range(bs - s.computed % bs, taken + 1, bs)
    ]
    if not names:  # the blocks alone, in the single steps' order, taken at once (counted free above)
        kv.grow_each([running[pos].rid for j, pos in events if j <= taken])
    else:
        todo = sorted([(j, 0, pos) for j, pos in events if j <= taken] + [(j, 1, pos) for j, pos in names])
        for j, naming, pos in todo:
            s = running[pos]
            if naming:
                full = min((s.computed + j) // bs, s.eager)
                if full > s.named:
                    name_blocks(kv, s, full)
            else:
                kv.grow(s.rid, s.computed + j)  # its free blocks counted above
    del ends[taken:]
    end, first_end = ends[-1], ends[0]
    rep.t = end
    rep.steps += taken
    rep.tokens_out += taken * d
    rep.tokens_computed += taken * d
    diffs = [b - a for a, b in itertools.pairwise(ends)]
    gap = max(diffs)  # every sequence's gaps after the first step's
    first: dict[float, int] = {}  # the first step's gaps: each sequence's after its last token
    for s in running:
        g = first_end - s.last
        first[g] = first.get(g, 0) + 1
        s.computed += taken
        s.made += taken
        worst = g if g > gap else gap
        if worst > s.stall:
            s.stall = worst
        s.last = end
    rep.gap_rows.extend((first_end, g, n) for g, n in first.items())
    rep.gap_rows.extend(zip(ends[1:], diffs, [d] * (taken - 1), strict=True))
    rep.running = running  # in the order it decoded (the replica's own list when not sorted)
    finished = ends_batch and taken == k
    if finished:  # as the single step ends: each finished sequence's blocks go, in batch order
        for s in [s for s in running if s.made >= s.output]:
            kv.free(s.rid)
            running.remove(s)
            rep.settle(s)
    opened = [0] * (taken + 1)  # blocks taken at each step
    for j, _ in events:
        if j > taken:
            break
        opened[j] += 1
    waiting, blocks, held = len(rep.waiting), kv.num_blocks, 0
    for j, t1 in enumerate(ends, start=1):
        held += opened[j]
        usage = 1.0 - (free - held) / blocks  # KVCache.usage's expression
        if finished and j == taken:
            usage = kv.usage  # after the finished sequences' blocks went
        rep.log_rows.append((begin, t1, 0, width, d, d, waiting, usage, 0.0))
        begin = t1
    return True


def _quiet_until(rep: Replica, ms: list[float], ends: list[float], taken: int, first: int) -> None:
    """Tell ``rep`` when the first step that may settle a request (or preempt one) starts:
    step ``first`` (1-based) of the ``k`` whose times ``ms`` holds, where the first
    sequence finishes or a block is short, as long as nothing new arrives (a push resets
    it), nor past the next pushed request's arrival. Until then its load (requests pushed
    less those settled) cannot change, so a router reading only that need not step it
    (:meth:`Replica.advance`). Its start is the end of step ``first - 1``, on the clock the
    later steps will add up: the same bits."""
    if first <= taken:  # it is among the steps taken: what comes after is not known here
        return
    t = ends[taken - 1] if taken else rep.t
    for work in ms[taken : first - 1]:
        t = t + work if rep.speed is None else rep.speed.finish_at(t, work)
    rep.quiet_until = min(t, rep.pending[0].arrival) if rep.pending else t


__all__ = ["decode_stretch"]
