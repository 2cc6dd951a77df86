"""The loop's work by the requests it holds, fitted to how fast the server drains a backlog
in the calibration's own open-loop slices (calibrate/README, "The ranker drains a backlog
slower than the model").

A slice's requests are binned by :data:`BIN_S` from the end of its warm-up: in each bin, the
requests in the system at the bin's start (sent on schedule, not yet answered) and the
answers the bin got, as a rate. Over the fitted levels, the mean rate by the count held
(:data:`EDGES`) is how fast the server works a backlog of that size off; the same, over
slices simulated from the profile as each level's are validated
(:func:`calibrate.validate.follows`), is the model's. Where they differ at the same level
and count, the model's loop does a request's work in a different time from the server's
when that many are held. The factor on the loop's work at each count
(``preprocess.event_loop.cost_by_held``) is the model's rate over the server's, moved only
where that ratio is :data:`Z` standard errors from 1, in up to :data:`ROUNDS` rounds (each
from the factor the last one left, stopping at one that moves nothing), held at 1 or more
and never lower at a larger count. The bins of a slice are not independent, so the
standard errors are too small and the gate too loose; and a bin is counted at the count it
starts with, so a slowdown at a larger count is partly put at a smaller one.

The closed loop's factor (:func:`calibrate.held.factors_by_held`) measures the same rise
with N requests always in flight and a load generator off the loop's core; on a 2-core AMD
EPYC host it was 1.0 to 32 held and 1.35 from 64, where the open-loop slices drained 10-25%
slower than the model from 16 held (calibrate/README).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from calibrate import validate
from calibrate.validate import design

DRAIN = True  # off: the closed loop's share per request held, as before (calibrate.refit.held_cost)
BIN_S = 0.1
EDGES = (0, 4, 8, 16, 32, 64, 128, 256)  # requests held: the bins a rate is compared in
AT = (2, 6, 12, 24, 48, 96, 192, 256)  # the count each bin's factor is put at (its middle; the last, its edge)
MIN_BINS = 8  # a count's rate from fewer bins than this, measured or simulated, is left out
SLICES = 40  # simulated slices a fitted level, a round
ROUNDS = 4  # at most: the fit stops at a round whose every step is 1
Z = 2.0  # a ratio moves the factor only where it is this many standard errors from 1


def rates_by_held(at_s: np.ndarray, done_s: np.ndarray, start_s: float, end_s: float) -> tuple[np.ndarray, np.ndarray]:
    """One slice's bins from ``start_s`` to ``end_s``: the requests held at each bin's start
    (arrived by then, not yet answered; ``done_s`` inf for one never answered) and the
    answers in it a second."""
    edges = np.arange(start_s, end_s - BIN_S / 2, BIN_S)
    edges = np.append(edges, edges[-1] + BIN_S) if len(edges) else edges
    if len(edges) < 2:
        return np.zeros(0, dtype=int), np.zeros(0)
    arrived = np.searchsorted(np.sort(at_s), edges[:-1], side="right")
    answered = np.searchsorted(np.sort(done_s), edges[:-1], side="right")
    return arrived - answered, np.histogram(done_s, edges)[0] / BIN_S


def measured(requests: pd.DataFrame, levels: list[int], start_s: float) -> pd.DataFrame:
    """The bins of every measured slice of ``levels``: level, held, rate."""
    rows = []
    got = requests[requests["level"].isin(levels) & requests["slice"].notna()]
    for (level, _), g in got.groupby(["level", "slice"]):
        at = g["scheduled_s"].to_numpy(float)
        done = at + np.where(g["status"] == 200, g["latency_ms"].to_numpy(float), np.inf) / 1e3
        held, rate = rates_by_held(at, done, start_s, float(at.max()))
        rows.append(pd.DataFrame({"level": level, "held": held, "rate": rate}))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=["level", "held", "rate"])


def simulated_slice(profile: dict, rate_rps: float, *, slice_s: float, warmup_s: float, seed: int):
    """One slice at ``rate_rps`` simulated from ``profile`` as the validation runs one
    (:func:`calibrate.validate.slice_run`): each request's arrival from the slice's
    start and when it was answered (s; inf for one never answered)."""
    rec, _, t0 = validate.slice_run(profile, rate_rps, slice_s=slice_s, warmup_s=warmup_s, seed=seed)
    at = rec.arrival / 1e3 - t0
    done = np.where(rec.completed, rec.t_response / 1e3 - t0, np.inf)
    mine = (at >= 0) & (at < slice_s)
    return at[mine], done[mine]


def simulated(
    profile: dict, level: int, rate_rps: float, *, slices: int, slice_s: float, warmup_s: float
) -> pd.DataFrame:
    """The bins of ``slices`` slices of ``level`` simulated from ``profile``
    (:func:`simulated_slice`)."""
    rows = []
    for k in range(slices):
        at, done = simulated_slice(profile, rate_rps, slice_s=slice_s, warmup_s=warmup_s, seed=7000 + k)
        held, rate = rates_by_held(at, done, warmup_s, slice_s)
        rows.append(pd.DataFrame({"level": level, "held": held, "rate": rate}))
    return pd.concat(rows, ignore_index=True)


def ratios(model: pd.DataFrame, server: pd.DataFrame) -> pd.DataFrame:
    """By the count held (the bins of :data:`EDGES`, labelled by :data:`AT`): the model's
    answer rate over the server's at the same level, pooled over the levels with both at
    least :data:`MIN_BINS` bins, each weighted by the fewer bins of the two; its standard
    error (of the log, from the bins' spread each side); and ``step``, the ratio where it is
    more than :data:`Z` standard errors from 1, else 1 (a count the two do not tell apart)."""
    out = []
    for name, d in (("model", model), ("server", server)):
        d = d.assign(bin=pd.cut(d["held"], [*EDGES, np.inf], right=False, labels=list(AT)))
        g = d.groupby(["level", "bin"], observed=True)["rate"]
        out.append(g.agg(["mean", "std", "size"]).add_prefix(name + "_"))
    both = out[0].join(out[1], how="inner")
    both = both[(both["model_size"] >= MIN_BINS) & (both["server_size"] >= MIN_BINS)]
    both = both[(both["server_mean"] > 0) & (both["model_mean"] > 0)]
    var = sum((both[f"{n}_std"] / both[f"{n}_mean"]) ** 2 / both[f"{n}_size"] for n in ("model", "server"))
    both = both.assign(
        log=np.log(both["model_mean"] / both["server_mean"]),
        var=var,
        weight=np.minimum(both["model_size"], both["server_size"]),
    )
    rows = {}
    for b, x in both.reset_index().groupby("bin", observed=True):
        w = x["weight"] / x["weight"].sum()
        log, se = float((w * x["log"]).sum()), float(np.sqrt((w**2 * x["var"]).sum()))
        step = np.exp(log) if abs(log) > Z * se else 1.0
        rows[int(b)] = {"ratio": np.exp(log), "se": se, "bins": int(x["weight"].sum()), "step": step}
    return pd.DataFrame.from_dict(rows, orient="index", columns=["ratio", "se", "bins", "step"])


def monotone(factors: dict[int, float]) -> dict[int, float]:
    """At least 1, and never lower at a larger count (the running maximum)."""
    out, top = {}, 1.0
    for n in sorted(factors):
        top = max(top, factors[n])
        out[n] = round(float(top), 4)
    return out


def fit(profile: dict, requests: pd.DataFrame, fit_levels: list[int], log=None) -> dict | None:
    """``profile``'s event loop with ``cost_by_held`` fitted to the fitted levels' drain
    (module docstring), in place, and the fit's record as its ``drain_fit``; None where it
    is off or the profile has no event loop on the feature store (a ranker fitted with the
    server's clocks), the profile untouched, and where no count held is told apart from the
    model's (the loop kept as fitted, with the closed loop's share per request held if it has
    one, and the comparison recorded in ``drain_fit``)."""
    fe = profile.get("frontend") or {}
    loop = fe.get("event_loop")
    if loop is not None:
        loop.pop("drain_fit", None)
    if not DRAIN or loop is None or not fe.get("on_store"):
        return None
    slice_s, warmup_s = design(requests, profile)
    rates = profile["levels_rps"]
    server = measured(requests, fit_levels, warmup_s)
    trial = {**profile, "frontend": {**fe, "event_loop": {k: v for k, v in loop.items() if k != "cost_per_in_flight"}}}
    factors: dict[int, float] = {}
    rounds = []
    for _ in range(ROUNDS):
        trial["frontend"]["event_loop"].pop("cost_by_held", None)
        if len(factors) >= 2:
            trial["frontend"]["event_loop"]["cost_by_held"] = dict(factors)
        model = pd.concat(
            [
                simulated(trial, lv, float(rates[lv]), slices=SLICES, slice_s=slice_s, warmup_s=warmup_s)
                for lv in fit_levels
            ],
            ignore_index=True,
        )
        table = ratios(model, server)
        if table.empty:  # no count compared (a later round: the factors so far stand)
            break
        rounds.append({str(n): [round(float(r.ratio), 4), round(float(r.se), 4)] for n, r in table.iterrows()})
        if (table["step"] == 1.0).all():
            break
        at = sorted(set(factors) | set(table.index))
        before = {n: float(np.interp(n, list(factors), list(factors.values()))) if factors else 1.0 for n in at}
        moved = monotone({n: before[n] * float(table["step"].get(n, 1.0)) for n in at})
        if moved == {n: round(before[n], 4) for n in at}:  # only steps below 1, held at the floor
            break
        factors = moved
    if len(factors) < 2 or max(factors.values()) == 1.0:  # none told apart: the loop as fitted
        loop["drain_fit"] = {"bin_s": BIN_S, "ratios_by_round": rounds, "cost_by_held": None}
        return None
    loop.pop("cost_per_in_flight", None)
    loop["cost_by_held"] = {int(n): f for n, f in factors.items()}
    record = {"bin_s": BIN_S, "ratios_by_round": rounds, "cost_by_held": {str(n): float(f) for n, f in factors.items()}}
    loop["drain_fit"] = record
    if log is not None:
        log(
            "the loop's work by the requests held, from the drain: "
            + ", ".join(f"{n}: {f:.3f}" for n, f in factors.items())
        )
    return record
