"""The platform's speed process (``platform.speed``): the time change, the kinds, theory.

* an M/M/1 whose server switches between two speeds (a queue in a Markovian random
  environment) against its exact mean sojourn time, through the pool's FCFS path, the
  compiled batch scheduler, the SimPy scheduler and the front end's station;
* the time change itself: work across a change of speed, identity at factor one;
* the log-AR(1) kind: mean one, its variance and autocorrelation.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.engine import simulate
from simulator.results.metrics import window
from simulator.scenario.config import LogAR1Speed, MarkovSpeed
from simulator.scenario.loader import ScenarioError, load_scenario
from simulator.stages.speed import SpeedPath, draw_path
from tests.test_theory import check
from tests.theory import mm1_random_environment_mean_sojourn

SPEEDS = "{kind: markov, factors: [0.8, 1.6], mean_holding_s: [0.2, 0.1]}"


def test_work_across_a_change_of_speed():
    path = SpeedPath(np.array([0.0, 10.0, 20.0]), np.array([1.0, 2.0, 0.5]))
    # 5 ms of work at full speed, then 5 at half speed: 10 ms of wall time more
    assert path.finish(5.0, 10.0) == pytest.approx(20.0)
    # from 15: 2.5 of work by 20, then at double speed 7.5 of work take 3.75 ms
    assert path.finish(15.0, 10.0) == pytest.approx(23.75)
    t = np.linspace(0, 40, 81)
    np.testing.assert_allclose(path.time(path.work(t)), t)


def test_one_step_in_plain_floats_is_the_arrays_to_the_bit():
    """``finish_at`` (an engine's step, in plain floats) gives exactly ``finish``'s bits,
    before the path, on its breakpoints, inside and past its end: a scenario and seed give
    the same records whichever the simulation uses."""
    rng = np.random.default_rng(5)
    path = SpeedPath(np.arange(200) * 7.0, np.exp(rng.normal(0, 0.3, 200)))
    starts = np.concatenate([rng.uniform(-5, 1500, 2000), path.t[:50], [0.0, 1393.0, 1e6]])
    works = rng.exponential(20.0, len(starts))
    works[:10] = 0.0
    got = np.array([path.finish_at(float(s), float(w)) for s, w in zip(starts, works, strict=True)])
    np.testing.assert_array_equal(got, path.finish(starts, works))


def test_factor_one_changes_nothing(root_dir):
    base = root_dir / "calibrate/profiles/cpu-resnet64/scenario.yaml"
    plain = simulate(load_scenario(base, ["duration_s=10", "traffic.rate_rps=280", "platform.speed=null"])).records
    traced = simulate(
        load_scenario(
            base, ["duration_s=10", "traffic.rate_rps=280", "platform.speed={kind: trace, step_ms: 7, factors: [1]}"]
        )
    ).records
    np.testing.assert_array_equal(plain.t_response, traced.t_response)


def test_log_ar1_has_mean_one_and_its_autocorrelation():
    cfg = LogAR1Speed(step_ms=10, components=[{"sigma": 0.2, "correlation_time_s": 1.0}])
    path = draw_path(cfg, 4_000_000.0, np.random.default_rng(3))
    x = np.log(path.f)
    assert path.f.mean() == pytest.approx(1.0, abs=0.01)
    assert x.std() == pytest.approx(0.2, rel=0.05)
    lag = 100  # 1 s: autocorrelation exp(-1)
    assert np.corrcoef(x[:-lag], x[lag:])[0, 1] == pytest.approx(np.exp(-1), abs=0.03)


def test_markov_speed_spends_time_in_proportion_to_its_holds():
    path = draw_path(MarkovSpeed(factors=[0.8, 1.6], mean_holding_s=[0.2, 0.1]), 2_000_000.0, np.random.default_rng(1))
    dt = np.diff(path.t)
    slow = (dt * (path.f[:-1] == 1.6)).sum() / dt.sum()
    assert slow == pytest.approx(1 / 3, abs=0.01)


@pytest.mark.parametrize(
    "path",
    [
        ["batching.max_batch_size=1"],  # the pool as an FCFS station
        ["batching.max_batch_size=1", "batching.max_queue_size=1000000"],  # the compiled batch scheduler
        ["batching.max_batch_size=1", "batching.deadline_ms=1e12"],  # the SimPy batch scheduler
        [
            "preprocess={service: {kind: exponential, mean_ms: 10.0}, cpu_workers: 1}",
            "workers.count=64",
            "workers.service_time={kind: deterministic, value_ms: 0.001}",
        ],
    ],
    ids=["fcfs-pool", "compiled-batcher", "simpy-batcher", "front-end-station"],
)
def test_mm1_in_a_random_environment_matches_theory(root_dir, path):
    """M/M/1, service 10 ms, at 0.07 requests/ms, the server at factor 0.8 for 0.2 s and
    1.6 for 0.1 s on average in turn (overloaded while slow): the exact mean sojourn is
    39.8 ms, against 29.3 ms for an M/M/1 at the average speed. The speed changes in the middle of
    services, as the environment of the theory does."""
    lam, mu = 0.07, 0.1
    expected = mm1_random_environment_mean_sojourn(lam, mu, [0.8, 1.6], [200.0, 100.0])
    duration = 100_000 / (lam * 1000)
    overrides = [
        "workers.count=1",
        f"traffic.rate_rps={lam * 1000}",
        "workers.service_time={kind: exponential, mean_ms: 10.0}",
        f"duration_s={duration:.1f}",
        f"warmup_s={duration * 0.05:.1f}",
        f"platform.speed={SPEEDS}",
        *path,
    ]
    s = load_scenario(root_dir / "scenarios/validation/mmc.yaml", overrides)
    est = []
    for seed in range(8):
        rec = simulate(s, seed=1000 + seed).records
        mask = window(rec, s) & rec.completed
        est.append((rec.t_response - rec.arrival)[mask].mean())
    check(est, expected, "M/M/1 in a two-speed random environment, mean sojourn")
    assert expected > 1.3 / (mu * (2 / 3 / 0.8 + 1 / 3 / 1.6) - lam)  # far from the M/M/1 at the average speed


def test_speed_errors_name_the_field(root_dir, tmp_path):
    bad = tmp_path / "bad.yaml"
    text = (root_dir / "scenarios/validation/mmc.yaml").read_text()
    bad.write_text(
        text
        + "platform:\n  speed: {kind: log_ar1, step_ms: 500, components: [{sigma: 0.1, correlation_time_s: 0.1}]}\n"
    )
    with pytest.raises(ScenarioError, match=r"line \d+: platform.speed.*step_ms"):
        load_scenario(bad)


def test_speed_paths_count_in_the_memory_budget(root_dir):
    """One path per worker at 0.1 ms steps for an hour is refused before the run, naming the knob."""
    from simulator.planning.budget import BudgetError, check

    s = load_scenario(
        root_dir / "scenarios/validation/mmc.yaml",
        [
            "workers.count=2000",
            "traffic.rate_rps=10",
            "duration_s=3600",
            "router.balancing=random",
            "platform.speed={kind: log_ar1, scope: worker, step_ms: 0.1, "
            "components: [{sigma: 0.1, correlation_time_s: 1}]}",
        ],
    )
    with pytest.raises(BudgetError, match=r"platform\.speed\.step_ms"):
        check(s)


def test_scope_worker_gives_each_queue_its_own_speed(root_dir):
    """scope: host slows every worker at once; scope: worker gives each fixed pool's queue a
    path of its own (and the front end another), the same on every run of the seed."""
    from simulator.rng import streams
    from simulator.stages.speed import SpeedProcess

    base = [
        "workers.count=4",
        "router.balancing=random",
        "traffic.rate_rps=200",
        "duration_s=20",
        "warmup_s=2",
    ]
    speed = "{kind: log_ar1, scope: SCOPE, components: [{sigma: 0.3, correlation_time_s: 0.5}]}"
    for scope in ("host", "worker"):
        s = load_scenario(
            root_dir / "scenarios/validation/mmc.yaml", [*base, f"platform.speed={speed.replace('SCOPE', scope)}"]
        )
        process = SpeedProcess(s.platform.speed, s.duration_s * 1000.0, streams(3).speed)
        paths = [process.worker(k).f for k in range(4)]
        same = all(np.array_equal(paths[0], p) for p in paths[1:])
        assert same == (scope == "host")
        again = SpeedProcess(s.platform.speed, s.duration_s * 1000.0, streams(3).speed)
        assert np.array_equal(again.worker(2).f, paths[2])
        rec = simulate(s, seed=3).records
        assert rec.completed[window(rec, s)].all()


@pytest.mark.parametrize("elasticity", [1.0, 0.5])
def test_episodes_mean_is_the_paths_time_average(elasticity):
    """``Episodes.mean``: a tenth of the time at 2x, the rest at 1, so 1.1 (0.5: 1.0414),
    against the time average of a long drawn path (10,000 episodes)."""
    from simulator.scenario.platform import Episodes

    ep = {"factor": 2.0, "mean_duration_s": 0.2, "mean_interval_s": 1.8}
    cfg = LogAR1Speed(step_ms=10, components=[{"sigma": 1e-3, "correlation_time_s": 1.0}], episodes=ep)
    path = draw_path(cfg, 20_000_000.0, np.random.default_rng(5))
    dt = np.diff(path.t)
    average = float((dt * path.f[:-1] ** elasticity).sum() / dt.sum())
    assert Episodes(**ep).mean(elasticity) == pytest.approx(1.0 + 0.1 * (2.0**elasticity - 1.0))
    assert average == pytest.approx(Episodes(**ep).mean(elasticity), abs=0.005)
