"""The requests' token lengths in a scenario (``traffic.tokens``): prompt and output
lengths (fixed, log-normal, an empirical sample, or a published trace's shape), shared
prompt prefixes, multi-turn sessions, and a trace's lengths replayed.

The presets are the published shapes of Azure's LLM inference traces and of ShareGPT as
DistServe sampled it. Draws are rounded and clipped to whole tokens, and
:meth:`TokenLengths.expected` is the exact mean of such a draw, so a session's mean turns
(and with it the rate its sessions start at) is exact.
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from simulator.scenario.distributions import Distribution
from simulator.scenario.frozen import Frozen

_Z99 = NormalDist().inv_cdf(0.99)


class TokenLengths(Frozen):
    """A length in tokens: ``fixed``; log-normal by ``mean`` and ``p99`` (as traces publish
    them) or by ``mean`` and ``cv``; or ``values`` drawn uniformly (an empirical sample).
    Draws are rounded and clipped to ``[min, max]``."""

    fixed: int | None = Field(None, ge=0, description="Every request has this many tokens.")
    mean: float | None = Field(None, gt=0, description="Mean tokens (log-normal, with p99 or cv).")
    p99: float | None = Field(None, gt=0, description="99th percentile, tokens (log-normal, with mean).")
    cv: float | None = Field(None, gt=0, description="Coefficient of variation (log-normal, with mean).")
    values: tuple[int, ...] | None = Field(None, min_length=1, description="An empirical sample, drawn uniformly.")
    min: int = Field(1, ge=0, description="Fewest tokens (draws below are raised to it).")
    max: int | None = Field(None, ge=1, description="Most tokens (draws above are cut to it; none: no cap).")

    @model_validator(mode="after")
    def _one_form(self) -> TokenLengths:
        forms = [
            self.fixed is not None,
            self.values is not None,
            self.mean is not None and (self.p99 is not None or self.cv is not None),
        ]
        if sum(forms) != 1 or (self.p99 is not None and self.cv is not None):
            raise ValueError("give exactly one of: fixed; values; mean with p99; mean with cv")
        if self.p99 is not None and self.p99 <= self.mean:
            raise ValueError(f"p99 ({self.p99:g}) must exceed the mean ({self.mean:g}) of a log-normal")
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        return self

    def mu_sigma(self) -> tuple[float, float]:
        """The log-normal's parameters: from mean and cv, or from mean and p99
        (ln p99 - ln mean = z99·σ - σ²/2, the smaller root)."""
        if self.cv is not None:
            s2 = math.log1p(self.cv**2)
            return math.log(self.mean) - s2 / 2, math.sqrt(s2)
        gap = math.log(self.p99 / self.mean)
        disc = _Z99**2 - 2 * gap
        if disc < 0:
            raise ValueError(f"no log-normal has mean {self.mean:g} and p99 {self.p99:g}")
        sigma = _Z99 - math.sqrt(disc)
        return math.log(self.mean) - sigma**2 / 2, sigma

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        if self.fixed is not None:
            x = np.full(n, self.fixed, dtype=np.int64)
        elif self.values is not None:
            x = np.asarray(self.values, dtype=np.int64)[rng.integers(0, len(self.values), n)]
        else:
            mu, sigma = self.mu_sigma()
            x = np.rint(rng.lognormal(mu, sigma, n)).astype(np.int64)
        return np.clip(x, self.min, self.max if self.max is not None else np.iinfo(np.int64).max)

    def expected(self) -> float:
        """The exact mean of a draw (rounded and clipped as :meth:`sample` does); a
        log-normal needs its ``max``."""
        top = self.max if self.max is not None else math.inf
        if self.fixed is not None:
            return float(min(max(self.fixed, self.min), top))
        if self.values is not None:
            return float(np.clip(np.asarray(self.values, dtype=float), self.min, top).mean())
        if math.isinf(top):
            raise ValueError("the mean of an uncapped log-normal count is not computed: give it a max")
        mu, sigma = self.mu_sigma()
        dist = NormalDist(mu, sigma)
        k = np.arange(self.min, self.max + 1, dtype=float)

        def cdf(x: float) -> float:  # P(X < x)
            return dist.cdf(math.log(x)) if x > 0 else 0.0

        edges = np.array([cdf(x) for x in (k[:-1] + 0.5)])
        mass = np.diff(np.concatenate(([0.0], edges, [1.0])))  # min takes all below, max all above
        return float((k * mass).sum())

    @property
    def upper(self) -> float:
        """The most tokens a draw can have (inf for an uncapped log-normal)."""
        if self.fixed is not None:
            return float(max(self.fixed, self.min))
        if self.values is not None:
            top = max(max(self.values), self.min)
            return float(top if self.max is None else min(top, self.max))
        return math.inf if self.max is None else float(self.max)

    @property
    def lower(self) -> float:
        """The fewest tokens a draw can have."""
        top = math.inf if self.max is None else self.max
        if self.fixed is not None:
            return float(min(max(self.fixed, self.min), top))
        if self.values is not None:
            return float(min(max(min(self.values), self.min), top))
        return float(self.min)


PRESETS: dict[str, tuple[TokenLengths, TokenLengths]] = {
    # Azure's LLM inference traces (2023), their published shapes: means and p99s
    "azure_conversation": (TokenLengths(mean=1155, p99=4142, max=16384), TokenLengths(mean=211, p99=601, max=4096)),
    "azure_code": (TokenLengths(mean=2048, p99=7436, max=16384), TokenLengths(mean=28, p99=249, max=4096)),
    # ShareGPT as DistServe sampled it for its vLLM runs (prompt mean ~780, p99 ~1,890;
    # output mean ~175, p99 ~830), cut as vLLM's benchmark filters it: prompt <= 1024,
    # prompt + output <= 2048, at least 4 of each
    "sharegpt": (TokenLengths(mean=780, p99=1890, min=4, max=1024), TokenLengths(mean=175, p99=830, min=4, max=1024)),
}


class PrefixGroups(Frozen):
    """Shared prompt prefixes (a system prompt, a RAG corpus's documents): a share of the
    requests begin with one of ``groups`` prefixes of ``tokens`` tokens, picked by Zipf
    popularity."""

    share: float = Field(1.0, ge=0, le=1, description="Share of requests that begin with a shared prefix.")
    groups: int = Field(1, ge=1, description="Distinct prefixes.")
    tokens: int = Field(ge=1, description="Tokens of a prefix (of the prompt; a shorter prompt shares all of it).")
    zipf_s: float = Field(1.0, ge=0, description="Zipf exponent of the prefixes' popularity (0: uniform).")


def _can_be_zero(d) -> bool:
    """Whether a gap distribution draws exactly 0 with positive probability."""
    match d.kind:
        case "deterministic":
            return d.value_ms <= 0
        case "uniform":  # its low_ms <= high_ms: 0 every time, or with probability 0
            return d.high_ms <= 0
        case "empirical":
            return d.samples_ms is not None and min(d.samples_ms) <= 0
    return False


class Sessions(Frozen):
    """Multi-turn conversations: each session is ``turns`` requests, the prompt of each turn
    the whole conversation so far (the earlier turns' prompts and answers, which a prefix
    cache may still hold) followed by the turn's new input (``traffic.tokens.prompt``).
    Sessions start as the traffic's arrival process at ``rate_rps`` divided by the mean
    turns, so ``rate_rps`` stays the rate of requests while every turn is answered.

    ``turn_gap_from`` says where a turn's gap starts. ``arrival`` (the default): the next
    turn arrives ``turn_gap`` after the turn before it *arrived*, as a trace records turns,
    whatever the answer's time (open loop: under overload a turn may come before the answer
    to the one before it). ``answer``: the user waits for the whole answer, then reads and
    types for ``turn_gap`` (closed loop: a slow fleet slows its sessions' later turns, and a
    failed turn ends its session)."""

    turns: TokenLengths = Field(
        description="Turns per session (a count: fixed; values; mean with cv or p99, with max)."
    )
    turn_gap: Distribution = Field(
        description="The gap before a session's next turn, ms: from the turn before's arrival (the answer's "
        "time and the user's think time), or with turn_gap_from answer from its answer (the think time alone; "
        "0: sent as the answer arrives, a benchmark's concurrency)."
    )
    turn_gap_from: Literal["arrival", "answer"] = Field(
        "arrival",
        description="arrival: the next turn comes turn_gap after the one before arrived (open loop, as a trace); "
        "answer: turn_gap after the answer to it reached the user (closed loop).",
    )
    max_context_tokens: int | None = Field(
        None,
        ge=1,
        description="The model's context window: a session ends before a turn whose prompt and answer would "
        "exceed it (none: no limit, so the longest session must fit a replica's KV cache).",
    )
    users: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="A fixed population of users instead of sessions starting at a rate: each user is in one "
        "conversation at a time and starts the next turn_gap after the last answer of the one before "
        "(needs turn_gap_from answer, and no traffic.rate_rps: the rate is what the users and the fleet make it).",
    )

    @model_validator(mode="after")
    def _counted(self) -> Sessions:
        if math.isinf(self.turns.upper):
            raise ValueError("traffic.tokens.sessions.turns has no max: set traffic.tokens.sessions.turns.max")
        if self.turns.min < 1 or self.turns.fixed == 0:
            raise ValueError("traffic.tokens.sessions.turns must be at least 1: a session has a first turn")
        if self.users is not None and getattr(self.turn_gap, "order", "random") == "sequential":
            raise ValueError(
                "traffic.tokens.sessions.users: each conversation draws from a stream of its own, so an empirical "
                "turn_gap cannot be replayed in order; set turn_gap.order: random"
            )
        if self.users is not None and self.turn_gap_from != "answer":
            raise ValueError(
                "traffic.tokens.sessions.users is a closed loop (each user waits for its answers): set "
                "turn_gap_from: answer"
            )
        return self

    def mean_turns(self) -> float:
        """The exact mean of the turns per session: its rounding and clipping included."""
        return self.turns.expected()

    def users_rps(self, answer_ms: float = 0.0) -> float:
        """The rate ``users`` send at were every answer ``answer_ms`` long (a user's turns
        come a mean think time and an answer apart), req/s: with answers no shorter than
        that, the most they send on average. With none (the default) and no think time
        (a load generator's concurrency), unbounded."""
        cycle = self.turn_gap.mean + answer_ms
        return self.users * 1000.0 / cycle if cycle > 0 else math.inf

    def instant(self) -> bool:
        """Whether a turn can follow the answer before it at once (a think time of 0 ms:
        a load generator holding a concurrency)."""
        return self.turn_gap_from == "answer" and _can_be_zero(self.turn_gap)


class Tokens(Frozen):
    """Each request's prompt and output lengths; the output length is hidden from the
    scheduler (the sequence simply stops when it has produced it)."""

    preset: Literal["azure_conversation", "azure_code", "sharegpt"] | None = Field(
        None, description="Published length shapes: azure_conversation, azure_code, sharegpt (prompt and output)."
    )
    from_trace: bool = Field(
        False,
        description="Replay the lengths of traffic.arrivals_file, a CSV of arrival_s, prompt_tokens, "
        "output_tokens (one request a row; its arrivals are replayed too).",
    )
    prompt: TokenLengths | None = Field(None, description="Prompt tokens (replaces the preset's).")
    output: TokenLengths | None = Field(None, description="Output tokens (replaces the preset's).")
    prefix: PrefixGroups | None = Field(None, description="Shared prompt prefixes (none: every prompt its own).")
    sessions: Sessions | None = Field(
        None, description="Multi-turn conversations (none: every request a conversation of its own)."
    )

    @model_validator(mode="after")
    def _complete(self) -> Tokens:
        if self.from_trace:
            if self.preset is not None or self.prompt is not None or self.output is not None:
                raise ValueError("traffic.tokens.from_trace replays the trace's lengths: drop preset, prompt, output")
            if self.sessions is not None:
                raise ValueError("traffic.tokens.from_trace replays requests, not sessions: drop sessions")
            return self
        if self.preset is None and (self.prompt is None or self.output is None):
            raise ValueError("traffic.tokens needs a preset, or both prompt and output (or from_trace)")
        out = self.lengths()[1]
        if out.fixed == 0 or out.min < 1 or out.max == 0:
            raise ValueError("traffic.tokens.output must be at least 1 token: a request produces at least one")
        return self

    def lengths(self) -> tuple[TokenLengths, TokenLengths]:
        """The prompt's and the output's lengths, the preset's where not given (a trace's:
        :func:`read_trace`)."""
        if self.from_trace:
            raise ValueError("traffic.tokens.from_trace: the lengths are the trace's (read_trace)")
        p, o = PRESETS[self.preset] if self.preset is not None else (None, None)
        return self.prompt or p, self.output or o


def read_trace(path: str | Path, duration_ms: float = math.inf) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An LLM trace (CSV: arrival_s, prompt_tokens, output_tokens; a header line and '#'
    comments skipped): arrival times (ms), prompt and output tokens, in time order (ties
    as in the file), those arriving before ``duration_ms``. ValueError names the file and
    what is wrong."""
    from simulator.scenario.distributions import read_rows

    rows = read_rows(Path(path))
    if rows.shape[1] < 3:
        raise ValueError(f"{path}: an LLM trace needs three columns: arrival_s, prompt_tokens, output_tokens")
    t, prompt, output = rows[:, 0], rows[:, 1], rows[:, 2]
    if not np.isfinite(rows[:, :3]).all() or (t < 0).any():
        raise ValueError(f"{path}: arrival_s must be finite and >= 0")
    for name, col, low in (("prompt_tokens", prompt, 0), ("output_tokens", output, 1)):
        bad = np.flatnonzero((col != np.round(col)) | (col < low))
        if len(bad):
            raise ValueError(
                f"{path}: row {int(bad[0]) + 1}: {name} must be a whole number >= {low}, not {col[bad[0]]:g}"
            )
    order = np.argsort(t, kind="stable")
    t, prompt, output = t[order] * 1000.0, prompt[order].astype(np.int64), output[order].astype(np.int64)
    keep = t < duration_ms
    return t[keep], prompt[keep], output[keep]


__all__ = ["PRESETS", "PrefixGroups", "Sessions", "TokenLengths", "Tokens", "read_trace"]
