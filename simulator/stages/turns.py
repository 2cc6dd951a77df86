"""What an LLM request asks of the engine, drawn when it arrives (:class:`Work`: its
prompt and output tokens, its shared prefix, and its place in a conversation), and the
prefix groups' draw; shared by the token draws (:mod:`simulator.stages.tokens`) and the
closed loop that releases conversations' turns (:mod:`simulator.stages.closed_loop`)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Work(NamedTuple):
    """Per request: prompt tokens (with its prefix and its session's history), output
    tokens, prefix group (-1: none), the prompt tokens that are the group's, its session
    (-1: none), its turn in the session (0 first) and the prompt tokens that are the
    session's earlier turns."""

    prompt: np.ndarray
    output: np.ndarray
    group: np.ndarray
    shared: np.ndarray
    session: np.ndarray
    turn: np.ndarray
    history: np.ndarray

    @classmethod
    def empty(cls) -> Work:
        return cls(*(np.zeros(0, dtype=np.int64) for _ in cls._fields))

    def take(self, rows) -> Work:
        return Work(*(col[rows] for col in self))


def groups(prefix, cdf, draws: list[np.random.Generator], n: int) -> tuple[np.ndarray, np.ndarray]:
    """The prefix group of each of ``n`` requests (or sessions) and its shared tokens (-1
    and 0: none), a member with probability ``prefix.share`` (``draws[2]``) of a group
    picked by the popularity ``cdf`` (``draws[3]``)."""
    if prefix is None:
        return np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.int64)
    member = draws[2].random(n) < prefix.share
    pick = np.minimum(np.searchsorted(cdf, draws[3].random(n), side="right"), prefix.groups - 1)
    return np.where(member, pick, -1), np.where(member, prefix.tokens, 0)


__all__ = ["Work", "groups"]
