"""Planning: the bisection against Erlang C, --max-rate, fleet sampling, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import optimize
from typer.testing import CliRunner

from servesim.cli import app
from simulator.engine import simulate
from simulator.planning.plan import Evaluation, Planner, Vary, on_instance_type, pareto
from simulator.planning.replicate import derive_seed, interval, replicate
from simulator.planning.sampling import sample_fleet, sampling_refusal
from simulator.results.reduce import summarize
from simulator.scenario.config import Affine
from simulator.scenario.loader import ScenarioError, load_scenario
from tests.helpers import ROOT, random_fleet, scenario
from tests.theory import mmc_sojourn_quantile

runner = CliRunner()
LAM, MU = 0.4, 0.1  # per ms: 400 req/s on servers of mean 10 ms, offered load a = 4


def mmc(**kw):
    """M/M/c through the simulator: one shared FCFS queue, batch size 1."""
    base = {
        "duration_s": 60.0,
        "warmup_s": 5.0,
        "traffic": {"rate_rps": LAM * 1000},
        "sla": {"percentile": 99, "target_ms": 54},
        "workers": {"count": 6, "service_time": {"kind": "exponential", "mean_ms": 1 / MU}},
        "cost": {"price_per_hour_usd": 1.0},
    }
    return scenario(**{**base, **kw})


def test_bisection_finds_the_erlang_c_minimum():
    # theory: p99 sojourn is 60.8 ms with 5 servers and 48.5 ms with 6, so p99 <= 54 ms needs 6
    assert mmc_sojourn_quantile(0.99, 5, LAM, MU) > 54 > mmc_sojourn_quantile(0.99, 6, LAM, MU)
    best, evals, check = Planner().min_workers(mmc(), 1, 12, "mmc")
    assert best.workers == 6
    assert check["monotone"]
    assert {5, 6, 7, 8}.issubset(check["checked"])
    at = {e.workers: e for e in evals}
    assert not at[5].met
    assert at[6].met
    assert at[4].load == pytest.approx(1.0)
    assert not at[4].met


def check_max_rate(rate: float, c: int, sla_ms: float, ci_hi: float, resolution: float) -> None:
    """A rate from --max-rate against Erlang C. "Meets" needs the interval's upper end under
    the target, so the answer sits on the safe side of the exact rate λ* (within the
    bisection's resolution), and the exact p99 at it lies within two half-widths of the
    simulated mean (t-interval of 3 replications: ~99% coverage)."""
    lam_star = optimize.brentq(lambda lam: mmc_sojourn_quantile(0.99, c, lam, MU) - 54, 0.1, c * MU - 1e-6) * 1000
    assert rate <= lam_star + resolution
    assert ci_hi <= 54
    exact = mmc_sojourn_quantile(0.99, c, rate / 1000, MU)
    assert abs(exact - sla_ms) <= 2 * (ci_hi - sla_ms)


def test_max_rate_matches_the_erlang_c_rate():
    best, evals = Planner().max_rate(mmc(), "mmc")
    r = best.row()
    check_max_rate(r["rate_rps"], 6, r["sla_ms"], r["sla_ci_hi"], resolution=0.01 * 600)
    assert all(e.met for e in evals if e.rate_rps <= best.rate_rps)


def test_a_non_monotone_verdict_is_reported():
    class Scripted(Planner):  # met at 3 and 5, missed at 4: the bisection must say so
        def evaluate(self, s, key):
            n = s.workers.count
            rows = pd.DataFrame({"sla_ms": [10.0, 11.0] if n in (3, 5, 6, 7, 8) else [90.0, 91.0], "met": True})
            return Evaluation(n, 1.0, rows, 50.0, n, 0.5)

    _best, _, check = Scripted().min_workers(mmc(), 1, 8, "x")
    assert not check["monotone"]
    assert (3, 4) in check["violations"]


def test_replications_are_reproducible_and_keyed_by_cell():
    s = mmc(duration_s=5.0, warmup_s=1.0)
    a = replicate(s, 3, "cell-a").drop(columns="wall_s")
    pd.testing.assert_frame_equal(a, replicate(s, 3, "cell-a").drop(columns="wall_s"))
    pd.testing.assert_frame_equal(
        a.iloc[2:].reset_index(drop=True), replicate(s, 3, "cell-a", start=2).drop(columns="wall_s")
    )
    assert derive_seed(1, "cell-a", 0) != derive_seed(1, "cell-b", 0)
    assert len({derive_seed(1, "cell-a", r) for r in range(100)}) == 100
    m, lo, hi = interval(np.array([1.0, 2.0, 3.0]))
    assert (m, lo, hi) == pytest.approx((2.0, 2.0 - 4.303 / np.sqrt(3), 2.0 + 4.303 / np.sqrt(3)), rel=1e-3)


def _fleet(**kw):
    return random_fleet(**kw)


def test_a_sampled_fleet_matches_the_full_fleet_within_noise():
    full, sampled = _fleet(), sample_fleet(_fleet(), 3)
    assert sampled.workers.count == 3
    assert sampled.traffic.rate_rps == pytest.approx(2400)
    r = 8
    a = replicate(full, r, "full")
    b = replicate(full, r, "sampled", sample=3, workers_billed=24)
    for col in ("p50_ms", "p99_ms", "completed_rps"):
        se = np.sqrt(a[col].var(ddof=1) / r + b[col].var(ddof=1) / r)
        # independent replications: the difference of means is ~N(0, se); 4 se fails by chance 6e-5 of the time
        assert abs(a[col].mean() - b[col].mean()) <= 4 * se, col
    assert b["cost_per_hour_usd"].iloc[0] == a["cost_per_hour_usd"].iloc[0] == 24.0


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"router": {"balancing": "round_robin"}}, "round_robin"),
        ({"router": {"balancing": "shared"}}, "shared"),
        ({"preprocess": {"service": {"kind": "exponential", "mean_ms": 1.0}, "cpu_workers": 4}}, "CPU pool"),
        ({"caches": {"result": {"keys": 1000, "ttl_s": 5.0}}}, "cache"),
    ],
)
def test_sampling_is_refused_where_it_would_be_wrong(change, reason):
    s = _fleet(**change)
    assert reason in sampling_refusal(s)
    with pytest.raises(ValueError, match="fleet sampling would be wrong"):
        sample_fleet(s, 2)


def test_an_autoscaled_fleet_is_sampled_one_worker_in_f():
    s = load_scenario(ROOT / "scenarios" / "autoscaling.yaml")  # 3 workers, 3..18 replicas
    assert sampling_refusal(s) is None
    one = sample_fleet(s, 1)
    assert one.workers.count == 1
    assert (one.workers.autoscaler.min_replicas, one.workers.autoscaler.max_replicas) == (1, 6)
    assert one.traffic.rate_rps == pytest.approx(200)
    result = runner.invoke(app, ["run", str(ROOT / "scenarios" / "autoscaling.yaml"), "--sample-workers", "2"])
    assert result.exit_code == 2
    assert "one worker in every f" in result.output
    assert "K = 1, 3" in result.output
    assert "Traceback" not in result.output
    kpa = s.model_copy(
        update={
            "workers": s.workers.model_copy(
                update={"autoscaler": s.workers.autoscaler.model_copy(update={"policy": "knative"})}
            )
        }
    )
    with pytest.raises(ValueError, match="Knative"):
        sample_fleet(kpa, 1)


@pytest.mark.slow
def test_a_sampled_autoscaled_fleet_follows_the_full_one():
    """The autoscaling scenario (HPA on in-flight, 90 s cold starts, traffic tripled for
    three minutes) at 4x its size, against 1 worker in 4 of it: 6 replications each. The
    sample's decisions step 4 full workers at a time, so this is a measurement with a
    tolerance, not an identity: p50, p99, the share of requests dropped and the serving
    workers (scaled back) agree within 4 standard errors or 3%."""
    base = load_scenario(ROOT / "scenarios" / "autoscaling.yaml")
    full = base.model_copy(
        update={
            "traffic": base.traffic.model_copy(update={"rate_rps": 2400.0}),
            "workers": base.workers.model_copy(
                update={
                    "count": 12,
                    "autoscaler": base.workers.autoscaler.model_copy(update={"min_replicas": 12, "max_replicas": 72}),
                }
            ),
        }
    )
    sampled = sample_fleet(full, 3)
    assert sampled.workers.autoscaler.max_replicas == 18

    def measure(s):
        rows = []
        for seed in range(6):
            m = summarize(simulate(s, seed=500 + seed))
            r = m["requests"]
            rows.append(
                (
                    m["latency_ms"]["e2e"]["p50"],
                    m["latency_ms"]["e2e"]["p99"],
                    (r["rejected"] + r["timed_out"]) / r["arrived"],
                    m["fleet"]["active_mean"] * (12 / s.workers.count),
                )
            )
        return np.array(rows)

    a, b = measure(full), measure(sampled)
    for i, name in enumerate(("p50", "p99", "dropped", "serving workers")):
        se = np.sqrt(a[:, i].var(ddof=1) / len(a) + b[:, i].var(ddof=1) / len(b))
        diff = abs(a[:, i].mean() - b[:, i].mean())
        assert diff <= max(4 * se, 0.03 * abs(a[:, i].mean())), (name, a[:, i].mean(), b[:, i].mean(), se)


def test_an_instance_type_rescales_the_batch_time_by_relative_throughput():
    s = _fleet(
        workers={
            "count": 4,
            "instance_type": "a100",
            "service_time": {"kind": "affine", "base_ms": 2.2, "per_item_ms": 0.44},
        }
    )
    h = on_instance_type(s, "h100")
    assert h.workers.instance_type == "h100"
    st = h.workers.service_time
    assert isinstance(st, Affine)
    assert (st.base_ms, st.per_item_ms) == pytest.approx((1.0, 0.2))
    with pytest.raises(ScenarioError, match="not in the catalog"):
        on_instance_type(s, "tpu")


def test_pareto_keeps_the_undominated_points():
    df = pd.DataFrame({"cost_per_hour_usd": [1, 2, 3, 4, 2.5], "sla_ms": [50, 40, 45, 20, 30]})
    front = pareto(df)
    assert front[["cost_per_hour_usd", "sla_ms"]].values.tolist() == [[1, 50], [2, 40], [2.5, 30], [4, 20]]


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("workers.count", "expected dotted.path=v1,v2"),
        ("workers.count=9..3", "1 <= lo <= hi"),
        ("workers.count=a..b", "whole numbers"),
        ("=1,2", "empty path"),
    ],
)
def test_bad_vary_is_refused(expr, message):
    with pytest.raises(ScenarioError, match=message):
        Vary.parse(expr)


PLATFORM_SMALL = ROOT / "scenarios" / "inference_platform.yaml"


def test_plan_cli_writes_a_runnable_cheapest_scenario(tmp_path):
    out = tmp_path / "chosen.yaml"
    args = [
        "plan", str(PLATFORM_SMALL), "--sla", "p99<=150ms", "--set", "duration_s=4", "--set", "warmup_s=1",
        "--vary", "workers.count=60..140", "--vary", "workers.instance_type=a100,h100",
        "--out", str(out), "--table", str(tmp_path / "points.csv"),
    ]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Pareto frontier" in result.output
    assert "chosen:" in result.output
    assert "fleet sampling on" in result.output
    chosen = load_scenario(out)  # it loads, and it is the cheapest that met
    points = pd.read_csv(tmp_path / "points.csv")
    met = points[points["met"]]
    assert chosen.workers.count * (4.0966 if chosen.workers.instance_type == "a100" else 6.88) == pytest.approx(
        met["cost_per_hour_usd"].min(), rel=1e-6
    )
    doc = yaml.safe_load(out.read_text())
    assert doc["name"] == "inference_platform_planned"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--sla", "p99<150"], "expected like p99<=150ms"),
        (["--vary", "workers.count=10..5"], "1 <= lo <= hi"),
        (["--vary", "batching.max_queue_delay_ms=-1"], "batching.max_queue_delay_ms"),
        (["--vary", "workers.instance_type=tpu"], "not in the catalog"),
        (["--vary", "batching.max_batch_size=1..4"], "workers.count only"),
        (["--sample", "some"], "auto, off, or a number"),
    ],
)
def test_plan_cli_bad_input_gets_a_clear_error(extra, message):
    result = runner.invoke(app, ["plan", str(PLATFORM_SMALL), *extra])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_napkin_reproduces_the_platform_seed():
    from simulator.planning.napkin import napkin

    s = load_scenario(PLATFORM_SMALL)
    lines = {ln.quantity: ln for ln in napkin(s, 4.0966)}
    assert lines["per-worker throughput"].value == pytest.approx(2000.0)  # 16 / (4 + 0.25 × 16) ms
    assert lines["workers"].value == 100
    assert lines["workers"].formula == "⌈200,000 / 2,000⌉"
    assert lines["workers with headroom"].value == 130
    assert lines["ingress bandwidth"].value == pytest.approx(12.8)  # Gbit/s: 200k × 8 KB × 8
    assert lines["prediction-log volume per day"].value == pytest.approx(155.52)  # TB: 1.8 GB/s × 86,400 s
    assert lines["feature-store keys read"].value == pytest.approx(1e7)


def test_explain_checks_the_napkin_with_the_simulator(tmp_path):
    doc_path = tmp_path / "explain.json"
    args = ["explain", str(PLATFORM_SMALL), "--set", "duration_s=4", "--set", "warmup_s=1", "--json", str(doc_path)]
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "⌈100 × (1 + 0.3)⌉" in result.output
    doc = json.loads(doc_path.read_text())
    verdict = doc["verdict"]
    assert verdict["napkin"]["workers"] == 100
    assert verdict["napkin + headroom"]["workers"] == 130
    assert verdict["napkin + headroom"]["met"]
    assert doc["minimum_workers"] is not None
    assert doc["minimum_workers"] <= 130
    assert doc["monotone"]
    assert "fewest workers meeting p99 ≤ 150 ms" in result.output


def test_a_napkin_batch_past_the_max_is_refused_with_its_line(tmp_path):
    text = PLATFORM_SMALL.read_text().replace("batch_size: 16 ", "batch_size: 64 ")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    result = runner.invoke(app, ["explain", str(bad)])
    assert result.exit_code == 2
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "batch_size: 64" in t)
    assert f"line {line}: napkin.batch_size" in result.output
    assert "Traceback" not in result.output


def test_plan_cli_max_rate_for_fixed_fleets(tmp_path):
    mmc_yaml = tmp_path / "mmc.yaml"
    mmc_yaml.write_text(yaml.safe_dump(mmc().model_dump(mode="json", exclude_none=True)))
    points = tmp_path / "points.csv"
    args = ["plan", str(mmc_yaml), "--max-rate", "--vary", "workers.count=6,8", "--table", str(points)]
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "highest rate meeting p99 ≤ 54 ms" in result.output
    chosen = pd.read_csv(points).query("chosen")
    for c in (6, 8):
        r = chosen[chosen["workers.count"] == c].iloc[0]
        check_max_rate(r["rate_rps"], c, r["sla_ms"], r["sla_ci_hi"], resolution=0.01 * c * MU * 1000)


def test_plan_and_explain_refuse_an_autoscaled_fleet():
    path = str(ROOT / "scenarios" / "autoscaling.yaml")
    result = runner.invoke(app, ["plan", path])
    assert result.exit_code == 2
    assert "plan bisects workers.count of one fixed fleet; this scenario has workers.autoscaler" in result.output
    result = runner.invoke(app, ["explain", path], env={"COLUMNS": "200"})
    assert result.exit_code == 0  # the napkin still prints; the check says why it is skipped
    said = " ".join(result.output.split())  # as read, whatever width the console wrapped it at
    assert "workers with headroom" in said
    assert "this scenario has an autoscaler" in said


def test_a_replication_bills_what_the_run_report_bills():
    from simulator.engine import simulate
    from simulator.results.reduce import summarize

    # the canary's and the shadow's own pools count, as in `servesim run`
    s = load_scenario(ROOT / "scenarios" / "canary.yaml", ["duration_s=20", "warmup_s=2"])
    row = replicate(s, 1).iloc[0]
    report = summarize(simulate(s.model_copy(update={"seed": int(row["seed"])})))
    assert row["cost_per_hour_usd"] == pytest.approx(report["cost"]["per_hour_usd"])
    assert row["p99_ms"] == pytest.approx(report["latency_ms"]["e2e"]["p99"])
