"""Work after a rest runs slower: a batch after its instance sat idle, a loop job after
the front end's loop slept (``workers.service_time.after_idle``,
``preprocess.event_loop.after_idle``), measured on the server's own clocks.

On the reference server a batch after 50 ms of its instance idle took 1.15-1.17 times one
that followed another at once, and an admission on a loop idle 10-20 ms 1.9 times one on a
loop that had just finished a job (calibrate/README, "A batch after an idle instance"):
light loads idle often and heavy ones seldom, so times fitted over several loads run fast
at the lightest and slow at the heaviest. The fits here give each factor by bands of idle
time; :mod:`calibrate.fit` takes the instance's out of the batch table, and
:mod:`calibrate.speed` out of the ratios the host's speed is fitted on.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# whether the fits take the factors after an idle instance and an idle loop (off: every batch,
# every loop job alike, as before them; calibrate/experiments/after_idle.py compares them)
AFTER_IDLE = True
LOOP_AFTER_IDLE = True
IDLE_EDGES_MS = (0.0, 1.0, 3.0, 6.0, 12.0, 25.0, 50.0, 100.0, np.inf)


def fit_after_idle(idle_ms: np.ndarray, ratio: np.ndarray, *, min_batches: int = 20) -> dict[float, float] | None:
    """The batch time's factor by how long its instance sat idle before it
    (``service_time.after_idle``): the mean ratio of measured to fitted batch time in bands
    of idle time (:data:`IDLE_EDGES_MS`), over the mean ratio of all, at each band's median
    idle. None where the idle time is unknown, fewer than two bands hold ``min_batches``,
    or batches overlap (several instances: the batch before is another instance's)."""
    idle, r = np.asarray(idle_ms, dtype=float), np.asarray(ratio, dtype=float)
    known = np.isfinite(idle) & np.isfinite(r)
    if known.sum() < 2 * min_batches or (idle[known] < -0.5).mean() > 0.01:
        return None
    idle, r = idle[known].clip(min=0.0), r[known]
    return _by_band(idle, r, np.searchsorted(IDLE_EDGES_MS, idle, side="right") - 1, min_batches)


def _by_band(x: np.ndarray, r: np.ndarray, band: np.ndarray, min_batches: int) -> dict[float, float] | None:
    """Each ``band`` of at least ``min_batches`` rows: its median ``x``, its mean ``r`` over
    all rows' mean; None unless two bands are left."""
    table = {}
    for k in np.unique(band):
        inside = band == k
        if inside.sum() >= min_batches:
            table[round(float(np.median(x[inside])), 3)] = round(float(r[inside].mean() / r.mean()), 4)
    return table if len(table) >= 2 else None


def idle_factor(idle_ms: np.ndarray, table: dict[float, float] | dict[str, float]) -> np.ndarray:
    """:func:`fit_after_idle`'s factor at each idle time, as the simulator interpolates it
    (flat beyond the ends; 1 where the idle time is unknown). ``table``'s keys may be the
    strings a profile.json gives back: they are read as numbers, in their numeric order
    (sorted as strings, '16.34' came before '4.839' and the interpolation read garbage)."""
    knots = sorted((float(k), float(v)) for k, v in table.items())
    f = np.interp(np.nan_to_num(idle_ms, nan=0.0), [k for k, _ in knots], [v for _, v in knots])
    return np.where(np.isfinite(idle_ms), f, 1.0)


def _clocked(df: pd.DataFrame) -> bool:
    """Whether ``df``'s rows carry their slice and the server's dispatch clock, every one."""
    return "dispatched_at_ns" in df and "slice" in df and not df["dispatched_at_ns"].isna().any()


def _batch_rows(df: pd.DataFrame, **values) -> pd.DataFrame:
    """One row per row of ``df`` (a request, or a batch): its slice, its batch's start by
    the server's dispatch clock (ms) and ``values``."""
    return pd.DataFrame({"slice": df["slice"].to_numpy(), "start": df["dispatched_at_ns"].to_numpy() / 1e6, **values})


def _from_batch_before(df: pd.DataFrame, values: np.ndarray) -> np.ndarray | None:
    """For each row (a request, or a batch) of ``df``: ``values`` (one per row, the same for
    a batch's rows) of the slice's batch before its own by the server's dispatch clock (NaN
    for a slice's first); None without that clock."""
    if not _clocked(df):
        return None
    rows = _batch_rows(df, v=np.asarray(values, dtype=float))
    b = rows.drop_duplicates(["slice", "start"]).sort_values("start", kind="stable")
    b = b.assign(before=b["v"].shift(1).where(b["slice"] == b["slice"].shift(1)))
    return rows.merge(b[["slice", "start", "before"]], on=["slice", "start"], how="left")["before"].to_numpy()


def idle_before_ms(df: pd.DataFrame, batch_ms: np.ndarray) -> np.ndarray | None:
    """For each row (a request, or a batch) of ``df``, whose batch took ``batch_ms``: how
    long its batch's instance sat idle before the batch, from the end of the slice's batch
    before it by the server's dispatch clock (NaN for a slice's first); None without that
    clock."""
    if "dispatched_at_ns" not in df:
        return None
    start = df["dispatched_at_ns"].to_numpy() / 1e6
    end_before = _from_batch_before(df, start + np.asarray(batch_ms, dtype=float))
    return None if end_before is None else start - end_before


LOOP_EDGES_MS = (0.05, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, np.inf)


def loop_gaps_ms(df: pd.DataFrame, batch_ms: np.ndarray) -> np.ndarray:
    """For each request of ``df`` (the server's clocks; its batch took ``batch_ms``): how
    long its front end's loop had been idle when it began reading it, from the end of the
    loop's last job before, the admissions (read to queued) and each batch's answers (its
    end to its last response) being the loop's jobs; <= 0 where the loop was busy then,
    inf for a slice's first read (left out of the bands)."""
    out = np.full(len(df), np.nan)
    recv = df["received_at_ns"].to_numpy() / 1e6
    enq = df["enqueued_at_ns"].to_numpy() / 1e6
    disp = df["dispatched_at_ns"].to_numpy() / 1e6
    bend = disp + np.asarray(batch_ms, dtype=float)
    done = recv + df["request_us"].to_numpy() / 1e3
    sl = df["slice"].to_numpy()
    for s in np.unique(sl):
        at = np.flatnonzero(sl == s)
        answers = pd.DataFrame({"start": bend[at], "end": done[at]}).groupby("start")["end"].max()
        starts = np.r_[recv[at], answers.index.to_numpy()]
        ends = np.r_[enq[at], answers.to_numpy()]
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], np.maximum.accumulate(ends[order])
        k = np.searchsorted(starts, recv[at], side="left") - 1  # the jobs begun before this read
        out[at] = np.where(k >= 0, recv[at] - ends[np.maximum(k, 0)], np.inf)
    return out


def fit_loop_after_idle(
    ok: pd.DataFrame, lowest: pd.DataFrame, batch_ms: np.ndarray, *, min_requests: int = 50
) -> dict | None:
    """``preprocess.event_loop.after_idle`` from the server's clocks: a read on an idle
    loop (read to queued), its median by band of the loop's idle time before it
    (:data:`LOOP_EDGES_MS`) over the median of the shortest band, at each band's median
    idle time; divided by its mean over the lightest fitted level's requests (a request
    that found the loop busy at the shortest band's), whose loop jobs the loop's costs are
    fitted on, so that level runs as fitted. None without the clocks, where fewer than two
    bands hold ``min_requests``, or with :data:`LOOP_AFTER_IDLE` off."""
    need = ("received_at_ns", "enqueued_at_ns", "dispatched_at_ns", "request_us", "slice")
    if not LOOP_AFTER_IDLE or not all(c in ok for c in need) or ok[list(need)].isna().any().any():
        return None
    gap = loop_gaps_ms(ok, batch_ms)
    read = (ok["enqueued_at_ns"].to_numpy() - ok["received_at_ns"].to_numpy()) / 1e6
    band = np.searchsorted(LOOP_EDGES_MS, gap, side="right") - 1
    knots, medians = [], []
    for k in range(len(LOOP_EDGES_MS) - 1):
        inside = band == k
        if inside.sum() >= min_requests:
            knots.append(float(np.median(gap[inside])))
            medians.append(float(np.median(read[inside])))
    if len(knots) < 2:
        return None
    factor = np.asarray(medians) / medians[0]
    light = ok.index.isin(lowest.index)
    base = float(np.mean(np.interp(np.clip(gap[light], 0.0, None), knots, factor)))
    return {round(x, 3): round(float(f / base), 4) for x, f in zip(knots, factor, strict=True)}


# the batch time's factor by the instance's recent throughput (``service_time.by_rate``):
# off, every batch alike at any load, as before it (calibrate/experiments/level_speed.py)
BY_RATE = True
# where the fit's throughput starts at each slice: "none" (from none at the slice's first
# batch: only the batches two time constants in are fitted) or "carried" (the rate the
# instance lived, carried over every batch of the run, the other levels' slices and the gaps
# included: every batch fitted; not adopted, calibrate/README "The fit's throughput at a
# slice's start")
RATE_START = "none"
RATE_WINDOW_MS = 500.0
RATE_BANDS = 8
# what by_rate's average counts (``service_time.rate_of``): "batches", the requests the instance
# took into batches, over RATE_WINDOW_MS; or "arrivals", the requests the server enqueued for it,
# over ARRIVALS_WINDOW_MS, where the run has the enqueue clock (tried, not adopted: calibrate/README,
# "The load, not the throughput")
RATE_OF = "batches"
ARRIVALS_WINDOW_MS = 125.0


def rate_source(df: pd.DataFrame, service: dict | None = None) -> tuple[str, float]:
    """What ``by_rate`` counts for a run's requests ``df`` and over how long (ms): a fitted
    ``service`` time's (``rate_of``, ``rate_window_ms``) where given; else
    (:data:`RATE_OF`, its window), or ("batches", :data:`RATE_WINDOW_MS`) where the run
    lacks the server's enqueue clock."""
    if service is not None and service.get("by_rate"):
        kind = service.get("rate_of", "batches")
        return kind, float(service.get("rate_window_ms", ARRIVALS_WINDOW_MS if kind == "arrivals" else RATE_WINDOW_MS))
    if RATE_OF == "arrivals" and _enqueued(df):
        return "arrivals", ARRIVALS_WINDOW_MS
    return "batches", RATE_WINDOW_MS


def _enqueued(df: pd.DataFrame) -> bool:
    return _clocked(df) and "enqueued_at_ns" in df and not df["enqueued_at_ns"].isna().any()


def _instances(df: pd.DataFrame) -> int:
    """How many instances shared the batch queue (their arrivals' shares)."""
    return max(int(df["instance"].nunique()), 1) if "instance" in df else 1


def arrival_rate(
    arrive_ms: np.ndarray, query_ms: np.ndarray, tau_ms: float, initial_rps: float = 0.0, share: float = 1.0
) -> np.ndarray:
    """Requests a second that reached the queue up to each of ``query_ms`` (sorted), an
    exponential average over ``tau_ms`` (an arrival at a query's time counted), from
    ``initial_rps`` at the first arrival, each arrival ``share`` of a request (an instance's
    share of its queue's): as the simulator keeps it (``service_time.rate_of: arrivals``,
    ``simulator.serving.compiled.arrive``)."""
    a = np.sort(np.asarray(arrive_ms, dtype=float))
    out = np.empty(len(query_ms))
    x, t, j = initial_rps / 1000.0, a[0] if len(a) else 0.0, 0
    for i, q in enumerate(np.asarray(query_ms, dtype=float)):
        while j < len(a) and a[j] <= q:
            x = x * np.exp(-(a[j] - t) / tau_ms) + share / tau_ms
            t = a[j]
            j += 1
        out[i] = x * np.exp(-(q - t) / tau_ms) * 1000.0
    return out


def recent_rate(
    start_ms: np.ndarray, sizes: np.ndarray, tau_ms: float = RATE_WINDOW_MS, initial_rps: float = 0.0
) -> np.ndarray:
    """Requests a second an instance took into batches before each of its batches (starting
    at ``start_ms``, in order, of ``sizes``): an exponential average over ``tau_ms``, from
    ``initial_rps`` as the first went (none by default), as the simulator keeps it
    (``simulator.serving.compiled.rate_factor``, ``service_time.rate_initial_rps``)."""
    out = np.empty(len(start_ms))
    x, t = initial_rps / 1000.0, float(start_ms[0]) if len(start_ms) else 0.0
    for i, (s, k) in enumerate(zip(np.asarray(start_ms, dtype=float), np.asarray(sizes, dtype=float), strict=True)):
        x *= np.exp(-(s - t) / tau_ms)
        out[i] = x * 1000.0
        x += k / tau_ms
        t = s
    return out


def rate_before(
    df: pd.DataFrame, tau_ms: float | None = None, initial: dict[int, float] | None = None, kind: str | None = None
) -> tuple[np.ndarray, np.ndarray] | None:
    """For each request of ``df`` (its slices whole): its instance's recent rate before its
    batch, as ``kind`` or else :func:`rate_source` counts it (over ``tau_ms``, by default its window):
    :func:`recent_rate` over its slice's batches by the server's dispatch clock, or
    :func:`arrival_rate` over its slice's requests by the enqueue clock, from none at the
    slice's first (the fit reads no other slice; from ``initial``'s rate for the slice where
    given, :func:`slice_start_rates`), and how long after the slice's first batch it went
    (ms; a rate soon after it misses the slice before it). None without the dispatch clock."""
    source = rate_source(df)
    kind = source[0] if kind is None else kind
    tau_ms = source[1] if tau_ms is None else tau_ms
    if not _clocked(df):
        return None
    arrivals = kind == "arrivals"
    if arrivals and not _enqueued(df):
        return None
    rows = _batch_rows(df, size=df["batch_size"].to_numpy(dtype=float))
    b = rows.drop_duplicates(["slice", "start"]).sort_values(["slice", "start"], kind="stable")
    sl, start, size = b["slice"].to_numpy(), b["start"].to_numpy(), b["size"].to_numpy()
    rate, since = np.empty(len(b)), np.empty(len(b))
    enq_sl = df["slice"].to_numpy()
    enq_ms = df["enqueued_at_ns"].to_numpy() / 1e6 if arrivals else None
    share = 1.0 / _instances(df)
    for s in np.unique(sl):
        at = np.flatnonzero(sl == s)
        first = (initial or {}).get(int(s), 0.0)
        if arrivals:  # the requests enqueued, from the slice's first
            rate[at] = arrival_rate(enq_ms[enq_sl == s], start[at], tau_ms, first, share)
        else:
            rate[at] = recent_rate(start[at], size[at], tau_ms, first)
        since[at] = start[at] - start[at[0]]
    b = b.assign(rate=rate, since=since)
    out = rows.merge(b[["slice", "start", "rate", "since"]], on=["slice", "start"], how="left")
    return out["rate"].to_numpy(), out["since"].to_numpy()


def slice_start_rates(
    df: pd.DataFrame, tau_ms: float | None = None, kind: str | None = None
) -> dict[int, float] | None:
    """Each slice's instance's recent rate (req/s, as ``kind`` or else :func:`rate_source` counts it, over
    ``tau_ms``, by default its window) as its first batch went: :func:`recent_rate` or
    :func:`arrival_rate` carried over every batch or request of the run by the server's
    clocks, the slices before it and the gaps between them included, as the instance lived
    them (``service_time.rate_initial_rps`` for a replay of that slice). None without the
    dispatch clock."""
    if not _clocked(df):
        return None
    source = rate_source(df)
    kind = source[0] if kind is None else kind
    tau_ms = source[1] if tau_ms is None else tau_ms
    if kind == "arrivals" and not _enqueued(df):
        return None
    b = (
        _batch_rows(df, size=df["batch_size"].to_numpy(dtype=float))
        .drop_duplicates(["slice", "start"])
        .sort_values("start", kind="stable")
    )
    if kind == "arrivals":
        enqueued = df["enqueued_at_ns"].to_numpy() / 1e6
        at = arrival_rate(enqueued, b["start"].to_numpy(), tau_ms, 0.0, 1.0 / _instances(df))
    else:
        at = recent_rate(b["start"].to_numpy(), b["size"].to_numpy(), tau_ms)
    b = b.assign(rate=at)
    return {int(s): float(r) for s, r in b.groupby("slice", sort=False)["rate"].first().items()}


def slice_gap_ms(df: pd.DataFrame) -> float | None:
    """The median time between a slice's last batch and the next slice's first, by the
    server's dispatch clock (the instance idle while the load generator reads the front
    end's metrics and sets up the next slice); None without that clock or with one slice."""
    if not _clocked(df):
        return None
    at = df.groupby("slice")["dispatched_at_ns"].agg(["min", "max"]).sort_values("min") / 1e6
    gaps = (at["min"].shift(-1) - at["max"]).dropna()
    return float(np.median(gaps)) if len(gaps) else None


def fit_by_rate(
    rate_rps: np.ndarray,
    ratio: np.ndarray,
    *,
    bands: int = RATE_BANDS,
    min_batches: int = 20,
    instrument: np.ndarray | None = None,
):
    """``service_time.by_rate``: the mean ratio of measured to fitted batch time in
    ``bands`` quantile bands of the instance's recent throughput, over the mean ratio of
    all, at each band's median rate. With ``instrument`` (:func:`scheduled_rate`), the bands
    are the instrument's, still placed at their median throughput: a fast spell that raises
    the throughput does not move a batch into a busier band, so the table keeps only what
    the load does to the speed. None where fewer than two bands differ in rate or hold
    ``min_batches``."""
    x, r = np.asarray(rate_rps, dtype=float), np.asarray(ratio, dtype=float)
    z = x if instrument is None else np.asarray(instrument, dtype=float)
    known = np.isfinite(x) & np.isfinite(r) & np.isfinite(z)
    x, r, z = x[known], r[known], z[known]
    if len(x) < 2 * min_batches:
        return None
    edges = np.unique(np.quantile(z, np.linspace(0, 1, bands + 1)))
    if len(edges) < 2:
        return None
    return _by_band(x, r, np.clip(np.searchsorted(edges, z, side="right") - 1, 0, len(edges) - 2), min_batches)


# how fit_by_rate reads the table: "bands" (the mean ratio in quantile bands of the recent
# throughput), "schedule" (in bands of the schedule's recent rate, the instrument, placed at
# their throughput; tried, not adopted: calibrate/README, "A level's speed from its first
# second") or "levels" (a line through the fitted levels' mean ratios at their mean
# throughput, carried a little past them)
BY_RATE_FIT = "bands"
LEVEL_REACH = (0.5, 1.25)  # the line's table spans these multiples of the lightest and busiest level's rate
LEVEL_POINTS = 8


def fit_by_level(rate_rps: np.ndarray, ratio: np.ndarray, level: np.ndarray, *, min_batches: int = 20):
    """``service_time.by_rate`` as a line in the instance's recent throughput through each
    level's mean ratio (over the mean ratio of all) at its mean throughput: the speed that a
    level's load sets, without the within-level spread of the throughput, along which the
    speed runs steeper (a burst of arrivals speeds a batch up, and a fast spell of the host
    takes more requests into batches: 7.1 against 4.1% per 100 req/s on the scheduled
    arrivals, calibrate/experiments/by_level.py; a median 6 against 4 on the 500 ms
    throughput, calibrate/experiments/two_speeds.py). Tabled at
    :data:`LEVEL_POINTS` rates from ``LEVEL_REACH[0]`` × the lightest level's rate to
    ``LEVEL_REACH[1]`` × the busiest one's, so that a held-out level beyond them follows
    the line. None where fewer than two levels hold ``min_batches``."""
    x, r, lv = (np.asarray(a, dtype=float) for a in (rate_rps, ratio, level))
    known = np.isfinite(x) & np.isfinite(r) & np.isfinite(lv)
    x, r, lv = x[known], r[known], lv[known]
    xs, ys = [], []
    for k in np.unique(lv):
        inside = lv == k
        if inside.sum() >= min_batches:
            xs.append(x[inside].mean())
            ys.append(r[inside].mean() / r.mean())
    if len(xs) < 2 or np.ptp(xs) <= 0:
        return None
    slope, icpt = np.polyfit(xs, ys, 1)
    at = np.linspace(LEVEL_REACH[0] * min(xs), LEVEL_REACH[1] * max(xs), LEVEL_POINTS)
    f = np.clip(icpt + slope * at, 0.5, 2.0)
    return {round(float(a), 3): round(float(v), 4) for a, v in zip(at, f, strict=True)}


def scheduled_rate(df: pd.DataFrame, tau_ms: float = RATE_WINDOW_MS) -> np.ndarray | None:
    """For each request of ``df`` (successful ones, their slices whole): the requests a second
    the load generator's schedule sent its slice before its batch went, averaged as
    :func:`recent_rate` averages the instance's throughput (from none at the slice's
    start). The schedule (``scheduled_s``) goes onto the server's clock by the slice's
    median offset to the requests' receipt. What the host's speed cannot move: the
    instrument for ``by_rate`` (:func:`fit_by_rate`, ``instrument``). None without the
    server's clocks."""
    if not _clocked(df) or "received_at_ns" not in df or "scheduled_s" not in df:
        return None
    out = np.empty(len(df))
    sl = df["slice"].to_numpy()
    sent_ms = df["scheduled_s"].to_numpy() * 1e3
    got_ms, went_ms = df["received_at_ns"].to_numpy() / 1e6, df["dispatched_at_ns"].to_numpy() / 1e6
    for s in np.unique(sl):
        at = np.flatnonzero(sl == s)
        sent = sent_ms[at] + np.median(got_ms[at] - sent_ms[at])
        queries, where = np.unique(went_ms[at], return_inverse=True)
        out[at] = arrival_rate(sent, queries, tau_ms)[where]  # the sends averaged as arrivals are
    return out


def rate_factor_at(rate_rps: np.ndarray, table: dict[float, float]) -> np.ndarray:
    """:func:`fit_by_rate`'s factor at each rate, as the simulator interpolates it (flat
    beyond the ends; 1 where the rate is unknown)."""
    return idle_factor(rate_rps, table)  # the same interpolation


AFTER_BATCH = False  # fit service_time.after_batch (tried, not adopted: calibrate/experiments/after_batch.py)


def previous_size(df: pd.DataFrame) -> np.ndarray:
    """For each row (a request, or a batch) of ``df``: the size of the batch its instance
    ran before its own, by the server's dispatch clock within its slice (NaN for a slice's
    first, and everywhere without that clock)."""
    before = _from_batch_before(df, df["batch_size"].to_numpy(dtype=float)) if "batch_size" in df else None
    return np.full(len(df), np.nan) if before is None else before


def fit_after_batch(before: np.ndarray, ratio: np.ndarray, min_batches: int = 20) -> dict[float, float] | None:
    """``service_time.after_batch``: the mean ratio of measured to fitted batch time by the
    size of the batch before, over the mean ratio of all with one before; None where fewer
    than two sizes hold ``min_batches``."""
    x, r = np.asarray(before, dtype=float), np.asarray(ratio, dtype=float)
    known = np.isfinite(x) & np.isfinite(r)
    if known.sum() < 2 * min_batches:
        return None
    return _by_band(x[known], r[known], x[known].astype(np.int64), min_batches)


def after_batch_factor(before: np.ndarray, table: dict[float, float] | dict[str, float]) -> np.ndarray:
    """:func:`fit_after_batch`'s factor for each size before, as the simulator interpolates
    it (flat beyond the ends; 1 for a slice's first batch)."""
    return idle_factor(before, table)
