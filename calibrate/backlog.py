"""The batch time's factor by the backlog (``service_time.by_queue``), measured against the
load generator's schedule.

The real host runs a batch faster while a backlog waits, beyond what its recent throughput
says (``by_rate``): calibrate/README, "What the speed keeps time with: the schedule's
backlog". Read off the measured batches alone, the backlog's effect comes out backwards: a
slow spell builds the backlog, so busy looks slow (least squares gives the wrong sign). So
the slope is measured with an instrument the host cannot move: the backlog the slice's
exact arrivals build through the fitted model at a constant speed.

Per window of ``WINDOW_S`` of every kept slice of the fitted levels: the measured log speed
(each batch's time over the fit, its factors divided out, as
:func:`calibrate.replay.window_trace` reads it) and the requests waiting as each batch was
taken (measured, by the server's clocks; and simulated at a constant speed), each
batch-weighted and about its slice's mean. The slope is the reduced form (speed on the
simulated count) over the first stage (measured count on simulated), pooled
(:func:`calibrate.backlog_fit.slope`). The factor is the exponential of that slope times
the count over one (:func:`table`), and the fit divides it out before it fits the batch
table and the other factors (:func:`calibrate.fit.fit_batch_time`, ``queue_slope``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from calibrate import idle

# whether calibrate run and refit fit by_queue: off, not adopted (calibrate/README, "What the
# speed keeps time with: the schedule's backlog": the 85% p99 inside its interval in 4 runs
# more of 19, the 50% and 70% p99 in 2 fewer each, the 85% p50 unmoved)
BY_QUEUE = False
WINDOW_S = 0.25
KNOTS = 8  # the table's points, from 1 waiting to the fitted levels' 99th percentile


def waiting_at_dispatch(df: pd.DataFrame) -> np.ndarray | None:
    """For each request of ``df`` (successful ones, their slices whole): the requests waiting
    in the batch queue as its batch was taken, its batch included (enqueued by then, not
    dispatched before), per slice by the server's clocks; None without them."""
    if not idle._clocked(df) or "enqueued_at_ns" not in df or df["enqueued_at_ns"].isna().any():
        return None
    out = np.empty(len(df))
    sl = df["slice"].to_numpy()
    enq, disp = df["enqueued_at_ns"].to_numpy(), df["dispatched_at_ns"].to_numpy()
    for s in np.unique(sl):
        at = np.flatnonzero(sl == s)
        e, d = np.sort(enq[at]), np.sort(disp[at])
        t = disp[at]
        out[at] = np.searchsorted(e, t, side="right") - np.searchsorted(d, t, side="left")
    return out


def queue_factor(waiting: np.ndarray, table: dict) -> np.ndarray:
    """``by_queue``'s factor at each count ``waiting``, as the simulator interpolates it (flat
    beyond the ends; 1 where the count is unknown)."""
    return idle.idle_factor(np.asarray(waiting, dtype=float), table)  # the same interpolation


def table(slope: float, waiting: np.ndarray) -> dict[float, float] | None:
    """``by_queue`` for a slope in log per request waiting: exp(slope × (count − 1)) at
    ``KNOTS`` counts from 1 to the 99th percentile of ``waiting`` (the fitted batches'),
    flat beyond; None where they never queue past one."""
    w = np.asarray(waiting, dtype=float)
    w = w[np.isfinite(w)]
    top = float(np.percentile(w, 99)) if len(w) else 1.0
    if top <= 1.0:
        return None
    knots = np.unique(np.round(np.linspace(1.0, top, KNOTS), 1))
    return {float(k): round(float(np.exp(slope * (k - 1.0))), 4) for k in knots}


def iv_slope(y: np.ndarray, x: np.ndarray, z: np.ndarray) -> dict[str, float]:
    """The slopes of ``y`` on ``x`` (each centred already): ordinary least squares, the
    reduced form (``y`` on ``z``), the first stage (``x`` on ``z``) and the instrumental
    one (reduced form over first stage, ``z`` the instrument)."""
    y, x, z = (np.asarray(a, dtype=float) for a in (y, x, z))
    reduced, first = (z @ y) / (z @ z), (z @ x) / (z @ z)
    return {
        "ols": float((x @ y) / (x @ x)),
        "reduced": float(reduced),
        "first": float(first),
        "iv": float(reduced / first),
    }
