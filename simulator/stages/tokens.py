"""An LLM request's work, drawn when it arrives: its prompt and output lengths in tokens,
and the shared prefix its prompt begins with (``traffic.tokens``).

Called as every stage is: built from the scenario and its streams, it draws in request
order, each quantity from its own child stream and only from draws whose values do not
depend on how many are taken at once, so a run in chunks draws what a whole run draws.
A request in a prefix group has the group's ``prefix.tokens`` followed by its own prompt.
With ``from_trace`` the lengths are a trace's, row by row in time order, beside its
arrivals (``traffic.arrivals_file``).

With ``sessions`` the requests are the turns of multi-turn conversations
(:class:`SessionTurns`): the arrivals are theirs, and each turn's prompt is its session's
earlier turns (their prompts and answers) followed by its own new input. Where a turn
waits for the answer before it (``turn_gap_from: answer``, or a population of ``users``)
the answers release the turns (:class:`~simulator.stages.closed_loop.ClosedLoop`).
"""

from __future__ import annotations

import math

import numpy as np

from simulator.rng import Streams, child
from simulator.scenario.config import Scenario
from simulator.scenario.tokens import read_trace
from simulator.stages.arrivals import ArrivalSource, shaped_source
from simulator.stages.closed_loop import ClosedLoop
from simulator.stages.turns import Work, groups


class SessionTurns:
    """The turns of multi-turn sessions, in time order, handed out in successive time
    chunks as :class:`~simulator.stages.arrivals.Arrivals` hands out arrivals.

    Sessions start as the traffic's arrival process at ``rate_rps`` over the mean turns. A
    session draws, when it starts, its turns, each turn's new input and answer lengths, the
    gaps between its turns' arrivals and its prefix group, each from its own stream in
    session order; its turns wait until their chunk comes. Within a session the turns'
    times and histories are summed along the session alone, so a session's numbers are the
    same whatever else its chunk holds. Turns in one chunk go in time order (ties: the
    earlier session, then the earlier turn). A session ends before a turn whose prompt and
    answer would exceed ``max_context_tokens``.

    The run starts in the steady state: sessions also start before time 0, at the rate of
    time 0 from a stream of their own, over a window no session outlasts but with
    negligible probability (its most turns times the gap's mean plus six standard
    deviations), and their turns from time 0 on arrive in the run.

    With ``users`` there is no rate: a fixed population, each user in one conversation at a
    time (:meth:`conversation`), the next begun when the last ends (:class:`ClosedLoop`).
    """

    def __init__(self, s: Scenario, rng: Streams, lengths: tuple, prefix, cdf, draws: list[np.random.Generator]):
        from simulator.scenario.distributions import Sampler

        sessions = s.traffic.tokens.sessions
        self.turns, self.prompt, self.output = sessions.turns, *lengths
        self.cap = sessions.max_context_tokens or np.iinfo(np.int64).max
        self.users = sessions.users  # a fixed population (no session starts at a rate)
        self.starts = None
        if self.users is None:
            self.starts = shaped_source(
                s.traffic.rate_rps, s.traffic.shape, s.duration_s * 1000.0, rng=rng.arrivals, per=sessions.mean_turns()
            )
        self.prefix, self.cdf = prefix, cdf  # the groups' popularity
        self.draws = draws  # prompt, output, member, pick: TokenDraws' streams
        self.count = child(rng.tokens, 4)
        self.gap = Sampler(sessions.turn_gap, child(rng.tokens, 5))
        self.next_session = 0
        self.waiting = (np.zeros(0), Work.empty())  # drawn turns not handed out yet
        self.ready = Work.empty()  # the work of the turns the last take handed out
        gap = sessions.turn_gap
        self.before_ms = (self.turns.upper - 1) * (gap.mean + 6.0 * math.sqrt(gap.variance))
        self.before = None
        if self.users is None:
            self.before = ArrivalSource(rate_rps=self.starts.rate_at(0.0), rng=child(rng.tokens, 6))
        self.user_seed = child(rng.tokens, 7).bit_generator.seed_seq  # each user's conversations' streams
        self.turn_gap = sessions.turn_gap
        self.turns_mean = sessions.mean_turns()
        self.closed = ClosedLoop(self) if sessions.turn_gap_from == "answer" else None

    def _draw(self, t0: np.ndarray) -> tuple[np.ndarray, Work, np.ndarray]:
        """The turns of sessions starting at ``t0``, in session order: their times as an
        open loop gives them, their work, and the gap before each (0 before a first)."""
        m = len(t0)
        turns = self.turns.sample(m, self.count)
        total = int(turns.sum())
        new_in = self.prompt.sample(total, self.draws[0])
        out = self.output.sample(total, self.draws[1])
        gaps = self.gap.draw(total - m)
        group, shared = groups(self.prefix, self.cdf, self.draws, m)
        # one row a session, one column a turn: sums along a row are the session's alone
        width = int(turns.max()) if m else 0
        on = np.arange(width) < turns[:, None]
        gap = np.zeros((m, width))
        gap[:, 1:][on[:, 1:]] = gaps
        tokens = np.zeros((m, width), dtype=np.int64)
        tokens[on] = new_in + out
        times = (t0[:, None] + np.cumsum(gap, axis=1))[on]
        history = (np.cumsum(tokens, axis=1) - tokens)[on]
        session = np.repeat(np.arange(self.next_session, self.next_session + m, dtype=np.int64), turns)
        self.next_session += m
        turn = np.broadcast_to(np.arange(width, dtype=np.int64), (m, width))[on]
        group, shared = np.repeat(group, turns), np.repeat(shared, turns)
        prompt = shared + history + new_in
        # a session ends before the turn that outgrows the context (each turn's prompt
        # holds the one before it and its answer: the turns kept are a session's first ones)
        keep = prompt + out <= self.cap
        work = Work(prompt, out, group, shared, session, turn, history)
        return times[keep], work.take(keep), gap[on][keep]

    def user_start(self, user: int) -> float:
        """When user ``user``'s first conversation begins, uniformly in a window before 0
        of five of a user's mean cycles (a conversation's turns and the think time after
        it), from a stream of its own: long enough that whether a user is in a
        conversation at 0, which turn it is at and how long its prompt has grown are near
        their steady state (1,000 users of ``llm_multiturn.yaml``'s conversations: the first
        minute's prompts 5.7% short of the steady state's; over a window of two cycles,
        19.2%)."""
        cycle = self.turns_mean * self.turn_gap.mean
        seq = self.user_seed
        g = np.random.default_rng(np.random.SeedSequence(seq.entropy, spawn_key=(*seq.spawn_key, user, 1 << 32)))
        return -5.0 * cycle * float(g.random())

    def conversation(self, user: int, c: int, t0: float) -> tuple[np.ndarray, Work, np.ndarray, float]:
        """User ``user``'s ``c``-th conversation (session ``c * users + user``), its first turn
        sent at ``t0``: its turns' open-loop times, work and gaps, as :meth:`_draw`, and the
        think time after its last answer. Drawn from a stream of its own, so that what it
        draws does not depend on when, or beside what, it starts."""
        seq = self.user_seed
        g = np.random.default_rng(np.random.SeedSequence(seq.entropy, spawn_key=(*seq.spawn_key, user, c)))
        turns = int(self.turns.sample(1, g)[0])
        new_in, out = self.prompt.sample(turns, g), self.output.sample(turns, g)
        gaps = self.turn_gap.sample(turns, rng=g)  # before turns 1, 2, ... and after the last
        group, shared = groups(self.prefix, self.cdf, [g, g, g, g], 1)
        gap = np.concatenate([[0.0], gaps[:-1]])
        tokens = new_in + out
        history = np.cumsum(tokens) - tokens
        prompt = shared[0] + history + new_in
        work = Work(
            prompt,
            out,
            np.full(turns, group[0]),
            np.full(turns, shared[0]),
            np.full(turns, c * self.users + user, dtype=np.int64),
            np.arange(turns, dtype=np.int64),
            history,
        )
        keep = prompt + out <= self.cap
        return (t0 + np.cumsum(gap))[keep], work.take(keep), gap[keep], float(gaps[-1])

    def _start(self, t0: np.ndarray) -> tuple[np.ndarray, Work]:
        """The turns of sessions starting at ``t0``: their times and work (open loop)."""
        times, work, _ = self._draw(t0)
        return times, work

    def take(self, until_ms: float) -> tuple[np.ndarray, np.ndarray]:
        """The turns arriving before ``until_ms`` not handed out yet (sorted) and their
        traffic classes (0); their work is :attr:`ready`."""
        if self.closed is not None:
            return self.closed.take(until_ms)
        if self.before is not None:  # the sessions under way when the run starts
            early = self.before.take(self.before_ms) - self.before_ms if self.before_ms > 0 else np.zeros(0)
            self.before = None
            kept = []
            for lo in range(0, len(early), 1 << 16):  # in blocks: most of them end before time 0
                t_new, w_new = self._start(early[lo : lo + (1 << 16)])
                now = t_new >= 0
                kept.append((t_new[now], w_new.take(now)))
            if kept:
                self.waiting = (
                    np.concatenate([t for t, _ in kept]),
                    Work(*(np.concatenate(c) for c in zip(*(w for _, w in kept), strict=True))),
                )
        times, work = self.waiting
        t0 = self.starts.take(until_ms)
        if len(t0):
            t_new, w_new = self._start(t0)
            times = np.concatenate([times, t_new])
            work = Work(*(np.concatenate(c) for c in zip(work, w_new, strict=True)))
        now = times < until_ms
        order = np.flatnonzero(now)
        order = order[np.lexsort((work.turn[order], work.session[order], times[order]))]
        self.waiting = (times[~now], work.take(~now))
        self.ready = work.take(order)
        return times[order], np.zeros(len(order), dtype=np.int8)


class TokenDraws:
    """The tokens of each request, in request order."""

    def __init__(self, s: Scenario, rng: Streams):
        t = s.traffic.tokens
        self.trace = None
        if t.from_trace:  # the trace's own lengths, request by request
            _, prompt, output = read_trace(s.traffic.arrivals_file, s.duration_s * 1000.0)
            self.trace, self.at = (prompt, output), 0
        else:
            self.prompt, self.output = t.lengths()
        self.prefix = t.prefix
        self.rng = [child(rng.tokens, k) for k in range(4)]
        self.cdf = None
        if self.prefix is not None:
            w = np.arange(1, self.prefix.groups + 1, dtype=float) ** -self.prefix.zipf_s
            self.cdf = np.cumsum(w / w.sum())
        self.sessions = None
        if t.sessions is not None:
            self.sessions = SessionTurns(s, rng, t.lengths(), self.prefix, self.cdf, self.rng)

    def take(self, until_ms: float) -> tuple[np.ndarray, np.ndarray]:
        """The sessions' turns before ``until_ms`` (the arrivals, where there are sessions)."""
        return self.sessions.take(until_ms)

    def draw(self, n: int) -> Work:
        if self.sessions is not None:  # the turns the last take handed out
            if len(self.sessions.ready.prompt) != n:
                raise RuntimeError(f"{n} arrivals but {len(self.sessions.ready.prompt)} session turns")
            return self.sessions.ready
        if self.trace is not None:
            prompt, output = (col[self.at : self.at + n] for col in self.trace)
            self.at += n
        else:
            prompt = self.prompt.sample(n, self.rng[0])
            output = self.output.sample(n, self.rng[1])
        group, shared = groups(self.prefix, self.cdf, self.rng, n)
        prompt = prompt + shared
        none = np.full(n, -1, dtype=np.int64)
        return Work(prompt, output, group, shared, none, np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64))

    def columns(self, n: int) -> dict[str, np.ndarray]:
        """The ledger's LLM columns of ``n`` arriving requests: their work (:meth:`draw`),
        and what their replicas will fill in (first token, preemptions, cached prompt
        tokens, the worst gap between tokens)."""
        w = self.draw(n)
        turns = {} if self.sessions is None else {"session": w.session, "turn": w.turn, "history": w.history}
        return {
            "prompt_tokens": w.prompt,
            "output_tokens": w.output,
            "prefix_group": w.group,
            "shared_tokens": w.shared,
            **turns,
            "t_first_token": np.full(n, np.nan),
            "preemptions": np.zeros(n, dtype=np.int64),
            "cached_tokens": np.zeros(n, dtype=np.int64),
            "max_itl_ms": np.full(n, np.nan),
        }


__all__ = ["SessionTurns", "TokenDraws"]
