"""The platform a server runs on: a host's speed as a random process.

A shared VM, a noisy neighbour, thermal or power throttling, a garbage collector: the
same work takes longer for a while, on every process of the host at once. ``platform.speed``
is that multiplier on service times, a random process of time shared by the stations of
one host (the front end's CPU and the model instances). A station works at rate
1 / factor(t): a batch of 10 ms of work that starts as the factor goes from 1 to 2
halfway through takes 15 ms (:mod:`simulator.stages.speed`).

Kinds (``kind``):

* ``log_ar1``: log factor = a sum of stationary Gaussian AR(1) components (an
  Ornstein–Uhlenbeck process sampled every ``step_ms``), each with its standard deviation
  and correlation time, the factor normalised to mean one: slow drifts of seconds beside
  fast wobbles of a fraction of a second, as fitted by ``servesim calibrate``; optionally
  times rare ``episodes`` (an on/off Markov slowdown), which a quiet host's occasional
  stalls need and a Gaussian wobble cannot make;
* ``markov``: a Markov-modulated factor: the host holds each factor for an exponential
  time with its mean, then jumps to another (two states: on/off throttling);
* ``trace``: measured factors, one per ``step_ms``, repeated after the last.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from simulator.scenario.frozen import Frozen


class _Speed(Frozen):
    frontend_elasticity: float = Field(
        1.0,
        ge=0,
        le=3,
        description=(
            "How the front end's CPU work (the preprocess station, a feature store's threads) follows the factor: "
            "its times scale by factor ** elasticity (0: unaffected)."
        ),
    )
    workers_elasticity: float = Field(
        1.0, ge=0, le=3, description="How the model instances' batch times follow the factor (factor ** elasticity)."
    )
    scope: Literal["host", "worker"] = Field(
        "host",
        description=(
            "host: one process shared by every station (one machine, or a fleet-wide slowdown); worker: each "
            "fixed pool's batch queue draws its own, the front end its own."
        ),
    )


class LogAR1Component(Frozen):
    """One AR(1) component of the log factor."""

    sigma: float = Field(gt=0, le=2, description="Standard deviation of this component of the log factor.")
    correlation_time_s: float = Field(gt=0, description="Its autocorrelation falls by e over this time, s.")


class Episodes(Frozen):
    """Rare slow episodes on top of the wobble: the host is slowed by ``factor`` for an
    exponential time of mean ``mean_duration_s``, every ``mean_interval_s`` on average (an
    on/off Markov process)."""

    factor: float = Field(gt=0, description="The multiplier during an episode (1.5: 50% slower).")
    mean_duration_s: float = Field(gt=0, description="Mean length of an episode, s.")
    mean_interval_s: float = Field(gt=0, description="Mean time between episodes (from the end of one), s.")

    def mean(self, elasticity: float = 1.0) -> float:
        """The time average of the multiplier raised to ``elasticity``: the share of time
        in an episode, ``d / (d + i)``, at ``factor ** elasticity``, the rest at 1."""
        share = self.mean_duration_s / (self.mean_duration_s + self.mean_interval_s)
        return 1.0 + share * (self.factor**elasticity - 1.0)


class LogAR1Speed(_Speed):
    """log factor = the sum of independent stationary AR(1) components, sampled every
    ``step_ms``; the factor exp(log factor − variance / 2) has mean one. With ``episodes``,
    times a rare slowdown that the Gaussian wobble cannot make (a quiet host's stalls)."""

    kind: Literal["log_ar1"] = "log_ar1"
    step_ms: float = Field(10.0, gt=0, description="The factor holds for this long between samples, ms.")
    components: tuple[LogAR1Component, ...] = Field(
        min_length=1, max_length=8, description="The components, e.g. a slow one (seconds) and a fast one (0.1 s)."
    )
    episodes: Episodes | None = Field(
        None, description="Rare slow episodes multiplying the wobble (none: no episodes)."
    )

    @model_validator(mode="after")
    def _step_resolves(self) -> LogAR1Speed:
        fastest = min(c.correlation_time_s for c in self.components) * 1000.0
        if self.step_ms > fastest:
            raise ValueError(
                f"step_ms ({self.step_ms:g}) is longer than the fastest component's correlation time "
                f"({fastest:g} ms): it would not be resolved"
            )
        return self


class MarkovSpeed(_Speed):
    """A factor that holds each value for an exponential time of mean ``mean_holding_s``,
    then jumps to one of the others, chosen uniformly."""

    kind: Literal["markov"] = "markov"
    factors: tuple[float, ...] = Field(min_length=2, description="The factors the host switches between.")
    mean_holding_s: tuple[float, ...] = Field(min_length=2, description="Mean time in each factor, s.")

    @model_validator(mode="after")
    def _valid(self) -> MarkovSpeed:
        if len(self.factors) != len(self.mean_holding_s):
            raise ValueError("factors and mean_holding_s must have the same length")
        if min(self.factors) <= 0 or min(self.mean_holding_s) <= 0:
            raise ValueError("factors and mean_holding_s must be > 0")
        return self


class SpeedTrace(_Speed):
    """Measured factors, each holding for ``step_ms``, the trace repeated after its end."""

    kind: Literal["trace"] = "trace"
    step_ms: float = Field(gt=0, description="How long each factor holds, ms.")
    factors: tuple[float, ...] = Field(min_length=1, description="The factors in time order.")

    @model_validator(mode="after")
    def _positive(self) -> SpeedTrace:
        if min(self.factors) <= 0:
            raise ValueError("factors must be > 0")
        return self


Speed = Annotated[LogAR1Speed | MarkovSpeed | SpeedTrace, Field(discriminator="kind")]


class Platform(Frozen):
    """The hosts the stations run on."""

    speed: Speed | None = Field(
        None, description="A random multiplier on service times shared by a host's stations (none: constant speed)."
    )
