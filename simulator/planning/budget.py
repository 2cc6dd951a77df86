"""A run's budget, decided before it starts: requests, memory and wall time.

A run in one chunk keeps every request in memory (about 320 bytes each, measured on the
platform scenario: 298–310 bytes per request between a 2 s and a 6 s run), so
a long or fast run can need more memory than the machine has; a streamed run
(:mod:`simulator.streaming`) holds one chunk of requests and the timeline instead. :func:`estimate` prices a validated
scenario from its own numbers; :func:`check` refuses the run when the estimate exceeds the
memory available, naming the remedies, before a single array is allocated.

The coefficients were measured on this project's 2-core machines (``/usr/bin/time -f %M``
around ``servesim run``): 298–310 B per request (``--chunk-s whole``, 2 s against 6 s of
the platform: 0.8M requests apart, two runs, 2026-11-24, after the engines became one;
293–294 B before, on the same command), 4.1 KB and 48 µs per worker, 35 B per
batch-size slot, 2.0 µs of wall time per request on the platform held whole (0.6 µs
streamed through a fixed pool: 62.4 s for 120M requests, ``benchmarks/README.md``). They are deliberately
rounded up: a budget that refuses a run that would have fitted costs a flag; one that
admits a run that cannot fit costs the machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import resource
from dataclasses import dataclass, field

from simulator.scenario.config import Scenario, expected_requests

BYTES_PER_REQUEST = 320
BYTES_PER_WORKER = 5_000
BYTES_PER_BATCH_SLOT = 40
BYTES_PER_TRIP_CELL = 32  # a feature round trip's latency sample, with its temporaries
TRIP_CHUNK_CELLS = 1 << 22  # features.py samples round trips in chunks of this many cells
BASE_BYTES = 250e6  # the interpreter with numpy, pandas, simpy and pydantic loaded
BYTES_PER_CHUNK_REQUEST = 600  # streamed: a chunk's requests in flight through the stages, with temporaries
BYTES_PER_RECORD_ROW = 200  # --records from a whole run: the table built from the records
BYTES_PER_TIMELINE_ROW = 2_000  # a timeline interval: its sums while running, its row in the summary
BYTES_PER_SPEED_STEP = 48  # a speed path's step: time, factor, work done, and the draws that made it
WALL_S_PER_REQUEST = 2.0e-6
WALL_S_PER_STREAMED_REQUEST = 0.6e-6  # streamed through a fixed pool's compiled batch queues (measured 0.52 µs)
WALL_S_PER_WORKER = 50e-6
WALL_S_PER_TRIP = 30e-9
# an LLM replica: a step in Python (measured 25-38 µs on one replica, 61 µs a step across 100
# with routing by state; benchmarks/README, issue 29), and a KV block's place in the prefix
# cache once used (its free-queue entry, content key and block number: about 180 B)
WALL_S_PER_LLM_STEP = 60e-6
BYTES_PER_KV_BLOCK = 200


class BudgetError(ValueError):
    """A run that would not fit; ``str(err)`` names the estimate and the remedies."""


@dataclass(frozen=True)
class Budget:
    """What a run is expected to take."""

    requests: float
    bytes: float
    wall_s: float
    instances: int = 0  # model instances, the most the fleet reaches
    parts: dict = field(default_factory=dict)  # bytes by what drives them: requests, workers, batch, features

    def describe(self) -> str:
        return (
            f"~{_count(self.requests)} requests, ~{_gb(self.bytes)} of memory, ~{_duration(self.wall_s)} of wall time"
        )


def estimate(s: Scenario, *, streamed: bool = False, records: bool = False, interval_s: float = 1.0) -> Budget:
    """The requests, peak memory (bytes) and wall time (s) of simulating ``s``: held whole,
    or ``streamed`` in chunks (:mod:`simulator.streaming`), whose memory holds one chunk
    and the timeline, not the run. ``records``: the run writes every request out."""
    n = expected_requests(s)
    if s.router.shadow is not None:  # shadowed requests run twice
        n *= 1 + s.router.shadow.percent / 100
    workers = s.workers.count * s.workers.instances
    if s.workers.autoscaler is not None:
        workers = max(workers, s.workers.autoscaler.max_replicas * s.workers.instances)
    d = getattr(s.batching, "disaggregation", None)
    if d is not None:  # each pool at its most
        pools = (
            (d.prefill_autoscaler, d.prefill_replicas),
            (d.decode_autoscaler, s.workers.count - d.prefill_replicas),
        )
        workers = max(workers, sum(n if a is None else max(n, a.max_replicas) for a, n in pools))
    workers += sum(c.workers or 0 for c in s.traffic.classes.values())
    if s.router.shadow is not None and s.router.shadow.pool == "own":
        workers += s.router.shadow.workers
    trips = 0
    f = s.features
    if f.lookups_per_request:
        trips = math.ceil(f.lookups_per_request / f.batch_size)
    if streamed:
        from simulator.chunks import chunk_ms

        per_chunk = expected_requests(s) / s.duration_s * chunk_ms(s) / 1000.0  # at the peak rate
        held = min(n, per_chunk) * BYTES_PER_CHUNK_REQUEST
    else:
        held = n * (BYTES_PER_REQUEST + (BYTES_PER_RECORD_ROW if records else 0))
    parts = {
        "requests": held,
        "workers": workers * BYTES_PER_WORKER,
        "batch": s.batching.max_batch_size * BYTES_PER_BATCH_SLOT,
        "timeline": s.duration_s / interval_s * BYTES_PER_TIMELINE_ROW,
        "features": max(trips, min(TRIP_CHUNK_CELLS, n * trips)) * BYTES_PER_TRIP_CELL if trips else 0.0,
        "speed": _speed_bytes(s),
    }
    fast = streamed and not s.workers.dynamic and s.traffic.tokens is None and _compiled(s)
    per_request = WALL_S_PER_STREAMED_REQUEST if fast else WALL_S_PER_REQUEST
    wall = n * per_request + workers * WALL_S_PER_WORKER + n * trips * WALL_S_PER_TRIP
    if s.traffic.tokens is not None:  # LLM replicas: at most one step per shortest step, each busy
        steps, blocks = _llm_steps(s)
        wall += steps * WALL_S_PER_LLM_STEP
        parts["kv"] = blocks * BYTES_PER_KV_BLOCK
    return Budget(requests=n, bytes=BASE_BYTES + sum(parts.values()), wall_s=wall, instances=workers, parts=parts)


def _llm_steps(s: Scenario) -> tuple[float, float]:
    """The most steps LLM replicas can take over the run (every replica busy, each step
    the shortest: one sequence decoding), and the KV blocks they hold at most."""
    from simulator.serving.step_time import Work, step_model

    b, w = s.batching, s.workers
    shortest_ms = max(step_model(b, w.instance_type).ms(Work(decodes=1, decode_context=1)), 1e-3)
    return w.count * s.duration_s * 1000.0 / shortest_ms, w.count * b.blocks(w.instance_type)


def _compiled(s: Scenario) -> bool:
    """Whether the compiled scheduler runs the fixed pool's queues (imported only when a
    streamed run asks: it loads numba)."""
    from simulator.serving.compiled import covers

    return covers(s.batching)


def _speed_bytes(s: Scenario) -> float:
    """The platform-speed paths: one per host, or one per worker and the front end's."""
    sp = s.platform.speed
    if sp is None or sp.kind == "markov":  # a Markov path has a step per switch: seconds apart
        return 0.0
    from simulator.stages.speed import TAIL_MS

    paths = 1 if sp.scope == "host" else s.workers.count + 1
    return paths * (s.duration_s * 1000.0 + TAIL_MS) / sp.step_ms * BYTES_PER_SPEED_STEP


def available_bytes() -> float:
    """Memory this process may still take: the system's available memory, or the address
    space left under ``RLIMIT_AS`` where that is lower."""
    avail = math.inf
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if math.isinf(avail):
        with contextlib.suppress(ValueError, OSError):
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        used = 0
        try:
            with open("/proc/self/statm") as f:
                used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            pass
        avail = min(avail, max(soft - used, 0))
    return avail


def check(
    s: Scenario,
    *,
    what: str = "this run",
    runs: int = 1,
    streamed: bool = False,
    records: bool = False,
    interval_s: float = 1.0,
) -> Budget:
    """The budget of ``s``; raises :class:`BudgetError` when it cannot fit in memory.

    ``runs`` counts the simulations a command makes of the scenario (their memory is not
    held at once, but their wall time adds up); ``streamed`` and ``records`` as for
    :func:`estimate`; ``interval_s`` the timeline's interval."""
    b = estimate(s, streamed=streamed, records=records, interval_s=interval_s)
    avail = available_bytes()
    if not math.isfinite(b.requests):
        raise BudgetError(f"{what}: rate × duration is not a finite number of requests; lower traffic.rate_rps")
    if b.bytes > avail:
        remedy = remedies(s, streamed=streamed, records=records, interval_s=interval_s)
        drivers = sorted(b.parts, key=b.parts.get, reverse=True)
        fixes = [remedy[d] for d in drivers if b.parts[d] > 0.2 * b.bytes] or [remedy[drivers[0]]]
        if not streamed:
            fixes.append("run it in chunks, in bounded memory (--chunk-s auto, or a number of seconds)")
        fixes.append("simulate part of the fleet with --sample-workers K (exact under random routing)")
        raise BudgetError(
            f"{what} would need {_gb(b.bytes)} of memory ({_count(b.requests)} requests, {b.instances:,} model "
            f"instances), more than the {_gb(avail)} available: " + "; or ".join(fixes) + "."
        )
    return dataclasses.replace(b, wall_s=b.wall_s * runs)


def remedies(s: Scenario, *, streamed: bool, records: bool, interval_s: float) -> dict[str, str]:
    """What lowers each part of :func:`estimate`'s memory, by the part's name."""
    return {
        "requests": "shorten it (--duration-s) or lower the rate"
        + (", or leave out --records" if records and not streamed else ""),
        "workers": f"use fewer workers (workers.count {s.workers.count:,})",
        "batch": f"lower batching.max_batch_size ({s.batching.max_batch_size:,})",
        "timeline": f"widen the timeline's intervals (--interval-s {interval_s:g})",
        "features": f"lower features.lookups_per_request ({s.features.lookups_per_request:,}) or raise its batch_size",
        "speed": "raise platform.speed.step_ms, or use scope: host (one path, not one per worker)",
        "kv": f"use fewer replicas (workers.count {s.workers.count:,}) or fewer KV blocks each (batching.num_blocks)",
    }


def _gb(x: float) -> str:
    if math.isinf(x):
        return "unbounded"
    return f"{x / 1e9:,.1f} GB" if x >= 1e8 else f"{x / 1e6:,.0f} MB"


def _count(x: float) -> str:
    return f"{x:,.0f}" if x < 1e15 else f"{x:.2g}"


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:,.1f} h"


def warnings(s: Scenario) -> list[str]:
    """Configurations that run but rarely mean what was intended."""
    out = []
    b = s.batching
    if b.max_queue_size is not None and b.max_batch_size > b.max_queue_size:
        out.append(
            f"batching.max_batch_size ({b.max_batch_size}) exceeds max_queue_size ({b.max_queue_size}): "
            f"no batch can hold more than {b.max_queue_size} requests"
        )
    if b.timeout_ms is not None and b.timeout_ms <= b.max_queue_delay_ms:
        out.append(
            f"batching.timeout_ms ({b.timeout_ms:g}) is not above max_queue_delay_ms ({b.max_queue_delay_ms:g}): "
            "a request waiting for its batching window times out first, so light traffic is all dropped"
        )
    sessions = s.traffic.tokens.sessions if s.traffic.tokens is not None else None
    if sessions is not None and sessions.turn_gap_from == "answer":
        # the conversations under way at time 0 are placed as if their answers before it had
        # taken no time: turns come 6-7% under their steady rate in the first two minutes of
        # llm_multiturn.yaml, 3% to the fifth, within 1% from the sixth; 1,000 users of its
        # conversations within 2.3% of the rate from the first minute, their prompts 5.7%
        # short in it, 2.3-2.4% in the next two, within 1.4% from the fourth
        # (calibrate/experiments/closed_loop_start.py)
        span_s = 2.0 * max(sessions.mean_turns() - 1.0, 1.0) * sessions.turn_gap.mean / 1000.0
        if s.warmup_s < span_s:
            out.append(
                "traffic.tokens.sessions: with turn_gap_from answer the conversations under way at time 0 are "
                "placed as if their answers before it had taken no time, so the turns come off their steady rate "
                f"at first; warmup_s ({s.warmup_s:g} s) is shorter than twice a conversation's think times "
                f"({span_s:,.0f} s): set warmup_s to {math.ceil(span_s):,} or more"
            )
    return out
