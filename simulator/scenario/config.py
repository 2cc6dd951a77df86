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
from simulator.scenario.rules import event_loop_rules, llm_rules
from simulator.scenario.servicetime import Affine, ServiceTime, Table
from simulator.scenario.shapes import rate_bound
from simulator.scenario.traffic import SLA, Traffic, TrafficClass


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
        llm_rules(self)
        return self

    @model_validator(mode="after")
    def _event_loop_supported(self) -> Scenario:
        event_loop_rules(self)
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
