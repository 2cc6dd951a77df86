"""The LLM section of a summary: time to first token and time per output token against
their SLA targets, token throughput, goodput, the prefix cache and preemptions, and the
cost per million tokens; read from the records piece by piece, like every section.

Definitions (vLLM's benchmark's):

- **TTFT**, as the client sees it: from its send to the first token's arrival, the
  replica's first token plus the network back (``t_first_token - arrival`` + the way back).
- **TPOT**: the time per output token after the first, ``(last - first) / (output - 1)``,
  for requests of at least two output tokens.
- **max ITL**: a request's worst gap between two output tokens (the longest pause its
  stream shows: a prefill sharing its step, a preemption), for requests of at least two.
- **ITL**: every gap between two consecutive output tokens of a sequence, over the tokens
  made in the window (vLLM's benchmark's inter-token latency; its mean, weighted by
  tokens, is the token-weighted TPOT).
- **cost per million tokens**: the fleet's cost split by the GPUs' time, each step's part
  that its prompt tokens added to it going to the input tokens, the rest to the output
  tokens (as providers price them apart); and the whole cost over every token.
- **early turns** (with ``traffic.tokens.sessions``): of the turns after a session's
  first, those that arrived before the turn before them had its answer back at the client.
  Turns arrive open loop, a gap after the turn before them *arrived*; a user waits for the
  answer, so a large share says the gaps are shorter than the answers take.
- **goodput**: completions per second that met both the TTFT and the TPOT target (each
  where set), the SLO-meeting sense; DistServe's other sense, the highest rate per GPU at
  which the percentile of requests meet both, is a search over rates (``servesim plan``).
"""

from __future__ import annotations

import numpy as np

from simulator.results.records import Records
from simulator.results.stats import PERCENTILES
from simulator.scenario.config import Scenario


def ttft_ms(r: Records) -> np.ndarray:
    """Each request's time to first token as its client sees it (ms; NaN if none came)."""
    return r.t_first_token - r.arrival + (r.t_response - r.t_postprocessed)


def tpot_ms(r: Records) -> np.ndarray:
    """Each request's time per output token after the first (ms; NaN below two tokens)."""
    out = r.output_tokens.astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(out > 1, (r.t_inferred - r.t_first_token) / (out - 1), np.nan)


class Tokens:
    """The LLM section, accumulated from pieces of records."""

    def __init__(self, s: Scenario, sample):
        self.s = s
        self.ttft, self.tpot, self.stall, self.itl = sample(), sample(), sample(), sample()
        names = ("completed", "good", "prompt", "output", "cached", "preemptions", "ttft_ok", "tpot_ok", "tpot_n")
        self.n = dict.fromkeys(names, 0)
        self.step_ms = self.prefill_ms = 0.0  # the replicas' step time in the window, and the prompts' part
        self.sessions = s.traffic.tokens.sessions is not None
        self.answered: dict[int, tuple[int, float]] = {}  # session -> its latest turn and its response
        self.later = self.early = 0  # completed turns after a session's first; those that came early

    def add_steps(self, inside_ms: np.ndarray, prefill_share: np.ndarray) -> None:
        """Steps' time inside the window, and the share of each its prompt tokens took."""
        self.step_ms += float(inside_ms.sum())
        self.prefill_ms += float((inside_ms * prefill_share).sum())

    def add_gaps(self, ms: np.ndarray, tokens: np.ndarray) -> None:
        """Gaps between consecutive tokens, each ``tokens`` times."""
        self.itl.add(ms, tokens)

    def add(self, r: Records, done: np.ndarray) -> None:
        sla, n = self.s.sla, self.n
        ttft, tpot = ttft_ms(r)[done], tpot_ms(r)[done]
        self.ttft.add(ttft)
        has = np.isfinite(tpot)
        self.tpot.add(tpot[has])
        self.stall.add(r.max_itl_ms[done][has])
        ok_ttft = ttft <= sla.ttft_ms if sla.ttft_ms is not None else np.ones(len(ttft), dtype=bool)
        ok_tpot = ~has | (tpot <= sla.tpot_ms) if sla.tpot_ms is not None else np.ones(len(ttft), dtype=bool)
        n["completed"] += len(ttft)
        n["good"] += int(np.count_nonzero(ok_ttft & ok_tpot))
        n["ttft_ok"] += int(np.count_nonzero(ok_ttft))
        n["tpot_ok"] += int(np.count_nonzero(ok_tpot & has))
        n["tpot_n"] += int(np.count_nonzero(has))
        n["prompt"] += int(r.prompt_tokens[done].sum())
        n["output"] += int(r.output_tokens[done].sum())
        n["cached"] += int(r.cached_tokens[done].sum())
        n["preemptions"] += int(r.preemptions[done].sum())
        if self.sessions:
            self._turns(r, done)

    def _turns(self, r: Records, done: np.ndarray) -> None:
        """Count the later turns, and those that arrived before the turn before them was
        answered (a piece holds each turn after the turn before it: requests are handed out
        in arrival order)."""
        rows = np.flatnonzero(r.session >= 0)
        rows = rows[np.lexsort((r.turn[rows], r.session[rows]))]
        session, turn, response = r.session[rows], r.turn[rows], r.t_response[rows]
        before = np.full(len(rows), np.nan)  # the turn before's response
        follows = np.zeros(len(rows), dtype=bool)
        if len(rows):
            follows[1:] = (session[1:] == session[:-1]) & (turn[1:] == turn[:-1] + 1)
            before[1:][follows[1:]] = response[:-1][follows[1:]]
            for i in np.flatnonzero(~follows & (turn > 0)):  # the turn before is in an earlier piece
                got = self.answered.get(int(session[i]))
                if got is not None and got[0] == turn[i] - 1:
                    before[i] = got[1]
            last = np.append(session[1:] != session[:-1], True)
            latest = zip(turn[last].tolist(), response[last].tolist(), strict=True)
            self.answered.update(zip(session[last].tolist(), latest, strict=True))
        later = done[rows] & (turn > 0)
        self.later += int(np.count_nonzero(later))
        with np.errstate(invalid="ignore"):
            self.early += int(np.count_nonzero(later & (r.arrival[rows] < before)))

    def seal(self) -> None:
        self.ttft.seal((self.s.sla.percentile,))
        self.tpot.seal((self.s.sla.percentile,))
        self.stall.seal()
        self.itl.seal()

    def summary(self, span_s: float, per_hour_usd: float, dropped: int) -> dict:
        s, n = self.s, self.n
        p = s.sla.percentile
        judged = n["completed"] + (dropped if s.sla.count_dropped else 0)

        def verdict(target, sample, ok, count):
            if target is None:
                return None
            attained = sample.percentile(p) if sample.count else float("nan")
            share = ok / count if count else float("nan")
            return {
                "target_ms": target,
                "attained_ms": attained,
                "met": bool(sample.count and attained <= target and share >= p / 100),
                "attainment": share,
            }

        out_per_s, in_per_s = n["output"] / span_s, n["prompt"] / span_s
        hourly = per_hour_usd
        share = self.prefill_ms / self.step_ms if self.step_ms else 0.0  # of the GPUs' time, the prompts'

        def per_million(usd_per_hour: float, per_s: float) -> float:
            return usd_per_hour / (per_s * 3600) * 1e6 if per_s else float("inf")

        return {
            "ttft_ms": self.ttft.summary(PERCENTILES),
            "tpot_ms": self.tpot.summary(PERCENTILES),
            "max_itl_ms": self.stall.summary(PERCENTILES),
            "itl_ms": self.itl.summary(PERCENTILES),
            "sla": {
                "percentile": p,
                "ttft": verdict(s.sla.ttft_ms, self.ttft, n["ttft_ok"], judged),
                "tpot": verdict(s.sla.tpot_ms, self.tpot, n["tpot_ok"], n["tpot_n"]),
                "goodput_rps": n["good"] / span_s,
                "good_share": n["good"] / judged if judged else float("nan"),
            },
            "tokens": {
                "prompt_per_s": in_per_s,
                "output_per_s": out_per_s,
                "prefix_hit_rate": n["cached"] / n["prompt"] if n["prompt"] else float("nan"),
                "preemptions_per_request": n["preemptions"] / n["completed"] if n["completed"] else float("nan"),
            },
            "sessions": None
            if not self.sessions
            else {
                "later_turns_share": self.later / n["completed"] if n["completed"] else float("nan"),
                "early_turns_share": self.early / self.later if self.later else float("nan"),
                "turn_gap_from": s.traffic.tokens.sessions.turn_gap_from,
            },
            # the fleet's cost split by the GPUs' time: the prompts' part of each step (what their
            # tokens added to it) to the input tokens, the rest (and idle time) to the output
            "cost": {
                "prefill_share_of_gpu_time": share,
                "per_million_input_tokens_usd": per_million(hourly * share, in_per_s),
                "per_million_output_tokens_usd": per_million(hourly * (1 - share), out_per_s),
                "per_million_tokens_usd": per_million(hourly, in_per_s + out_per_s),
            },
        }


__all__ = ["Tokens", "tpot_ms", "ttft_ms"]
