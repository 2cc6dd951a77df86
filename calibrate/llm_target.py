"""What the LLM calibration's target can tell apart: how often a correct model passes it.

``servesim calibrate llm`` judges 24 held-out cells (TTFT and TPOT at p50, p90 and p99, at
30, 50, 70 and 85% of the knee): a cell is met when its prediction is within 10% (p50,
p90) or 20% (p99) of the measurement, or the measurement is inside the prediction's 90%
interval (:func:`calibrate.llm_report.verdicts`). Issue 30's target asks for all 18 cells at
30-70% in each of three consecutive runs.

Here the truth is a calibrated model itself. A *virtual run* measures each level as the
calibration does (``rounds`` slices of ``slice_s``, each started idle, its first
``warmup_s`` left out, pooled), on the truth's simulator, and a predictor gives each cell
the median and the range of ``replications`` simulated designs (its 90% prediction
interval), as the calibration does. Each level's slices are drawn from a pool simulated once (a slice of the real
calibration is minutes from the next, so its slices are independent draws of the host's
speed process, as the pool's are); a run's measured slices and its predictor's are
distinct draws of the pool when truth and predictor are one model.

Three models, as truth or predictor:

* ``fitted``: the profile's own scenario (its step time, noise and speed process);
* ``no speed``: the same without the speed process (the white step noise kept);
* ``minute drift``: the fitted one with one more speed component, a factor a slice of
  ``minute_sigma`` in log (correlation time ten minutes, so constant over a slice and
  independent between slices): the drift between minutes that the ABAB experiments
  measured (0.11 in log between 25-s runs, more than the fitted components give). A
  profile made since the calibration fits that drift itself (``minute_drift``) has it in
  ``fitted`` already, and this adds as much again.

The knee is judged as the calibration judges it: the mean of ``rounds + 1`` overload
slices of the truth (each simulated alone, started idle, counted from 10 s on) against the
median of half as many replications of the predictor's, within 5%.

The report gives, for each (truth, predictor) pair, the share of virtual runs meeting
all 18 cells at 30-70%, at least 17 and all 24, the share of triples of consecutive runs
all meeting 18 of 18, each cell's pass rate, the number of the 18 cells a predictor
meets in 90% of runs, and the knee within 5% in a run and in three.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pandas as pd

from calibrate import llm_profile, llm_report, llm_sim
from simulator.scenario.config import Scenario

JUDGED = (0.3, 0.5, 0.7)  # the levels whose 18 cells the target asks for
MINUTE_SIGMA = 0.085  # log: the drift between 25-s runs beyond the fitted components (calibrate/README, ABAB)
KNEE_BOUND = 0.05  # the capacity target: the knee within 5%
KNEE_POOL = 60  # overload slices simulated for each model
PAIRS = (("fitted", "fitted"), ("fitted", "no speed"), ("minute drift", "fitted"), ("minute drift", "minute drift"))


def models(profile: dict, minute_sigma: float = MINUTE_SIGMA) -> dict[str, dict]:
    """The scenarios of the three models (see the module's note) at 1 req/s."""
    fit, engine = profile["step_time"], profile["engine"]
    slice_s, warmup_s = float(profile["slice_s"]), float(profile["warmup_s"])
    fitted = llm_sim.scenario_dict(fit, engine, rate_rps=1.0, duration_s=slice_s, warmup_s=warmup_s)
    if "platform" not in fitted:
        raise ValueError("the profile's step_time has no speed process (step_time.speed) to be the truth")
    blind = {k: v for k, v in fitted.items() if k != "platform"}
    speed = fitted["platform"]["speed"]
    drift = {"sigma": float(minute_sigma), "correlation_time_s": llm_profile.MINUTE_S}
    minute = {**fitted, "platform": {"speed": {**speed, "components": [*speed["components"], drift]}}}
    return {"fitted": fitted, "no speed": blind, "minute drift": minute}


def level_rates(profile: dict) -> dict[float, float]:
    """Each held-out level's offered rate, as the calibration placed it (a share of its
    first knee slice)."""
    knee = profile["knee"]
    first = float(knee.get("first_rps", knee["completed_rps"]))
    return {float(share): float(share) * first for share in profile["levels"]}


def _pool(doc: dict, rate: float, seeds: list[int], slice_s: float, warmup_s: float) -> list:
    s = Scenario.model_validate(llm_sim.at_rate(doc, rate, slice_s, warmup_s))
    return [llm_sim.slice_latencies(s, seed, slice_s, warmup_s) for seed in seeds]


def _knee_pool(doc: dict, offered: float, seeds: list[int], knee_s: float) -> list:
    s = Scenario.model_validate(llm_sim.at_rate(doc, offered, knee_s * 3, 0.0))
    return [llm_sim.knee_slice(s, seed, knee_s, llm_sim.KNEE_SKIP_S) for seed in seeds]


def pools(
    docs: dict[str, dict],
    rates: dict[float, float],
    *,
    size: int,
    slice_s: float,
    warmup_s: float,
    knee: tuple[float, float, int] | None = None,
    seed: int = 0,
) -> dict[tuple[str, float | str], list]:
    """``size`` simulated slices of each model at each level, and with ``knee`` (offered
    req/s, slice seconds, how many) that many overload slices of each model (keyed
    ``(model, "knee")``: completions a second); seeded by model, level and draw, so the same
    pools whatever the number of processes."""
    tasks = {}
    for m, (name, doc) in enumerate(docs.items()):
        for j, (share, rate) in enumerate(rates.items()):
            base = seed * 10_000_000 + m * 1_000_000 + j * 100_000
            for lo in range(0, size, 25):
                seeds = [base + k for k in range(lo, min(lo + 25, size))]
                tasks[(name, share, lo)] = (_pool, doc, rate, seeds, slice_s, warmup_s)
        if knee is not None:
            offered, knee_s, n = knee
            base = seed * 10_000_000 + m * 1_000_000 + 900_000
            for lo in range(0, n, 5):
                seeds = [base + k for k in range(lo, min(lo + 5, n))]
                tasks[(name, "knee", lo)] = (_knee_pool, doc, offered, seeds, knee_s)
    out: dict[tuple[str, float | str], list] = {}
    with ProcessPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as ex:
        futures = {key: ex.submit(*args) for key, args in tasks.items()}
        for (name, share, _), fut in futures.items():  # submission order: the pool's order
            out.setdefault((name, share), []).extend(fut.result())
    return out


def _draw(mine: list, theirs: list, same: bool, measured: int, predicted: int, rng: np.random.Generator):
    """Indices of ``measured`` draws of the truth's pool and ``predicted`` of the predictor's,
    distinct when they are one pool."""
    if len(theirs) < predicted + measured * same:
        raise ValueError(f"a pool of {len(theirs)} is too small for {predicted + measured * same} draws")
    pick = rng.choice(len(theirs), predicted + measured * same, replace=False)
    if same:
        return pick[:measured], pick[measured:]
    return rng.choice(len(mine), measured, replace=False), pick


def virtual_run(
    pool: dict, truth: str, predictor: str, rates: dict, *, rounds: int, replications: int, rng: np.random.Generator
) -> tuple[pd.DataFrame, float]:
    """One virtual calibration: each level measured from ``rounds`` of the truth's slices and
    predicted from ``replications`` designs of the predictor's, judged as the calibration
    judges (:func:`calibrate.llm_report.verdicts`); and the knee's error (the median of half as
    many of the predictor's overload slices against the mean of ``rounds + 1`` of the
    truth's; NaN without knee pools)."""
    rows = []
    same = truth == predictor
    for share, rate in rates.items():
        mine, theirs = pool[(truth, share)], pool[(predictor, share)]
        got, pick = _draw(mine, theirs, same, rounds, rounds * replications, rng)
        measured = llm_sim.pooled_percentiles([mine[i] for i in got])
        sims = pd.DataFrame(
            [llm_sim.pooled_percentiles([theirs[i] for i in d]) for d in pick.reshape(replications, rounds)]
        )
        rows += llm_report.cells(share, rate, measured, sims)
    knee_error = float("nan")
    if (truth, "knee") in pool:
        mine, theirs = pool[(truth, "knee")], pool[(predictor, "knee")]
        got, pick = _draw(mine, theirs, same, rounds + 1, replications // 2, rng)
        knee_error = float(np.median([theirs[i] for i in pick]) / np.mean([mine[i] for i in got]) - 1.0)
    return llm_report.verdicts(pd.DataFrame(rows)), knee_error


def summary(runs: list[pd.DataFrame], picks: np.ndarray, knee_errors: np.ndarray) -> dict:
    """Pass rates over virtual runs: of the 18 cells at 30-70% all met, at least 17, all 24;
    three runs (``picks``, rows of three run indices) all meeting 18 of 18; the count met in
    90% of runs, and over three runs the least of the three and their total met in 90% of
    triples; each cell's pass rate, share inside the interval and median error; the knee
    within 5% in a run and in all three, and the |error| three runs stay within 90% of the
    time."""
    judged = np.array([int(r[r["level"].isin(JUDGED)]["ok"].sum()) for r in runs])
    every = np.array([int(r["ok"].sum()) for r in runs])
    cells = len(runs[0][runs[0]["level"].isin(JUDGED)])
    per_cell = (
        pd.concat(runs)
        .groupby(["level", "metric", "q"])
        .agg(pass_rate=("ok", "mean"), inside=("inside", "mean"), median_error=("error", "median"))
    )
    least, total = judged[picks].min(axis=1), judged[picks].sum(axis=1)
    knee = np.abs(knee_errors)
    worst_knee = knee[picks].max(axis=1)
    return {
        "knee_within_5pct": float(np.mean(knee <= KNEE_BOUND)),
        "three_runs_knee_within_5pct": float(np.mean(worst_knee <= KNEE_BOUND)),
        "knee_bound_three_runs_90pct": float(np.quantile(worst_knee, 0.9)),
        "runs": len(runs),
        "cells_judged": cells,
        "all_judged": float((judged == cells).mean()),
        "at_least_one_less": float((judged >= cells - 1).mean()),
        "all_24": float((every == len(runs[0])).mean()),
        "three_runs_all_judged": float((least == cells).mean()),
        "judged_met_in_90pct": int(np.quantile(judged, 0.1, method="lower")),
        "three_runs_least_in_90pct": int(np.quantile(least, 0.1, method="lower")),
        "three_runs_total_in_90pct": int(np.quantile(total, 0.1, method="lower")),
        "mean_judged_met": float(judged.mean()),
        "least": least,
        "total": total,
        "cells": per_cell.reset_index().to_dict(orient="records"),
    }


def pool_for(rounds: int, replications: int) -> int:
    """The default pool a level and model: 200 slices, or as many as a virtual run draws
    when the truth is the predictor (its measured slices and its replications', distinct)."""
    return max(200, rounds * (replications + 1))


def target_report(
    profile: dict,
    *,
    runs: int = 200,
    pool_size: int | None = None,
    minute_sigma: float = MINUTE_SIGMA,
    triples: int = 2000,
    knee_pool: int | None = None,
    seed: int = 0,
    rounds: int | None = None,
) -> dict:
    """The pass rates of each (truth, predictor) pair of :data:`PAIRS` over ``runs``
    virtual runs of ``profile``'s calibration design (the knee's too, from ``knee_pool``
    overload slices a model, by default :data:`KNEE_POOL` or as many as the design draws;
    0: not), or of the same design with ``rounds`` rounds of
    slices (a level measured in that many slices, the knee in one more); the three-run
    rules a correct model (the first pair) passes 90% of the time, and how often each pair
    passes them. ``pool_size``: slices simulated a level and model (default: 200, or as
    many as the design draws when that is more)."""
    replications = int(profile["replications"])
    rounds = int(profile["rounds"]) if rounds is None else int(rounds)
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, not {rounds}")
    slice_s, warmup_s = float(profile["slice_s"]), float(profile["warmup_s"])
    if pool_size is None:
        pool_size = pool_for(rounds, replications)
    if pool_size < rounds * (replications + 1):
        raise ValueError(f"pool_size must be at least {rounds * (replications + 1)} (rounds x (replications + 1))")
    if runs < 3:
        raise ValueError("runs must be at least 3: the target judges three runs")
    if knee_pool is None:
        knee_pool = max(KNEE_POOL, rounds + 1 + replications // 2)
    if knee_pool and knee_pool < rounds + 1 + replications // 2:
        need = rounds + 1 + replications // 2
        raise ValueError(f"knee_pool must be 0 or at least {need} (rounds + 1 + replications // 2)")
    docs = models(profile, minute_sigma)
    rates = level_rates(profile)
    k = profile["knee"]
    knee = (float(k["offered_rps"]), float(k.get("slice_s", 25.0)), knee_pool) if knee_pool else None
    pool = pools(docs, rates, size=pool_size, slice_s=slice_s, warmup_s=warmup_s, knee=knee, seed=seed)
    rng = np.random.default_rng(seed)
    picks = np.array([rng.choice(runs, 3, replace=False) for _ in range(triples)])
    pairs = []
    for truth, predictor in PAIRS:
        got = [
            virtual_run(pool, truth, predictor, rates, rounds=rounds, replications=replications, rng=rng)
            for _ in range(runs)
        ]
        tables, knee_errors = [g[0] for g in got], np.array([g[1] for g in got])
        pairs.append({"truth": truth, "predictor": predictor, **summary(tables, picks, knee_errors)})
    least, total = pairs[0]["three_runs_least_in_90pct"], pairs[0]["three_runs_total_in_90pct"]
    for p in pairs:
        p["passes_least_rule"] = float((p.pop("least") >= least).mean())
        p["passes_total_rule"] = float((p.pop("total") >= total).mean())
    rule = {"every_run_at_least": least, "three_runs_total_at_least": total, "of": 3 * pairs[0]["cells_judged"]}
    return {
        "runs": runs,
        "rounds": rounds,
        "triples": triples,
        "pool_size": pool_size,
        "minute_sigma": minute_sigma,
        "rates": rates,
        "passable_rule": rule,
        "pairs": pairs,
    }
