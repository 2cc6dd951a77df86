"""Predictions as intervals that include what the fit does not know.

A held-out level was measured as a design: ``n`` slices of ``slice_s`` each, started idle,
their first ``warmup_s`` left out, pooled. Its percentile is a random quantity twice over:
the slices' own luck (which the slice bootstrap of the measurement shows) and the fitted
parameters' error. :func:`prediction_interval` simulates the same design ``draws`` times,
each with parameters drawn from their uncertainty (:func:`parameter_draws`: a bootstrap
over the fitted slices, stratified by level, refitting what the tail is most sensitive
to: the batch time's scale, the front end's CPU per request and the speed process), and
gives each percentile's median and its 90% prediction interval.

The slices of one simulated design share one run and one speed path: each slice's
arrivals are a step of the offered rate, the next slice starting after as long an idle gap
as the real design left between two slices of one level (the other levels' slices), so the
slow component of the speed carries over between them as it did.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from calibrate.scenario import scenario_dict
from calibrate.specs import scaled_batch_time
from calibrate.speed import batch_log_ratios, fit_slices_only, fit_speed_process, fitted_mean_ms
from calibrate.station import fit_frontend
from simulator.engine import simulate
from simulator.scenario.config import Scenario

PI_LEVEL = 0.90  # the prediction interval's coverage
QUANTILES = {"p50": 50.0, "p95": 95.0, "p99": 99.0}


def parameter_draws(
    profile: dict,
    requests: pd.DataFrame,
    slices: pd.DataFrame,
    *,
    draws: int,
    rng: np.random.Generator,
) -> list[tuple[dict, float]]:
    """``draws`` (profile, front-end factor) pairs, each refitted on a bootstrap resample of
    the fitted slices: the batch times' scale (their mean log ratio to the fit), the front
    end's CPU per request (its line refitted), the speed process. The held-out slices are
    never read: everything comes from :func:`calibrate.speed.fit_slices_only`."""
    fit_levels = [f["level"] for f in profile["fit_levels"]]
    fitted = fit_slices_only(requests, fit_levels)  # its slices' rates worked out once, for every draw
    used = slices[slices["kept"] & slices["level"].isin(fit_levels)]
    period = float(used["seconds"].median())
    mean_ms = fitted_mean_ms(profile["service_time"])
    st = profile["service_time"]
    b = batch_log_ratios(
        fitted, mean_ms, period, st.get("after_idle"), st.get("by_rate"), st.get("after_batch"), st.get("by_queue")
    )
    per_slice = b.assign(s=b["log_ratio"] * b["weight"]).groupby("slice")[["s", "weight"]].sum()
    base = per_slice["s"].sum() / per_slice["weight"].sum()
    fe = profile.get("frontend")
    shares = bool(fe and fe.get("client_shares_cores"))
    by_level = {lv: g["slice"].to_numpy() for lv, g in used.groupby("level")}
    out = []
    for _ in range(draws):
        pick = np.concatenate([rng.choice(ids, len(ids)) for ids in by_level.values()])
        ps = per_slice.reindex(pick).dropna()
        shift = ps["s"].sum() / ps["weight"].sum() - base
        p = {**profile, "service_time": scaled_batch_time(profile["service_time"], float(np.exp(shift)))}
        factor = 1.0
        if fe is not None:
            refit = fit_frontend(used.set_index("slice").loc[pick].reset_index(), servers=fe["servers"],
                                 client_shares_cores=shares)  # fmt: skip
            factor = refit["station_ms_per_request"] / fe["station_ms_per_request"]
        if "speed_process" in profile:
            uniq = np.unique(pick)
            p["speed_process"] = fit_speed_process(
                fitted[fitted["slice"].isin(uniq)],
                slices[slices["slice"].isin(uniq)],
                mean_ms,
                fit_levels,
                period_s=period,
                client_shares_cores=shares,
                after_idle=st.get("after_idle"),
                by_rate=st.get("by_rate"),
                after_batch=st.get("after_batch"),
            )
        out.append((p, factor))
    return out


class SliceDesign(NamedTuple):
    """How a level was measured: ``slices`` slices of ``slice_s`` each, their first
    ``warmup_s`` left out, ``gap_s`` between two of them (the other levels' slices). With
    ``lead_rates`` (the other levels' offered rates), each slice follows one of them drawn
    at random, ``lead_gap_s`` before it, as the interleaved rounds ran them: the instance
    comes to a slice busy, its recent throughput (``by_rate``) and its queue as the slice
    before left them, not idle since the level's last slice (:func:`lead_in`)."""

    slices: int
    slice_s: float
    warmup_s: float
    gap_s: float
    lead_rates: tuple[float, ...] = ()
    lead_gap_s: float = 0.0


LEAD_IN_S = 1.5  # how much of the slice before is simulated: three of by_rate's 500 ms time constants


def lead_in(design: SliceDesign, rate_rps: float, seed: int) -> tuple[float, list[dict]]:
    """The traffic steps of ``design`` at ``rate_rps`` (as :func:`design_run` lays its
    slices out, slice ``j`` from ``t0 + j * (slice_s + gap_s)``) and ``t0``: without
    ``lead_rates``, the slices alone from 0; with them, each slice preceded by the last
    :data:`LEAD_IN_S` of a slice at one of those rates (drawn from ``seed``), then
    ``lead_gap_s`` without arrivals. The lead-ins' requests fall outside the slices, and
    so outside what the design keeps."""
    period = design.slice_s + design.gap_s
    lead = min(LEAD_IN_S, design.slice_s, max(design.gap_s - design.lead_gap_s, 0.0)) if design.lead_rates else 0.0
    t0 = lead + design.lead_gap_s if lead > 0 else 0.0
    before = np.random.default_rng([seed, 7]).choice(np.asarray(design.lead_rates or [0.0]), size=design.slices)
    steps: list[dict] = []
    for j in range(design.slices):
        at = t0 + j * period
        if lead > 0:
            steps += [
                {"at_s": at - t0, "rate_rps": float(before[j])},
                {"at_s": at - design.lead_gap_s, "rate_rps": 0.0},
            ]
        steps += [{"at_s": at, "rate_rps": rate_rps}, {"at_s": at + design.slice_s, "rate_rps": 0.0}]
    return t0, steps


def design_run(
    profile: dict,
    rate_rps: float,
    design: SliceDesign,
    *,
    seed: int,
    frontend_factor: float = 1.0,
    load_generator: bool = True,
):
    """One simulated ``design`` at ``rate_rps``, its slices in one run: the records, and
    which arrivals its design keeps (past each slice's warm-up). ``load_generator``: the
    server as the calibration's client drove it (:func:`calibrate.scenario.scenario_dict`)."""
    period = design.slice_s + design.gap_s
    t0, steps = lead_in(design, rate_rps, seed)
    doc = scenario_dict(
        profile,
        rate_rps,
        duration_s=t0 + design.slices * period,
        warmup_s=0.0,
        seed=seed,
        speed=frontend_factor,
        load_generator=load_generator,
    )
    doc["traffic"] = {"shape": {"kind": "steps", "steps": steps}}
    rec = simulate(Scenario.model_validate(doc)).records
    at = rec.arrival / 1000.0 - t0
    offset = at % period
    return rec, (at >= 0) & (offset >= design.warmup_s) & (offset < design.slice_s)


def design_percentiles(
    profile: dict, rate_rps: float, design: SliceDesign, *, seed: int, frontend_factor: float = 1.0
) -> dict[str, float]:
    """One simulated ``design`` at ``rate_rps`` (:func:`design_run`): the pooled percentiles
    of the answered requests, and ``refused``, the share of the kept arrivals the simulated
    server refused or dropped (out of the percentiles, as a measured level's errors are)."""
    rec, kept = design_run(profile, rate_rps, design, seed=seed, frontend_factor=frontend_factor)
    keep = rec.completed & kept
    lat = (rec.t_response - rec.arrival)[keep]
    out = {q: float(np.percentile(lat, pct)) if len(lat) else float("nan") for q, pct in QUANTILES.items()}
    out["refused"] = float(1.0 - keep.sum() / kept.sum()) if kept.any() else 0.0
    return out


def _designs(draws, rate_rps: float, design: SliceDesign, *, seed: int) -> dict[str, np.ndarray]:
    """Each percentile of one simulated design per parameter draw, and its share refused."""
    per = {q: [] for q in (*QUANTILES, "refused")}
    for k, (p, factor) in enumerate(draws):
        sub = int(np.random.SeedSequence([seed, k]).generate_state(1)[0] % 2**31)
        got = design_percentiles(p, rate_rps, design, seed=sub, frontend_factor=factor)
        for q in per:
            per[q].append(got[q])
    return {q: np.asarray(v) for q, v in per.items()}


def discrepancy(
    draws: list[tuple[dict, float]], fitted: list[tuple[float, SliceDesign, dict[str, float]]]
) -> dict[str, float]:
    """What the model gets wrong where it was fitted: per percentile, the squared log error
    at each fitted level (``fitted``: rate, design, measured percentiles) less what the
    simulated designs' own spread explains there (the measurement's luck), never below
    zero, the median over the levels. A structural error the fitted levels share (a p50 a
    few percent high at every load) then widens the held-out intervals instead of leaving
    them to miss; one level's episode (a p99 four times the prediction at 80% alone) does not
    widen every interval of every load."""
    excess: dict[str, list[float]] = {q: [] for q in QUANTILES}
    for k, (rate, design, measured) in enumerate(fitted):
        designs = _designs(draws, rate, design, seed=10_000 + k)
        for q in QUANTILES:
            v = designs[q]
            logs = np.log(v[np.isfinite(v) & (v > 0)])
            if len(logs) > 1 and measured[q] > 0:
                err = float(np.median(logs) - np.log(measured[q]))
                excess[q].append(max(err * err - float(logs.var(ddof=1)), 0.0))
    return {q: float(np.median(v)) if v else 0.0 for q, v in excess.items()}


def prediction_interval(
    draws: list[tuple[dict, float]],
    rate_rps: float,
    design: SliceDesign,
    *,
    seed: int,
    structural: dict[str, float] | None = None,
) -> dict[str, tuple[float, float, float]]:
    """Each percentile's median over the parameter draws' simulated designs and its
    :data:`PI_LEVEL` prediction interval; ``structural`` (per percentile, a log variance:
    :func:`discrepancy`) multiplies each draw by a log-normal factor of that spread. Also
    ``refused``, the share of requests the simulated server refused, the same way."""
    per = _designs(draws, rate_rps, design, seed=seed)
    tail = (1 - PI_LEVEL) / 2
    rng = np.random.default_rng(seed)
    out = {}
    for q, v in per.items():
        if structural and structural.get(q, 0.0) > 0:
            v = v * np.exp(rng.normal(0.0, np.sqrt(structural[q]), len(v)))
        out[q] = (float(np.median(v)), float(np.quantile(v, tail)), float(np.quantile(v, 1 - tail)))
    return out
