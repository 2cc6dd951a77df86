"""The front end as one event loop, fitted from the server's clocks
(``preprocess.event_loop``): its jobs after a batch, the hand-back, the admission and the
pure delay (:func:`fit_event_loop`), and the ranker's loop visited once per Redis round
trip (:func:`loop_on_trips`). Called by :func:`calibrate.fit.fit_profile`."""

from __future__ import annotations

import numpy as np
import pandas as pd

from calibrate import idle
from calibrate.behind import fit_read_behind, later_responses
from calibrate.samples import batch_time_us, fit_distribution

CLOCKS = ("received_at_ns", "enqueued_at_ns", "dispatched_at_ns")


def fit_event_loop(
    df: pd.DataFrame, lowest: pd.DataFrame, service: np.ndarray, rest: np.ndarray, *, rng: np.random.Generator
) -> dict | None:
    """The front end as one event loop that also answers (``preprocess.event_loop``), from
    the server's clocks; None without them.

    A request's time after its batch, up to its handler resuming (its ``request_us`` less
    the time to the queue, the queue wait and the batch), is the loop's work on the batch:
    waking, handing back, then the handlers of the batch one after another. At the lightest
    fitted level, where the loop rarely waits, its mean for batches of ``k`` is
    ``per_batch + per_request × (k − 1) / 2`` (least squares over the requests): the
    batch's job on the loop and each response's. What the loop spends on responses and
    hand-backs comes off the station's CPU per request (``service``), so the admission job
    is the rest and the loop's CPU per request is unchanged (the hand-back once counted
    twice: 11% of the ranker's loop, whose batches are of one); the fixed delay keeps the
    light-load latency:
    it loses what the loop now holds after the batch (``per_batch + per_request × (k +
    1) / 2`` on average for a request of a batch of ``k``). The batch's hand-back (its
    outputs read and copied on the loop, ``handoff`` less ``handoff_in``) is a loop job of
    its light-load median (``return_ms``), or drawn from the light level's hand-backs
    (``return_time``), and the instance's own time is the fitted batch time less the
    hand-back's mean over the fitted levels (``instance_less_ms``), waits for the loop
    included: the model's loop adds its own. The median's CPU comes off the admission;
    the tail above it is the loop kept from its core, not its work."""
    if not all(c in df and df[c].notna().any() for c in CLOCKS):
        return None
    ok = df.dropna(subset=[*CLOCKS, "batch_size"])
    to_queue = (ok["enqueued_at_ns"] - ok["received_at_ns"]) / 1e6
    after = ok["request_us"] / 1e3 - to_queue - ok["queue_us"] / 1e3 - batch_time_us(ok) / 1e3
    light = ok.index.isin(lowest.index)
    k = ok["batch_size"].to_numpy(dtype=float)
    if light.sum() < 20 or np.ptp(k[light]) == 0:
        return None
    slope, intercept = np.polyfit((k[light] - 1) / 2, after.to_numpy()[light], 1)
    per_request, per_batch = max(float(slope), 0.0), max(float(intercept), 0.0)
    batches = ok.drop_duplicates(subset=["slice", "dispatched_at_ns"]) if "slice" in ok else ok
    # the hand-back (the instance's answer read and its outputs copied on the loop): the
    # loop's job is its light-load median; the instance's own time loses the whole
    # measured hand-back (the model's loop adds its job and the waits for it)
    back = (batches["handoff_us"] - batches["handoff_in_us"]) / 1e3 if "handoff_in_us" in batches else None
    light_b = batches.index.isin(lowest.index)
    return_ms = float(np.median(back[light_b])) if back is not None and light_b.any() else 0.0
    # the batch's jobs (its hand-back and its responses' resumption), per request of the
    # fitted levels: the loop's CPU as well, so off the admission too
    share = (per_batch + return_ms) * len(batches) / len(ok)
    admit = np.maximum(service - per_request - share, 0.01)
    sizes = lowest["batch_size"].to_numpy(dtype=float)
    held = per_batch + per_request * (np.nan_to_num(sizes, nan=1.0) + 1) / 2
    # a client on the loop's core reads a batch's answers late (calibrate.behind): the model
    # adds that per later response, so the pure delay is what is left
    behind = fit_read_behind(df, cap_ms=per_request) or 0.0
    delay = rest + service - admit - held - behind * later_responses(lowest).fillna(0.0).to_numpy()
    # a loop job after the loop slept runs slower: by the server's clocks, against the light level
    cold = idle.fit_loop_after_idle(ok, lowest, batch_time_us(ok).to_numpy() / 1e3)
    # its draws: the light level's hand-backs whole, for their tail (a wake-up or a core
    # shared with the client, past 1 ms for one batch in ten) is not the model's loop waits
    # (calibrate/README, "The hand-back's tail")
    drawn = back[light_b] if back is not None else None
    return {
        "return_ms": return_ms,
        **({"return_time": fit_distribution(drawn, rng=rng)} if drawn is not None and (drawn > 0).sum() >= 20 else {}),
        "instance_less_ms": float(back.mean()) if back is not None else 0.0,
        "respond_per_batch_ms": per_batch,
        "respond_per_request_ms": per_request,
        "read_behind_ms": behind,
        "admit": fit_distribution(admit, rng=rng),
        "fixed_delay": fit_distribution(np.maximum(delay, 0.01), rng=rng),
        "fixed_delay_clipped": float((delay < 0.01).mean()),
    } | ({} if cold is None else {"after_idle": cold})


def loop_on_trips(
    out: dict,
    light: pd.DataFrame,
    per_trip: np.ndarray,
    fetch_cost: dict,
    overhead: pd.Series,
    after: pd.Series,
    *,
    rng: np.random.Generator,
) -> None:
    """The ranker's event loop as one thread visited once per Redis round trip.

    Its Redis client's work is most of the loop's CPU per request (``fetch_cost``: the
    server's own client timed alone, CPU per trip), and each GET's continuation queues
    behind the other requests' work on the one loop. So the loop is the feature store's
    one-thread station: each trip holds it for the loop's whole CPU per request spread
    over the trips (at least the client's CPU per trip), and waits for Redis's answer, the
    light-load trip time less the client's CPU (and a redis-server's, when it shares the
    loop's one core), off the loop. The front end's separate
    station goes (its CPU is on the trips now, counted once), and the light-load time
    outside the fetch and the batch becomes a pure delay, less the CPU the trips took over
    from the rest of the request (parsing, the response), so light-load latency is kept.
    """
    fe, f = out["frontend"], out["features"]
    trips = float(light["feature_round_trips"].mean())
    client = float(fetch_cost["cpu_ms_per_trip"])
    # a redis-server on the loop's own core answers with that core's CPU: on the trips already
    side = fe.get("sidecar_cpu_ms_per_request") or 0.0
    on_core = client + (side / trips if fe.get("client_shares_cores") else 0.0)
    hold = max(fe["station_ms_per_request"] / trips, on_core)
    moved = trips * (hold - on_core)  # the rest of the request's CPU, now on the trips
    f["store"] = {"threads": 1, "per_op_ms": hold}
    f["store_wait"] = fit_distribution(np.clip(per_trip - on_core, 0.001, None), rng=rng)
    # the trip's whole wall time at light load, for the loop that holds the CPU in its
    # admission job instead (``preprocess.event_loop``, calibrate.scenario.ranker_on_loop)
    f["light_round_trip"] = fit_distribution(per_trip, rng=rng)
    f["loop"] = {
        "client_cpu_ms_per_trip": client,
        "on_core_ms_per_trip": on_core,
        "trips_per_request": trips,
        "moved_ms": moved,
    }
    rest = (overhead.loc[light.index] + after.loc[light.index] + light["preprocess_us"] / 1e3).to_numpy() - moved
    behind = (fe.get("event_loop") or {}).get("read_behind_ms") or 0.0  # the model adds it (calibrate.behind)
    rest = rest - behind * later_responses(light).fillna(0.0).to_numpy()
    fe["on_store"] = True
    fe["fixed_delay"] = fit_distribution(np.maximum(rest, 0.01), rng=rng)
    fe["fixed_delay_clipped"] = float((rest < 0.01).mean())
