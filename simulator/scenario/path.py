"""The request path's sections outside the batcher: network, router and activator, feature
store and fetch, caches, pre- and postprocessing, prediction logging."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from simulator.scenario.distributions import (
    Distribution,
)
from simulator.scenario.frozen import Frozen
from simulator.scenario.servicetime import check_after_idle
from simulator.scenario.versions import Canary, Shadow


class Network(Frozen):
    """Client ↔ API hops: a latency per direction plus payload transfer over a bandwidth."""

    client_to_api: Distribution | None = Field(None, description="One-way latency client → API, ms.")
    api_to_client: Distribution | None = Field(None, description="One-way latency API → client, ms.")
    bandwidth_gbps: float | None = Field(
        None, gt=0, description="Per-connection bandwidth, Gbit/s, for payload transfer time (none: no transfer time)."
    )


class Activator(Frozen):
    """Knative's activator: while no worker serves, requests wait here instead of failing."""

    capacity: int | None = Field(None, ge=1, description="Most requests buffered at once (none: unbounded).")
    timeout_ms: float = Field(60_000.0, gt=0, description="A request buffered this long gets an error (rejected), ms.")


class ScoreWeights(Frozen):
    """The weights of ``balancing: scored``: each replica scores
    ``prefix·(share of the prompt cached) + queue·(1 − its load / the most loaded's) +
    kv·(1 − its KV use)``, and the highest wins (ties: the lower replica)."""

    prefix: float = Field(2.0, ge=0, description="Weight of the share of the prompt the replica has cached.")
    queue: float = Field(1.0, ge=0, description="Weight of a short queue (running + waiting).")
    kv: float = Field(1.0, ge=0, description="Weight of free KV memory.")


class Router(Frozen):
    """API layer and traffic router: auth, schema normalisation, version choice."""

    overhead: Distribution | None = Field(None, description="Per-request API/router processing time, ms.")
    balancing: Literal["random", "round_robin", "shared", "least_loaded", "prefix_affinity", "scored"] = Field(
        "random",
        description=(
            "How requests reach workers: random (uniform, like kube-proxy) or round_robin to per-worker batch "
            "queues, or shared: one queue feeding every instance of the pool (an M/M/c-style central queue). "
            "LLM replicas (batching.kind continuous) may also be picked by their state when the request "
            "reaches them: least_loaded (fewest requests running and waiting), prefix_affinity (the most of "
            "its prompt's prefix cached, then the least loaded), or scored (llm-d's weighted sum of prefix "
            "hit, queue and KV use: router.weights)."
        ),
    )
    weights: ScoreWeights = Field(
        default_factory=lambda: ScoreWeights(), description="Weights of balancing: scored (llm-d's scorers)."
    )
    users: int = Field(100_000, ge=1, description="User population; a user's id fixes its canary bucket.")
    canary: Canary | None = Field(None, description="A candidate version on its own pool, sticky per user.")
    shadow: Shadow | None = Field(None, description="Mirror a share of primary requests to a shadow version.")
    activator: Activator | None = Field(
        None,
        description="Buffer requests while no worker serves (scale from zero, all crashed); none: reject them (503).",
    )


class KVStore(Frozen):
    """A remote KV store of finite capacity: each round trip holds one server thread."""

    threads: int = Field(ge=1, description="Server threads serving round trips concurrently.")
    per_op_ms: float = Field(0.0, ge=0, description="Thread time per round trip, ms.")
    per_key_ms: float = Field(0.0, ge=0, description="Thread time per key in a round trip, ms.")


class Window(Frozen):
    """A time window of the run."""

    start_s: float = Field(ge=0, description="Window start, s.")
    duration_s: float = Field(gt=0, description="Window length, s.")


class Slowdown(Window):
    """A window in which something takes ``multiplier`` times longer."""

    multiplier: float = Field(gt=0, description="Latency multiplier inside the window.")


class Features(Frozen):
    """Online feature fetch from a remote KV store, in batched round trips.

    ``lookups_per_request`` keys are fetched in ``ceil(lookups / batch_size)`` round trips,
    ``parallelism`` in flight at a time. ``batch_size: 1`` is one GET per key; a large
    batch is an MGET.
    """

    lookups_per_request: int = Field(0, ge=0, description="Keys fetched per request (0: no feature fetch).")
    batch_size: int = Field(1, ge=1, description="Keys per round trip (MGET size).")
    parallelism: int = Field(1, ge=1, description="Round trips in flight at once per request.")
    round_trip: Distribution | None = Field(
        None, description="Network + client latency of one round trip, ms (excludes store thread time)."
    )
    per_key_ms: float = Field(
        0.0, ge=0, description="Extra round-trip latency per key carried, ms (uncontended store)."
    )
    store: KVStore | None = Field(None, description="Finite store capacity; none means the store never queues.")
    timeout_ms: float | None = Field(
        None, gt=0, description="Client timeout of the whole fetch, ms; then on_timeout applies."
    )
    on_timeout: Literal["default", "fail"] = Field(
        "default", description="default: go on with default features (flagged degraded); fail: the request fails."
    )
    outages: tuple[Window, ...] = Field((), description="Store outages: round trips overlapping one never return.")
    slowdowns: tuple[Slowdown, ...] = Field((), description="Windows where round trips take `multiplier` times longer.")

    @model_validator(mode="after")
    def _needs_latency(self) -> Features:
        if self.lookups_per_request > 0 and self.round_trip is None and self.store is None:
            raise ValueError("features with lookups_per_request > 0 need round_trip or store")
        if self.outages and self.timeout_ms is None:
            raise ValueError("features.outages need features.timeout_ms (how long a request waits)")
        if (self.outages or self.slowdowns) and self.store is not None:
            raise ValueError("outage and slowdown windows are modelled for the uncontended store only (no store:)")
        return self


class Cache(Frozen):
    """A cache in front of a stage: Zipf key popularity, TTL, optional LRU capacity."""

    keys: int = Field(1_000_000, ge=1, description="Size of the key space (distinct inputs or entities).")
    zipf_s: float = Field(1.0, ge=0, description="Zipf exponent of key popularity (0: uniform).")
    hit_rate: float | None = Field(
        None, ge=0, le=1, description="Override: hits are independent coin flips with this probability."
    )
    ttl_s: float | None = Field(None, gt=0, description="Entry lifetime from insertion, s (none: no expiry).")
    capacity: int | None = Field(None, ge=1, description="LRU capacity in entries (none: unbounded).")
    invalidate_at_s: tuple[float, ...] = Field((), description="Times the whole cache is flushed (deploys), s.")
    hit: Distribution | None = Field(None, description="Latency of a hit, ms.")
    miss: Distribution | None = Field(None, description="Latency of the lookup on a miss, ms (before the work).")


class Caches(Frozen):
    """Optional caches: results (skip the model on a hit) and features (skip the fetch)."""

    result: Cache | None = Field(None, description="Result cache after the router, keyed by model version and input.")
    feature: Cache | None = Field(None, description="Feature cache in front of the KV store, keyed by entity.")


class EventLoop(Frozen):
    """The front end as one event loop that also answers (asyncio, Node, one HTTP thread).

    The loop admits each request (``preprocess.service``: parse, decode, enqueue) and, when
    a batch comes back, resumes its requests and writes their responses: one job of
    ``respond_per_batch_ms`` plus ``respond_per_request_ms`` for each request, request ``j``
    of the batch answered ``respond_per_batch_ms + (j + 1) × respond_per_request_ms`` after
    the job starts. Before that, the loop takes the batch back from its instance
    (``return_ms``, a job of its own): the instance is free, and the next batch goes, when
    that job ends, so ``workers.service_time`` is the instance's own time without it. Jobs
    run one at a time in the order they became ready, and the batching window's timer
    waits for the job in progress (and fires ``timer_late`` after its due time, when that is
    set). So requests that arrive while a
    batch's responses are written wait in the socket, and a batch's responses wait behind
    requests being admitted: arrivals to the batch queue are coupled to the batch cycle, as
    on the reference server (calibrate/README, "The light-load gap").
    """

    return_ms: float = Field(
        0.0,
        ge=0,
        description="Loop time to take a batch back from its instance (wake-up, copy the outputs), ms; "
        "the instance is free when it is done.",
    )
    return_time: Distribution | None = Field(
        None,
        description="The hand-back's time drawn per batch, ms, in place of return_ms (servesim calibrate fits the "
        "light level's hand-backs: on the ResNet server a median near 0.24 ms and one in ten past 1 ms, so a "
        "constant of the median left the mean 12-40% short at every load in 13 runs). None: return_ms every time.",
    )
    respond_per_batch_ms: float = Field(0.0, ge=0, description="Loop time per batch to resume its requests, ms.")
    respond_per_request_ms: float = Field(
        0.0, ge=0, description="Loop time per response, ms (resume the request, encode, write)."
    )
    read_behind_ms: float = Field(
        0.0,
        ge=0,
        description="A client on the loop's core reads a batch's answers late: response j of a batch of B reaches "
        "it read_behind_ms × (B − 1 − j) after the loop wrote it (while the loop writes the later ones it holds the "
        "core they share). Fitted by servesim calibrate from where each response came in its batch: 0.17-0.31 ms on "
        "eleven ResNet runs, 0.4-0.65 of its loop's time per response. 0: each response read as written.",
    )
    resume_ms: float | None = Field(
        None,
        ge=0,
        description="The handler awaits the feature fetch mid-way (a Redis client on the loop): preprocess.service "
        "is the loop's work before the fetch, the fetch passes off the loop (its replies in the order sent), and "
        "resume_ms is the loop's job after it (read the reply, queue the request), ms; a request's features time "
        "is then when its fetch was back. None: the fetch comes before the admission.",
    )
    reads_first: bool = Field(
        False,
        description="With resume_ms: the loop reads every request waiting before it resumes a handler whose fetch "
        "is back (a reply's continuation passes through the loop's ready queue several times, and newly arrived "
        "requests get in first at each pass), so in a burst the first requests' resumptions wait for the "
        "burst's reads. False: jobs in the order they became ready.",
    )
    reads_first_ms: float | None = Field(
        None,
        gt=0,
        description="With reads_first: how long after its fetch is back a resumption still lets waiting reads go "
        "first, ms; past it, it takes its turn in the order jobs became ready (asyncio lets a reply's continuation "
        "in after a few passes of its loop, not only when no request waits). None: for as long as any request "
        "waits to be read.",
    )
    responds_first: bool = Field(
        False,
        description="A batch's responses are written before the reads and resumptions that became ready while the "
        "loop took the batch back or waited for it (asyncio runs the handlers a batch's answer wakes before the "
        "socket events it has yet to poll). False: jobs in the order they became ready.",
    )
    batcher_yields: bool = Field(
        False,
        description="The batcher is a task on the loop: woken by its window's timer, or by a request queued past "
        "the window, it sends the batch at its turn, after the jobs already ready then (reads, resumptions, a batch's "
        "return and responses), whose requests still join it (asyncio's batcher takes several passes of the loop "
        "from its wake-up to its dispatch, a handler whose fetch is back one). False: the timer runs in the order "
        "it became ready, and a request queued past the window sends the batch at once.",
    )
    cost_per_in_flight: float = Field(
        0.0,
        ge=0,
        le=1,
        description="How the loop's work grows with the requests it holds (held_counts): each job "
        "takes its time × (1 + cost_per_in_flight × the others held when it starts). A Python server's loop "
        "pays per request held (its collector's passes, more sockets to poll): "
        "the MGET ranker's CPU per request rose 13-19% from 32 to 128 requests in flight and 18-26% at 256, "
        "0.0007-0.0010 a request (0.00085-0.00185 in the closed loops of three later runs). 0: a fixed cost "
        "per request.",
    )
    cost_by_held: dict[int, float] | None = Field(
        None,
        description="The loop's work by the requests it holds (held_counts), as measured: "
        "{held: factor}, each job's time × the factor at the count held when it starts, interpolated "
        "linearly between the counts given and flat beyond them (a closed loop's CPU per request at N "
        "in flight over its value at the first N). The MGET ranker's rose little to 40 in flight, then "
        "0.0025 of its value a request held to 96 and 0.0003 past 128. None: no such factor.",
    )
    held_counts: Literal["read", "arrived"] = Field(
        "arrived",
        description="Which requests count as held for cost_per_in_flight and cost_by_held: arrived (every request "
        "in the server not yet answered, those waiting to be read too, as a closed loop's N in flight are) or "
        "read (admitted only). On the MGET ranker's runs arrived moved every 70% and 85% p99 toward the "
        "measurement (the 85% p99 by 2 to 19 points).",
    )
    timer_late: Distribution | None = Field(
        None,
        description="How late the batching window's timer fires after its due time, ms, one draw per window "
        "(asyncio's and uvloop's timers: whole milliseconds on a loop clock cached at the last iteration, "
        "then the callbacks ready before it). A request queued or an instance freed after the due time "
        "still closes the window at once. None: the timer fires on time.",
    )

    after_idle: dict[float, float] | None = Field(
        None,
        description="Each loop job's time by how long the loop sat idle before it (idle ms: factor), "
        "interpolated, flat beyond the ends: a core that sleeps between requests runs the next job "
        "slower (the ResNet server's admission on an idle loop: 0.58 ms after under 0.5 ms idle, 1.1 ms "
        "after 10-20 ms). Fitted by servesim calibrate relative to its lightest fitted level; none: every "
        "job alike.",
    )

    @model_validator(mode="after")
    def _idle(self) -> EventLoop:
        check_after_idle(self.after_idle)
        return self

    @model_validator(mode="after")
    def _one_cost_by_held(self) -> EventLoop:
        by = self.cost_by_held
        if by is None:
            return self
        if len(by) < 2:
            raise ValueError("cost_by_held needs at least two counts (a factor at each)")
        if min(by) < 1:
            raise ValueError("cost_by_held: the counts are requests held, 1 or more")
        if not all(0 < f <= 10 for f in by.values()):
            raise ValueError("cost_by_held: each factor must be above 0 and at most 10")
        if self.cost_per_in_flight > 0:
            raise ValueError("give cost_by_held or cost_per_in_flight, not both")
        return self


class Relay(Frozen):
    """The way back through the hub of several front ends (``servesim serve --frontends N``).

    Each of the ``cpu_workers`` front ends is an event loop, dealt every N-th request: it
    reads and preprocesses a request (``preprocess.service``) and relays it to the hub,
    and when the answer comes back it writes the response (``respond_ms``), its jobs one
    at a time in the order they became ready. The hub is one loop too: it takes each item
    in (``preprocess.hub``) and, when an instance has computed a batch (the instance is
    free then: the batch time holds the hand-back), takes its outputs in
    (``hub_return_ms``) and sends the answers to their front ends (``hub_answer_ms``
    each, in the batch's order); the batching window's timer waits for its job in
    progress. So an answer that reaches a front end busy preprocessing another request
    waits for it, and a batch's later answers wait for its earlier ones (calibrate/README,
    "The way back through the hub").
    """

    respond_ms: float = Field(
        0.0, ge=0, description="A front end's time to read a request's answer and write its response, ms."
    )
    hub_return_ms: float = Field(
        0.0,
        ge=0,
        description="The hub's time to take a batch's outputs in before it sends their answers, ms (the instance "
        "is free at the batch's end: the batch time holds the hand-back).",
    )
    hub_answer_ms: float = Field(
        0.0, ge=0, description="The hub's time to send one request's answer to its front end, ms."
    )


class Preprocess(Frozen):
    """CPU preprocessing (decode, resize, tokenise) on a pool of CPU workers, FCFS."""

    service: Distribution | None = Field(None, description="CPU time per request, ms.")
    cpu_workers: int | None = Field(
        None, ge=1, description="CPU workers in the pool (none: unlimited, preprocessing never queues)."
    )
    dispatch: Literal["shared", "round_robin"] = Field(
        "shared",
        description="shared: one queue for the pool (threads taking work as they free up); round_robin: "
        "each worker its own queue, dealt every cpu_workers-th request (front-end processes dealt connections "
        "in turn, as servesim serve --frontends N).",
    )
    event_loop: EventLoop | None = Field(
        None,
        description="The pool is one event loop that also writes the responses (cpu_workers 1, one batch queue).",
    )
    hub: Distribution | None = Field(
        None,
        description="CPU time per request, ms, of one process every request passes after the pool, one at a "
        "time, before the batcher (the hub of servesim serve --frontends N, which relays items to the one "
        "batcher and the answers back; a single dispatcher thread).",
    )

    relay: Relay | None = Field(
        None,
        description="The answers' way back through the hub to the front ends, each front end and the hub an event "
        "loop (needs cpu_workers of 2 or more, dispatch round_robin and hub). None: the front ends and the hub are "
        "stations before the batch queue, and the way back a pure delay.",
    )

    @model_validator(mode="after")
    def _loop_is_one_worker(self) -> Preprocess:
        if self.event_loop is not None and (self.cpu_workers != 1 or self.service is None):
            raise ValueError("preprocess.event_loop is one loop: it needs preprocess.service and cpu_workers: 1")
        if self.hub is not None and self.event_loop is not None:
            raise ValueError("preprocess.hub and preprocess.event_loop: the event loop is the one process already")
        if self.relay is not None:
            need = [
                (self.service is None, "preprocess.service (each front end's work per request)"),
                ((self.cpu_workers or 0) < 2, "cpu_workers of 2 or more (the front ends)"),
                (self.dispatch != "round_robin", "dispatch: round_robin (each front end dealt its requests)"),
                (self.hub is None, "preprocess.hub (the hub's work per request on the way in)"),
                (self.event_loop is not None, "no preprocess.event_loop (one front end's loop)"),
            ]  # fmt: skip
            missing = [why for cond, why in need if cond]
            if missing:
                raise ValueError(
                    f"preprocess.relay runs several front ends and their hub: it needs {'; '.join(missing)}"
                )
        if self.dispatch == "round_robin" and self.cpu_workers is None:
            raise ValueError("preprocess.dispatch round_robin deals requests to cpu_workers queues: set cpu_workers")
        return self


class Postprocess(Frozen):
    """Postprocessing and response serialisation."""

    service: Distribution | None = Field(None, description="Per-request time, ms.")


class PredictionLog(Frozen):
    """Asynchronous prediction logging: one record per request into a pipeline of finite bandwidth."""

    record_kb: float = Field(gt=0, description="Log record size per request, KB (input + output + metadata).")
    bandwidth_gbps: float = Field(gt=0, description="Pipeline throughput, Gbit/s.")
