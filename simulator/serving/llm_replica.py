"""One LLM replica stepping over its paged KV cache, as vLLM's engines do.

Each iteration of the engine is one *step* on the GPU: the scheduler picks which sequences
compute how many tokens, the model runs once over all of them, and every sequence whose
known tokens are then all computed samples one more output token. Who joins a step is the
replica's scheduler's to decide (``batching.policy``, one module each, behind one Protocol:
:mod:`simulator.serving.replica_scheduler`): vLLM V1's chunked prefill, vLLM v0's prefill
first, or static batches. The replica keeps the rest: the clock, the queues, the KV cache
(:mod:`simulator.serving.kv_cache`), and the mechanics every policy shares: admitting a
sequence, preempting one by recompute (its blocks freed, their content kept in the prefix
cache while it lasts, and back to the front of the waiting queue), running a step and
settling what it finished.

A step's time is a function of its work (:mod:`simulator.serving.step_time`: a fitted
linear form, DistServe's, or a roofline), times the replica's noise. With nothing running
and nothing waiting the replica idles until the next arrival; the first steps after it
idled cost a fitted ``wake_ms`` more each (a fitted step time's). The output length is not
the scheduler's to know: a sequence stops when it has produced it. Decode-only stretches
are taken in one go where nothing can change between their steps
(:mod:`simulator.serving.decode_stretch`: the same steps, exactly).

:class:`Replica` steps incrementally: requests are pushed as they become known and
:meth:`Replica.advance` runs every step that starts before the horizon of what is known,
so a run in chunks takes the same steps as a run in one. A whole run on one replica in one
call is :func:`simulator.serving.llm_serve.serve`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Sequence

from simulator.ledger import table_columns
from simulator.scenario.llm import Policy
from simulator.serving.decode_stretch import decode_stretch
from simulator.serving.kv_cache import KVCache
from simulator.serving.llm_types import Finished, Keys, Limits, Seq, Steps, name_blocks, session_owner
from simulator.serving.replica_scheduler import replica_scheduler
from simulator.serving.step_time import StepModel, Work


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
        Take decode-only stretches in one go (:func:`decode_stretch`; the same steps).
    speed : SpeedPath, optional
        The host's speed (``platform.speed``): a step of ``ms`` nominal work started at
        ``t`` ends at ``speed.finish_at(t, ms)``.

    Attributes
    ----------
    scheduler : ReplicaScheduler
        Its policy, which decides each step.
    pending, waiting, running
        Pushed requests not yet arrived at its clock; arrived, not admitted (the front
        first); admitted, in the order they were.
    settled, log_rows, gap_rows : list of tuple
        What :meth:`finished`, :meth:`step_log` and :meth:`token_gaps` hand out, row by row.
    """

    def __init__(self, policy: Policy, step: StepModel, limits: Limits, noise=None, *, skip: bool = True, speed=None):
        self.scheduler = replica_scheduler(policy, limits)  # refuses an unknown policy
        self.step, self.limits, self.noise = step, limits, noise
        self.skip = skip  # take decode-only stretches in one go (the same steps, exactly)
        self.speed = speed  # the host's speed path (platform.speed): a step's work as a time change
        self.kv = KVCache(limits.num_blocks, limits.block_size, prefix_caching=limits.prefix_caching)
        self.pending: deque[Seq] = deque()  # pushed, not yet arrived at the replica's clock
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.t = 0.0
        self.wake = tuple(getattr(step, "wake_ms", ()))  # extra ms of the first steps after an idle
        self.woke = 0  # steps since the replica last idled (it starts idle; len(wake) or more: awake)
        self.steps = 0
        self.tokens_out = 0  # output tokens produced
        self.tokens_computed = 0  # tokens whose KV a step computed (recomputes included, cache hits not)
        self.settled: list[tuple] = []
        self.log_rows: list[tuple] = []
        self.gap_rows: list[tuple[float, float, int]] = []  # (when, gap, tokens): each token's gap after the one before
        self._seen = 0  # of settled, the rows just_finished() has handed out
        # where an autoscaler reads the time to first token: (when, TTFT ms) of the first
        # tokens made in the last ``ttft_window`` ms (0: none kept)
        self.ttft_window = 0.0
        self.firsts: deque[tuple[float, float]] = deque()
        # no request settles in a step that starts before this time unless one is pushed
        # (set by a decode stretch cut short by the horizon; see :meth:`load_at`)
        self.quiet_until = math.inf

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
        self.quiet_until = -math.inf  # what it changes is for advance() to find
        s = Seq(rid, arrival, int(prompt), int(output), keys, eager)
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
                    self.quiet_until = math.inf  # nothing to settle until a push
                    return
                self.t = pending[0].arrival
                self.woke = 0
                continue
            if self.t >= horizon:
                return
            self.quiet_until = -math.inf  # a stretch cut short by the horizon says otherwise
            if self.skip and decode_stretch(self, horizon):
                continue
            self.scheduler.step(self)

    def load_at(self, t: float) -> int:
        """Requests pushed and not settled after the steps that start before ``t`` (what
        a least-loaded router counts), stepping only when a step before ``t`` may settle
        one: a decode stretch cut short knows when its first finish (or a block's
        shortage) comes, and nothing else changes the count."""
        if t > self.quiet_until:
            self.advance(t)
        return len(self.pending) + len(self.waiting) + len(self.running)

    def just_finished(self) -> list[int]:
        """The ids of the requests settled since the last call (of this method; what
        :meth:`finished` hands out is kept for it)."""
        new = [row[0] for row in self.settled[self._seen :]]
        self._seen = len(self.settled)
        return new

    def finished(self) -> Finished:
        """The requests settled since the last call."""
        rows, self.settled, self._seen = self.settled, [], 0
        cols = table_columns(rows, 8, ints=(0, 4, 5, 6))
        cols[6] = cols[6].astype(bool)  # ignored
        return Finished(*cols)

    def token_gaps(self) -> list[tuple[float, float, int]]:
        """The gaps between consecutive output tokens made since the last call: (when, gap
        ms, tokens that came that long after the token before them)."""
        rows, self.gap_rows = self.gap_rows, []
        return rows

    def step_log(self) -> Steps:
        """The steps run since the last call."""
        rows, self.log_rows = self.log_rows, []
        return Steps(*table_columns(rows, 9, ints=(2, 3, 4, 5, 6)))

    # --- the mechanics every scheduler shares -----------------------------------
    def admit(self, s: Seq, tokens: int) -> int | None:
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

    def preempt(self, s: Seq) -> None:
        """Preempt ``s`` by recompute: its blocks freed (their content named in the prefix
        cache first), back to the front of the waiting queue."""
        full = min(s.computed // self.limits.block_size, s.nkeys)
        if full > s.named:  # the blocks named lazily (push): named now, before they are freed
            name_blocks(self.kv, s, full)
        s.eager = s.nkeys  # named as they fill from now on
        self.kv.free(s.rid)
        s.computed = 0
        s.ready = 0
        s.named = 0
        s.preempted += 1
        self.waiting.appendleft(s)
        if s in self.running:
            self.running.remove(s)

    def refuse_head(self) -> None:
        """No step could be formed although requests wait: the head of the queue can never
        be served here (validation refuses such requests, so this is a guard)."""
        s = self.waiting.popleft()
        self.settle(s, ignored=True)

    def decode_all(self, width: int = 0) -> None:
        """One token for every running sequence, in arrival order (prefill first, static),
        the step computed at ``width`` at least; each needs its block: without one, the
        latest arrival not yet given its slot is preempted, or the sequence itself."""
        kv = self.kv
        order = sorted(self.running, key=lambda s: (s.arrival, s.rid))
        kept: list[Seq] = []
        while order:
            s = order.pop(0)
            while kv.allocate(s.rid, s.computed + 1) is None:
                victim = order.pop() if order else s
                self.preempt(victim)
                if victim is s:
                    break
            else:
                kept.append(s)
        self.running = kept
        if not kept:
            return
        self.run_step([(s, 1) for s in kept], width=width)

    def run_step(self, scheduled: list[tuple[Seq, int]], width: int = 0) -> None:
        """Run one step over ``scheduled`` (sequence, tokens it computes), computed at
        ``width`` decodes at least (static batches: the finished keep their slots): its
        time, then the tokens it produced."""
        during = len(self.running)
        prefill = chunks = decodes = context = total = 0
        attention = 0.0
        for s, n in scheduled:
            total += n
            if n == 1 and s.made and s.computed == s.prompt + s.made - 1:
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
        keep = self.scheduler.keeps_slots
        gaps: dict[float, int] = {}
        bs, made_here, kv, done = self.limits.block_size, 0, self.kv, []
        for s, n in scheduled:
            if s.start != s.start:  # NaN: its first step
                s.start = start
            computed = s.computed = s.computed + n
            if s.eager and computed // bs > s.named:  # a block filled: named, as far as it has keys
                full = min(computed // bs, s.eager)
                if full > s.named:
                    name_blocks(kv, s, full)
            if computed == s.prompt + s.made:  # every known token computed: one more token
                made = s.made = s.made + 1
                made_here += 1
                if made == 1:
                    s.first = end
                    if self.ttft_window:
                        self.firsts.append((end, end - s.arrival))
                else:
                    g = end - s.last
                    gaps[g] = gaps.get(g, 0) + 1
                    if g > s.stall:
                        s.stall = g
                s.last = end
                if made >= s.output:
                    kv.free(s.rid)
                    done.append(s)
        if done:
            running = self.running
            if keep:
                for s in done:
                    self.settle(s)
                self.running = [s for s in running if s.made < s.output]
            else:
                for s in done:
                    running.remove(s)
                    self.settle(s)
        self.tokens_computed += total
        self.tokens_out += made_here
        self.log_rows.append((start, end, prefill, decodes, len(scheduled), during, len(self.waiting), kv.usage, share))
        self.gap_rows.extend((end, g, n) for g, n in gaps.items())

    def settle(self, s: Seq, ignored: bool = False) -> None:
        """``s`` leaves the replica: done now, or dropped (``ignored``)."""
        done = math.nan if ignored else self.t
        self.settled.append((s.rid, s.start, s.first, done, s.preempted, s.cached, ignored, s.stall))


__all__ = ["Replica"]
