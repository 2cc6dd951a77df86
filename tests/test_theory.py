"""The simulator against queueing theory, with replications.

Each check runs R independent replications (seeds 0..R-1), takes one estimate per
replication, and compares the mean with theory using the spread across replications
(which absorbs the autocorrelation inside a run). A check fails only when the error is
both statistically significant (|z| > 4) and practically large (> 2%). Nothing is
compared with pinned outputs.
"""

from __future__ import annotations

import zlib
from types import SimpleNamespace

import numpy as np
import pytest

from simulator.engine import simulate
from simulator.results.metrics import window
from simulator.scenario.loader import load_scenario
from simulator.streaming import simulate_streaming
from tests.theory import erlang_c, mmc_mean_wait, mmc_sojourn_quantile, pk_mean_wait, round_robin_mm_mean_sojourn

Z_MAX = 4.0
REL_MAX = 0.02


def check(estimates, expected: float, what: str) -> None:
    est = np.asarray(estimates, dtype=float)
    mean = est.mean()
    se = est.std(ddof=1) / np.sqrt(len(est))
    z = (mean - expected) / se if se > 0 else (0.0 if mean == expected else np.inf)
    rel = abs(mean - expected) / expected
    assert not (abs(z) > Z_MAX and rel > REL_MAX), (
        f"{what}: simulated {mean:.5g} ± {se:.2g} (R={len(est)}) vs theory {expected:.5g}: z={z:.1f}, error {rel:.2%}"
    )


def _replicate(path, overrides, reps):
    """Run ``reps`` replications; seeds differ between checks so that they stay independent.

    Every other replication runs through the streaming engine (in 0.5 s chunks), so each
    check holds for both engines (their records are identical on a seed:
    ``tests/test_streaming.py``)."""
    s = load_scenario(path, overrides)
    first = zlib.crc32(" ".join(overrides).encode()) % 10**6 * 100
    for seed in range(first, first + reps):
        if seed % 2:
            records, _, _ = simulate_streaming(s, seed=seed, chunk_s=0.5)
            run = SimpleNamespace(records=records)
        else:
            run = simulate(s, seed=seed)
        mask = window(run.records, s) & run.records.completed
        yield run, mask


def _mmc(root, c, rho, mean_ms, extra=()):
    lam = rho * c / mean_ms  # per ms
    overrides = [
        f"workers.count={c}",
        f"traffic.rate_rps={lam * 1000}",
        f"workers.service_time.mean_ms={mean_ms}",
        *extra,
    ]
    # long enough that each replication sees ~ 60k requests after warm-up; more at high load
    n_target = 60_000 if rho < 0.85 else 150_000
    duration = n_target / (lam * 1000)
    overrides += [f"duration_s={duration:.3f}", f"warmup_s={duration * 0.1:.3f}"]
    return lam, overrides


@pytest.mark.parametrize("c", [1, 8, 64])
@pytest.mark.parametrize("rho", [0.5, 0.8, 0.9])
def test_mmc_sojourn_quantiles_match_erlang_c(root_dir, c, rho):
    mean_ms = 10.0
    lam, overrides = _mmc(root_dir, c, rho, mean_ms)
    qs = {50: [], 95: [], 99: []}
    for run, mask in _replicate(root_dir / "scenarios/validation/mmc.yaml", overrides, reps=8):
        e2e = (run.records.t_response - run.records.arrival)[mask]
        for p, got in zip(qs, np.percentile(e2e, list(qs)), strict=True):
            qs[p].append(got)
    for p, est in qs.items():
        check(est, mmc_sojourn_quantile(p / 100, c, lam, 1 / mean_ms), f"M/M/{c} rho={rho} p{p} sojourn")


def test_mmc_through_simpy_scheduler_matches_erlang_c(root_dir):
    """The same M/M/8 through the event-driven batcher path (a queue limit forces it)."""
    lam, overrides = _mmc(root_dir, 8, 0.8, 10.0, extra=["batching.max_queue_size=1000000"])
    waits, p_wait = [], []
    for run, mask in _replicate(root_dir / "scenarios/validation/mmc.yaml", overrides, reps=6):
        w = run.records.stage_ms("queue")[mask]
        waits.append(w.mean())
        p_wait.append(np.mean(w > 0))
    check(waits, mmc_mean_wait(8, lam, 0.1), "M/M/8 mean wait (SimPy path)")
    check(p_wait, erlang_c(8, lam / 0.1), "M/M/8 P(wait) (SimPy path)")


@pytest.mark.parametrize(
    ("service", "mean", "var"),
    [
        (["workers.service_time.kind=deterministic", "workers.service_time.value_ms=1.0"], 1.0, 0.0),
        (["workers.service_time={kind: gamma, mean_ms: 1.0, cv: 2.0}"], 1.0, 4.0),
        (["workers.service_time={kind: uniform, low_ms: 0.5, high_ms: 1.5}"], 1.0, 1 / 12),
        # a calibration's measured noise ratios, resampled: half 0.5, half 1.5 (mean 1, variance 0.25)
        ([f"workers.service_time={{kind: table, batch_ms: {{1: 1.0}}, noise_ratios: {[0.5, 1.5] * 5}}}"], 1.0, 0.25),
    ],
    ids=["M/D/1", "M/G/1-gamma-cv2", "M/G/1-uniform", "M/G/1-measured-ratios"],
)
@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_mg1_mean_wait_matches_pollaczek_khinchine(root_dir, service, mean, var, rho):
    lam = rho / mean
    n_target = 80_000 if var <= 1 else 300_000
    duration = n_target / (lam * 1000)
    overrides = [
        *service,
        f"traffic.rate_rps={lam * 1000}",
        f"duration_s={duration:.3f}",
        f"warmup_s={duration * 0.1:.3f}",
    ]
    waits = [
        run.records.stage_ms("queue")[mask].mean()
        for run, mask in _replicate(root_dir / "scenarios/validation/md1.yaml", overrides, reps=8)
    ]
    check(waits, pk_mean_wait(lam, mean, var), f"rho={rho} mean wait")


def test_theory_helpers_agree_with_known_values():
    # M/M/1: P(wait) = rho, sojourn ~ Exp(mu - lam)
    assert erlang_c(1, 0.8) == pytest.approx(0.8)
    assert mmc_sojourn_quantile(0.99, 1, 0.8, 1.0) == pytest.approx(np.log(100) / 0.2, rel=1e-9)
    # a textbook Erlang C value: c=2, a=1 -> 1/3
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)


def _preprocess_sojourns(root, preprocess: str, lam: float, reps: int = 8) -> list[float]:
    """Mean time in the preprocess stage per replication, with ``preprocess`` (a YAML flow
    mapping) at ``lam`` requests per ms, about 150k requests each, workers never queueing."""
    duration = 150_000 / (lam * 1000)
    overrides = [
        f"preprocess={preprocess}",
        f"traffic.rate_rps={lam * 1000}",
        "workers.count=64",
        f"duration_s={duration:.3f}",
        f"warmup_s={duration * 0.1:.3f}",
    ]
    return [
        run.records.stage_ms("preprocess")[mask].mean()
        for run, mask in _replicate(root / "scenarios/validation/mmc.yaml", overrides, reps=reps)
    ]


@pytest.mark.parametrize("rho", [0.5, 0.85])
def test_round_robin_front_ends_match_the_erlang_n_queue(root_dir, rho):
    """``preprocess.dispatch: round_robin`` over 4 exponential workers (each dealt every
    4th request, as ``servesim serve --frontends 4`` deals its connections): each is an
    E4/M/1 queue, whose mean sojourn is exact (GI/M/1); a shared pool of 4 (M/M/4) waits
    less, and a random split (M/M/1 each) more."""
    n, mean_ms = 4, 1.0
    lam = rho * n / mean_ms  # per ms
    pre = "{service: {kind: exponential, mean_ms: 1.0}, cpu_workers: 4, dispatch: round_robin}"
    sojourn = _preprocess_sojourns(root_dir, pre, lam)
    expected = round_robin_mm_mean_sojourn(lam, 1 / mean_ms, n)
    check(sojourn, expected, f"E{n}/M/1 rho={rho} mean sojourn")
    shared = mean_ms + mmc_mean_wait(n, lam, 1 / mean_ms)
    split = mean_ms / (1 - rho)
    assert shared < expected < split
    assert abs(np.mean(sojourn) - shared) > 0.05 * shared  # the test tells the dispatch rules apart


@pytest.mark.parametrize("rho_hub", [0.5, 0.85])
def test_a_hub_after_the_pool_is_a_tandem_queue(root_dir, rho_hub):
    """``preprocess.hub``: after an M/M/2 pool, every request passes one exponential server
    (the hub between front ends and the batcher). The pool's departures are Poisson
    (Burke), so the hub is an M/M/1 of its own and the stage's mean sojourn is the sum of
    the two; without the hub's queueing it would be its service alone."""
    lam, pool_ms = 1.0, 1.2  # per ms; the pool runs at 60%
    hub_ms = rho_hub / lam
    pre = (
        f"{{service: {{kind: exponential, mean_ms: {pool_ms}}}, cpu_workers: 2, "
        f"hub: {{kind: exponential, mean_ms: {hub_ms}}}}}"
    )
    sojourn = _preprocess_sojourns(root_dir, pre, lam)
    pool = pool_ms + mmc_mean_wait(2, lam, 1 / pool_ms)
    hub = hub_ms / (1 - rho_hub)
    check(sojourn, pool + hub, f"M/M/2 then M/M/1 (hub at {rho_hub:.0%}) mean sojourn")
    assert abs(np.mean(sojourn) - (pool + hub_ms)) > 0.05 * (pool + hub)  # the hub's queue is seen
