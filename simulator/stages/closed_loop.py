"""Conversations whose turns wait for their answers (``turn_gap_from: answer``, or a
population of ``users``): the answers the engine settles release the next turns, and a
chunk of the run ends before any turn not known yet could arrive."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from simulator.stages.turns import Work

if TYPE_CHECKING:
    from simulator.stages.tokens import SessionTurns


class ClosedLoop:
    """Sessions whose turns wait for their answers (``turn_gap_from: answer``).

    A session draws what an open-loop one draws, from the same streams, but only its
    first turn's time is known when it starts; each later turn is parked until the turn
    before it is answered, then arrives its gap after the answer reached the user. A turn
    that is not answered (rejected, dropped, failed) ends its session.

    The engine learns the answers chunk by chunk, so a chunk must end before any turn
    it does not know yet can arrive (:meth:`reach`): a turn in flight at the chunk's
    start ``lo`` is answered after ``lo`` (or after the floor its replica's state gives,
    :meth:`~simulator.serving.continuous.Replicas.answer_floors`), one arriving in the
    chunk at ``t`` after ``t``, and its next turn comes its gap later; with a think time
    of 0 the answers' own least time, a step's
    (:meth:`~simulator.serving.continuous.Replicas.least_step`), keeps the chunk from
    ending where it starts. Cut so, the chunks
    hand out the turns a whole run would, in the same order, and the records are the same
    for any chunk length.

    The run starts near the steady state: the sessions under way at time 0 are an open
    loop's (:class:`SessionTurns`), as if their answers before time 0 had taken no time, so
    each one's first turn in the run comes its gap after its last turn before 0 arrived,
    and its later turns wait for their answers. Sessions then under way are fewer than a
    closed loop keeps (turns 6-7% under their steady rate in the first two minutes of
    ``llm_multiturn.yaml``: ``calibrate/experiments/closed_loop_start.py``): the warm-up
    absorbs it. With ``users`` there are no session starts: each user is placed so, its
    conversations played from a start in a window before 0 to the one under way at 0
    (:meth:`_under_way`), and a conversation's end (its last turn answered, or one failed)
    begins its user's next, a think time later.
    """

    def __init__(self, sessions: SessionTurns):
        self.sessions = sessions
        self.times = np.zeros(0)  # the turns whose times are known, not handed out yet
        self.work = Work.empty()
        self.next_gap = np.zeros(0)  # the gap after each of them (inf: its session's last turn)
        self.parked: dict[int, list[tuple]] = {}  # session -> its later turns (work, gap), last first
        self.awaiting: dict[int, float] = {}  # session -> next gap, its turn handed out and unanswered
        self.drawn_until = -math.inf
        self.users = sessions.users
        self.user_of: dict[int, tuple[int, int, float]] = {}  # session -> user, conversation, think after it

    def _start(self, until_ms: float) -> None:
        """The sessions starting before ``until_ms`` (the first time, those under way at 0)."""
        if until_ms <= self.drawn_until:
            return
        ses = self.sessions
        if self.users is not None:
            if self.drawn_until == -math.inf:  # every user's conversation under way at time 0, admitted at once
                self._admit_all([self._under_way(user) for user in range(self.users)])
            self.drawn_until = until_ms
            return
        if ses.before is not None:
            early = ses.before.take(ses.before_ms) - ses.before_ms if ses.before_ms > 0 else np.zeros(0)
            ses.before = None
            for lo in range(0, len(early), 1 << 16):  # in blocks: most of them end before time 0
                times, work, gap = ses._draw(early[lo : lo + (1 << 16)])
                now = times >= 0
                self._admit(times[now], work.take(now), gap[now])
        self.drawn_until = until_ms
        t0 = ses.starts.take(until_ms)
        if len(t0):
            self._admit(*ses._draw(t0))

    def _rows(self, user: int, c: int, drawn: tuple, from_ms: float = -math.inf):
        """User ``user``'s ``c``-th conversation (as :meth:`SessionTurns.conversation` drew
        it), its turns from ``from_ms`` on: their times, work, gaps and the think time after
        the conversation, a row each."""
        times, work, gap, after = drawn
        self.user_of[c * self.users + user] = (user, c, after)
        now = times >= from_ms
        return times[now], work.take(now), gap[now], np.full(int(now.sum()), after)

    def _admit_all(self, parts: list[tuple]) -> None:
        """Users' conversations (:meth:`_rows`), admitted at once."""
        if parts:
            times, gap, after = (np.concatenate([p[k] for p in parts]) for k in (0, 2, 3))
            self._admit(times, Work(*(np.concatenate(c) for c in zip(*(p[1] for p in parts), strict=True))), gap, after)

    def _under_way(self, user: int) -> tuple[np.ndarray, Work, np.ndarray, np.ndarray]:
        """User ``user`` at time 0: its conversations from a start in the window before 0
        (:meth:`SessionTurns.user_start`), played as an open loop (as if their answers had
        taken no time) up to the one under way at 0, whose turns from 0 on arrive in the run
        (or, between two conversations, the next one, when its think time ends): their
        times, work, gaps and the think time after the conversation, a row each."""
        ses = self.sessions
        t, c = ses.user_start(user), 0
        while True:
            drawn = ses.conversation(user, c, t)
            times, after = drawn[0], drawn[3]
            end = (times[-1] if len(times) else t) + after  # its user's next conversation
            if end >= 0:
                break
            t, c = end, c + 1
        if not (times >= 0).any():  # between two conversations: the next one
            return self._rows(user, c + 1, ses.conversation(user, c + 1, end))
        return self._rows(user, c, drawn, from_ms=0.0)

    def _admit(self, times: np.ndarray, work: Work, gap: np.ndarray, after: float | np.ndarray = math.inf) -> None:
        """Sessions' turns in session order, each session's from its first in the run: that
        one's time is known, the later ones are parked until their answers. ``after``: the
        think time after a session's last turn (its user's next conversation), one for all
        or a row each."""
        if not len(times):
            return
        first = np.ones(len(times), dtype=bool)
        first[1:] = work.session[1:] != work.session[:-1]
        nxt = np.array(np.broadcast_to(after, len(times)), dtype=float)  # the gap before the session's next turn
        nxt[:-1][~first[1:]] = gap[1:][~first[1:]]
        later = np.flatnonzero(~first)
        for row in zip(*(c[later].tolist() for c in work), gap[later].tolist(), strict=True):
            self.parked.setdefault(row[4], []).append(row)
        for turns in (self.parked[s] for s in set(work.session[later].tolist())):
            turns.reverse()  # the next turn at the end
        self._known(times[first], work.take(first), nxt[first])

    def _known(self, times: np.ndarray, work: Work, next_gap: np.ndarray) -> None:
        self.times = np.concatenate([self.times, times])
        self.work = Work(*(np.concatenate(c) for c in zip(self.work, work, strict=True)))
        self.next_gap = np.concatenate([self.next_gap, next_gap])

    def reach(
        self,
        lo: float,
        hi: float,
        floors: dict[int, float] | None = None,
        least: tuple[float, float] = (0.0, math.inf),
    ) -> float:
        """The end of a chunk from ``lo`` meant to end at ``hi``: ``hi``, or earlier where a
        turn not known yet could arrive before it. ``floors``: sessions whose turn in
        flight is known to be answered no earlier than a time after ``lo``. ``least``:
        ``(ms, until)``, every answer comes at least ``ms`` after its turn reached the
        fleet (and after ``lo``) up to ``until``
        (:meth:`~simulator.serving.continuous.Replicas.least_step`): with it a think time
        of 0 (a turn sent as the answer before it arrives) still lets a chunk end after
        ``lo``. The later of the two bounds, each safe."""
        self._start(hi)
        floors = floors or {}
        ms, until = least
        if ms <= 0:
            return self._cut(lo, hi, floors, 0.0)
        cut = self._cut(lo, hi, floors, ms)  # never below the other: each of its terms is at least the other's
        return cut if cut <= until else max(self._cut(lo, hi, floors, 0.0), until)

    def _cut(self, lo: float, hi: float, floors: dict[int, float], ms: float) -> float:
        """The earliest a turn not known yet could arrive, were every answer at least
        ``ms`` after its turn and after ``lo``: ``hi`` at most."""
        cut = hi
        if self.awaiting:
            cut = min(cut, min(max(lo + ms, floors.get(s, lo)) + g for s, g in self.awaiting.items()))
        soon = self.times < hi
        if soon.any():
            cut = min(cut, float((self.times[soon] + ms + self.next_gap[soon]).min()))
        return cut

    def take(self, until_ms: float) -> tuple[np.ndarray, np.ndarray]:
        self._start(until_ms)
        now = self.times < until_ms
        order = np.flatnonzero(now)
        order = order[np.lexsort((self.work.turn[order], self.work.session[order], self.times[order]))]
        times, nxt = self.times[order], self.next_gap[order]
        ready = self.work.take(order)
        self.times, self.work, self.next_gap = self.times[~now], self.work.take(~now), self.next_gap[~now]
        going = np.isfinite(nxt)
        self.awaiting.update(zip(ready.session[going].tolist(), nxt[going].tolist(), strict=True))
        self.sessions.ready = ready
        return times, np.zeros(len(order), dtype=np.int8)

    def answered(self, hi: float, session: np.ndarray, turn: np.ndarray, t_answer: np.ndarray, ok: np.ndarray) -> None:
        """Turns settled in the chunk ending at ``hi``: each answered one's next turn arrives
        its gap after ``t_answer`` (never before ``hi``: :meth:`reach`); an unanswered one
        ends its session."""
        rows, ended = [], []
        for s, k, t, good in zip(session.tolist(), turn.tolist(), t_answer.tolist(), ok.tolist(), strict=True):
            self.awaiting.pop(s, None)
            later = self.parked.get(s)
            if later is None or not good:
                if later is not None:
                    del self.parked[s]
                if self.users is not None:  # its user starts the next conversation after a think time
                    ended.append((s, t))
                continue
            row = later.pop()
            if row[5] != k + 1:
                raise RuntimeError(f"session {s}: turn {k} answered, but its next parked turn is {row[5]}")
            if not later:
                del self.parked[s]
            at = t + row[7]
            if at < hi:
                raise RuntimeError(f"session {s}: turn {k + 1} due at {at} ms, before the chunk's end {hi} ms")
            after = self.user_of[s][2] if self.users is not None else math.inf
            rows.append((at, *row[:7], later[-1][7] if later else after))
        if rows:
            cols = list(zip(*rows, strict=True))
            work = Work(*(np.array(c, dtype=np.int64) for c in cols[1:8]))
            self._known(np.array(cols[0]), work, np.array(cols[8]))
        nxt = []  # the next conversations of the users whose conversation ended, admitted at once
        for s, t in ended:
            user, c, after = self.user_of.pop(s)
            if t + after < hi:
                raise RuntimeError(f"user {user}: a conversation due at {t + after} ms, before the chunk's end {hi} ms")
            nxt.append(self._rows(user, c + 1, self.sessions.conversation(user, c + 1, t + after)))
        self._admit_all(nxt)


__all__ = ["ClosedLoop"]
