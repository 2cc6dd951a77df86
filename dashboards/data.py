"""The dashboard's data: scenario files, edited YAML, runs reduced to tidy tables.

No Streamlit here, so every function is testable on its own; pages cache them with
``st.cache_data``. Runs use fleet sampling where it is exact (see
:mod:`simulator.planning.sampling`), so a shipped scenario answers in seconds.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from simulator.planning.plan import with_workers
from simulator.planning.replicate import headline
from simulator.planning.runner import run as simulate_run
from simulator.results.anatomy import batch_histogram, e2e_cdf, stage_bands
from simulator.results.metrics import window
from simulator.scenario.config import Scenario
from simulator.scenario.loader import apply_overrides, load_scenario, parse_set

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
PROFILES = ROOT / "calibrate" / "profiles"


def scenario_files() -> list[Path]:
    """The shipped scenarios, validation ones last."""
    return sorted(SCENARIOS.glob("*.yaml")) + sorted(SCENARIOS.glob("*/*.yaml"))


def value_at(s: Scenario, path: str):
    """The value of a dotted ``path`` (``workers.service_time.base_ms``) in a scenario."""
    obj = s
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def documented_variants(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """The variants a scenario's header documents: each ``servesim run … --set …`` command
    line (continuations joined) as (its comment, or its overrides; the overrides)."""
    lines, out = [], []
    for raw in text.splitlines():
        if not raw.startswith("#"):
            break
        body = raw.lstrip("#").strip()
        if lines and lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1] + " " + body
        else:
            lines.append(body)
    for line in lines:
        if not line.startswith("servesim run ") or "--set" not in line:
            continue
        command, _, comment = line.partition("  #")
        try:
            words = shlex.split(command)
        except ValueError:
            continue
        sets = tuple(words[i + 1] for i, w in enumerate(words[:-1]) if w == "--set")
        if sets:
            out.append((comment.strip() or ", ".join(sets), sets))
    return out


@dataclass(frozen=True)
class Choice:
    """A scenario as the sidebar left it: its file (or upload), its text, the overrides."""

    source: str  # file path (relative files resolve next to it) or the upload's name
    text: str
    overrides: tuple[str, ...] = ()

    def load(self, extra: tuple[str, ...] = ()) -> Scenario:
        """The validated scenario (raises ScenarioError with the CLI's message)."""
        return load_scenario(self.source, [*self.overrides, *extra], text=self.text)

    def edited_yaml(self, extra: tuple[str, ...] = ()) -> str:
        """The YAML with the overrides written in (comments are not kept)."""
        data = yaml.safe_load(self.text)
        data = apply_overrides(data, [parse_set(o) for o in (*self.overrides, *extra)])
        return yaml.safe_dump(data, sort_keys=False)


@dataclass(frozen=True)
class Result:
    """One run, reduced: the summary dict and the tables the charts draw."""

    summary: dict
    stages: pd.DataFrame  # simulator.results.anatomy.stage_bands
    cdf: pd.DataFrame
    batches: pd.DataFrame
    timeline: pd.DataFrame
    events: pd.DataFrame
    sampled: int | None  # workers simulated when fleet-sampled, else None

    def kpis(self) -> dict:
        """The headline numbers: latency vs SLA, verdict, workers, utilization, cost; an LLM
        run's TTFT and TPOT at the SLA's percentile, goodput, output tokens and their cost."""
        s = self.summary
        e2e = s["latency_ms"]["e2e"]
        llm = s.get("llm")
        tokens = {}
        if llm:
            sla = llm["sla"]
            tokens = {
                "ttft_ms": sla["ttft"]["attained_ms"] if sla["ttft"] else llm["ttft_ms"]["p99"],
                "tpot_ms": sla["tpot"]["attained_ms"] if sla["tpot"] else llm["tpot_ms"]["p99"],
                "goodput_rps": sla["goodput_rps"],
                "output_tokens_per_s": llm["tokens"]["output_per_s"],
                "cost_per_million_tokens_usd": llm["cost"]["per_million_tokens_usd"],
            }
        return tokens | {
            "p50_ms": e2e["p50"],
            "p95_ms": e2e["p95"],
            "p99_ms": e2e["p99"],
            "sla_percentile": s["sla"]["percentile"],
            "sla_target_ms": s["sla"]["target_ms"],
            "sla_attained_ms": s["sla"]["attained_ms"],
            "sla_met": s["sla"]["met"],
            "workers": s["fleet"]["billed_mean"],  # the fleet's mean (a fixed fleet: its count)
            "utilization": s["utilization"]["of_peak_capacity"],
            "cost_per_hour_usd": s["cost"]["per_hour_usd"],
            "cost_per_million_usd": s["cost"]["per_million_requests_usd"],
        }


def run(s: Scenario, *, sample: bool = True, interval_s: float = 1.0) -> Result:
    """Simulate ``s`` (fleet-sampled where exact and ``sample``) and reduce it."""
    result = simulate_run(s, sample="auto" if sample else None, chunk_s="whole", interval_s=interval_s)
    sim, rec, summary = result.simulated, result.records, result.summary
    mask = window(rec, sim)
    t0, t1 = sim.warmup_s * 1000.0, sim.duration_s * 1000.0
    events = pd.DataFrame(summary["fleet"]["events"], columns=["t_s", "event", "detail"])
    return Result(
        summary=json.loads(json.dumps(summary, default=float)),
        stages=stage_bands(rec, mask),
        cdf=e2e_cdf(rec, mask),
        batches=batch_histogram(result.run.batches.size, result.run.batches.start, t0, t1),
        timeline=result.timeline,
        events=events[events["event"] != "ready"] if len(events) else events,
        sampled=result.sampled,
    )


def _point(x: Scenario) -> dict:
    """One run's headline numbers, fleet-sampled where exact, restated for the whole fleet."""
    return headline(x, sample="auto", workers_billed=x.workers.count)


def load_curve(s: Scenario, factors: list[float]) -> pd.DataFrame:
    """p50/p99 against offered load: one run per factor × the scenario's rate."""
    base = s.traffic.rate_rps
    rows = []
    for f in factors:
        traffic = s.traffic.model_copy(update={"rate_rps": base * f})
        rows.append({"factor": f, "offered_rps": base * f, **_point(s.model_copy(update={"traffic": traffic}))})
    return pd.DataFrame(rows)


def worker_curve(s: Scenario, counts: list[int]) -> pd.DataFrame:
    """p50/p99 and cost against the worker count: one run per count."""
    return pd.DataFrame({"workers": n, **_point(with_workers(s, n))} for n in counts)


def llm_capacity(s: Scenario) -> float:
    """The napkin's requests a second for an LLM scenario's fleet: replicas × the
    per-replica throughput at the widest batch within TPOT."""
    from simulator.planning.llm_napkin import llm_napkin
    from simulator.results.metrics import worker_price

    return s.workers.count * llm_napkin(s, worker_price(s))[1].per_replica_rps


def llm_load_curve(s: Scenario, rates: list[float]) -> pd.DataFrame:
    """TTFT and TPOT at the SLA's percentile, goodput and cost against the offered rate:
    one run per rate."""
    rows = []
    for rate in rates:
        traffic = s.traffic.model_copy(update={"rate_rps": float(rate)})
        rows.append({"offered_rps": float(rate), **_point(s.model_copy(update={"traffic": traffic}))})
    return pd.DataFrame(rows)


def llm_users_curve(s: Scenario, users: list[int]) -> pd.DataFrame:
    """TTFT and TPOT at the SLA's percentile, goodput and cost against a population's size
    (``traffic.tokens.sessions.users``): one run per size."""
    rows = []
    ses = s.traffic.tokens.sessions
    for n in users:
        tokens = s.traffic.tokens.model_copy(update={"sessions": ses.model_copy(update={"users": int(n)})})
        traffic = s.traffic.model_copy(update={"tokens": tokens})
        rows.append({"users": int(n), **_point(s.model_copy(update={"traffic": traffic}))})
    return pd.DataFrame(rows)


def knee(curve: pd.DataFrame, targets: dict[str, float], x: str = "offered_rps") -> float | None:
    """The highest offered rate (or other load ``x``) at which every target (column → ms)
    holds, where the curve crosses the first one it breaks (log-linear between the points
    around it); None when the lowest load breaks one already, the highest when none breaks."""
    c = curve.sort_values(x).reset_index(drop=True)
    ok = np.ones(len(c), dtype=bool)
    for col, target in targets.items():
        ok &= c[col].to_numpy() <= target
    if not ok[0]:
        return None
    if ok.all():
        return float(c[x].iloc[-1])
    i = int(np.argmin(ok))  # the first rate that breaks a target
    lo, hi = c.iloc[i - 1], c.iloc[i]
    cross = []
    for col, target in targets.items():
        if hi[col] > target:  # where this one crosses, log-linear in its value
            a, b = np.log(max(lo[col], 1e-9)), np.log(max(hi[col], 1e-9))
            f = (np.log(target) - a) / (b - a) if b > a else 0.0
            cross.append(lo[x] + min(max(f, 0.0), 1.0) * (hi[x] - lo[x]))
    return float(min(cross))


def llm_plan(s: Scenario, gpus: list[str], budgets: list[int], lo: int, hi: int, reps: int) -> pd.DataFrame:
    """The fewest replicas meeting the SLA (TTFT and TPOT included) for each GPU type and
    ``max_num_batched_tokens``, with their cost: one bisection each."""
    from simulator.planning.plan import Planner, label

    planner = Planner(replications=reps, max_replications=max(reps, 6))
    rows = []
    for gpu in gpus:
        for budget in budgets:
            sets = {"workers.instance_type": gpu, "batching.max_num_batched_tokens": int(budget)}
            x = s.model_copy(
                update={
                    "workers": s.workers.model_copy(update={"instance_type": gpu}),
                    "batching": s.batching.model_copy(update={"max_num_batched_tokens": int(budget)}),
                }
            )
            found, _, _ = planner.min_workers(x, lo, hi, label(sets))
            row = {"gpu": gpu, "max_num_batched_tokens": int(budget)}
            rows.append(row | (found.row() if found else {"met": False}))
    return pd.DataFrame(rows)


def calibration_reports() -> dict[str, dict]:
    """Every committed calibration report (``validation.json``) by profile name."""
    out = {}
    for path in sorted(PROFILES.glob("*/validation.json")):
        out[path.parent.name] = json.loads(path.read_text())
    return out


def calibration_table(report: dict) -> pd.DataFrame:
    """Tidy: one row per (level, percentile, source) with ms; source measured or predicted."""
    rows = []
    for r in report["validation"]:
        for source in ("measured", "predicted"):
            rows.append(
                {
                    "load": r["load"],
                    "offered_rps": r["offered_rps"],
                    "percentile": r["percentile"],
                    "source": source,
                    "ms": r[f"{source}_ms"],
                    "error_pct": r["error_pct"],
                }
            )
    return pd.DataFrame(rows)


def validation_rows(report: dict) -> pd.DataFrame:
    """The held-out levels as the report gives them: measured ms with its 95% interval,
    predicted ms with its interval (a 90% prediction interval where the report has them,
    with whether it covers the measurement; else 95% over replications), the error and the
    verdict (older reports: without intervals)."""
    df = pd.DataFrame(report["validation"])
    out = pd.DataFrame(
        {
            "load": df["load"].map("{:.0%}".format),
            "percentile": df["percentile"],
            "measured ms": df["measured_ms"].round(1),
            "predicted ms": df["predicted_ms"].round(1),
            "error": df["error_pct"].map("{:+.1f}%".format),
        }
    )
    if "measured_lo" in df:
        out.insert(1, "requests", df["requests"])
        out.insert(
            4,
            "measured 95%",
            [f"[{lo:.1f}, {hi:.1f}]" for lo, hi in zip(df["measured_lo"], df["measured_hi"], strict=True)],
        )
        bands = "covered" in df and df["covered"].notna().any()
        out.insert(
            6,
            "predicted 90% PI" if bands else "predicted 95%",
            [f"[{lo:.1f}, {hi:.1f}]" for lo, hi in zip(df["predicted_lo"], df["predicted_hi"], strict=True)],
        )
        if bands:
            out["covered"] = df["covered"].map({True: "yes", False: "no"})
        out["verdict"] = df["verdict"]
    return out
