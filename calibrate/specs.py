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


def table_to(st: dict, max_batch: int, per_item_ms: float | None) -> dict:
    """A batch table that stops short of ``max_batch``, carried to it from its largest size
    at ``per_item_ms`` a request (the line fitted through every batch), so that the
    simulator's extrapolation past the table follows that line, not the table's last
    segment: a last size measured on few batches, in a jam, made one ranker's model run away
    (calibrate/README, "Three fresh runs with the fit"). Anything else, unchanged."""
    if st.get("kind") != "table" or per_item_ms is None or per_item_ms < 0:
        return st
    sizes = {int(k): float(v) for k, v in st["batch_ms"].items()}
    last = max(sizes)
    if last >= max_batch:
        return st
    key = type(next(iter(st["batch_ms"])))(max_batch)  # as the table's own keys are (a file's: strings)
    return {**st, "batch_ms": {**st["batch_ms"], key: round(sizes[last] + per_item_ms * (max_batch - last), 4)}}


def shifted_batch_time(st: dict, ms: float) -> dict:
    """A batch-time model (table or affine) with ``ms`` added to every batch size's time
    (never below 1% of it)."""
    out = dict(st)
    if st["kind"] == "table":
        out["batch_ms"] = {k: max(v + ms, 0.01 * v) for k, v in st["batch_ms"].items()}
    else:
        out["base_ms"] = max(st["base_ms"] + ms, 0.01 * st["base_ms"])
    return out
