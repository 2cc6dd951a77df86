"""The scenario: frozen pydantic models validated once at load.

A scenario describes one serving system end to end, in the order a request sees it:
traffic → network → router → features → preprocess → batching → workers →
postprocess → network back. Units are in the field names; every field is described,
so ``servesim schema`` doubles as the reference. Nothing here does I/O: files named
by a scenario are read by :mod:`simulator.scenario.loader` after validation.

The sections live by area (:mod:`~simulator.scenario.traffic`, :mod:`~simulator.scenario.path`,
:mod:`~simulator.scenario.fleet`); this module assembles them into :class:`Scenario`, with the
checks that span sections, and exports every section under one name.
"""

from __future__ import annotations

import math

import yaml
from pydantic import Field, PrivateAttr, model_validator

from simulator.scenario.catalog import Catalog, load_catalog, worker_hour_price
from simulator.scenario.distributions import (
    Deterministic,
    Empirical,
    Exponential,
    Gamma,
    LogNormal,
    Uniform,
)
from simulator.scenario.fleet import Batching, ColdStart, Cost, Crash, Failures, TritonBatching, Workers
from simulator.scenario.frozen import Frozen
from simulator.scenario.llm import ContinuousBatching
from simulator.scenario.path import (
    Activator,
    Cache,
    Caches,
    Features,
    KVStore,
    Network,
    Postprocess,
    PredictionLog,
    Preprocess,
    Router,
    Slowdown,
    Window,
)
from simulator.scenario.platform import Episodes, LogAR1Component, LogAR1Speed, MarkovSpeed, Platform, SpeedTrace
from simulator.scenario.servicetime import Affine, ServiceTime, Table
from simulator.scenario.shapes import rate_bound
from simulator.scenario.traffic import SLA, Traffic, TrafficClass

STATEFUL = ("least_loaded", "prefix_affinity", "scored")  # balancing that reads the replicas' state


class Napkin(Frozen):
    """The back-of-envelope assumptions that ``servesim explain`` writes out, then checks."""

    batch_size: int | None = Field(
        None, ge=1, description="Batch size the per-worker throughput is read at (default: batching.max_batch_size)."
    )
    headroom: float = Field(0.3, ge=0, description="Fraction added on top of rate / per-worker throughput.")


class Scenario(Frozen):
    """One serving system and the traffic it sees.

    Frozen and validated once, at load (:func:`simulator.load_scenario`). The sections
    follow a request's path: ``traffic``, ``network``, ``router``, ``caches``,
    ``features``, ``preprocess``, ``batching``, ``workers``, ``postprocess``; then ``sla``,
    ``cost`` and ``logging``. Units are in the field names (``_ms``, ``_s``, ``_rps``,
    ``_kb``, ``_usd``), and every field is described: ``servesim schema`` prints them all.
    Derive a variant with ``model_copy(update=...)`` or load with ``--set`` overrides.
    """

    name: str = Field(description="Short name of the scenario.")
    description: str = Field("", description="What question the scenario answers.")
    seed: int = Field(0, ge=0, description="Root seed; every random stream derives from it.")
    duration_s: float = Field(gt=0, description="Simulated seconds of arrivals.")
    warmup_s: float = Field(0.0, ge=0, description="Arrivals before this time are excluded from metrics, s.")
    sla: SLA = Field(description="Latency objective.")
    traffic: Traffic = Field(description="Arrivals and payload sizes.")
    network: Network = Field(Network(), description="Client ↔ API network hops.")
    router: Router = Field(Router(), description="API/router overhead.")
    caches: Caches = Field(Caches(), description="Result and feature caches.")
    features: Features = Field(Features(), description="Online feature fetch.")
    preprocess: Preprocess = Field(Preprocess(), description="CPU preprocessing.")
    batching: Batching = Field(TritonBatching(), description="The batch scheduler: kind triton (the default).")
    workers: Workers = Field(description="GPU worker pool.")
    postprocess: Postprocess = Field(Postprocess(), description="Postprocessing and serialisation.")
    logging: PredictionLog | None = Field(None, description="Prediction logging pipeline (none: not modelled).")
    platform: Platform = Field(Platform(), description="The hosts: their speed as a random process of time.")
    cost: Cost = Field(Cost(), description="Pricing.")
    napkin: Napkin = Field(Napkin(), description="Back-of-envelope assumptions checked by `servesim explain`.")

    # one worker-hour in USD, resolved once at load (the override, or the catalog's row for
    # workers.instance_type on cost.market), so that no metric reads a file; or why it could not be
    _price_usd: float | None = PrivateAttr(None)
    _price_problem: str | None = PrivateAttr(None)
    _type_prices: dict[str, float] = PrivateAttr(default_factory=dict)  # a mixed fleet's, by GPU type

    @model_validator(mode="after")
    def _resolve_price(self) -> Scenario:
        self._set_price(None if self.cost.price_per_hour_usd is not None else _catalog_or_problem(self.cost.catalog))
        return self

    def repriced(self, catalog: Catalog) -> Scenario:
        """A copy priced from ``catalog``: for a copy that changed ``workers.instance_type`` or
        ``cost`` (a copy is not validated again, so it keeps the price it was made with)."""
        new = self.model_copy()
        new._set_price(catalog)
        return new

    def _set_price(self, catalog: Catalog | str | None) -> None:
        # a string: why the catalog could not be read
        self._type_prices = {}
        if self.cost.price_per_hour_usd is not None:
            self._price_usd, self._price_problem = self.cost.price_per_hour_usd, None
        elif isinstance(catalog, str):
            self._price_usd, self._price_problem = None, catalog
        else:
            try:
                w = self.workers
                price = worker_hour_price(catalog, w.instance_type, self.cost.market)
                if w.mix:  # a mixed fleet: its mean price per worker, and each type's
                    self._type_prices = {t: worker_hour_price(catalog, t, self.cost.market) for t in w.mix}
                    self._type_prices[w.instance_type] = price
                    others = sum(n * self._type_prices[t] for t, n in w.mix.items())
                    price = (price * (w.count - sum(w.mix.values())) + others) / w.count
            except ValueError as err:
                self._price_usd, self._price_problem = None, str(err)
            else:
                self._price_usd, self._price_problem = price, None

    def price_of(self, instance_type: str) -> float:
        """USD per worker-hour of one GPU type of a mixed fleet (the override, if any, for
        every type); ValueError if it was not resolved."""
        if self.cost.price_per_hour_usd is not None:
            return self.cost.price_per_hour_usd
        if instance_type not in self._type_prices:
            raise ValueError(self._price_problem or f"no price resolved for {instance_type!r}")
        return self._type_prices[instance_type]

    @property
    def price_per_worker_hour_usd(self) -> float:
        """USD per worker-hour, as resolved at load; ValueError if the catalog had none."""
        if self._price_usd is None:
            raise ValueError(self._price_problem or "the price of a worker-hour was not resolved")
        return self._price_usd

    @property
    def autoscaled(self) -> list[str]:
        """The fields of the autoscalers the fleet changes under (``workers.autoscaler``, or
        a disaggregated LLM fleet's pools'); empty for a fixed fleet."""
        scalers = self.batching.autoscalers(self.workers) if self.batching.kind == "continuous" else []
        scalers = scalers or [("workers.autoscaler", self.workers.autoscaler)]
        return [name for name, a in scalers if a is not None]

    @model_validator(mode="after")
    def _napkin_batch_fits(self) -> Scenario:
        b = self.napkin.batch_size
        if b is not None and b > self.batching.max_batch_size:
            raise ValueError(
                f"napkin.batch_size ({b}) exceeds batching.max_batch_size ({self.batching.max_batch_size})"
            )
        return self

    @model_validator(mode="after")
    def _activator_needs_a_changing_fleet(self) -> Scenario:
        if self.router.activator is not None and not self.workers.dynamic:
            raise ValueError("router.activator buffers while no worker serves: it needs workers.autoscaler or failures")
        return self

    @model_validator(mode="after")
    def _dynamic_fleet_needs_worker_queues(self) -> Scenario:
        if self.workers.dynamic and self.router.balancing == "shared":
            raise ValueError("autoscaling and failures need per-worker queues: router.balancing random or round_robin")
        return self

    @model_validator(mode="after")
    def _classes_supported(self) -> Scenario:
        if not self.traffic.classes:
            return self
        if self.workers.dynamic:
            raise ValueError("traffic.classes run on fixed pools: drop workers.autoscaler and workers.failures")
        if self.router.canary is not None or self.router.shadow is not None:
            raise ValueError("traffic.classes and router.canary/shadow cannot be combined yet")
        if all(c.workers is not None for c in self.traffic.classes.values()):
            raise ValueError(
                "every traffic class has its own workers: leave one on the shared pool (workers), "
                "which is then that class's dedicated pool"
            )
        slots = self.workers.count * self.workers.instances
        for name, c in self.traffic.classes.items():
            if c.max_instances is not None and c.max_instances > slots:
                raise ValueError(
                    f"traffic.classes.{name}.max_instances ({c.max_instances}) exceeds the shared pool's "
                    f"{slots} model instances"
                )
        return self

    @model_validator(mode="after")
    def _llm_complete(self) -> Scenario:
        b, w, t = self.batching, self.workers, self.traffic
        if not isinstance(b, ContinuousBatching):
            if self.router.balancing in STATEFUL:
                raise ValueError(
                    f"router.balancing {self.router.balancing} reads LLM replicas' state: "
                    "it needs batching.kind continuous"
                )
            if self.sla.ttft_ms is not None or self.sla.tpot_ms is not None:
                raise ValueError("sla.ttft_ms and sla.tpot_ms judge LLM requests: they need batching.kind continuous")
            if t.tokens is not None:
                raise ValueError("traffic.tokens describes LLM requests: it needs batching.kind continuous")
            if w.autoscaler is not None and w.autoscaler.metric == "ttft_ms":
                raise ValueError(
                    "workers.autoscaler.metric ttft_ms reads LLM replicas' first tokens: it needs batching.kind "
                    "continuous (p99_ms is a batch queue's latency)"
                )
            if w.service_time is None:
                raise ValueError("workers.service_time is required (how long a batch takes on a worker)")
            if w.mix:
                raise ValueError("workers.mix is for LLM replicas (batching.kind continuous) yet")
            return self
        if t.tokens is None:
            raise ValueError("batching.kind continuous serves tokens: traffic.tokens gives their lengths")
        if w.service_time is not None:
            raise ValueError("workers.service_time is a batch time; an LLM engine has batching.step_time instead")
        reasons = [
            (bool(t.classes), "traffic.classes"),
            (self.router.canary is not None or self.router.shadow is not None, "router.canary and router.shadow"),
            (self.preprocess.event_loop is not None, "preprocess.event_loop"),
            (self.preprocess.relay is not None, "preprocess.relay"),
            (w.failures is not None, "workers.failures"),
            (self.router.activator is not None, "router.activator"),
            *(
                reason
                for name, a in b.autoscalers(w)
                if a is not None
                for reason in (
                    (a.metric == "p99_ms", f"{name}.metric p99_ms"),
                    (a.scrape_delay_s > 0, f"{name}.scrape_delay_s"),
                    (a.min_replicas < 1, f"{name}.min_replicas 0"),
                )
            ),
            (self.router.balancing == "shared", "router.balancing shared (the router picks a replica)"),
            (w.instances > 1, "workers.instances above 1 (a worker is one replica)"),
        ]
        found = [why for cond, why in reasons if cond]
        if found:
            raise ValueError(f"batching.kind continuous does not combine with {', '.join(found)} yet")
        if w.mix:
            from simulator.scenario.llm import LinearStep, gpu_spec

            if isinstance(b.step_time, LinearStep):
                raise ValueError(
                    "workers.mix: batching.step_time is fitted on one GPU; a mixed fleet steps by each GPU's "
                    "roofline (drop step_time)"
                )
            for gpu in w.mix:
                try:
                    gpu_spec(gpu)
                except ValueError:
                    raise ValueError(f"workers.mix.{gpu}: no GPU preset for {gpu!r}") from None
        d = b.disaggregation
        if d is not None:
            if d.prefill_replicas >= w.count:
                raise ValueError(
                    f"batching.disaggregation.prefill_replicas ({d.prefill_replicas}) leaves no decode replica "
                    f"of workers.count {w.count}"
                )
            if w.autoscaler is not None:
                raise ValueError(
                    "workers.autoscaler: prefill and decode apart, each pool scales on its own: "
                    "use batching.disaggregation.decode_autoscaler (and prefill_autoscaler)"
                )
            starts = (d.prefill_replicas, w.count - d.prefill_replicas)
            for (name, a), start, pool in zip(b.autoscalers(w), starts, ("prefill", "decode"), strict=True):
                if a is not None and start > a.max_replicas:
                    raise ValueError(
                        f"{name}.max_replicas ({a.max_replicas}) is under the {start} {pool} replicas "
                        "the fleet starts with"
                    )
        blocks = min(b.blocks(gpu) for gpu in (w.instance_type, *w.mix))  # the smallest replica's
        if b.max_num_seqs > blocks:
            raise ValueError(
                f"batching.max_num_seqs ({b.max_num_seqs}) exceeds the {blocks} KV blocks of a replica: "
                "every running sequence holds at least one block"
            )
        if t.tokens.from_trace:
            if t.arrivals_file is None:
                raise ValueError("traffic.tokens.from_trace replays traffic.arrivals_file: give the trace there")
            return self  # the trace's lengths are checked once it is read (the loader)
        prompt, output = t.tokens.lengths()
        room = blocks * b.block_size
        for name, lengths in (("prompt", prompt), ("output", output)):
            if math.isinf(lengths.upper):
                raise ValueError(
                    f"traffic.tokens.{name} has no max: a draw could exceed the KV cache "
                    f"({room} tokens); set traffic.tokens.{name}.max"
                )
        prefix = t.tokens.prefix.tokens if t.tokens.prefix is not None else 0
        longest = prompt.upper + prefix + output.upper  # a request's prompt and answer, at most
        longest_prompt = prompt.upper + prefix
        sessions = t.tokens.sessions
        if sessions is not None:
            if sessions.max_context_tokens is not None:
                if longest > sessions.max_context_tokens:
                    raise ValueError(
                        f"traffic.tokens.sessions.max_context_tokens ({sessions.max_context_tokens}) is below a "
                        f"first turn's prompt and answer ({longest:.0f} tokens at most)"
                    )
                longest = sessions.max_context_tokens
                longest_prompt = longest - output.min
                grown = f"max_context_tokens ({longest})"
            else:  # every turn carries the ones before it
                longest = prefix + sessions.turns.upper * (prompt.upper + output.upper)
                longest_prompt = longest - output.upper
                grown = f"a session of {sessions.turns.upper:.0f} turns ({longest:.0f} tokens)"
            if longest > room:
                raise ValueError(
                    f"traffic.tokens.sessions: {grown} is more than the KV cache of a replica holds "
                    f"({blocks} blocks of {b.block_size} = {room} tokens); set a smaller "
                    "traffic.tokens.sessions.max_context_tokens"
                )
        if longest > room:
            raise ValueError(
                f"traffic.tokens.prompt: a prompt of {longest_prompt:.0f} and an answer of "
                f"{output.upper:.0f} tokens can never fit the KV cache of a replica "
                f"({blocks} blocks of {b.block_size} = {room} tokens)"
            )
        if b.policy == "prefill_first" and longest_prompt > b.max_num_batched_tokens:
            raise ValueError(
                f"batching.max_num_batched_tokens ({b.max_num_batched_tokens}) is below the longest prompt "
                f"({longest_prompt:.0f}): prefill_first prefills whole prompts"
            )
        if sessions is not None and t.arrivals_file is not None:
            raise ValueError("traffic.tokens.sessions start as a Poisson process: drop traffic.arrivals_file")
        if sessions is not None and sessions.instant():  # every answer must take a step's time at least
            failing = self.features.lookups_per_request > 0 and self.features.on_timeout == "fail"
            for on, what in ((self.caches.result is not None, "caches.result"), (failing, "features.on_timeout fail")):
                if on:
                    raise ValueError(
                        f"traffic.tokens.sessions.turn_gap can be 0 ms, and {what} answers without a replica's "
                        f"step, as soon as it likes: a user could send again at the same instant; give turn_gap a "
                        f"think time above 0, or drop {what}"
                    )
        return self

    @model_validator(mode="after")
    def _event_loop_supported(self) -> Scenario:
        if self.preprocess.event_loop is None and self.preprocess.relay is None:
            return self
        reasons = [
            (self.workers.dynamic, "workers.autoscaler and workers.failures"),
            (bool(self.traffic.classes), "traffic.classes"),
            (self.router.canary is not None or self.router.shadow is not None, "router.canary and router.shadow"),
            (self.workers.count > 1 and self.router.balancing != "shared", "a batch queue per worker"),
            (self.batching.timeout_ms is not None or self.batching.deadline_ms is not None,
             "batching.timeout_ms and deadline_ms"),
        ]  # fmt: skip
        found = [why for cond, why in reasons if cond]
        name = "preprocess.event_loop" if self.preprocess.event_loop is not None else "preprocess.relay"
        if found:
            raise ValueError(
                f"{name} models front ends feeding one batch queue; it does not combine with {', '.join(found)} yet"
            )
        if self.preprocess.event_loop is None:
            return self
        f = self.features
        if self.preprocess.event_loop.resume_ms is not None:
            awaits = [
                (f.lookups_per_request == 0, "features.lookups_per_request above 0 (a fetch to await)"),
                (f.store is not None, "no features.store (the loop is the station)"),
                (f.on_timeout == "fail", "features.on_timeout: default (a failed fetch leaves its handler)"),
            ]  # fmt: skip
            need = [why for cond, why in awaits if cond]
            if need:
                raise ValueError(
                    f"preprocess.event_loop.resume_ms awaits the feature fetch: it needs {'; '.join(need)}"
                )
        if self.preprocess.event_loop.reads_first and self.preprocess.event_loop.resume_ms is None:
            raise ValueError(
                "preprocess.event_loop.reads_first puts reads before the resumptions of awaited fetches: "
                "it needs preprocess.event_loop.resume_ms (a handler that awaits its fetch)"
            )
        if self.preprocess.event_loop.reads_first_ms is not None and not self.preprocess.event_loop.reads_first:
            raise ValueError(
                "preprocess.event_loop.reads_first_ms bounds how long reads go before a resumption: "
                "it needs preprocess.event_loop.reads_first: true"
            )
        if self.preprocess.event_loop.timer_late is not None and self.batching.max_queue_delay_ms <= 0:
            raise ValueError(
                "preprocess.event_loop.timer_late delays the batching window's timer: it needs a window "
                "(batching.max_queue_delay_ms above 0; without one a batch goes at once, with no timer)"
            )
        return self

    @model_validator(mode="after")
    def _window_inside(self) -> Scenario:
        delay = self.batching.max_queue_delay_ms
        if delay >= self.duration_s * 1000:
            raise ValueError(
                f"batching.max_queue_delay_ms ({delay:g}) is not shorter than the run ({self.duration_s:g} s): "
                "a batching window is milliseconds (Triton's default is 0)"
            )
        return self

    @model_validator(mode="after")
    def _warmup_inside(self) -> Scenario:
        if self.warmup_s >= self.duration_s:
            raise ValueError(f"warmup_s ({self.warmup_s:g}) must be smaller than duration_s ({self.duration_s:g})")
        return self


def _catalog_or_problem(path: str | None) -> Catalog | str:
    try:
        return load_catalog(path)
    except (OSError, ValueError, yaml.YAMLError) as err:
        return f"cost.catalog: cannot read {path}: {err}"


def least_answer_ms(s: Scenario) -> float:
    """The shortest answer an LLM fleet can give, ms: the fewest output tokens, each made
    by a step of its own, every step at least :meth:`ContinuousBatching.least_step_ms` on
    the fleet's fastest GPU type (0 for a fleet that is not an LLM one)."""
    b, t = s.batching, s.traffic.tokens
    if getattr(b, "kind", None) != "continuous" or t is None or t.from_trace:
        return 0.0
    fewest = max(t.lengths()[1].lower, 1.0)
    return fewest * min(b.least_step_ms(gpu) for gpu in (s.workers.instance_type, *s.workers.mix))


def expected_requests(s: Scenario) -> float:
    """An upper estimate of the arrivals: each source at its peak rate for the whole run."""
    if s.traffic.classes:
        return sum(rate_bound(c.shape, c.rate_rps) * s.duration_s for c in s.traffic.classes.values())
    if s.traffic.arrivals_file is not None:
        try:  # replayed timestamps: about one per line
            with open(s.traffic.arrivals_file, "rb") as f:
                return float(sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b"")) + 1)
        except OSError:
            return 0.0
    if s.traffic.users is not None:  # a think time and an answer apart each, on average
        return s.traffic.tokens.sessions.users_rps(least_answer_ms(s)) * s.duration_s
    return rate_bound(s.traffic.shape, s.traffic.rate_rps) * s.duration_s


__all__ = [
    "SLA",
    "Activator",
    "Affine",
    "Batching",
    "Cache",
    "Caches",
    "ColdStart",
    "Cost",
    "Crash",
    "Deterministic",
    "Empirical",
    "Episodes",
    "Exponential",
    "Failures",
    "Features",
    "Gamma",
    "KVStore",
    "LogAR1Component",
    "LogAR1Speed",
    "LogNormal",
    "MarkovSpeed",
    "Napkin",
    "Network",
    "Platform",
    "Postprocess",
    "PredictionLog",
    "Preprocess",
    "Router",
    "Scenario",
    "ServiceTime",
    "Slowdown",
    "SpeedTrace",
    "Table",
    "Traffic",
    "TrafficClass",
    "TritonBatching",
    "Uniform",
    "Window",
    "Workers",
    "expected_requests",
    "least_answer_ms",
]
