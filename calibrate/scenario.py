"""A calibration profile as a scenario: the server it measured, as the simulator runs it.

The scenario has the server's structure (``calibrate/README.md``, "The method"): the front
end as a CPU station (or, for the ranker, the feature store's one-thread loop), the rest of
a request outside the batch as a pure delay, the dynamic batcher as the server's
``/config`` reported it, the model instances as the workers with the fitted batch time and
its noise, and, where the profile fitted one, the host's speed as a process
(``platform.speed``) with the batch noise keeping the share the process leaves it. Used by
the validation, the prediction intervals, the replay, the target's virtual runs, the live
twin and the ``scenario.yaml`` a run writes (:func:`write_scenario`: ``servesim run scenario.yaml
--set traffic.rate_rps=R`` predicts another rate, for anyone to check with their own load
generator).

What the calibration simulates is the server *with its load generator*
(:func:`scenario_dict`, ``load_generator=True``): that client holds at most
:func:`client_connections` requests in flight and keeps the rest waiting in itself, their
wait counted, so a server queue at least that long can never refuse one, and the scenario
lifts its cap. The request waits in the client about as long as it would have in the
queue: the path is first-come first-served to the one batch queue, and the client frees a
connection only when an answer is back, while the N - 1 requests ahead of it take far
longer to serve than the way from the client to the queue and back (calibrate/README,
"The load generator's connections"). The ``scenario.yaml`` a run writes is the server
alone, its cap kept: the clients a planner has in mind are not this one.
"""

from __future__ import annotations

import heapq
from pathlib import Path

import numpy as np
import yaml

from calibrate.loadgen import CONNECTIONS
from calibrate.specs import dist, scaled, scaled_batch_time, shifted_batch_time, spec_mean, table_to
from calibrate.speed import shrink_ratios
from simulator.scenario.catalog import instance_for_gpu
from simulator.scenario.platform import Episodes

# the fit's model; the rest of a profile's service_time is its quality
SERVICE_KEYS = (
    "kind",
    "base_ms",
    "per_item_ms",
    "batch_ms",
    "noise_cv",
    "noise_ratios",
    "after_idle",
    "by_rate",
    "rate_window_ms",
    "rate_of",
    "after_batch",
    "by_queue",
)


# Whether a calibrated ranker's loop reads the waiting requests before it resumes a handler
# whose fetch is back (``preprocess.event_loop.reads_first``): None, as the profile's fit says
# (``frontend.event_loop.reads_first.hold_ms``, calibrate/reads.py: for how long); True, while
# any request waits, or READS_FIRST_MS after the reply (unbounded it brought the fetch's tail and
# the p99 at 50-70% to the measurement but put the p50 at 70-85% 7-15% over it: calibrate/README,
# "The window's timer drawn per window, and reads before resumptions"); False, in the order
# ready (the model before "Reads first, for a while"). ranker_loop_models.py --model
# loop_reads_first, --reads-first-ms and --in-order set them.
READS_FIRST: bool | None = None
READS_FIRST_MS = None
# which requests the loop's cost per request held counts (event_loop.held_counts): "arrived"
# (every request in the server, as the closed loop's N in flight), or "read" (before
# 2026-11-29, evening; ranker_loop_models.py --held-counts read)
HELD_COUNTS = "arrived"
# a batch's responses before the reads and resumptions ready while it came back
# (event_loop.responds_first); ranker_loop_models.py --responds-first
RESPONDS_FIRST = False
# the batcher as a task on the loop, sending after the jobs ready at its turn
# (event_loop.batcher_yields; calibrate/README, "The batcher is a task on the loop");
# ranker_loop_models.py --no-batcher-yields turns it off
BATCHER_YIELDS = True
# the batch's hand-back on the loop drawn from the light level's (event_loop.return_time,
# profiles since "The hand-back's tail"), not its median every time (return_ms)
HAND_BACK_DRAWN = True


def timer_late(profile: dict, preprocess: dict) -> dict | None:
    """The window timer's lateness for a front end on one event loop
    (``preprocess.event_loop.timer_late``): the empirical draws
    :func:`calibrate.cycle.fit_window` read off the batches no arrival closed; None
    without a loop or for a profile fitted before them, whose window is lengthened by the
    mean lateness instead."""
    timer = (profile.get("window") or {}).get("timer_ms")
    if "event_loop" not in preprocess or not timer:
        return None
    return {"kind": "empirical", "samples_ms": timer}


def client_connections(profile: dict) -> int:
    """The connections the calibration's load generator held: the profile's
    ``design.connections``, or :data:`calibrate.loadgen.CONNECTIONS` (a profile written
    before the design kept it: its load generator had that many)."""
    return int((profile.get("design") or {}).get("connections", CONNECTIONS))


def pool_sends(arrival: np.ndarray, answered: np.ndarray, connections: int) -> np.ndarray:
    """When a client of ``connections`` connections sends each request (in request order,
    scheduled at ``arrival``, its answer back at ``answered``): at once if a connection is
    free, else, first come first served, when the answer that frees one is back (the
    ``connections``-th latest of the answers before it)."""
    sends = np.asarray(arrival, dtype=float).copy()
    latest: list[float] = []  # the latest ``connections`` answers of the requests sent so far
    for i, back in enumerate(np.asarray(answered, dtype=float)):
        if len(latest) == connections:
            sends[i] = max(sends[i], latest[0])
            if back > latest[0]:
                heapq.heapreplace(latest, back)
        else:
            heapq.heappush(latest, back)
    return sends


def scenario_dict(
    profile: dict,
    rate_rps: float,
    *,
    duration_s: float,
    warmup_s: float,
    seed: int = 0,
    speed: float = 1.0,
    load_generator: bool = True,
) -> dict:
    """The calibrated server under Poisson load at ``rate_rps``, as a scenario document;
    ``speed`` multiplies the front end's CPU times (a slice's platform speed, see
    :func:`calibrate.station.fit_speed`; 1 is the run's average). With ``load_generator``
    (the default: the calibration's simulations stand for its measurements) the server is
    the one the calibration's client drove, whose connections bound the requests in flight:
    a queue that many long cannot refuse one, and its cap is lifted (the module's
    docstring); without, the server alone, its cap kept (:func:`write_scenario`). A ranker fitted with the
    server's clocks runs on the front end's event loop (:func:`ranker_on_loop`), one
    without them on the feature store's station (calibrate/README, "The ranker's loop as
    the ResNet's")."""
    server = profile["server"]
    affine = (profile.get("service_time_fits") or {}).get("affine") or {}
    st = table_to(profile["service_time"], server["max_batch_size"], affine.get("per_item_ms"))
    episodes = episodes_mean(profile)
    if episodes is not None:  # the fitted times hold the episodes' mean, which the process adds on top
        st = scaled_batch_time(st, 1.0 / episodes[1])
        speed = speed / episodes[0]
    features = {}
    fe = profile.get("frontend")
    ranker_loop = ranker_on_loop(profile)
    if "features" in profile:
        f = profile["features"]
        features = {k: f[k] for k in ("lookups_per_request", "batch_size", "parallelism")}
        if ranker_loop:  # the fetch's wall time at light load; its CPU is the loop's admission job
            features["round_trip"] = dist(f["light_round_trip"])
        elif "store" in f:  # round trips queue for the server's event loop: a one-thread station
            features["store"] = {**f["store"], "per_op_ms": f["store"]["per_op_ms"] * speed}
            if "store_wait" in f:  # and wait for Redis off the loop
                features["round_trip"] = dist(f["store_wait"])
        else:
            features["round_trip"] = dist(f["round_trip"])
    if fe is not None:
        router = {"overhead": dist(fe["fixed_delay"]), "balancing": "shared"}
        # the ranker's loop CPU is on the feature store's station (``on_store``): no second station
        preprocess = (
            {} if fe.get("on_store") else {"service": scaled(dist(fe["service"]), speed), "cpu_workers": fe["servers"]}
        )
        if preprocess and fe["servers"] > 1 and server.get("frontend_dispatch") == "round_robin":
            preprocess["dispatch"] = "round_robin"  # the hub deals connections in turn (--frontends)
        if preprocess and fe.get("hub_station_ms_per_request"):  # and relays every request to the batcher
            preprocess["hub"] = {"kind": "deterministic", "value_ms": fe["hub_station_ms_per_request"] * speed}
        loop = fe.get("event_loop")
        if loop is not None and (ranker_loop or not fe.get("on_store")) and fe["servers"] == 1:
            # one event loop admits the requests and writes the responses (calibrate/README)
            router["overhead"] = dist(loop["fixed_delay"])
            preprocess = {
                "service": scaled(dist(loop["admit"]), speed),
                "cpu_workers": 1,
                "event_loop": {
                    k: loop[k] * speed for k in ("return_ms", "respond_per_batch_ms", "respond_per_request_ms")
                },
            }
            if HAND_BACK_DRAWN and loop.get("return_time"):  # the hand-back as measured, its tail too
                preprocess["event_loop"]["return_time"] = scaled(dist(loop["return_time"]), speed)
                del preprocess["event_loop"]["return_ms"]
            if loop.get("read_behind_ms"):  # a client on its core reads a batch's answers late (calibrate.behind)
                preprocess["event_loop"]["read_behind_ms"] = loop["read_behind_ms"] * speed
            if loop.get("cost_by_held"):  # its work grows with the requests it holds, as measured
                by = {int(n): float(f) for n, f in loop["cost_by_held"].items()}
                preprocess["event_loop"]["cost_by_held"] = dict(sorted(by.items()))
            elif loop.get("cost_per_in_flight"):  # or a share per request held
                preprocess["event_loop"]["cost_per_in_flight"] = loop["cost_per_in_flight"]
            if loop.get("cost_by_held") or loop.get("cost_per_in_flight"):
                preprocess["event_loop"]["held_counts"] = HELD_COUNTS
            resume = loop.get("resume_ms")
            if ranker_loop and resume is not None:  # the handler reads, awaits its fetch, then resumes
                admit = dist(loop["admit"])  # its read: the admission less the resumption, the same shape
                read = max(1.0 - resume / spec_mean(admit), 0.05)
                preprocess["service"] = scaled(admit, read * speed)
                preprocess["event_loop"]["resume_ms"] = resume * speed
                hold = reads_first_hold(loop)
                if hold != 0:  # reads before resumptions, for ``hold`` ms (None: no bound)
                    preprocess["event_loop"]["reads_first"] = True
                    if hold is not None:  # a few passes of the loop: as slow as its jobs
                        preprocess["event_loop"]["reads_first_ms"] = hold * speed
            if RESPONDS_FIRST:
                preprocess["event_loop"]["responds_first"] = True
            if BATCHER_YIELDS:
                preprocess["event_loop"]["batcher_yields"] = True
            if loop.get("after_idle"):  # a job after the loop slept: slower (calibrate.idle)
                preprocess["event_loop"]["after_idle"] = loop["after_idle"]
        postprocess: dict = {}
    else:
        router = {"overhead": dist(profile["stages"]["overhead"]), "balancing": "shared"}
        preprocess = {"service": dist(profile["stages"]["preprocess"]), "cpu_workers": server["preprocess_threads"]}
        postprocess = {"service": dist(profile["stages"]["postprocess"])}
    late = timer_late(profile, preprocess)
    if late is not None:
        preprocess["event_loop"]["timer_late"] = late
    out = {
        "name": f"calibrated-{profile['model']['kind']}",
        "seed": seed,
        "duration_s": duration_s,
        "warmup_s": warmup_s,
        "sla": {"percentile": 99, "target_ms": 1000},
        "traffic": {"rate_rps": rate_rps},
        "router": router,
        "features": features,
        "preprocess": preprocess,
        "batching": {
            "max_batch_size": server["max_batch_size"],
            # the window as the server keeps it: its timers close it late (calibrate.cycle.fit_window),
            # drawn per window on the loop, or (profiles before the timer's own lateness) on average
            "max_queue_delay_ms": server["max_queue_delay_ms"]
            + (0.0 if late is not None else (profile.get("window") or {}).get("late_ms", 0.0)),
            "max_queue_size": server["max_queue_size"],
        },
        "workers": {
            "count": 1,
            "instances": server["instances"],
            "service_time": {k: v for k, v in st.items() if k in SERVICE_KEYS},
        },
        "postprocess": postprocess,
        "cost": {"price_per_hour_usd": 1.0},
    }
    loop = (fe or {}).get("event_loop")
    if "event_loop" in out["preprocess"] and loop.get("instance_less_ms"):  # the hand-back is on the loop
        out["workers"]["service_time"] = shifted_batch_time(out["workers"]["service_time"], -loop["instance_less_ms"])
    sp = profile.get("speed_process")
    if sp is not None and sp["speed"] is not None:  # the host's speed as a process, shared by front end and instance
        out["platform"] = {"speed": sp["speed"]}
        ratios = out["workers"]["service_time"].get("noise_ratios")
        if ratios is not None:  # the batches' own noise: what the process leaves of their spread
            out["workers"]["service_time"]["noise_ratios"] = shrink_ratios(ratios, sp["noise_share"])
    gpu = catalog_gpu(profile)
    if gpu is not None:  # measured on a GPU the catalog prices: that type, at its price
        out["workers"]["instance_type"] = gpu
        del out["cost"]
    return with_load_generator(out, profile) if load_generator else out


def episodes_mean(profile: dict) -> tuple[float, float] | None:
    """The time average of a fitted speed process's slow episodes on the front end and on
    the instances (each through its elasticity), or None without episodes. The batch table
    and the front end's CPU per request were fitted on every batch and slice, the
    episodes' included, so they hold that average; the process multiplies the episodes on
    top (its wobble has mean one), and :func:`scenario_dict` divides it out of both."""
    speed = ((profile.get("speed_process") or {}).get("speed")) or {}
    if not speed.get("episodes"):
        return None
    ep = Episodes.model_validate(speed["episodes"])
    return ep.mean(speed.get("frontend_elasticity", 1.0)), ep.mean(speed.get("workers_elasticity", 1.0))


def with_load_generator(doc: dict, profile: dict) -> dict:
    """``doc`` (a scenario of the server ``profile`` measured) as the calibration's client
    drove it: a queue cap no shorter than the client's connections lifted, for the client
    fills first and never lets the queue refuse (the module's docstring)."""
    cap = doc["batching"].get("max_queue_size")
    if cap is not None and client_connections(profile) <= cap:
        doc["batching"]["max_queue_size"] = None
    return doc


def reads_first_hold(loop: dict) -> float | None:
    """How long the loop reads waiting requests before a resumption, ms (None: no bound;
    0: in the order ready): :data:`READS_FIRST` if set, else the profile's fit (profiles
    before it: 0)."""
    if READS_FIRST is not None:
        return READS_FIRST_MS if READS_FIRST else 0.0
    fitted = loop.get("reads_first")
    return 0.0 if fitted is None else fitted["hold_ms"]


def ranker_on_loop(profile: dict) -> bool:
    """Whether a ranker's front end runs as one event loop (``preprocess.event_loop``)
    rather than as the feature store's station: its loop fitted from the server's clocks,
    the fetch's wall time at light load kept (profiles since the ranker's loop)."""
    fe, f = profile.get("frontend") or {}, profile.get("features") or {}
    return bool(fe.get("on_store")) and fe.get("event_loop") is not None and "light_round_trip" in f


def write_scenario(profile: dict, path: Path, *, load: float = 0.5) -> None:
    """The profile as a runnable scenario, at ``load`` × the measured capacity."""
    rate = round(load * float(profile.get("capacity_rps", 100.0)), 1)
    doc = scenario_dict(profile, rate, duration_s=60.0, warmup_s=2.0, load_generator=False)
    doc["sla"] = {"percentile": 99, "target_ms": 100}
    loop_doc = doc["preprocess"].get("event_loop", {})
    fe = profile.get("frontend")
    header = [
        f"# The server measured by `servesim calibrate run` on {profile['hardware']['cpu']}, {profile['created']}.",
        f"# Predict another rate: servesim run {path.name} --set traffic.rate_rps=R (capacity measured: "
        f"{profile.get('capacity_rps', float('nan')):.0f} req/s).",
        "# Stages, as the server is built:",
    ]
    if fe and ranker_on_loop(profile):
        header += [
            "#   router.overhead  - loopback, HTTP and the client outside the server's CPU work (a pure delay)",
            "#   features         - the Redis fetch's wall time at light load (a pure delay)",
            "#   preprocess       - the front end's one event loop: admits each request (parse, the Redis client's",
            "#                      work, the redis-server and load generator on its core) and writes the responses,",
            f"#                      {fe['cpu_ms_per_request']:.2f} ms of the server's own CPU per request"
            + (
                f" plus {fe['client_cpu_ms_per_request']:.2f} ms of the load generator that shared its core"
                if fe["client_shares_cores"]
                else ""
            ),
        ]
    elif fe:
        header += [
            "#   router.overhead  - loopback, HTTP and the client outside the server's CPU work (a pure delay)",
            f"#   preprocess       - the front end: {fe['servers']} server(s) of CPU per request (parse, JPEG "
            "decode, encode),",
            f"#                      {fe['cpu_ms_per_request']:.2f} ms of the server's own"
            + (
                f" plus {fe['client_cpu_ms_per_request']:.2f} ms of the load generator that shared its cores;"
                if fe["client_shares_cores"]
                else " (the load generator had cores of its own)"
            ),
        ]
        if fe["client_shares_cores"]:
            header.append("#                      with the client on another host, lower its mean by that much")
        if fe.get("hub_station_ms_per_request"):
            header.append(
                "#   preprocess.hub   - the hub that relays every request between the front ends and the batcher "
                f"({fe['hub_cpu_ms_per_request']:.2f} ms of the above)"
            )
    else:
        header += ["#   router.overhead, preprocess, postprocess - the request's time outside the batch"]
    w = profile.get("window")
    header += [
        "#   batching         - the server's dynamic batcher, as its /config reported it"
        + (
            f"; the window as its timers keep it ({profile['server']['max_queue_delay_ms']:g} ms configured, "
            f"closed {w['late_ms']:.2f} ms late on average"
            + ("; the loop's timer_late draws its lateness per window)" if "timer_late" in loop_doc else ")")
            if w
            else ""
        ),
        "#   workers          - the model instances (processes); service_time = hand-off + compute per batch size",
        "",
    ]
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120)
    path.write_text("\n".join(header) + body)


def catalog_gpu(profile: dict) -> str | None:
    """The catalog key of the GPU a CUDA profile was measured on (``h100`` for an
    'NVIDIA H100 80GB HBM3'), or None for a CPU profile or a GPU the catalog lacks."""
    name = ((profile.get("hardware") or {}).get("gpu") or {}).get("name")
    if not name or not str(profile.get("server", {}).get("device", "")).startswith("cuda"):
        return None
    return instance_for_gpu(name)
