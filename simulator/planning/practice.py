"""The interview trainer: a capacity question with fresh numbers, estimated step by step,
checked against the napkin, then answered by the simulator.

A *situation* is one of the seed articles' systems (the 200k RPS platform, a recsys
feature fetch, vision preprocessing, a CV classifier losing its tail, a ranker under
load), told in this module's own words. :func:`ask` draws its numbers from ranges around
the seed's, from a seed of its own, so an attempt can be shared and a second attempt is
not memory. The candidate estimates the napkin's steps (:data:`~simulator.planning.situations.STEPS`: peak rate,
bandwidth, batches per second, per-worker throughput, workers, headroom, cost) and the
stage the tail lives in; :func:`check` grades each against the napkin
(:func:`simulator.planning.napkin.napkin`) within a tolerance. :func:`reveal` then runs
the simulator: the fewest workers that meet the SLA, the candidate's fleet's tail, where
the latency lives, and why the napkin and the simulation differ, in words.

The LLM situations (a chat assistant's fleet, KV memory, continuous against static
batching, chunked prefill, prefix caching for RAG) ask their own steps and answer with
their own contrasts: :mod:`simulator.planning.llm_practice`.

No user interface here: the dashboard's Practice page and ``servesim practice`` draw it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from simulator.planning.napkin import napkin, napkin_batch, workers_needed
from simulator.planning.plan import Planner, with_workers
from simulator.planning.runner import run
from simulator.planning.situations import SCENARIOS, SITUATIONS
from simulator.results.anatomy import STAGE_WORDS, stage_bands, tail_stage
from simulator.results.metrics import window, worker_price
from simulator.scenario.config import Scenario
from simulator.scenario.loader import load_scenario
from simulator.serving.workers import mean_service_ms


@dataclass
class Question:
    """One attempt's question: the situation, its seed, the scenario with the drawn
    numbers, what the candidate is given (``givens``) and the napkin's answers."""

    situation: str
    seed: int
    scenario: Scenario
    text: str
    givens: dict[str, str]
    answers: dict[str, float] = field(default_factory=dict)
    formulas: dict[str, str] = field(default_factory=dict)
    sets: tuple[str, ...] = ()  # the overrides that made the scenario from its file

    @property
    def steps(self):
        return SITUATIONS[self.situation].asked


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 or float(x).is_integer() else f"{x:,.3g}"


def ask(situation: str = "platform", seed: int | None = None, overrides: dict[str, float] | None = None) -> Question:
    """A question: ``situation``'s numbers drawn from ``seed`` (a fresh one when None), or
    with ``overrides`` (path → value) the candidate's or interviewer's own numbers."""
    if situation not in SITUATIONS:
        raise ValueError(f"unknown situation {situation!r}: one of {', '.join(SITUATIONS)}")
    sit = SITUATIONS[situation]
    if seed is None:
        seed = int(np.random.default_rng().integers(1, 1_000_000))
    rng = np.random.default_rng(seed)
    values = {k.path: k.draw(rng) for k in sit.knobs}
    values.update(overrides or {})
    sets = [f"{p}={int(v) if float(v).is_integer() and 'rate' not in p else v}" for p, v in values.items()]
    base = load_scenario(SCENARIOS / sit.file, sets)
    if sit.kind == "llm":
        return _ask_llm(situation, seed, base, tuple(sets))
    # the configured fleet is the napkin's own answer: the simulation then checks it
    _, padded = workers_needed(base)
    s = with_workers(base, padded)
    lines = {ln.quantity: ln for ln in napkin(s, worker_price(s))}
    b = napkin_batch(s)
    givens = {
        "rate": f"{_fmt(s.traffic.rate_rps)} requests/s",
        "rate_per_min": f"{_fmt(s.traffic.rate_rps * 60)}",
        "payload_kb": _fmt(s.traffic.payload_kb),
        "response_kb": _fmt(s.traffic.response_kb),
        "gpu": s.workers.instance_type,
        "batch": str(b),
        "batch_ms": f"{mean_service_ms(s.workers, b):.3g}",
        "target": f"{s.sla.target_ms:g} ms",
        "percentile": f"{s.sla.percentile:g}",
        "price": f"${worker_price(s):.4g}",
        "headroom": f"{s.napkin.headroom:.0%}",
        "lookups": _fmt(s.features.lookups_per_request),
        "per_trip": _fmt(s.features.batch_size),
        "parallel": _fmt(s.features.parallelism),
        "trip_ms": f"{_median_ms(s.features.round_trip):.3g}" if s.features.round_trip is not None else "?",
        "bandwidth": f"{s.network.bandwidth_gbps:g} Gbit/s" if s.network.bandwidth_gbps else "fast",
        "pre_ms": f"{s.preprocess.service.mean:.3g}" if s.preprocess.service is not None else "0",
        "cpu_workers": _fmt(s.preprocess.cpu_workers or 0),
        "users": _fmt(s.traffic.rate_rps * 10),
        "think_s": "10",
    }
    return _question(situation, seed, s, lines.values(), givens, tuple(sets))


def _ask_llm(situation: str, seed: int, base: Scenario, sets: tuple[str, ...]) -> Question:
    """An LLM question (:mod:`simulator.planning.llm_practice`): where it asks for a
    fleet, the scenario runs the napkin's replicas with headroom, as a request-path
    question's does."""
    from simulator.planning.llm_napkin import llm_napkin
    from simulator.planning.llm_practice import NAPKINS

    sit = SITUATIONS[situation]
    s = base
    if sit.fleet_step is not None:
        s = with_workers(base, llm_napkin(base, worker_price(base))[1].padded)
    lines, givens = NAPKINS[situation](s, worker_price(s))
    return _question(situation, seed, s, lines, givens, sets)


def _question(situation: str, seed: int, s: Scenario, lines, givens: dict[str, str], sets: tuple[str, ...]):
    """The question told with ``givens``, each of its steps answered by the napkin line
    the step names."""
    sit = SITUATIONS[situation]
    by = {ln.quantity: ln for ln in lines}
    return Question(
        situation=situation,
        seed=seed,
        scenario=s,
        text=sit.story.format(**givens),
        givens=givens,
        answers={st.key: by[st.quantity].value for st in sit.asked},
        formulas={st.key: by[st.quantity].formula for st in sit.asked},
        sets=sets,
    )


def _median_ms(dist) -> float:
    return float(np.median(dist.sample(20_001, rng=np.random.default_rng(0))))


def stage_key(text: str) -> str | None:
    """A stage as a candidate names it ('queue', 'queueing', 'feature fetch', 'GPU') as a
    key of :data:`STAGE_WORDS`, or None."""
    t = text.strip().lower().replace("_", " ")
    if not t:
        return None
    aliases = {"gpu": "inference", "model": "inference", "batching": "queue", "decode": "preprocess"}
    if t in aliases:
        return aliases[t]
    for key, words in STAGE_WORDS.items():
        words = words.removeprefix("the ")
        if t in (key.replace("_", " "), words) or words.startswith(t) or key.startswith(t.replace(" ", "_")):
            return key
    return None


COUNTS = ("workers", "replicas", "sequences", "steps")  # graded within one as well


@dataclass(frozen=True)
class Mark:
    """A step graded: the candidate's value, the napkin's, and whether it is within tolerance."""

    key: str
    prompt: str
    yours: float | str | None
    truth: float | str
    ok: bool
    note: str


def check(q: Question, key: str, yours: float | None) -> Mark:
    """Grade one napkin step against the napkin, within the step's tolerance (workers also
    within ±1)."""
    step = next(s for s in q.steps if s.key == key)
    truth = q.answers[key]
    if yours is None or not math.isfinite(yours):
        return Mark(key, step.prompt, yours, truth, False, f"the napkin says {_fmt(truth)} {step.unit}")
    err = (yours - truth) / truth if truth else (0.0 if yours == 0 else math.inf)
    ok = abs(err) <= step.tolerance or (step.unit in COUNTS and abs(yours - truth) <= 1)
    how = "right" if ok else f"off by {err:+.0%}"
    return Mark(key, step.prompt, yours, truth, ok, f"{how}: {q.formulas[key]} = {_fmt(truth)} {step.unit}")


@dataclass
class Reveal:
    """The simulator's answer to a question, at the candidate's fleet."""

    minimum_workers: int | None
    workers: int
    attained_ms: float
    met: bool
    stage: str  # where the tail lives (a key of STAGE_WORDS)
    stage_share: float
    mean_batch: float  # at the simulated minimum (at ``workers`` when there is none)
    load_of_peak: float  # the same
    why: list[str]


def _run(s: Scenario) -> tuple[dict, object]:
    result = run(s, chunk_s="whole", interval_s=None)
    rec = result.records
    return result.summary, stage_bands(rec, window(rec, result.simulated))


def reveal(q: Question, workers: int | None = None):
    """Simulate the question's system at ``workers`` (default: the napkin's, with headroom):
    its tail and where the latency lives; the fewest workers that meet the SLA; and why
    the napkin and the simulation differ, read from a run at that minimum (or, when no
    fleet in range meets the SLA, at ``workers``). An LLM question's answer is an
    :class:`~simulator.planning.llm_practice.LLMReveal`."""
    if SITUATIONS[q.situation].kind == "llm":
        from simulator.planning.llm_practice import reveal as reveal_llm

        return reveal_llm(q, workers)
    s = q.scenario
    bare, padded = workers_needed(s)
    n = max(1, int(workers or padded))
    m, bands = _run(with_workers(s, n))
    pct = f"p{s.sla.percentile:g}"
    stage, share = tail_stage(bands, pct if pct in set(bands["percentile"]) else "p99") or ("inference", 0.0)
    top = max(2 * padded, bare + 2, n)
    planner = Planner(replications=2, max_replications=4)
    best, _, _ = planner.min_workers(s, max(1, bare // 2), top, f"practice:{q.seed}")
    minimum = best.workers if best else None
    at = minimum or n
    m_at, bands_at = (m, bands) if at == n else _run(with_workers(s, at))
    mean_batch = float(m_at["batch_size"]["mean"] or 0.0)
    load = float(m_at["utilization"]["of_peak_capacity"])
    why = differences(q, bands_at, at, minimum, mean_batch, load)
    if minimum is None:
        why.insert(
            0,
            f"No fleet of up to {top} workers meets the SLA: the tail lives in "
            f"{STAGE_WORDS.get(stage, stage)}, which more GPU workers do not shorten.",
        )
    attained, met = float(m["sla"]["attained_ms"]), bool(m["sla"]["met"])
    return Reveal(minimum, n, attained, met, stage, share, mean_batch, load, why)


def differences(q: Question, bands, n: int, minimum: int | None, mean_batch: float, load: float) -> list[str]:
    """Why the napkin and the simulation differ, in words, from what the run shows."""
    s = q.scenario
    b = napkin_batch(s)
    bare = q.answers["workers"]
    out = []
    if minimum is not None and minimum != bare:
        direction = "fewer" if minimum < bare else "more"
        out.append(
            f"The simulator needs {minimum} workers where the bare napkin says {bare:,.0f}: {direction}, for the "
            "reasons below."
        )
    if mean_batch and abs(mean_batch - b) / b > 0.15:
        if mean_batch > b:
            out.append(
                f"Batches grow under load: the napkin assumed batches of {b}, the run's averaged {mean_batch:.1f}. "
                "A fuller batch costs little more time, so each worker serves more than the napkin's rate."
            )
        else:
            out.append(
                f"Batches stay small: the napkin assumed {b}, the run's averaged {mean_batch:.1f} (the batching "
                "window closes first), so each worker serves less than the napkin's rate."
            )
    pct = "p99"
    band = bands[bands["percentile"] == pct]
    total = float(band["ms"].sum()) if len(band) else 0.0
    queue = float(band.loc[band["stage"] == "queue", "ms"].sum()) if len(band) else 0.0
    if total and queue / total >= 0.3:
        out.append(
            f"Queueing near saturation: at {n} worker{'s' if n != 1 else ''} the fleet runs at {load:.0%} of its "
            f"peak capacity and waiting for a worker is {queue / total:.0%} of p99. Queues grow without bound "
            "as load nears capacity, which the napkin's averages do not see."
        )
    if load >= 0.97:
        out.append(
            f"At {load:.0%} of peak capacity the queue grows for as long as the peak lasts: this minimum holds "
            f"for a peak as short as the run ({s.duration_s - s.warmup_s:g} s measured). That is what the "
            "headroom is for."
        )
    f = s.features
    if f.lookups_per_request:
        trips = math.ceil(f.lookups_per_request / f.batch_size)
        feat = float(band.loc[band["stage"] == "features", "ms"].sum()) if len(band) else 0.0
        if trips > 1 and total and feat / total >= 0.2:
            out.append(
                f"Fan-out tails: each request waits for the slowest of its {trips:,} round trips "
                f"({f.parallelism} in flight), so the feature fetch is {feat / total:.0%} of p99 however many "
                "GPUs there are: batch the lookups (more keys per round trip) before buying workers."
            )
    fixed = total - queue - (float(band.loc[band["stage"] == "inference", "ms"].sum()) if len(band) else 0.0)
    if total and fixed / total >= 0.3:
        out.append(
            f"The stages around the model (network, router, features, pre- and postprocessing) add "
            f"{fixed:.0f} ms at p99 whatever the fleet: the napkin counts GPUs, not this floor."
        )
    if not out:
        out.append(
            "Here the napkin and the simulation agree: the fleet is far from saturation and the tail is the "
            "model's own time."
        )
    return out
