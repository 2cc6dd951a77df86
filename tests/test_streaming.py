"""The streaming engine against the whole-run engine: identical records, request for request.

``simulator.streaming.stream`` simulates in time chunks and carries every stage's state
across them (stations, random streams, the SimPy batch queues). On the same seed its
records must equal ``simulate``'s exactly, whatever the chunk length, on every kind of
scenario it supports (caches included: their contents carry over); anything else would be a
bug in the carry-over.
"""

from __future__ import annotations

import itertools
from dataclasses import fields

import numpy as np
import pytest

from simulator import load_scenario, simulate
from simulator.ledger import concat_logs
from simulator.pieces import concat_records, gather
from simulator.serving.lives import WorkerState
from simulator.streaming import simulate_streaming, stream
from tests.helpers import ROOT

LOOP = [
    "duration_s=10",
    "warmup_s=1",
    "traffic.rate_rps=500",
    "preprocess.cpu_workers=1",
    "router.balancing=shared",
    "workers.count=1",
    "preprocess.event_loop={return_ms: 0.3, respond_per_batch_ms: 0.1, respond_per_request_ms: 0.05}",
]
CASES = {
    "platform": ("inference_platform.yaml", ["duration_s=0.6", "warmup_s=0.1", "workers.count=40"]),
    "platform_shared": (
        "inference_platform.yaml",
        ["duration_s=0.4", "warmup_s=0.1", "workers.count=30", "router.balancing=shared"],
    ),
    "platform_round_robin": (
        "inference_platform.yaml",
        ["duration_s=0.4", "warmup_s=0.1", "router.balancing=round_robin"],
    ),
    "queue_limits": (
        "inference_platform.yaml",
        ["duration_s=0.4", "warmup_s=0.1", "workers.count=25", "batching.max_queue_size=40", "batching.timeout_ms=15"],
    ),
    "cpu_pool": ("vision_preprocessing.yaml", ["preprocess.cpu_workers=2"]),
    "cpu_single": ("vision_preprocessing.yaml", ["preprocess.cpu_workers=1", "traffic.rate_rps=50"]),
    "cpu_dealt": ("vision_preprocessing.yaml", ["preprocess.cpu_workers=3", "preprocess.dispatch=round_robin"]),
    "cpu_hub": (
        "vision_preprocessing.yaml",
        [
            "preprocess.cpu_workers=3",
            "preprocess.dispatch=round_robin",
            "preprocess.hub={kind: exponential, mean_ms: 0.5}",
        ],
    ),
    "deadlines": ("cv_degradation.yaml", ["duration_s=40", "warmup_s=5"]),
    "mmc": ("validation/mmc.yaml", ["duration_s=20"]),
    "md1": ("validation/md1.yaml", ["duration_s=20"]),
    "fast_path_instances": ("validation/mmc.yaml", ["duration_s=15", "router.balancing=random", "workers.instances=2"]),
    "feature_outage_fail": (
        "feature_store_outage.yaml",
        [
            "duration_s=4",
            "warmup_s=0.5",
            "features.on_timeout=fail",
            "features.outages=[{start_s: 1, duration_s: 1.5}]",
        ],
    ),
    # a feature store of finite capacity: its threads carried across chunks in SimPy
    "finite_store": (
        "recsys_feature_fetch.yaml",
        ["duration_s=3", "warmup_s=0.5", "features.batch_size=50", "features.store={threads: 8, per_op_ms: 0.5}"],
    ),
    "finite_store_cache_timeout": (
        "recsys_feature_fetch.yaml",
        [
            "duration_s=3",
            "warmup_s=0.5",
            "features.batch_size=50",
            "features.store={threads: 6, per_op_ms: 0.5}",
            "features.timeout_ms=30",
            "caches.feature={hit_rate: 0.3, hit: {kind: deterministic, value_ms: 0.2}}",
            "caches.result={keys: 300, ttl_s: 1}",
        ],
    ),
    "finite_store_fail_speed": (
        "recsys_feature_fetch.yaml",
        [
            "duration_s=3",
            "warmup_s=0.5",
            "features.batch_size=50",
            "features.store={threads: 7, per_op_ms: 0.5}",
            "features.timeout_ms=35",
            "features.on_timeout=fail",
            "platform.speed={kind: log_ar1, step_ms: 20, frontend_elasticity: 0.7, "
            "components: [{sigma: 0.3, correlation_time_s: 0.5}]}",
        ],
    ),
    # the front end's one event loop: its queue, instances and jobs carried across chunks
    "event_loop": ("calibrated_cpu_resnet.yaml", LOOP),
    "event_loop_cap_cache_speed": (
        "calibrated_cpu_resnet.yaml",
        [
            *LOOP,
            "traffic.rate_rps=700",
            "batching.max_queue_size=6",
            "batching.preferred_batch_sizes=[2, 4]",
            "caches.result={keys: 200, ttl_s: 2}",
            "platform.speed={kind: log_ar1, step_ms: 20, frontend_elasticity: 0.7, "
            "components: [{sigma: 0.3, correlation_time_s: 0.5}]}",
        ],
    ),
    "log_behind": ("inference_platform.yaml", ["duration_s=0.4", "warmup_s=0.1", "logging.bandwidth_gbps=4"]),
    "autoscaler": ("autoscaling.yaml", ["duration_s=150"]),
    "autoscaler_p99_metric": (
        "autoscaling.yaml",
        ["duration_s=70", "workers.autoscaler.metric=p99_ms", "workers.autoscaler.target=80"],
    ),
    "crashes": ("autoscaling.yaml", ["duration_s=120", "workers.failures={mtbf_s: 40, mttr_s: 10}"]),
    "scale_to_zero": ("scale_to_zero.yaml", []),
    "diurnal": (
        "validation/mmc.yaml",
        ["duration_s=20", "traffic.shape={kind: diurnal, period_s: 10, peak_to_mean: 1.2}"],
    ),
    "result_cache_ttl": ("cache_ttl.yaml", ["duration_s=30", "warmup_s=5"]),
    "result_cache_lru_flushed": (
        "cache_ttl.yaml",
        ["duration_s=30", "warmup_s=5", "caches.result.capacity=500", "caches.result.invalidate_at_s=[10, 21]"],
    ),
    "feature_cache": (
        "recsys_feature_fetch.yaml",
        [
            "duration_s=20",
            "warmup_s=2",
            "caches.feature={keys: 2000, zipf_s: 1.1, ttl_s: 5, hit: {kind: lognormal, mean_ms: 0.3, cv: 0.5}, "
            "miss: {kind: deterministic, value_ms: 0.4}}",
        ],
    ),
    "both_caches_cpu_pool": (
        "vision_preprocessing.yaml",
        [
            "preprocess.cpu_workers=2",
            "caches.result={keys: 300, ttl_s: 2}",
            "caches.feature={hit_rate: 0.5, hit: {kind: deterministic, value_ms: 0.2}}",
        ],
    ),
    "result_cache_autoscaler": (
        "autoscaling.yaml",
        ["duration_s=100", "caches.result={keys: 1000, ttl_s: 30, hit: {kind: lognormal, mean_ms: 1, cv: 0.5}}"],
    ),
    # the host's speed: a time change of the CPU pool, the batch times and the FCFS stations
    "speed_host_batching": (
        "vision_preprocessing.yaml",
        [
            "preprocess.cpu_workers=2",
            "platform.speed={kind: log_ar1, step_ms: 20, frontend_elasticity: 0.7, "
            "components: [{sigma: 0.3, correlation_time_s: 0.5}]}",
        ],
    ),
    "speed_worker_fcfs": (
        "validation/mmc.yaml",
        [
            "duration_s=15",
            "router.balancing=random",
            "platform.speed={kind: markov, scope: worker, factors: [1, 0.5], mean_holding_s: [2, 0.5]}",
        ],
    ),
    "llm_prefix_noise": (
        "llm_chat.yaml",
        [
            "duration_s=6",
            "warmup_s=0",
            "workers.count=3",
            "traffic.rate_rps=30",
            "traffic.tokens.prefix={share: 0.5, groups: 3, tokens: 600}",
            "batching.noise_cv=0.1",
            "platform.speed={kind: log_ar1, step_ms: 100, components: [{sigma: 0.2, correlation_time_s: 2}]}",
            "batching.num_blocks=3000",
            "batching.max_num_batched_tokens=1024",
        ],
    ),
    "llm_scored_routing": (
        "llm_rag_prefix.yaml",
        [
            "duration_s=5",
            "warmup_s=0",
            "workers.count=3",
            "traffic.rate_rps=30",
            "traffic.tokens.prefix.groups=20",
            "router.balancing=scored",
            "batching.num_blocks=2000",
            "batching.noise_cv=0.1",
        ],
    ),
    "llm_sessions": (
        "llm_multiturn.yaml",
        [
            "duration_s=8",
            "warmup_s=0",
            "workers.count=3",
            "traffic.rate_rps=25",
            "traffic.tokens.sessions.turn_gap={kind: exponential, mean_ms: 1500}",
            "batching.num_blocks=4000",
            "batching.noise_cv=0.1",
        ],
    ),
    "llm_disaggregated": (
        "llm_disaggregated.yaml",
        [
            "duration_s=8",
            "warmup_s=0",
            "traffic.rate_rps=40",
            "router.balancing=scored",
            "traffic.tokens.prefix={share: 0.5, groups: 3, tokens: 600}",
            "batching.num_blocks=1200",
            "batching.noise_cv=0.1",
            "batching.disaggregation={prefill_replicas: 2, kv_transfer_gb_s: 2, kv_transfer_ms: 3}",
        ],
    ),
    "llm_mixed_fleet": (
        "llm_chat.yaml",
        [
            "duration_s=6",
            "warmup_s=0",
            "traffic.rate_rps=30",
            "workers.count=4",
            "workers.mix={a100: 1, l4: 1}",
            "traffic.tokens.prompt.max=3000",
            "traffic.tokens.output.max=512",
            "router.balancing=least_loaded",
            "batching.noise_cv=0.1",
        ],
    ),
    "llm_autoscaler": (
        "llm_autoscaling.yaml",
        [
            "duration_s=60",
            "warmup_s=0",
            "traffic.rate_rps=12",
            "traffic.shape={kind: diurnal, peak_to_mean: 1.8, period_s: 60, peak_at_s: 30}",
            "workers.autoscaler.sync_period_s=3",
            "workers.autoscaler.target=8",
            "workers.autoscaler.scale_down_stabilization_s=6",
            "workers.cold_start={model_load: {kind: lognormal, mean_ms: 4000, cv: 0.3}, warm_pool: 1}",
        ],
    ),
    "llm_autoscaler_ttft": (  # on the p99 of the first tokens in a window
        "llm_autoscaling.yaml",
        [
            "duration_s=60",
            "warmup_s=0",
            "traffic.rate_rps=12",
            "traffic.shape={kind: diurnal, peak_to_mean: 1.8, period_s: 60, peak_at_s: 30}",
            "workers.autoscaler={metric: ttft_ms, target: 120, metric_window_s: 6, max_replicas: 6, sync_period_s: 3, "
            "scale_down_stabilization_s: 6}",
            "workers.cold_start={model_load: {kind: lognormal, mean_ms: 4000, cv: 0.3}}",
        ],
    ),
    "llm_disaggregated_autoscalers": (  # each pool under its own autoscaler, both scaling
        "llm_disaggregated.yaml",
        [
            "duration_s=50",
            "warmup_s=0",
            "traffic.rate_rps=30",
            "traffic.shape={kind: diurnal, peak_to_mean: 1.8, period_s: 50, peak_at_s: 25}",
            "workers.count=2",
            "batching.disaggregation.prefill_replicas=1",
            "batching.disaggregation.prefill_autoscaler={metric: queue_depth, target: 1, max_replicas: 3, "
            "sync_period_s: 2, scale_down_stabilization_s: 4}",
            "batching.disaggregation.decode_autoscaler={metric: in_flight, target: 8, max_replicas: 3, "
            "sync_period_s: 3, scale_down_stabilization_s: 6}",
            "workers.cold_start={model_load: {kind: lognormal, mean_ms: 3000, cv: 0.3}, warm_pool: 1}",
        ],
    ),
    "speed_autoscaler": (
        "autoscaling.yaml",
        [
            "duration_s=90",
            "platform.speed={kind: log_ar1, step_ms: 100, components: [{sigma: 0.2, correlation_time_s: 5}]}",
        ],
    ),
}


def _equal(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:  # a column the run does not have (an LLM's without batching.kind continuous)
        return a is None and b is None
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


@pytest.mark.parametrize("case", sorted(CASES))
def test_streamed_records_equal_whole_run(case):
    path, overrides = CASES[case]
    s = load_scenario(ROOT / "scenarios" / path, overrides)
    whole = simulate(s)
    for chunk_s in (0.05, 0.731):
        records, batches, _ = simulate_streaming(s, chunk_s=chunk_s)
        differ = [
            f.name
            for f in fields(whole.records)
            if not _equal(getattr(whole.records, f.name), getattr(records, f.name))
        ]
        assert differ == [], f"{case}, chunks of {chunk_s} s: columns differ: {differ}"
        key_a, key_b = (
            np.lexsort((whole.batches.instance, whole.batches.start)),
            np.lexsort((batches.instance, batches.start)),
        )
        for name in ("start", "end", "size", "instance"):
            assert np.array_equal(getattr(whole.batches, name)[key_a], getattr(batches, name)[key_b]), name
        if whole.batches.gaps is not None:  # an LLM's gaps between tokens, the same ones in any order
            a, b = whole.batches.gaps, batches.gaps
            ka, kb = np.lexsort((a.tokens, a.ms, a.end)), np.lexsort((b.tokens, b.ms, b.end))
            for name in ("end", "ms", "tokens"):
                assert np.array_equal(getattr(a, name)[ka], getattr(b, name)[kb]), name
    if whole.fleet is not None:  # a dynamic pool: the same workers' lives and events
        fleet = list(stream(s, chunk_s=0.731))[-1].fleet
        assert fleet.events == whole.fleet.events
        for state in WorkerState:
            for a, b in zip(whole.fleet.intervals(state), fleet.intervals(state), strict=True):
                assert np.array_equal(a, b), state


def test_pieces_are_contiguous_and_hold_little():
    """Each piece continues where the last stopped; the engine holds only the requests in
    flight, not the run."""
    s = load_scenario(ROOT / "scenarios/inference_platform.yaml", ["duration_s=1", "warmup_s=0.1"])
    nxt, sizes = 0, []
    for piece in stream(s, chunk_s=0.1):
        assert piece.first == nxt
        nxt += len(piece.records)
        sizes.append(len(piece.records))
        if np.isfinite(piece.watermark_ms):
            assert piece.watermark_ms <= piece.horizon_ms
    assert nxt == len(simulate(s).records)
    assert max(sizes) < 0.2 * nxt  # about one chunk's worth at a time


VERSIONS = {
    "canary_own_shadow": ("canary.yaml", ["duration_s=20", "warmup_s=2", "router.canary.rollback_at_s=15"]),
    "shared_shadow_impact": (
        "canary.yaml",
        ["duration_s=10", "warmup_s=1", "router.shadow.pool=shared", "router.shadow.measure_impact=true"],
    ),
    # requests that never reach a pool: answered from the result cache, failed at the features
    "canary_cache_failures_round_robin": (
        "canary.yaml",
        [
            "duration_s=12",
            "warmup_s=1",
            "router.balancing=round_robin",
            "router.shadow.pool=shared",
            "router.shadow.measure_impact=true",
            "caches.result={keys: 3000, ttl_s: 2}",
            "features.timeout_ms=8",
            "features.on_timeout=fail",
        ],
    ),
    # the primary under an autoscaler routes its requests itself; the shadow has its own pool
    "canary_own_shadow_autoscaler": (
        "autoscaling.yaml",
        [
            "duration_s=80",
            "router.users=5000",
            "router.canary={percent: 10, workers: 2}",
            "router.shadow={percent: 20, pool: own, workers: 2}",
        ],
    ),
    # a changing fleet shares its queues with the shadow's copies, which tie with their
    # requests: each worker draws its batch times from a stream of its own
    "shared_shadow_autoscaler": (
        "autoscaling.yaml",
        ["duration_s=80", "router.shadow={percent: 20, pool: shared, measure_impact: true}"],
    ),
    "canary_shared_queue_deadlines": (
        "canary.yaml",
        ["duration_s=10", "warmup_s=1", "router.balancing=shared", "batching.deadline_ms=60"],
    ),
}


# the tagger's burst (4x for 40 s from 40 s in the scenario) early and short
NOISY = (
    "noisy_neighbour.yaml",
    [
        "duration_s=8",
        "warmup_s=1",
        "traffic.classes.tagger.shape={kind: bursts, bursts: [{start_s: 2, duration_s: 4, multiplier: 4}]}",
    ],
)
CLASSES = {
    "classes_shared_queue": NOISY,
    "classes_quota": (NOISY[0], [*NOISY[1], "traffic.classes.tagger.max_instances=5"]),
    "classes_priority": (NOISY[0], [*NOISY[1], "traffic.classes.tagger.priority=bulk"]),
    # per-worker queues: a quota across eight feeds
    "classes_quota_per_worker": (
        NOISY[0],
        [*NOISY[1], "traffic.classes.tagger.max_instances=5", "router.balancing=random"],
    ),
    # dedicated pools, routed round robin over requests some of which never reach them
    "classes_own_pools_cache_failures": (
        NOISY[0],
        [
            *NOISY[1],
            "workers.count=3",
            "traffic.classes.tagger.workers=5",
            "router.balancing=round_robin",
            "caches.result={keys: 3000, ttl_s: 2}",
            "features={lookups_per_request: 20, batch_size: 20, round_trip: {kind: lognormal, p50_ms: 2, p99_ms: 12}}",
            "features.timeout_ms=8",
            "features.on_timeout=fail",
        ],
    ),
    "classes_deadlines_speed": (
        NOISY[0],
        [
            *NOISY[1],
            "traffic.classes.tagger.priority=bulk",
            "batching.deadline_ms=40",
            "platform.speed={kind: log_ar1, step_ms: 50, components: [{sigma: 0.2, correlation_time_s: 1}]}",
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(VERSIONS) + sorted(CLASSES))
def test_other_pools_stream_the_records_of_a_whole_run(case):
    """A canary's, a shadow's and the traffic classes' pools run chunk by chunk: for any
    chunk length the records, every pool's batches, the shadow copies and the responses
    without them are a whole run's, and the requests are handed out as they settle (not
    at the end)."""
    path, overrides = VERSIONS.get(case) or CLASSES[case]
    s = load_scenario(ROOT / "scenarios" / path, overrides)
    whole = simulate(s)
    for chunk_s in (0.05, 0.731):
        pieces = list(stream(s, chunk_s=chunk_s))
        assert sum(len(p.records) for p in pieces[: len(pieces) // 2]) > 0.3 * len(whole.records)
        records = concat_records([p.records for p in pieces])
        pools, shadow, alone = gather(pieces)
        differ = [
            f.name for f in fields(records) if not _equal(getattr(whole.records, f.name), getattr(records, f.name))
        ]
        assert differ == [], f"{case}, chunks of {chunk_s} s: columns differ: {differ}"
        for name, log in [("primary", concat_logs([p.batches for p in pieces])), *pools.items()]:
            ref = whole.batches if name == "primary" else whole.pools[name]
            key_a, key_b = np.lexsort((ref.instance, ref.start)), np.lexsort((log.instance, log.start))
            for col in ("start", "end", "size", "instance"):
                assert np.array_equal(getattr(ref, col)[key_a], getattr(log, col)[key_b]), (name, col)
        assert sorted(pools) == sorted(whole.pools)
        assert (shadow is None) == (whole.shadow is None)
        for k, v in (shadow or {}).items():
            assert _equal(v, whole.shadow[k]), k
        assert (alone is None) == (whole.response_without_shadow is None)
        if alone is not None:
            assert _equal(alone, whole.response_without_shadow)


def test_run_streams_records_a_row_group_per_chunk(tmp_path):
    """``servesim run --chunk-s 0.3 --records``: the same rows as a run held whole
    (``--chunk-s whole``) writes, a Parquet row group per chunk (or CSV rows appended), and
    the same counts."""
    import json

    import pandas as pd
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from servesim.cli import app

    runner = CliRunner()
    args = ["run", str(ROOT / "scenarios/inference_platform.yaml"), "--duration-s", "1", "--set", "warmup_s=0.2"]
    args += ["--set", "traffic.rate_rps=60000", "--set", "workers.count=40"]
    files = {}
    for engine, suffix in (("whole", "parquet"), ("stream", "parquet"), ("stream", "csv")):
        rec, js = tmp_path / f"{engine}.{suffix}", tmp_path / f"{engine}-{suffix}.json"
        chunks = "whole" if engine == "whole" else "0.3"
        res = runner.invoke(app, [*args, "--chunk-s", chunks, "--records", str(rec), "--json", str(js)])
        assert res.exit_code == 0, res.output
        files[engine, suffix] = rec, json.loads(js.read_text())
    (whole, s_whole), (streamed, s_streamed) = files["whole", "parquet"], files["stream", "parquet"]
    assert pq.ParquetFile(streamed).num_row_groups > 1
    a, b = pd.read_parquet(whole), pd.read_parquet(streamed)
    pd.testing.assert_frame_equal(a, b)
    c = pd.read_csv(files["stream", "csv"][0], index_col="request")
    assert len(c) == len(a)
    assert np.allclose(c["t_response_ms"], a["t_response_ms"], rtol=1e-12, equal_nan=True)
    assert s_streamed["requests"] == s_whole["requests"]
    assert s_streamed["batch_size"] == s_whole["batch_size"]


def test_chunk_choice_and_budget():
    from typer.testing import CliRunner

    from servesim.cli import app
    from simulator.chunks import prefer_streaming
    from simulator.planning.budget import estimate

    hour = load_scenario(ROOT / "scenarios/inference_platform.yaml", ["duration_s=3600"])
    assert prefer_streaming(hour)  # 720M requests: streamed by default
    assert estimate(hour, streamed=True).bytes < 1e9 < estimate(hour).bytes / 100
    short = load_scenario(ROOT / "scenarios/inference_platform.yaml")
    assert not prefer_streaming(short)  # 2M requests: held whole, exact percentiles
    # every scenario runs in chunks: traffic classes, a canary and a shadow
    res = CliRunner().invoke(app, ["run", str(ROOT / "scenarios/noisy_neighbour.yaml"), "--chunk-s", "5"])
    assert res.exit_code == 0, res.output
    assert "tagger" in res.output
    res = CliRunner().invoke(app, ["run", str(ROOT / "scenarios/canary.yaml"), "--duration-s", "20", "--chunk-s", "5"])
    assert res.exit_code == 0, res.output
    assert "ranker-v2" in res.output
    for bad in ("0", "-1", "soon", "nan", "inf"):  # one line naming the option, before anything runs
        res = CliRunner().invoke(app, ["run", str(ROOT / "scenarios/canary.yaml"), "--chunk-s", bad])
        assert res.exit_code == 2, bad
        assert "--chunk-s" in res.output
        assert "Traceback" not in res.output
    res = CliRunner().invoke(app, ["run", str(ROOT / "scenarios/canary.yaml"), "--engine", "stream"])
    assert res.exit_code == 2  # the old option says what replaced it
    assert "--chunk-s" in res.output


@pytest.mark.parametrize("servers", [2, 8, 65])
def test_the_compiled_fcfs_loop_equals_heapq_in_chunks(servers):
    """numba's heap and Python's heapq pick the same server for every request and give the
    same start times, in one run or in chunks with the state carried over."""
    from simulator.stages.stations import FcfsStation

    g = np.random.default_rng(servers)
    n = 50_000
    a = np.sort(g.uniform(0.0, 1e4, n))
    a[100:110] = a[100]  # simultaneous arrivals
    s = g.exponential(0.95 * servers * 1e4 / n, n)
    s[200:260] = 0.5  # equal service times: ties in the heap
    reference = FcfsStation(servers, compiled=False).run(a, s)
    station = FcfsStation(servers, compiled=True)
    cuts = [0, 1, 105, 20_000, n]
    parts = [station.run(a[i:j], s[i:j]) for i, j in itertools.pairwise(cuts)]
    assert np.array_equal(np.concatenate([p[0] for p in parts]), reference[0])
    assert np.array_equal(np.concatenate([p[1] for p in parts]), reference[1])


def test_progress_reaches_the_end_and_the_bar_runs(tmp_path):
    """A streamed run reports the simulated time after every chunk (the CLI's bar and its
    time left read it), up to the run's end."""
    from servesim.streamed import run_streamed
    from simulator.streaming import summarize_stream

    s = load_scenario(ROOT / "scenarios/validation/mmc.yaml", ["duration_s=12"])
    seen: list[float] = []
    summarize_stream(s, chunk_s=2.5, progress=seen.append)
    assert seen == sorted(seen)
    assert seen[-1] == pytest.approx(12.0)
    assert len(seen) == 5
    out = run_streamed(s, interval_s=1.0, records=tmp_path / "r.csv", show_progress=True, chunk_s=2.5)
    assert out["requests"]["arrived"] > 0
    assert (tmp_path / "r.csv").stat().st_size > 0
