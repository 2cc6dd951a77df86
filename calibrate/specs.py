"""A profile's fitted times as the scenario's specs: a distribution's mean, a distribution
or a batch-time model (a table by batch size, or affine) with its times scaled or
shifted. :mod:`calibrate.scenario` writes them; the replays and intervals scale them."""

from __future__ import annotations


def dist(spec: dict) -> dict:
    """A fitted distribution as the scenario takes it: without the fit's quality."""
    return {k: v for k, v in spec.items() if k != "fit"}


def scaled(spec: dict, factor: float) -> dict:
    """A distribution spec with every time in it (``*_ms``, samples included) times ``factor``."""
    if factor == 1.0:
        return spec
    out = dict(spec)
    for k, v in spec.items():
        if k.endswith("_ms") and isinstance(v, int | float):
            out[k] = v * factor
        elif k == "samples_ms":
            out[k] = [x * factor for x in v]
    return out


def spec_mean(spec: dict) -> float:
    """A fitted distribution's mean, ms (:func:`calibrate.fit.fit_distribution`'s kinds:
    empirical, its samples'; the others, their ``mean_ms``)."""
    if spec["kind"] == "empirical":
        return float(sum(spec["samples_ms"]) / len(spec["samples_ms"]))
    return float(spec["mean_ms"])


def scaled_batch_time(st: dict, factor: float) -> dict:
    """A batch-time model (table or affine) with its times multiplied by ``factor``."""
    out = dict(st)
    if st["kind"] == "table":
        out["batch_ms"] = {k: v * factor for k, v in st["batch_ms"].items()}
    else:
        out["base_ms"], out["per_item_ms"] = st["base_ms"] * factor, st["per_item_ms"] * factor
    return out


def shifted_batch_time(st: dict, ms: float) -> dict:
    """A batch-time model (table or affine) with ``ms`` added to every batch size's time
    (never below 1% of it)."""
    out = dict(st)
    if st["kind"] == "table":
        out["batch_ms"] = {k: max(v + ms, 0.01 * v) for k, v in st["batch_ms"].items()}
    else:
        out["base_ms"] = max(st["base_ms"] + ms, 0.01 * st["base_ms"])
    return out
