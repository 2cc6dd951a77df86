"""An LLM request's work, drawn when it arrives: its prompt and output lengths in tokens,
and the shared prefix its prompt begins with (``traffic.tokens``).

Called as every stage is: built from the scenario and its streams, it draws in request
order, each quantity from its own child stream and only from draws whose values do not
depend on how many are taken at once, so a run in chunks draws what a whole run draws.
A request in a prefix group has the group's ``prefix.tokens`` followed by its own prompt.
With ``from_trace`` the lengths are a trace's, row by row in time order, beside its
arrivals (``traffic.arrivals_file``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simulator.rng import Streams, child
from simulator.scenario.config import Scenario
from simulator.scenario.llm import read_trace


class Work(NamedTuple):
    """Per request: prompt tokens (with its prefix), output tokens, prefix group (-1:
    none) and the prompt tokens that are the group's."""

    prompt: np.ndarray
    output: np.ndarray
    group: np.ndarray
    shared: np.ndarray


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
        if self.prefix is not None:
            w = np.arange(1, self.prefix.groups + 1, dtype=float) ** -self.prefix.zipf_s
            self.cdf = np.cumsum(w / w.sum())

    def draw(self, n: int) -> Work:
        if self.trace is not None:
            prompt, output = (col[self.at : self.at + n] for col in self.trace)
            self.at += n
        else:
            prompt = self.prompt.sample(n, self.rng[0])
            output = self.output.sample(n, self.rng[1])
        group = np.full(n, -1, dtype=np.int64)
        shared = np.zeros(n, dtype=np.int64)
        p = self.prefix
        if p is not None:
            member = self.rng[2].random(n) < p.share
            pick = np.minimum(np.searchsorted(self.cdf, self.rng[3].random(n), side="right"), p.groups - 1)
            group = np.where(member, pick, -1)
            shared = np.where(member, p.tokens, 0)
            prompt = prompt + shared
        return Work(prompt, output, group, shared)


__all__ = ["TokenDraws", "Work"]
