"""A host's speed as a time change: when work started at t on a slowed station is done.

A path is piecewise constant: factor ``f[k]`` from ``t[k]`` to ``t[k+1]`` (the last
forever). A station at factor f does 1/f ms of work per ms, so the work done by time t is
W(t) = ∫ dt / f, piecewise linear and increasing, and work ``w`` started at ``s`` is
done at W⁻¹(W(s) + w): exact for a factor that changes in the middle of a batch.

Because W is increasing, an FCFS station (one server or many) under a speed path is the
same station at constant speed in W's clock: map arrivals through W (:meth:`SpeedPath.work`),
run the ordinary recursion with the nominal service times, map the ends back
(:meth:`SpeedPath.time`).
Batch queues keep their windows in real time and ask :meth:`SpeedPath.finish` per batch
(:mod:`simulator.serving.compiled` passes the arrays to its compiled loop).

:class:`SpeedProcess` draws the paths of a scenario's ``platform.speed`` from one stream:
one path for the host, or one per worker with ``scope: worker``.
"""

from __future__ import annotations

import math
from bisect import bisect_right

import numpy as np

from simulator.rng import child
from simulator.scenario.platform import LogAR1Speed, MarkovSpeed, Speed, SpeedTrace

TAIL_MS = 60_000.0  # paths are drawn this far past the last arrival; the last factor holds after


class SpeedPath:
    """A piecewise-constant factor: ``times`` (ms, from 0, increasing) and ``factors``."""

    def __init__(self, times: np.ndarray, factors: np.ndarray):
        self.t = np.ascontiguousarray(times, dtype=float)
        self.f = np.ascontiguousarray(factors, dtype=float)
        if len(self.t) == 0 or self.t[0] != 0.0 or len(self.t) != len(self.f):
            raise ValueError("a speed path starts at 0 with one factor per breakpoint")
        self.w = np.concatenate([[0.0], np.cumsum(np.diff(self.t) / self.f[:-1])])  # W at each breakpoint
        self._views: tuple[memoryview, memoryview, memoryview] | None = None  # finish_at's, on first use

    def scaled(self, elasticity: float) -> SpeedPath | None:
        """The path each factor of which is raised to ``elasticity`` (None for 0: no effect)."""
        if elasticity == 0:
            return None
        return self if elasticity == 1 else SpeedPath(self.t, self.f**elasticity)

    def work(self, t: np.ndarray) -> np.ndarray:
        """W(t): the nominal work a station does from 0 to ``t`` (ms)."""
        t = np.asarray(t, dtype=float)
        k = np.clip(np.searchsorted(self.t, t, side="right") - 1, 0, None)
        return self.w[k] + (t - self.t[k]) / self.f[k]

    def time(self, w: np.ndarray) -> np.ndarray:
        """W⁻¹(w): when the station has done ``w`` ms of nominal work."""
        w = np.asarray(w, dtype=float)
        k = np.clip(np.searchsorted(self.w, w, side="right") - 1, 0, None)
        return self.t[k] + (w - self.w[k]) * self.f[k]

    def finish(self, start, work):
        """When ``work`` ms of nominal work started at ``start`` (ms) is done."""
        return self.time(self.work(start) + work)

    def finish_at(self, start: float, work: float) -> float:
        """:meth:`finish` for one step, in plain floats: an engine's loop asks it once a
        step, where numpy's cost a call was most of a simulation. The same operations in
        the same order as the arrays', so the same bits; read through memoryviews of the
        arrays (an element a Python float), so a path costs no memory twice."""
        if self._views is None:
            self._views = (memoryview(self.t), memoryview(self.w), memoryview(self.f))
        t, w, f = self._views
        k = max(bisect_right(t, start) - 1, 0)
        done = w[k] + (start - t[k]) / f[k] + work
        j = max(bisect_right(w, done) - 1, 0)
        return t[j] + (done - w[j]) * f[j]

    def times(self, other: SpeedPath) -> SpeedPath:
        """The product of two paths (breakpoints of both)."""
        t = np.union1d(self.t, other.t)
        return SpeedPath(t, self.factor_at(t) * other.factor_at(t))

    def factor_at(self, t: np.ndarray) -> np.ndarray:
        """The factor in force at each time ``t``."""
        return self.f[np.clip(np.searchsorted(self.t, np.asarray(t, dtype=float), side="right") - 1, 0, None)]


def _log_ar1(cfg: LogAR1Speed, horizon_ms: float, rng: np.random.Generator) -> SpeedPath:
    n = math.ceil(horizon_ms / cfg.step_ms) + 1
    total = np.zeros(n)
    var = 0.0
    for c in cfg.components:
        a = math.exp(-cfg.step_ms / (c.correlation_time_s * 1000.0))
        eps = rng.standard_normal(n) * c.sigma
        eps[1:] *= math.sqrt(1.0 - a * a)  # the first draw is stationary
        x = _ar1(eps, a)
        total += x
        var += c.sigma**2
    path = SpeedPath(np.arange(n) * cfg.step_ms, np.exp(total - var / 2.0))
    if cfg.episodes is None:
        return path
    e = cfg.episodes
    on_off = _markov(MarkovSpeed(factors=(1.0, e.factor), mean_holding_s=(e.mean_interval_s, e.mean_duration_s)),
                     horizon_ms, child(rng, 1))  # fmt: skip
    return path.times(on_off)


def _ar1(eps: np.ndarray, a: float) -> np.ndarray:
    """x[0] = eps[0], x[k] = a x[k-1] + eps[k] (scipy's lfilter: a linear recursion in C)."""
    from scipy.signal import lfilter  # 53 ms of imports that only a log-AR(1) run needs

    return lfilter([1.0], [1.0, -a], eps)


def _markov(cfg: MarkovSpeed, horizon_ms: float, rng: np.random.Generator) -> SpeedPath:
    f = np.asarray(cfg.factors, dtype=float)
    hold = np.asarray(cfg.mean_holding_s, dtype=float) * 1000.0
    k = len(f)
    share = hold / hold.sum()  # a uniform jump chain spends time in proportion to the mean holds
    state = int(rng.choice(k, p=share))  # start in the stationary distribution
    times, states, t = [0.0], [state], 0.0
    while t < horizon_ms:
        t += rng.exponential(hold[state])
        state = (state + 1 + int(rng.integers(k - 1))) % k
        times.append(t)
        states.append(state)
    return SpeedPath(np.asarray(times), f[np.asarray(states)])


def _trace(cfg: SpeedTrace, horizon_ms: float) -> SpeedPath:
    n = math.ceil(horizon_ms / cfg.step_ms) + 1
    f = np.resize(np.asarray(cfg.factors, dtype=float), n)
    return SpeedPath(np.arange(n) * cfg.step_ms, f)


def draw_path(cfg: Speed, horizon_ms: float, rng: np.random.Generator) -> SpeedPath:
    """One path of ``cfg`` from 0 to at least ``horizon_ms``."""
    match cfg:
        case LogAR1Speed():
            return _log_ar1(cfg, horizon_ms, rng)
        case MarkovSpeed():
            return _markov(cfg, horizon_ms, rng)
        case SpeedTrace():
            return _trace(cfg, horizon_ms)


class SpeedProcess:
    """A scenario's ``platform.speed``, its paths drawn lazily from ``rng``'s children:
    child 0 is the host's (or, with ``scope: worker``, the front end's), child ``k + 1``
    the ``k``-th batch queue's."""

    def __init__(self, cfg: Speed, duration_ms: float, rng: np.random.Generator):
        self.cfg = cfg
        self._horizon = duration_ms + TAIL_MS
        self._rng = rng
        self._paths: dict[tuple[int, float], SpeedPath | None] = {}

    def _path(self, k: int, elasticity: float) -> SpeedPath | None:
        """Path ``k`` raised to ``elasticity``, drawn and scaled once (a fleet's queues
        share the host's)."""
        if (k, 1.0) not in self._paths:
            self._paths[k, 1.0] = draw_path(self.cfg, self._horizon, child(self._rng, k))
        if (k, elasticity) not in self._paths:
            self._paths[k, elasticity] = self._paths[k, 1.0].scaled(elasticity)
        return self._paths[k, elasticity]

    @property
    def frontend(self) -> SpeedPath | None:
        """The front end's path, its factors raised to ``frontend_elasticity``."""
        return self._path(0, self.cfg.frontend_elasticity)

    def worker(self, k: int) -> SpeedPath | None:
        """The ``k``-th batch queue's path, raised to ``workers_elasticity``."""
        return self._path(0 if self.cfg.scope == "host" else k + 1, self.cfg.workers_elasticity)
