"""Record hashes: what a behaviour-keeping change must leave identical, bit for bit.

Runs every shipped scenario (shortened where long), the streaming engine's test cases (the
versions' and the traffic classes' among them) and the variants the tests use (canary and
shadow, traffic classes, a finite feature store, the platform's speed, the front end's
event loop), two seeds each, and prints one SHA-256
per run over everything a run leaves: the records, the batch logs of every pool, the fleet's
events and intervals and the shadow copies, bit for bit; and its summary (its wall time and
the scenario's hash left out), kept beside the hashes and compared value by value, floats
within 1e-9 (relative or absolute: the summary builder may add a level's area in another
order). Streamed runs are hashed too, from the
streamed records, where the streaming engine covers them.

    python benchmarks/record_hashes.py --out /tmp/before.json
    python benchmarks/record_hashes.py --compare /tmp/before.json     # exit 1 on any change

A refactor that keeps behaviour shows the same hashes before and after (issue 27).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
import time
from dataclasses import fields, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHORT = ["duration_s=30", "warmup_s=3"]
CASES: dict[str, tuple[str, list[str]]] = {
    "autoscaling": ("autoscaling.yaml", ["duration_s=120"]),
    "cache_ttl": ("cache_ttl.yaml", SHORT),
    "calibrated_cpu_resnet": ("calibrated_cpu_resnet.yaml", ["duration_s=20", "warmup_s=2"]),
    "canary": ("canary.yaml", ["duration_s=40", "warmup_s=4", "router.canary.rollback_at_s=30"]),
    "canary_shared_shadow": (
        "canary.yaml",
        ["duration_s=20", "warmup_s=2", "router.shadow.pool=shared", "router.shadow.measure_impact=true"],
    ),
    "cv_degradation": ("cv_degradation.yaml", ["duration_s=40", "warmup_s=5"]),
    "feature_store_outage": ("feature_store_outage.yaml", ["duration_s=20", "warmup_s=2"]),
    "inference_platform": ("inference_platform.yaml", ["duration_s=0.5", "warmup_s=0.1"]),
    "noisy_neighbour": ("noisy_neighbour.yaml", SHORT),
    "noisy_neighbour_capped": ("noisy_neighbour.yaml", [*SHORT, "traffic.classes.tagger.max_instances=5"]),
    "recsys_feature_fetch": ("recsys_feature_fetch.yaml", ["duration_s=10", "warmup_s=1"]),
    "recsys_store": (
        "recsys_feature_fetch.yaml",
        ["duration_s=5", "warmup_s=1", "features.store={threads: 8, per_op_ms: 0.2}"],
    ),
    "recsys_under_load": ("recsys_under_load.yaml", ["duration_s=10", "warmup_s=1"]),
    "scale_to_zero": ("scale_to_zero.yaml", []),
    "vision_preprocessing": ("vision_preprocessing.yaml", SHORT),
    "mmc": ("validation/mmc.yaml", ["duration_s=20"]),
    "md1": ("validation/md1.yaml", ["duration_s=20"]),
    "speed_log_ar1": (
        "validation/mmc.yaml",
        [
            "duration_s=20",
            "platform.speed={kind: log_ar1, step_ms: 50, components: [{sigma: 0.2, correlation_time_s: 1}]}",
        ],
    ),
    # LLM replicas short of KV blocks: preemption by recompute under each policy, with the
    # prefix cache's shared groups, and sessions whose turns share their blocks
    **{
        f"llm_preempt_{policy}": (
            "llm_chat.yaml",
            [
                "duration_s=20",
                "warmup_s=0",
                "workers.count=1",
                "traffic.rate_rps=6",
                "traffic.tokens.prefix={share: 0.5, groups: 3, tokens: 600}",
                "traffic.tokens.prompt.max=3000",
                "traffic.tokens.output.max=1000",
                "batching.num_blocks=700",
                f"batching.policy={policy}",
            ],
        )
        for policy in ("continuous", "prefill_first", "static")
    },
    # LLM replicas on a host whose speed varies (each step's end through the speed path):
    # the calibrated CPU engine near its knee, and static batching's stretches
    "llm_speed_calibrated": (
        "../calibrate/profiles/cpu-tiny-llm/scenario.yaml",
        ["duration_s=60", "warmup_s=5", "traffic.rate_rps=18"],
    ),
    "llm_speed_static": (
        "llm_chat.yaml",
        [
            "duration_s=20",
            "warmup_s=0",
            "workers.count=1",
            "traffic.rate_rps=6",
            "batching.policy=static",
            "platform.speed={kind: log_ar1, step_ms: 5, components: [{sigma: 0.3, correlation_time_s: 0.2}]}",
        ],
    ),
    # least-loaded routing over replicas short of KV blocks, each step's end through the
    # speed path: the routing reads each replica's load at every arrival
    **{
        f"llm_least_loaded_{policy}": (
            "llm_chat.yaml",
            [
                "duration_s=20",
                "warmup_s=0",
                "workers.count=3",
                "traffic.rate_rps=15",
                "router.balancing=least_loaded",
                "traffic.tokens.prompt.max=3000",
                "traffic.tokens.output.max=1000",
                "batching.num_blocks=700",
                "batching.noise_cv=0.1",
                "platform.speed={kind: log_ar1, step_ms: 5, components: [{sigma: 0.3, correlation_time_s: 0.2}]}",
                f"batching.policy={policy}",
            ],
        )
        for policy in ("continuous", "prefill_first", "static")
    },
    "llm_sessions_preempt": (
        "llm_multiturn.yaml",
        ["duration_s=10", "warmup_s=0", "workers.count=1", "traffic.rate_rps=10", "batching.num_blocks=900"],
    ),
    # closed-loop sessions: the engine cuts chunks where a turn it does not know yet could come
    "llm_sessions_closed": (
        "llm_multiturn.yaml",
        [
            "duration_s=30",
            "warmup_s=0",
            "workers.count=1",
            "traffic.rate_rps=20",
            "traffic.tokens.sessions.turn_gap_from=answer",
            "traffic.tokens.sessions.turn_gap={kind: exponential, mean_ms: 3000}",
        ],
    ),
    # a population of users: each conversation drawn from its user's stream when it starts
    "llm_users": (
        "llm_multiturn.yaml",
        [
            "duration_s=30",
            "warmup_s=0",
            "workers.count=1",
            "traffic.rate_rps=null",
            "traffic.tokens.sessions.users=150",
            "traffic.tokens.sessions.turn_gap_from=answer",
            "traffic.tokens.sessions.turn_gap={kind: exponential, mean_ms: 3000}",
        ],
    ),
    # a benchmark's concurrency: no think time, chunks bounded by a step's least time
    "llm_concurrency": ("llm_concurrency.yaml", ["duration_s=30", "warmup_s=5"]),
    "llm_concurrency_split_autoscaled": (
        "llm_concurrency.yaml",
        [
            "duration_s=30",
            "warmup_s=5",
            "workers.count=2",
            "batching.disaggregation={prefill_replicas: 1, kv_transfer_gb_s: 50, "
            "decode_autoscaler: {min_replicas: 1, max_replicas: 3, metric: in_flight, target: 16, sync_period_s: 2}}",
        ],
    ),
    "event_loop": (
        "calibrated_cpu_resnet.yaml",
        [
            "duration_s=20",
            "warmup_s=2",
            "traffic.rate_rps=500",
            "preprocess.cpu_workers=1",
            "router.balancing=shared",
            "workers.count=1",
            "preprocess.event_loop={return_ms: 0.3, respond_per_batch_ms: 0.1, respond_per_request_ms: 0.05}",
        ],
    ),
}


def _streaming_cases() -> dict[str, tuple[str, list[str]]]:
    from tests.test_streaming import CASES as STREAMED
    from tests.test_streaming import CLASSES, VERSIONS

    return {f"stream:{k}": v for k, v in {**STREAMED, **VERSIONS, **CLASSES}.items()}


def _feed(h, value) -> None:
    if value is None:
        h.update(b"<none>")
    elif isinstance(value, np.ndarray):
        h.update(str((value.dtype.str, value.shape)).encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, dict):
        for k in sorted(value):
            h.update(str(k).encode())
            _feed(h, value[k])
    elif isinstance(value, list | tuple):
        h.update(f"<{len(value)}>".encode())
        for v in value:
            _feed(h, v)
    elif hasattr(value, "__dataclass_fields__"):
        for f in fields(value):
            if getattr(value, f.name) is None:  # a column this run does not have (an LLM's, say)
                continue
            h.update(f.name.encode())
            _feed(h, getattr(value, f.name))
    elif hasattr(value, "_fields"):  # a NamedTuple
        for name in value._fields:
            h.update(name.encode())
            _feed(h, getattr(value, name))
    else:
        h.update(repr(value).encode())


def _without_wall(summary):
    """The summary less its wall times and the scenario's hash (a hash of the validated
    scenario, which a new field with its default changes while every run stays the same)."""
    if isinstance(summary, dict):
        drop = ("wall_s", "requests_per_wall_s", "start_s", "simulate_s", "hash")
        return {k: _without_wall(v) for k, v in summary.items() if k not in drop and v is not None}
    if isinstance(summary, list):
        return [_without_wall(v) for v in summary]
    return summary


def _flat(summary, path: str = "") -> dict[str, object]:
    """The summary as ``{path: leaf}``, lists indexed."""
    if isinstance(summary, dict):
        return {k: v for key, value in summary.items() for k, v in _flat(value, f"{path}/{key}").items()}
    if isinstance(summary, list | tuple):
        return {k: v for i, value in enumerate(summary) for k, v in _flat(value, f"{path}[{i}]").items()}
    if isinstance(summary, float | np.floating):
        return {path: float(summary)}
    return {path: summary if isinstance(summary, int | str | bool | None) else repr(summary)}


# The timeline's time-averaged levels: until issue 27's one summary builder, a whole run's
# came from prefix sums over the run (about 1e10 ms·requests), which cancel to ~3e-9
# relative (2.5e-9 absolute at most); the builder sums each interval's own area, equal
# to math.fsum's to the bit (scale_to_zero, seed 1, interval 759: 0.39432165993261153 both; 0.3943216609954834 before)
LEVELS = frozenset({"queue_depth", "in_flight", "log_backlog_mb"})
LEVEL_TOL = 1e-7  # relative, or absolute below 1


def _summaries_differ(before: dict, got: dict, rel: float = 1e-9, abs_: float = 1e-9) -> list[str]:
    """Where two flattened summaries differ: another set of keys, another value, or floats
    further apart than ``rel`` (relative) and ``abs_`` (absolute)."""
    out = [f"{k}: only on one side" for k in sorted(set(before) ^ set(got))]
    for k in sorted(set(before) & set(got)):
        a, b = before[k], got[k]
        if isinstance(a, float) and isinstance(b, float):
            scale = max(abs(a), abs(b))
            tol = LEVEL_TOL * max(scale, 1.0) if k.rsplit("/", 1)[-1] in LEVELS else max(abs_, rel * scale)
            if not (a == b or (np.isnan(a) and np.isnan(b)) or abs(a - b) <= tol):
                out.append(f"{k}: {a!r} -> {b!r}")
        elif a != b:
            out.append(f"{k}: {a!r} -> {b!r}")
    return out


def _sorted_gaps(g) -> tuple:
    """Token gaps in one order whatever the chunks (by time, gap, count)."""
    order = np.lexsort((g.tokens, g.ms, g.end))
    return g.end[order], g.ms[order], g.tokens[order]


def _digest(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        _feed(h, p)
    return h.hexdigest()[:16]


def hashes(only: str | None = None) -> tuple[dict[str, str], dict[str, dict]]:
    from simulator import load_scenario, simulate, summarize
    from simulator.serving.lives import WorkerState
    from simulator.streaming import simulate_streaming

    out, summaries = {}, {}
    cases = {**CASES, **_streaming_cases()}
    for name, (path, sets) in sorted(cases.items()):
        if only and only not in name:
            continue
        for seed in (1, 2):
            t0 = time.perf_counter()
            s = load_scenario(ROOT / "scenarios" / path, sets)
            run = simulate(s, seed=seed)
            fleet = None
            if run.fleet is not None:
                fleet = (repr(run.fleet.events), [run.fleet.intervals(k) for k in WorkerState])
            out[f"{name}/{seed}"] = _digest(
                run.records, replace(run.batches, gaps=None), run.pools, run.shadow, run.response_without_shadow, fleet
            )
            if run.batches.gaps is not None:  # an LLM's gaps between tokens, apart (they came later)
                out[f"{name}/{seed}/gaps"] = _digest(_sorted_gaps(run.batches.gaps))
            summaries[f"{name}/{seed}"] = _flat(json.loads(json.dumps(_without_wall(summarize(run)), default=repr)))
            if name.startswith("stream:"):
                records, batches, _ = simulate_streaming(s, seed=seed, chunk_s=0.731)
                order = np.lexsort((batches.instance, batches.start))
                rows = replace(batches, gaps=None)
                logged = (v[order] for f in fields(rows) if (v := getattr(rows, f.name)) is not None)
                out[f"{name}/{seed}/streamed"] = _digest(records, *logged)
                if batches.gaps is not None:
                    out[f"{name}/{seed}/streamed/gaps"] = _digest(_sorted_gaps(batches.gaps))
            print(f"{name}/{seed}: {out[f'{name}/{seed}']} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return out, summaries


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write the hashes here (JSON), the summaries beside them")
    ap.add_argument("--compare", type=Path, help="compare with hashes written before; exit 1 on any difference")
    ap.add_argument("--only", help="only the cases whose name contains this")
    a = ap.parse_args()
    got, summaries = hashes(a.only)
    if a.out:
        a.out.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        with gzip.open(_beside(a.out), "wt") as f:
            json.dump(summaries, f)
    if a.compare:
        before = json.loads(a.compare.read_text())
        keys = sorted(set(got) & set(before)) if a.only else sorted(set(got) | set(before))
        differ = [k for k in keys if got.get(k) != before.get(k)]
        print(f"records: {len(keys) - len(differ)} of {len(keys)} runs identical", file=sys.stderr)
        for k in differ:
            print(f"  differs: {k}: {before.get(k)} -> {got.get(k)}", file=sys.stderr)
        with gzip.open(_beside(a.compare), "rt") as f:
            old = json.load(f)
        names = sorted(set(summaries) & set(old)) if a.only else sorted(set(summaries) | set(old))
        bad = {k: _summaries_differ(old.get(k, {}), summaries.get(k, {})) for k in names}
        bad = {k: v for k, v in bad.items() if v}
        values = [(k, p) for k in names for p in set(old.get(k, {})) & set(summaries.get(k, {}))]
        same = sum(_same(old[k][p], summaries[k][p]) for k, p in values)
        print(
            f"summaries: {len(names) - len(bad)} of {len(names)} within 1e-9 (levels 1e-7); "
            f"{same} of {len(values)} values identical to the bit",
            file=sys.stderr,
        )
        for k, v in bad.items():
            print(f"  differs: {k}: {len(v)} values, first {v[0]}", file=sys.stderr)
        return 1 if differ or bad else 0
    return 0


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b))


def _beside(path: Path) -> Path:
    return path.with_name(path.stem + ".summaries.json.gz")


if __name__ == "__main__":
    sys.exit(main())
