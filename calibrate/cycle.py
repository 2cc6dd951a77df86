"""The batch cycle as the server's own clocks show it: every request lined up against the
batches of its slice, from a run whose server reports ``received_at_ns``, ``enqueued_at_ns``
and ``dispatched_at_ns`` (CLOCK_MONOTONIC, one clock for the host's processes).

Four comparisons, each changing one thing (calibrate/README, "The light-load gap"):

* **rule**: every batch against the batcher's rule: it goes when it is full, or at the later
  of the instance's free time and its oldest request's window. How many went early, and how
  late the window-bound ones were.
* **phase**: where in the running batch the requests reach the queue, in tenths of the
  batch. A stream that ignores the batches (Poisson sends through a front end of its own)
  is uniform; the reference server's one event loop, which also hands batches over and
  writes their responses, is not.
* **waits**: the queue wait by what a request found (:func:`found`): the instance idle or busy, the queue
  empty (it heads its batch) or not.
* **replay**: the model's batcher fed exactly the measured queue arrivals and each batch
  size's measured mean time: its queue wait against the measured one. What is left is the
  coupling of arrivals to the batch cycle, which a batcher fed independent arrivals lacks.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from calibrate.samples import EMPIRICAL_POINTS, batch_time_us

CLOCKS = ("received_at_ns", "enqueued_at_ns", "dispatched_at_ns")
PHASE_BINS = 10


def has_clocks(requests: pd.DataFrame) -> bool:
    """Whether the run's server reported when each request was queued and dispatched."""
    return all(c in requests and requests[c].notna().any() for c in CLOCKS)


def clocked(requests: pd.DataFrame) -> pd.DataFrame:
    """The answered requests with their clocks in ms: queued, dispatched, the batch's time and end."""
    df = requests[(requests["status"] == 200)].dropna(subset=[*CLOCKS, "batch_size"]).copy()
    df["enq_ms"] = df["enqueued_at_ns"] / 1e6
    df["disp_ms"] = df["dispatched_at_ns"] / 1e6
    df["batch_ms"] = batch_time_us(df) / 1e3
    df["end_ms"] = df["disp_ms"] + df["batch_ms"]
    return df


def batches(df: pd.DataFrame) -> pd.DataFrame:
    """One row per batch of one slice (requests of a batch share its dispatch time), in
    dispatch order: dispatch, end (dispatch plus the batch time: hand-off and compute),
    size, its oldest request's enqueue time and the previous batch's end."""
    b = (
        df.groupby("disp_ms")
        .agg(end_ms=("end_ms", "first"), size=("batch_size", "first"), oldest_ms=("enq_ms", "min"))
        .reset_index()
        .sort_values("disp_ms")
    )
    b["prev_end_ms"] = b["end_ms"].shift(1)
    return b


def rule_check(b: pd.DataFrame, window_ms: float, max_batch_size: int) -> dict:
    """Batches that went before the rule allows (not full, before the later of the instance's
    free time and the oldest's window; 0.05 ms of clock reading allowed), and how late the
    window-bound ones went (median, ms)."""
    free = b["prev_end_ms"].fillna(-np.inf)
    due = np.maximum(free, b["oldest_ms"] + window_ms)
    partial = b["size"] < max_batch_size
    early = partial & (b["disp_ms"] < due - 0.05)
    by_window = partial & (b["oldest_ms"] + window_ms > free)
    late = (b["disp_ms"] - due)[by_window]
    return {
        "batches": len(b),
        "early_share": float(early.mean()),
        "window_late_median_ms": float(late.median()) if len(late) else float("nan"),
    }


def window_lateness(s: pd.DataFrame, window_ms: float, max_batch_size: int) -> pd.DataFrame:
    """One slice's window-bound batches (:func:`rule_check`'s: not full, its oldest's window
    later than the instance's free time; oldest queued after the warm-up), from its clocked
    requests (:func:`clocked`'s columns): each one's ``late`` (dispatch less due time, ms,
    at least 0), whether a request queued after the due time ``woke`` the batcher (it
    looks at its queue then, and goes at once), and when that request came past the due
    time (``closed_after``)."""
    b = batches(s)  # the warm-up's too, so that each batch has its oldest and the one before it
    warm = s.loc[s["warmup"], "enq_ms"].max() if s["warmup"].any() else -np.inf
    due = (b["oldest_ms"] + window_ms).to_numpy()
    bound = (b["size"] < max_batch_size).to_numpy() & (due > b["prev_end_ms"].fillna(np.inf).to_numpy())
    bound &= (b["oldest_ms"] > warm).to_numpy()
    enq = np.sort(s["enq_ms"].to_numpy())
    first = np.searchsorted(enq, due, side="right")  # the first request queued after the due time
    woke = first < np.searchsorted(enq, b["disp_ms"].to_numpy(), side="right")
    return pd.DataFrame(
        {
            "late": np.clip(b["disp_ms"].to_numpy() - due, 0.0, None),
            "woke": woke,
            "closed_after": enq[np.minimum(first, len(enq) - 1)] - due,
        }
    )[bound]


def fit_window(requests: pd.DataFrame, fit_levels: list[int], window_ms: float, max_batch_size: int) -> dict | None:
    """How late the server's batching window closes, for the scenario: at the lightest
    fitted level, each window-bound batch's dispatch less its due time
    (:func:`window_lateness`); None without the server's clocks or with no window.

    The reference server's batcher waits on asyncio timers, whole milliseconds on a loop
    clock cached at the last iteration, and checks the clock when they fire: a 2 ms window
    closed 0.11 ms late (median) and 0.19 ms (mean) at 30% load on the MGET ranker, whose
    batches are of one to three, never early. ``late_ms`` is that mean. ``timer_ms`` is
    the timer's own lateness, for ``preprocess.event_loop.timer_late``: the Kaplan-Meier
    estimate from the windows the timer closed and those a request closed first
    (:func:`_timer_quantiles`). It holds the loop's other jobs at that load too, which the
    model's loop adds again (at light load ~0.02 ms of the mean)."""
    if window_ms <= 0 or not has_clocks(requests):
        return None
    light = clocked(requests[requests["level"] == min(fit_levels)])
    parts = [window_lateness(s, window_ms, max_batch_size) for _, s in light.groupby("slice")]
    w = pd.concat(parts) if parts else None
    if w is None or len(w) < 20:
        return None
    late = w["late"].to_numpy()
    out = {
        "late_ms": float(late.mean()),
        "late_quantiles_ms": {str(q): round(float(np.percentile(late, q)), 4) for q in (5, 50, 95)},
        "batches": len(late),
    }
    timer_ms = _timer_quantiles(w.loc[~w["woke"], "late"].to_numpy(), w.loc[w["woke"], "closed_after"].to_numpy())
    if timer_ms is not None:
        out["timer_ms"] = timer_ms
    return out


KM_MIN_AT_RISK = 20  # past the lateness where fewer windows are still open, the estimate stops


def _timer_quantiles(fired: np.ndarray, closed: np.ndarray) -> list[float] | None:
    """The timer's lateness as :data:`~calibrate.samples.EMPIRICAL_POINTS` quantiles, from
    the windows its firing closed (``fired``: its lateness) and those a request queued
    first (``closed``: the timer would have fired later than that): the Kaplan-Meier
    estimate of a right-censored sample. The fired ones alone are biased short, as a
    long lateness leaves more time for a request to come first. The estimate holds while
    :data:`KM_MIN_AT_RISK` windows or more are still open; the share left open there (the
    longest windows, nearly all closed by a request) gets that lateness: what the data
    says of them is that the timer had not fired by then. (It once got the largest fired
    value: on the MGET ranker since 2026-11-29, 7-12% of the windows were still open at
    1-1.5 ms with a dozen at risk, and one loop stall of 3.6-5.7 ms set the draws' 95th
    percentile, calibrate/README "The timer's tail past its data".) None with fewer than
    20 fired."""
    if len(fired) < 20:
        return None
    closed = np.clip(closed, 0.0, None)
    km = stats.ecdf(stats.CensoredData(uncensored=fired, right=closed))
    x, p = km.cdf.quantiles, km.cdf.probabilities
    at_risk = len(fired) + len(closed) - np.searchsorted(np.sort(np.concatenate([fired, closed])), x, side="left")
    held = at_risk >= KM_MIN_AT_RISK
    x, p = x[held], p[held]
    want = (np.arange(EMPIRICAL_POINTS) + 0.5) / EMPIRICAL_POINTS
    q = x[np.minimum(np.searchsorted(p, want, side="left"), len(x) - 1)]
    return [round(float(v), 4) for v in q]


def fit_resume(requests: pd.DataFrame, fit_levels: list[int]) -> float | None:
    """The loop's time to resume a handler whose fetch is back and queue its request
    (``preprocess.event_loop.resume_ms``): the median gap between back-to-back queue
    arrivals (under 0.1 ms) at the lightest fitted level; None without the server's clocks
    or with fewer than 20 such gaps.

    The ranker's replies from the redis-server on the loop's core come back together, and
    their handlers queue their requests one after another: on the MGET ranker 17-19% of the
    queue-arrival gaps at 30% load are under 0.1 ms, and their median is 0.018-0.019 ms in
    three runs (2026-11-29)."""
    if not has_clocks(requests):
        return None
    light = clocked(requests[(requests["level"] == min(fit_levels)) & ~requests["warmup"]])
    gaps = np.concatenate(
        [np.diff(np.sort(s["enq_ms"].to_numpy())) for _, s in light.groupby("slice")] or [np.empty(0)]
    )
    close = gaps[gaps < 0.1]
    return float(np.median(close)) if len(close) >= 20 else None


def phases(df: pd.DataFrame, b: pd.DataFrame) -> tuple[np.ndarray, pd.Series, pd.Series]:
    """For each request: the batch running when it reached the queue (index into ``b``, -1
    for none), whether the instance was busy, and whether it found others queued."""
    enq = df["enq_ms"].to_numpy()
    k = np.searchsorted(b["disp_ms"].to_numpy(), enq, side="right") - 1
    ends = b["end_ms"].to_numpy()
    busy = (k >= 0) & (enq < ends[np.maximum(k, 0)])
    order = np.argsort(enq, kind="stable")
    disp = df["disp_ms"].to_numpy()[order]
    before = np.concatenate([[-np.inf], np.maximum.accumulate(disp)[:-1]])  # latest dispatch of those queued earlier
    joiner = np.empty(len(enq), bool)
    joiner[order] = before > enq[order]
    return k, pd.Series(busy, index=df.index), pd.Series(joiner, index=df.index)


def phase_counts(df: pd.DataFrame, b: pd.DataFrame) -> np.ndarray:
    """How many requests reached the queue in each tenth of the batch then running."""
    k, busy, _ = phases(df, b)
    enq = df["enq_ms"].to_numpy()[busy.to_numpy()]
    kb = k[busy.to_numpy()]
    start, end = b["disp_ms"].to_numpy()[kb], b["end_ms"].to_numpy()[kb]
    return np.histogram((enq - start) / (end - start), bins=PHASE_BINS, range=(0.0, 1.0))[0]


FOUND = ("idle, queue empty", "idle, queue not empty", "busy, queue empty", "busy, queue not empty")


def found(df: pd.DataFrame, b: pd.DataFrame) -> pd.Series:
    """What each request found on reaching the queue (one of :data:`FOUND`)."""
    _, busy, joiner = phases(df, b)
    return pd.Series(np.asarray(FOUND)[2 * busy.to_numpy() + joiner.to_numpy()], index=df.index)


def replay_queue(level: pd.DataFrame, profile: dict, *, seed: int = 0) -> tuple[float, float]:
    """The model's batcher fed the level's measured queue arrivals, slice by slice (each from
    idle, 1 s apart), with each batch size's measured mean time at this level: mean and
    median queue wait (ms) of the requests after each slice's warm-up."""
    from calibrate.scenario import scenario_dict
    from simulator.engine import simulate
    from simulator.scenario.config import Scenario

    per_size = level.drop_duplicates(["slice", "disp_ms"]).groupby("batch_size")["batch_ms"].mean()
    table = per_size.reindex(range(1, int(profile["server"]["max_batch_size"]) + 1)).interpolate().bfill().ffill()
    times, keep, offset = [], [], 0.0
    for _, s in level.sort_values("enq_ms").groupby("slice"):
        t = s["enq_ms"].to_numpy() - s["enq_ms"].min()
        times.append(offset + t)
        keep.append(~s["warmup"].to_numpy())
        offset += t.max() + 1000.0
    t = np.concatenate(times)
    warm = np.concatenate(keep)
    doc = scenario_dict(profile, 100.0, duration_s=offset / 1e3, warmup_s=0.0, seed=seed)
    doc.pop("platform", None)
    doc.pop("postprocess", None)
    doc["router"], doc["preprocess"] = {}, {}
    service = doc["workers"]["service_time"]
    service.pop("noise_ratios", None)
    service["noise_cv"] = 0.0
    service["batch_ms"] = {str(k): float(v) for k, v in table.items()}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "arrivals.txt"
        np.savetxt(path, t / 1e3, fmt="%.9f")
        doc["traffic"] = {"arrivals_file": str(path)}
        rec = simulate(Scenario.model_validate(doc)).records
    order = np.argsort(rec.arrival, kind="stable")
    wait = (rec.t_dispatch - rec.t_preprocessed)[order][warm]
    wait = wait[~np.isnan(wait)]
    return float(wait.mean()), float(np.median(wait))


def cycle(requests: pd.DataFrame, profile: dict) -> pd.DataFrame:
    """One row per level: the four comparisons of this module (requests after warm-up)."""
    if not has_clocks(requests):
        raise ValueError(
            "this run's server did not report when requests were queued and dispatched "
            "(received_at_ns, enqueued_at_ns, dispatched_at_ns): run `servesim calibrate run` again"
        )
    server = profile["server"]
    df = clocked(requests)
    rows = []
    for lv, level in df.groupby("level"):
        parts = [(batches(s), s) for _, s in level.groupby("slice")]
        kept = [(b, s[~s["warmup"]]) for b, s in parts]
        all_b = pd.concat([b for b, _ in parts])
        rule = rule_check(all_b, server["max_queue_delay_ms"], server["max_batch_size"])
        ph = sum(phase_counts(s, b) for b, s in kept)
        measured = level[~level["warmup"]]
        wait = measured["disp_ms"] - measured["enq_ms"]
        by_found = wait.groupby(pd.concat([found(s, b) for b, s in kept])).agg(["size", "mean"])
        sim_mean, sim_median = replay_queue(level, profile)
        row = {
            "level": int(lv),
            "offered_rps": float(level["offered_rps"].iloc[0]),
            **rule,
            "phase_first_tenth": float(ph[0] / ph.mean()),
            "phase_last_tenth": float(ph[-1] / ph.mean()),
            "measured_wait_mean_ms": float(wait.mean()),
            "replayed_wait_mean_ms": sim_mean,
            "measured_wait_median_ms": float(wait.median()),
            "replayed_wait_median_ms": sim_median,
        }
        for name in FOUND:
            n, mean = by_found.loc[name] if name in by_found.index else (0, float("nan"))
            row[f"share: {name}"] = n / len(measured)
            row[f"wait ms: {name}"] = float(mean)
        rows.append(row)
    return pd.DataFrame(rows)
