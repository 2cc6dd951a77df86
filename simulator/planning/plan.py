"""Capacity planning: the fewest workers (and the cheapest configuration) that meet the SLA.

For each combination of the varied discrete knobs, the worker count is bisected down to
the minimum that meets the SLA. "Meets" is decided from replications: the Student-t
interval of the SLA percentile must lie under the target (and every replication must
attain it); an interval that straddles the target earns more replications, up to a cap,
and is then counted as a miss and flagged marginal. Replication ``r`` uses the same seed
at every worker count of a configuration (common random numbers), so neighbouring counts
are compared on the same traffic.

Bisection assumes the verdict is monotone in the worker count; the planner checks it on
every count it evaluated, with two counts above the answer and two more below it, and
reports where it fails rather than assuming it. A count whose offered load reaches the
peak capacity never meets the SLA, however the finite run went: that queue is unstable.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from simulator.planning.replicate import interval, replicate
from simulator.planning.sampling import auto_sample_size, sampling_refusal
from simulator.results.metrics import peak_throughput_rps
from simulator.scenario.catalog import load_catalog
from simulator.scenario.config import Scenario
from simulator.scenario.gputypes import on_type
from simulator.scenario.loader import ScenarioError, apply_overrides, parse_set


@dataclass(frozen=True)
class Vary:
    """One ``--vary path=values``: a list of values, or an integer range ``lo..hi``."""

    path: str
    values: tuple
    lo: int | None = None
    hi: int | None = None

    @classmethod
    def parse(cls, expr: str) -> Vary:
        if "=" not in expr:
            raise ScenarioError(f"--vary {expr!r}: expected dotted.path=v1,v2,... or dotted.path=lo..hi")
        path, raw = (x.strip() for x in expr.split("=", 1))
        if not path or not all(path.split(".")):
            raise ScenarioError(f"--vary {expr!r}: empty path component")
        span = re.fullmatch(r"(\d+)\s*\.\.\s*(\d+)", raw)
        if span:
            lo, hi = int(span[1]), int(span[2])
            if not 1 <= lo <= hi:
                raise ScenarioError(f"--vary {expr!r}: a range lo..hi needs 1 <= lo <= hi")
            return cls(path, (), lo, hi)
        if ".." in raw:
            raise ScenarioError(f"--vary {expr!r}: a range is lo..hi with whole numbers")
        values = tuple(parse_set(f"x={v.strip()}")[1] for v in raw.split(",") if v.strip())
        if not values:
            raise ScenarioError(f"--vary {expr!r}: no values")
        return cls(path, values)


def with_workers(s: Scenario, n: int) -> Scenario:
    """``s`` with a fleet of ``n`` workers. Where prefill and decode are apart, the fleet
    keeps its share of prefill replicas (rounded, at least one of each side; one GPU does
    both); a mixed fleet keeps each GPU type's share (rounded, at least one of the main
    type)."""
    b, w = s.batching, s.workers
    mix = dict(w.mix)
    if mix and n != w.count:
        mix = {t: round(n * m / w.count) for t, m in w.mix.items()}
        for t in reversed(list(mix)):  # the main type keeps at least one
            mix[t] -= min(mix[t], max(sum(mix.values()) - (n - 1), 0))
        mix = {t: m for t, m in mix.items() if m > 0}
    update = {"workers": w.model_copy(update={"count": n, "mix": mix})}
    d = getattr(b, "disaggregation", None)
    if d is not None and n != s.workers.count:
        split = None
        if n > 1:
            p = min(max(round(n * d.prefill_replicas / s.workers.count), 1), n - 1)
            split = d.model_copy(update={"prefill_replicas": p})
        update["batching"] = b.model_copy(update={"disaggregation": split})
    new = s.model_copy(update=update)
    return new.repriced(load_catalog(s.cost.catalog)) if w.mix and n != w.count else new


def on_instance_type(s: Scenario, instance_type: str) -> Scenario:
    """``s`` on another GPU type: price from the catalog, batch time scaled by the types'
    relative throughput, as `servesim run --set workers.instance_type=...` does (one
    meaning, in :mod:`simulator.scenario.gputypes`)."""
    try:
        return on_type(s, instance_type, load_catalog(s.cost.catalog))
    except ValueError as err:
        raise ScenarioError(str(err)) from None


def configure(base: dict, s_base: Scenario, combo: dict, loader) -> Scenario:
    """The scenario for one combination of varied values (instance type handled apart)."""
    combo = dict(combo)
    itype = combo.pop("workers.instance_type", None)
    s = loader(apply_overrides(base, [(tuple(k.split(".")), v) for k, v in combo.items()])) if combo else s_base
    return on_instance_type(s, itype) if itype is not None else s


@dataclass
class Evaluation:
    """The replications at one worker count (or rate) of one configuration."""

    workers: int
    rate_rps: float
    rows: pd.DataFrame
    target_ms: float
    sample: int
    load: float  # offered rate over what full batches on every instance complete (ρ at the peak)
    tokens: dict[str, float] = field(default_factory=dict)  # an LLM's targets: ttft_ms, tpot_ms

    @property
    def sla_ci(self) -> tuple[float, float, float]:
        return interval(self.rows["sla_ms"].to_numpy())

    def _intervals(self) -> list[tuple[tuple[float, float, float], float]]:
        """Each judged figure's interval over the replications, with its target."""
        out = [(self.sla_ci, self.target_ms)]
        out += [(interval(self.rows[col].to_numpy()), target) for col, target in self.tokens.items()]
        return out

    @property
    def met(self) -> bool:
        # an offered load at or past the peak is unstable however the finite run went
        stable = not self.load >= 1.0
        return (
            stable
            and bool(self.rows["met"].all())
            and all(math.isfinite(hi) and hi <= target for (_, _, hi), target in self._intervals())
        )

    @property
    def marginal(self) -> bool:
        # every interval reaches below its target: more replications may settle it
        return (
            self.load < 1.0
            and not self.met
            and all(math.isfinite(lo) and lo <= target for (_, lo, _), target in self._intervals())
        )

    def row(self) -> dict:
        m, lo, hi = self.sla_ci
        return {
            "workers": self.workers,
            "rate_rps": self.rate_rps,
            "sla_ms": m,
            "sla_ci_lo": lo,
            "sla_ci_hi": hi,
            "met": self.met,
            "marginal": self.marginal,
            "replications": len(self.rows),
            "cost_per_hour_usd": float(self.rows["cost_per_hour_usd"].mean()),
            "cost_per_million_usd": float(self.rows["cost_per_million_usd"].mean()),
            "load_of_peak": self.load,
            **{col: float(self.rows[col].mean()) for col in self.tokens},
            "sampled_workers": self.sample,
            "requests": int(self.rows["requests"].sum()),
        }


@dataclass
class Planner:
    """Evaluates configurations with replications, fleet-sampled where that is exact."""

    replications: int = 3
    max_replications: int = 10
    sample: str | int = "auto"  # "auto", "off", or a number of workers
    target_requests: float = 100_000.0
    notes: list[str] = field(default_factory=list)
    evaluated: int = 0
    requests: int = 0

    def _k(self, s: Scenario) -> int:
        if self.sample == "off" or sampling_refusal(s) or s.autoscaled:
            return s.workers.count  # an autoscaled fleet is sampled by `run --sample-workers` only
        if self.sample == "auto":
            return auto_sample_size(s, self.target_requests)
        return min(int(self.sample), s.workers.count)

    def evaluate(self, s: Scenario, key: str) -> Evaluation:
        """Replications of ``s`` until the verdict is clear or the cap is reached."""
        n = s.workers.count
        k = self._k(s)
        rows = replicate(s, self.replications, key, sample=k, workers_billed=n)
        rate = s.traffic.rate_rps or float("nan")
        tokens = {col: t for col, t in (("ttft_ms", s.sla.ttft_ms), ("tpot_ms", s.sla.tpot_ms)) if t is not None}
        peak = float("nan") if s.traffic.tokens is not None else peak_throughput_rps(s)  # an LLM's has no batch time
        ev = Evaluation(n, rate, rows, s.sla.target_ms, k, rate / peak, tokens)
        while ev.marginal and len(ev.rows) < self.max_replications:
            upto = min(len(ev.rows) + 2, self.max_replications)
            more = replicate(s, upto, key, start=len(ev.rows), sample=k, workers_billed=n)
            ev.rows = pd.concat([ev.rows, more], ignore_index=True)
        self.evaluated += 1
        self.requests += int(ev.rows["requests"].sum())
        return ev

    def min_workers(self, s: Scenario, lo: int, hi: int, key: str) -> tuple[Evaluation | None, list[Evaluation], dict]:
        """Bisect the fewest workers in ``lo..hi`` meeting the SLA; the evaluations; the
        monotonicity check ({"monotone": bool, "checked": counts, "violations": [...]})."""
        seen: dict[int, Evaluation] = {}

        def at(n: int) -> Evaluation:
            if n not in seen:
                seen[n] = self.evaluate(with_workers(s, n), key)
            return seen[n]

        best = None
        if at(hi).met:
            a, b = lo, hi  # invariant: b meets; a-1 is below the range or fails
            if at(lo).met:
                b = lo
            while b - a > 1:
                mid = (a + b) // 2
                if at(mid).met:
                    b = mid
                else:
                    a = mid
            best = at(b)
            # around the answer, where a non-monotone verdict shows (fewer workers, fuller
            # batches, more throughput): two counts above it and two more below it
            for extra in (b + 1, b + 2, b - 2, b - 3):
                if lo <= extra <= hi:
                    at(extra)
        counts = sorted(seen)
        flips = [(m, n) for m in counts for n in counts if m < n and seen[m].met and not seen[n].met]
        # a flip is a violation when more workers are significantly worse, judged on paired
        # replications (common random numbers); otherwise the two verdicts differ within noise
        violations = [(m, n) for m, n in flips if worse(seen[n], seen[m])]
        noise = [f for f in flips if f not in violations]
        check = {"monotone": not violations, "checked": counts, "violations": violations, "within_noise": noise}
        return best, [seen[n] for n in counts], check

    def max_rate(self, s: Scenario, key: str, rel_tol: float = 0.01) -> tuple[Evaluation | None, list[Evaluation]]:
        """Bisect the highest arrival rate the fixed fleet of ``s`` serves within the SLA."""
        if s.traffic.rate_rps is None or s.traffic.classes:
            raise ScenarioError("--max-rate needs traffic.rate_rps (one traffic class)")
        evals = []

        def at(rate: float) -> Evaluation:
            ev = self.evaluate(s.model_copy(update={"traffic": s.traffic.model_copy(update={"rate_rps": rate})}), key)
            evals.append(ev)
            return ev

        lo, hi = 0.0, rate_ceiling(s)
        best = None
        while hi - lo > rel_tol * hi:
            mid = (lo + hi) / 2
            ev = at(mid)
            if ev.met:
                lo, best = mid, ev
            else:
                hi = mid
        return best, evals


def rate_ceiling(s: Scenario) -> float:
    """A rate the fleet of ``s`` cannot serve, req/s: every instance busy with full batches;
    for LLM replicas, twice the napkin's per-replica throughput at the widest batch the KV
    cache holds (a step's batch then no longer gains throughput)."""
    if s.traffic.tokens is None:
        return peak_throughput_rps(s)
    from simulator.planning.llm_napkin import llm_napkin

    wide = s.model_copy(update={"sla": s.sla.model_copy(update={"tpot_ms": None})})
    return 2.0 * s.workers.count * llm_napkin(wide, 0.0)[1].per_replica_rps


def worse(a: Evaluation, b: Evaluation, confidence: float = 0.95) -> bool:
    """Whether ``a``'s SLA percentile is significantly above ``b``'s, pairing replication r
    of each (they share seeds)."""
    r = min(len(a.rows), len(b.rows))
    d = a.rows["sla_ms"].to_numpy()[:r] - b.rows["sla_ms"].to_numpy()[:r]
    _, lo, _ = interval(d, confidence)
    return bool(math.isfinite(lo) and lo > 0) or bool(not np.all(np.isfinite(d)) and a.rows["met"].sum() == 0)


def combos(varies: list[Vary]) -> list[dict]:
    """Every combination of the discrete ``--vary`` values (ranges excluded)."""
    discrete = [v for v in varies if v.lo is None]
    return [
        dict(zip([v.path for v in discrete], vals, strict=True))
        for vals in itertools.product(*[v.values for v in discrete])
    ]


def pareto(df: pd.DataFrame, x: str = "cost_per_hour_usd", y: str = "sla_ms") -> pd.DataFrame:
    """The rows no other row beats on both ``x`` and ``y`` (lower is better), by ``x``."""
    d = df.sort_values([x, y]).reset_index(drop=True)
    keep, best = [], np.inf
    for i, v in enumerate(d[y]):
        if v < best:
            keep.append(i)
            best = v
    return d.iloc[keep].reset_index(drop=True)


def label(combo: dict) -> str:
    """A configuration as short text: ``field=value`` pairs (the last part of each path)."""
    return " · ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in combo.items()) or "(as written)"
