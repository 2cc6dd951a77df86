"""The validation report's section on the fitted model (``validation.md``, "The fitted
model"): the batch time with its noise and its factors after an idle instance and by its
recent throughput, the host's speed process, the front end as a station or as one event
loop, and Redis; :mod:`calibrate.report` puts the sections together."""

from __future__ import annotations

import numpy as np

from calibrate import scenario
from calibrate.specs import spec_mean as _mean


def _service(st: dict) -> str:
    if st["kind"] == "table":
        return "per batch size " + ", ".join(f"{b}: {ms:.2f}" for b, ms in st["batch_ms"].items()) + " ms"
    return f"{st['base_ms']:.2f} + {st['per_item_ms']:.2f} × B ms"


def _noise_text(st: dict) -> str:
    r = st.get("noise_ratios")
    if not r:
        return f"log-normal, CV {st['noise_cv']:.3f}"
    q = np.quantile(r, [0.5, 0.95, 0.99])
    return f"median {q[0]:.3f}, 95th {q[1]:.3f}, 99th {q[2]:.3f}"


def _speed_process(profile: dict) -> list[str]:
    """The fitted platform-speed process, in words."""
    sp = profile.get("speed_process")
    if sp is None:
        return []
    ac = ", ".join(f"{k} s: {v:.2f}" for k, v in list(sp["autocorrelation"].items())[::3])
    if sp["speed"] is None:
        return [f"- **Platform speed**: the batches show no correlated speed (autocorrelation by lag: {ac})."]
    parts = " and ".join(f"σ {c['sigma']:.3f} over {c['correlation_time_s']:.2f} s" for c in sp["speed"]["components"])
    ep = sp.get("episodes")
    episodes = (
        f"; and {ep['count']} slow episodes in {ep['observed_s']:.0f} s of fitted slices, {ep['factor']:.2f}× for "
        f"{ep['mean_duration_s'] * 1e3:.0f} ms on average, one every {ep['mean_interval_s']:.1f} s (an on/off "
        "process times the wobble)"
        if ep
        else ""
    )
    return [
        f"- **Platform speed** (`platform.speed`, from the fitted levels' batches alone): log-AR(1), components "
        f"{parts}, shared by the instance and the front end (elasticity {sp['speed']['frontend_elasticity']:.2f}, "
        f"r {sp['frontend_r']:.2f} over the fitted slices){episodes}; the batches' own noise keeps "
        f"{sp['noise_share']:.0%} of the log variance. Autocorrelation of the batches' log ratios by lag: {ac}.",
    ]


def _idle_table(table: dict) -> str:
    """An ``after_idle`` table as the report says it: ``×factor after idle ms``, in order."""
    return ", ".join(f"×{f:.2f} after {float(x):.2g} ms" for x, f in sorted(table.items(), key=lambda kv: float(kv[0])))


def _after_table(table: dict, word: str = "after") -> str:
    """``after_batch``'s factors, by the size of the batch before (or another table by a
    count, ``word`` before it), as the report gives them."""
    return ", ".join(
        f"×{float(f):.2f} {word} {float(k):g}" for k, f in sorted(table.items(), key=lambda kv: float(kv[0]))
    )


def _rate_table(table: dict) -> str:
    """A ``by_rate`` table as the report says it: ``×factor at rate req/s``, in order."""
    return ", ".join(f"×{f:.2f} at {float(x):.3g} req/s" for x, f in sorted(table.items(), key=lambda kv: float(kv[0])))


def fitted_model(profile: dict) -> list[str]:
    """The fitted batch time, its residuals, the front end and Redis."""
    st = profile["service_time"]
    lines = [
        "",
        "## The fitted model",
        "",
        f"- **Batch time** (hand-off to the instance and back, plus compute): {_service(st)}, times the measured "
        f"ratios to the fit, resampled ({_noise_text(st)}); robust noise CV {st.get('noise_cv_robust', 0):.3f}, the "
        f"plain standard deviation of the ratios {st['noise_cv_sd']:.3f}; "
        f"R² {st['r2']:.3f} over {st['batches']:,} batches; {st['stalls']} stalled batches set apart"
        + (f" (longest {', '.join(f'{x:.1f}' for x in st['stall_ms'][:5])} ms)" if st["stalls"] else "")
        + "."
        + (
            " A batch after its instance sat idle runs slower (`service_time.after_idle`, the mean ratio by band "
            f"of idle time over all, taken out of the table): {_idle_table(st['after_idle'])}."
            if st.get("after_idle")
            else ""
        )
        + (
            " A batch runs faster the busier its instance has been (`service_time.by_rate`, the mean ratio by "
            + (
                "band of its share of the requests a second that reached its queue over the last "
                f"{st.get('rate_window_ms', 500):.0f} ms, its slice's first {2 * st.get('rate_window_ms', 500):.0f} ms"
                if st.get("rate_of") == "arrivals"
                else f"band of its requests a second over the last {st.get('rate_window_ms', 500):.0f} ms, its slice's "
                "first second"
            )
            + f" left out, taken out of the table too): {_rate_table(st['by_rate'])}."
            if st.get("by_rate")
            else ""
        )
        + (
            " A batch runs slower the bigger its instance's batch before it (`service_time.after_batch`, the mean "
            f"ratio by the size before over all, taken out of the table too): {_after_table(st['after_batch'])}."
            if st.get("after_batch")
            else ""
        )
        + (
            " A batch runs faster the more requests wait as it is taken (`service_time.by_queue`, its slope "
            f"{100 * (profile.get('by_queue_fit') or {}).get('slope', float('nan')):+.2f}% a request measured "
            "against the load generator's schedule, taken out of the table too): "
            f"{_after_table(st['by_queue'], 'at')} waiting."
            if st.get("by_queue")
            else ""
        ),
        "- **Residuals** (measured / fitted batch time) at quantiles "
        + ", ".join(f"{q}: {v:.3f}" for q, v in st["residual_ratio_quantiles"].items())
        + ".",
        *_speed_process(profile),
    ]
    if profile.get("frontend"):
        lines.append(_frontend(profile["frontend"], scenario.ranker_on_loop(profile)))
    if "features" in profile:
        f = profile["features"]
        if scenario.ranker_on_loop(profile):
            how = (
                f"each trip a pure delay of its light-load wall time (mean {_mean(f['light_round_trip']):.3f} ms); "
                "its CPU is in the loop's admission job (`preprocess.event_loop`, above)."
            )
        else:
            how = f"a one-thread station at {f['store']['per_op_ms']:.3f} ms per trip." if "store" in f else ""
        lines.append(f"- **Redis**: {f['lookups_per_request']} keys per request in trips of {f['batch_size']}; " + how)
    return lines


def _frontend(fe: dict, on_loop: bool = False) -> str:
    """The front-end station, as one bullet (``on_loop``: a ranker's front end as one event
    loop, :func:`calibrate.scenario.ranker_on_loop`)."""
    return (
        f"- **Front end** as a station of {fe['servers']} server(s): {fe['cpu_ms_per_request']:.2f} ms of server "
        f"CPU per request"
        + (
            f" (of which the hub, the one process every request passes between the front ends and the batcher, "
            f"{fe['hub_cpu_ms_per_request']:.2f} ms, with {fe['hub_background_cores']:.2f} of its core busy "
            f"whatever the load: a station of one server after the {fe['servers']}, "
            f"{fe['hub_station_ms_per_request']:.2f} ms a request, `preprocess.hub`)"
            if fe.get("hub_station_ms_per_request") is not None
            else ""
        )
        + (
            f", plus {fe['client_cpu_ms_per_request']:.2f} ms of this load generator's on the same cores"
            + (
                f" and {fe['sidecar_cpu_ms_per_request']:.2f} ms of the redis-server's"
                if fe.get("sidecar_cpu_ms_per_request") is not None
                else ""
            )
            if fe["client_shares_cores"]
            else " (this load generator's loop has cores of its own)"
        )
        + f", and {fe['background_cores']:.2f} cores busy whatever the load (timers, meters, scrapes), which "
        f"stretch the rest: service mean {_mean(fe['service']):.2f} ms ({fe['service']['fit']['family']}). "
        f"The rest of a request's time outside the batch at light load (loopback, HTTP, waiting) is a pure "
        f"delay of mean {_mean(fe['fixed_delay']):.2f} ms ({fe['fixed_delay']['fit']['family']})"
        + (
            f", of which {fe['preprocess_wait_ms']:.2f} ms is preprocessing's wall time beyond its CPU "
            "(a decode thread waiting for the GIL)."
            if fe.get("preprocess_wait_ms", 0) > 0.005
            else "."
        )
        + _event_loop(fe, on_loop)
    )


def _reads_first(fit: dict) -> str:
    """The hold fitted for reads before a resumption (calibrate/reads.py), in words."""
    hold = fit["hold_ms"]
    best = next(r for r in fit["by_hold"] if r["hold_ms"] == hold)
    said = (
        "only when they became ready first (no hold)"
        if hold == 0
        else "while any request waits to be read"
        if hold is None
        else f"for {hold:g} ms after its reply (`event_loop.reads_first_ms`)"
    )
    return (
        f" The loop reads new requests before a handler whose fetch is back {said}: the shortest hold whose fetch "
        f"p90s at the fitted levels ({', '.join(f'{v:.2f}' for v in best['p90_ms'])} ms) come as close as any to the "
        f"measured ({', '.join(f'{v:.2f}' for v in fit['measured_p90_ms'])} ms), within the fit's noise."
    )


def _hand_back(loop: dict) -> str:
    """The loop's take-back of a batch: drawn from the light level's (``return_time``) or its median."""
    if loop.get("return_time") and scenario.HAND_BACK_DRAWN:
        return f"drawn per batch from the light level's hand-backs, median {loop['return_ms']:.2f} ms, mean " + (
            f"{_mean(loop['return_time']):.2f} ms"
        )
    return f"{loop['return_ms']:.2f} ms"


def _event_loop(fe: dict, on_loop: bool = False) -> str:
    """The front end's event loop (``preprocess.event_loop``), when the scenario uses it
    (``on_loop``: a ranker's, whose Redis client's CPU it holds too)."""
    loop = fe.get("event_loop")
    if loop is None or (fe.get("on_store") and not on_loop) or fe["servers"] != 1:
        return ""
    return (
        f" As the scenario runs it, the station is **one event loop** (`preprocess.event_loop`, from the "
        f"server's clocks) that also takes each batch back ({_hand_back(loop)}; the instance's time "
        f"less {loop['instance_less_ms']:.2f} ms, the hand-back's mean) and writes its responses "
        f"({loop['respond_per_batch_ms']:.2f} ms a batch plus {loop['respond_per_request_ms']:.2f} ms a "
        f"request): admissions mean {_mean(loop['admit']):.2f} ms, and the pure delay mean "
        f"{_mean(loop['fixed_delay']):.2f} ms."
        + (
            f" Each handler awaits its Redis fetch mid-way: the admission less {loop['resume_ms']:.3f} ms before the "
            "fetch, the rest (`event_loop.resume_ms`, the median gap between back-to-back queue arrivals) when its "
            "reply is back, the replies in the order sent."
            if on_loop and loop.get("resume_ms") is not None
            else ""
        )
        + (_reads_first(loop["reads_first"]) if on_loop and loop.get("reads_first") else "")
        + (
            f" The client reads a batch's answers late: {loop['read_behind_ms']:.2f} ms for each response of its "
            "batch written after its own (`event_loop.read_behind_ms`, the time outside the server against that "
            "count within each fitted level), out of the pure delay."
            if loop.get("read_behind_ms")
            else ""
        )
        + (
            " A job after the loop slept runs slower (`event_loop.after_idle`, a read on an idle loop by how long "
            f"it had slept, against the lightest fitted level): {_idle_table(loop['after_idle'])}."
            if loop.get("after_idle")
            else ""
        )
        + (
            f" Each of its jobs takes {loop['cost_per_in_flight']:.5f} of its time more per other request in the "
            "server, read or waiting to be read (`event_loop.cost_per_in_flight`: the CPU per request of the server "
            "and its redis-server "
            "against the requests in flight past the loop's saturation, a closed loop with this load generator "
            "off the loop's core)."
            if loop.get("cost_per_in_flight")
            else ""
        )
        + (
            " Its jobs take longer the more requests it holds (`event_loop.cost_by_held`, "
            + (
                "fitted until the model answers a backlog of each size as fast as the server did in the fitted "
                "levels' slices, 100 ms at a time: `calibrate.drain`): "
                if loop.get("drain_fit")
                else "the CPU per request of the server and its redis-server at each count in flight over the "
                "first, a closed loop with this load generator off the loop's core): "
            )
            + ", ".join(f"{n} held ×{float(f):.3f}" for n, f in loop["cost_by_held"].items())
            + "."
            if loop.get("cost_by_held")
            else ""
        )
    )
