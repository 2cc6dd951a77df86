"""The simulator's side of an LLM calibration (:mod:`calibrate.llm_run`): the calibrated
scenario, and the same designs as the engine was measured in, simulated.

:func:`scenario_dict` writes the scenario a fit gives (the tiny engine on the machine that
ran it, its step time, its noise and the host's speed process); :func:`simulated` runs a
level's design (rounds of short slices, each started empty, its first seconds left out,
pooled) over replications; :func:`simulated_knee` and :func:`saturated_rate` run the
knee's (an overload slice's completions a second); :func:`at_speed` moves a fit to another
host speed. Nothing here measures: the engine's side is :mod:`calibrate.llm_run`'s.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from calibrate import llm_profile
from calibrate.speed import window_var
from simulator.scenario.config import Scenario
from simulator.scenario.llm import Roofline, step_kind

KNEE_SKIP_S = 10.0  # an overload slice's completions are counted from here on: by then the engine is full
QUANTILES = (50, 90, 99)
WORKLOAD = {
    "prompt": {"mean": 256, "cv": 0.6, "min": 8, "max": 1024},
    "output": {"mean": 64, "cv": 0.6, "min": 2, "max": 256},
}


def scenario_dict(
    fit: dict, engine: dict, *, rate_rps: float, duration_s: float, warmup_s: float, instance: str = "cpu"
) -> dict:
    """The calibrated scenario: the tiny engine on the machine that ran it (one replica of
    ``instance``: ``cpu``, priced here, or a GPU the catalog prices), its fitted step time
    and noise, the workload's lengths."""
    coef = {k: round(fit[k], 9) for k in llm_profile.COEFFICIENTS}
    if fit.get("decode_threshold") is not None:
        coef["decode_threshold"] = int(fit["decode_threshold"])
        coef["decode_ms_per_seq_above"] = round(fit["decode_ms_per_seq_above"], 9)
    if any(fit.get("wake_ms") or []):
        coef["wake_ms"] = [round(w, 6) for w in fit["wake_ms"]]
    return {
        "name": "calibrated_tiny_llm",
        "description": "servesim serve-llm on this machine, calibrated by servesim calibrate llm",
        "seed": 1,
        "duration_s": float(duration_s),
        "warmup_s": float(warmup_s),
        "sla": {"percentile": 99, "target_ms": 60000, "ttft_ms": 300, "tpot_ms": 50},
        "traffic": {"rate_rps": round(float(rate_rps), 4), "tokens": WORKLOAD},
        "network": {"client_to_api": {"kind": "deterministic", "value_ms": round(fit.get("overhead_ms", 0.0), 4)}},
        "router": {"balancing": "round_robin"},
        "batching": {
            "kind": "continuous",
            "policy": "continuous",
            "model": "servesim-tiny",
            **engine,
            "enable_prefix_caching": True,
            "step_time": {"kind": "linear", **coef},
            "noise_cv": round(fit["noise_cv"], 4),
        },
        "workers": {"count": 1, "instance_type": instance},
        "cost": {"price_per_hour_usd": 0.1} if instance == "cpu" else {},
        **({"platform": {"speed": fit["speed"]}} if fit.get("speed") else {}),
    }


def at_rate(doc: dict, rate_rps: float, duration_s: float, warmup_s: float) -> dict:
    """The scenario ``doc`` at another rate and length."""
    traffic = {**doc["traffic"], "rate_rps": float(rate_rps)}
    return {**doc, "traffic": traffic, "duration_s": float(duration_s), "warmup_s": float(warmup_s)}


def slice_latencies(s, seed: int, slice_s: float, warmup_s: float) -> tuple[np.ndarray, np.ndarray]:
    """One simulated slice of the validated scenario ``s`` (``slice_s`` long, started empty):
    the TTFT and TPOT (ms) of the requests that arrived after its first ``warmup_s``, as the
    client sees them (the simulator's own definitions)."""
    from simulator import simulate
    from simulator.results.tokens import tpot_ms, ttft_ms

    r = simulate(s, seed=seed).records
    keep = (r.arrival >= warmup_s * 1000.0) & (r.arrival < slice_s * 1000.0) & np.isfinite(r.t_response)
    per_token = tpot_ms(r)[keep]
    return ttft_ms(r)[keep], per_token[np.isfinite(per_token)]


def pooled_percentiles(slices: list[tuple[np.ndarray, np.ndarray]]) -> dict:
    """TTFT and TPOT percentiles (ms) of slices pooled, as a level's are measured."""
    row = {}
    for k, name in enumerate(("ttft", "tpot")):
        v = np.concatenate([sl[k] for sl in slices])
        for q in QUANTILES:
            row[f"{name}_p{q}_ms"] = float(np.percentile(v, q)) if len(v) else np.nan
    return row


def simulated(
    doc: dict | list[dict],
    rate_rps: float | list[float],
    slice_s: float,
    warmup_s: float,
    seeds: range,
    rounds: int = 1,
) -> pd.DataFrame:
    """The simulator's percentiles (ms) of the measured design: a slice of ``slice_s`` a
    round, each started empty with its first ``warmup_s`` left out, pooled; one row per
    replication. ``rate_rps``: each round's rate (a list), or one rate for ``rounds``;
    ``doc``: the scenario, or each round's (a list as long as the rounds)."""
    rates = [float(rate_rps)] * rounds if np.isscalar(rate_rps) else list(rate_rps)
    docs = list(doc) if isinstance(doc, list) else [doc] * len(rates)
    if len(docs) != len(rates):
        raise ValueError(f"{len(docs)} scenarios for {len(rates)} rounds")
    loaded = [Scenario.model_validate(at_rate(d, rate, slice_s, warmup_s)) for d, rate in zip(docs, rates, strict=True)]
    rows = []
    for seed in seeds:
        slices = [slice_latencies(sc, seed * 1000 + k, slice_s, warmup_s) for k, sc in enumerate(loaded)]
        rows.append({"seed": seed, **pooled_percentiles(slices)})
    return pd.DataFrame(rows)


def at_speed(fit: dict, log_speed: float, window_s: float | None = None) -> dict:
    """The step time ``fit`` on a host ``exp(log_speed)`` times as slow: every coefficient
    (the fixed cost, the per-token and per-sequence rates, the wake costs) scaled, the
    request's own overhead left as it is. With ``window_s``, ``log_speed`` is the host's
    mean over a window that long, so the speed process keeps only its variation within
    such a window: each component's variance less that of its window mean (a ten-minute
    drift: a trace; a component much faster than the window: nearly all)."""
    k = float(np.exp(log_speed))
    out = {**fit, **{c: fit[c] * k for c in llm_profile.COEFFICIENTS}}
    if fit.get("decode_threshold") is not None:
        out["decode_ms_per_seq_above"] = fit["decode_ms_per_seq_above"] * k
    if fit.get("wake_ms"):
        out["wake_ms"] = [w * k for w in fit["wake_ms"]]
    if window_s is not None and fit.get("speed"):
        parts = []
        for c in fit["speed"]["components"]:
            left = c["sigma"] ** 2 - window_var(c["sigma"], c["correlation_time_s"], window_s)
            if left > 1e-8:
                parts.append({**c, "sigma": float(np.sqrt(left))})
        out["speed"] = {**fit["speed"], "components": parts} if parts else None
    return out


def knee_slice(s, seed: int, duration_s: float, skip_s: float) -> float:
    """Completions a second of one simulated overload slice of the validated scenario ``s``
    (run three times ``duration_s``, so the backlog drains): of the requests that arrived
    in its first ``duration_s``, those done between ``skip_s`` and ``duration_s``."""
    from simulator import simulate

    r = simulate(s, seed=seed).records
    done = r.t_response[r.arrival < duration_s * 1000.0]
    return np.count_nonzero((done >= skip_s * 1000.0) & (done < duration_s * 1000.0)) / (duration_s - skip_s)


def simulated_knee(doc: dict, rate_rps: float, duration_s: float, skip_s: float, seeds: range) -> float:
    """Completions a second the simulator gives in the knee's design (offered ``rate_rps``,
    counted from ``skip_s`` to ``duration_s``), the median over seeds."""
    s = Scenario.model_validate(at_rate(doc, rate_rps, duration_s * 3, 0.0))  # long enough for the backlog to drain
    return float(np.median([knee_slice(s, seed, duration_s, skip_s) for seed in seeds]))


def saturated_rate(doc: dict, knee_s: float, start_rps: float = 50.0) -> float:
    """What the scenario ``doc`` completes a second when overloaded (the knee's design): offered
    ``start_rps``, doubled until it completes less than 80% of what it is offered (a fast
    engine, a GPU's, takes far more than a CPU's 20-30 req/s)."""
    rate = start_rps
    for _ in range(12):
        done = simulated_knee(doc, rate, knee_s, KNEE_SKIP_S, range(1, 4))
        if done < 0.8 * rate:
            return done
        rate *= 2.0
    raise ValueError(f"the step-time fit takes over {rate / 2:.0f} req/s: is the profile's fit degenerate?")


def scaled_step_time(step: dict, factor: float) -> dict:
    """An LLM scenario's ``batching.step_time`` (parsed YAML) run ``factor`` times slower:
    a linear model's coefficients times it; a roofline's overhead times it, its shares of
    the datasheet's peaks over it (at most all of it). ValueError for another kind."""
    kind = step_kind(step)
    if kind == "linear":
        out = dict(step)
        for k in (
            "c0_ms",
            "prefill_ms_per_token",
            "attention_ms_per_token2",
            "decode_ms_per_seq",
            "kv_ms_per_token",
            "decode_ms_per_seq_above",
        ):
            if k in out:
                out[k] = out[k] * factor
        return out
    if kind == "roofline":
        defaults = Roofline()
        out = {**step, "kind": "roofline", "overhead_ms": step.get("overhead_ms", defaults.overhead_ms) * factor}
        for k in ("mfu", "mbu"):  # a share of the datasheet's peak: at most all of it
            out[k] = min(step.get(k, getattr(defaults, k)) / factor, 1.0)
        return out
    raise ValueError(f"batching.step_time kind {kind!r} cannot be scaled (linear or roofline)")
