"""What a validated scenario names outside itself, read and checked before a run: the files
(empirical samples, rate traces, calibration profiles, replayed arrivals), an LLM trace
against a replica's KV cache, and the batch times rescaled to ``workers.instance_type``
with its price found in ``cost.catalog``.

Each collects ``(path, message)`` pairs for :func:`simulator.scenario.loader.load_scenario`,
which names the YAML line of each; nothing here raises past it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml
from pydantic import BaseModel

from simulator.scenario.catalog import load_catalog
from simulator.scenario.config import Scenario, Traffic
from simulator.scenario.distributions import Empirical, read_numbers
from simulator.scenario.gputypes import on_type
from simulator.scenario.servicetime import ProfileRef
from simulator.scenario.shapes import RateTrace

Path_ = tuple[str | int, ...]


def resolve_files(model: BaseModel, base_dir: Path, path: Path_, errors: list[tuple[Path_, str]]) -> BaseModel:
    """Read the files a validated scenario names; collect (path, message) for failures."""
    if isinstance(model, Empirical | RateTrace) and model.file is not None:
        try:
            return model.resolve_files(base_dir)
        except (OSError, ValueError) as err:
            errors.append(((*path, "file"), file_msg(err)))
            return model
    if isinstance(model, ProfileRef):
        try:
            return model.resolve(base_dir)
        except (OSError, ValueError) as err:
            errors.append(((*path, "path"), file_msg(err)))
            return model
    if isinstance(model, Traffic) and model.arrivals_file is not None:
        target = (base_dir / model.arrivals_file).resolve()
        try:
            read_numbers(target)
        except (OSError, ValueError) as err:
            errors.append(((*path, "arrivals_file"), file_msg(err)))
            return model
        return model.model_copy(update={"arrivals_file": str(target)})
    updates = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            new = resolve_files(value, base_dir, (*path, name), errors)
            if new is not value:
                updates[name] = new
        elif isinstance(value, dict) and any(isinstance(v, BaseModel) for v in value.values()):
            # traffic.classes: each class's service time may name a profile or a file too
            resolved = {
                k: resolve_files(v, base_dir, (*path, name, k), errors) if isinstance(v, BaseModel) else v
                for k, v in value.items()
            }
            if any(resolved[k] is not value[k] for k in value):
                updates[name] = resolved
        elif isinstance(value, tuple) and any(isinstance(v, BaseModel) for v in value):
            items = tuple(
                resolve_files(v, base_dir, (*path, name, i), errors) if isinstance(v, BaseModel) else v
                for i, v in enumerate(value)
            )
            if any(a is not b for a, b in zip(items, value, strict=True)):
                updates[name] = items
    return model.model_copy(update=updates) if updates else model


def file_msg(err: Exception) -> str:
    if isinstance(err, FileNotFoundError):
        return f"file not found: {err.filename}"
    if isinstance(err, OSError):
        return f"cannot read {err.filename}: {err.strerror}"
    return str(err)


def check_trace(scenario: Scenario, errors: list[tuple[Path_, str]]) -> None:
    """An LLM trace (``traffic.tokens.from_trace``): its rows readable, and every request one
    replica's KV cache can hold, before the run."""
    t = scenario.traffic
    if t.tokens is None or not t.tokens.from_trace:
        return
    from simulator.scenario.tokens import read_trace

    try:
        _, prompt, output = read_trace(t.arrivals_file)
    except (OSError, ValueError) as err:
        errors.append((("traffic", "arrivals_file"), file_msg(err)))
        return
    b = scenario.batching
    room = b.blocks(scenario.workers.instance_type) * b.block_size
    prefix = t.tokens.prefix.tokens if t.tokens.prefix is not None else 0
    over = np.flatnonzero(prompt + prefix + output > room)
    if len(over):
        i = int(over[0])
        errors.append(
            (
                ("traffic", "arrivals_file"),
                f"request {i} of the trace: {int(prompt[i])} prompt and {int(output[i])} output tokens can never "
                f"fit the KV cache of a replica ({room} tokens)",
            )
        )
    if b.policy == "prefill_first" and len(prompt) and prompt.max() + prefix > b.max_num_batched_tokens:
        errors.append(
            (
                ("batching", "max_num_batched_tokens"),
                f"{b.max_num_batched_tokens} is below the trace's longest prompt ({int(prompt.max()) + prefix}): "
                "prefill_first prefills whole prompts",
            )
        )


def check_pricing(scenario: Scenario, base_dir: Path, errors: list[tuple[Path_, str]]) -> Scenario:
    """Rescale the batch times to ``workers.instance_type`` where they were measured on
    another type, and check that the type has a price (the scenario resolved it from
    ``cost.catalog``, already a path from the file's folder, when it was validated)."""
    cost = scenario.cost
    w = scenario.workers
    retyped = w.measured_on is not None and w.measured_on != w.instance_type
    if cost.price_per_hour_usd is not None and not retyped:
        return scenario
    try:
        catalog = load_catalog(cost.catalog)
    except (OSError, ValueError, yaml.YAMLError) as err:
        errors.append((("cost", "catalog"), file_msg(err) if isinstance(err, OSError) else f"bad catalog: {err}"))
        return scenario
    if retyped:
        try:
            scenario = on_type(scenario, w.instance_type, catalog)
        except ValueError as err:
            errors.append((("workers", "instance_type"), str(err)))
            return scenario
    if cost.price_per_hour_usd is not None:
        return scenario
    row = catalog.instances.get(scenario.workers.instance_type)
    if row is None:
        known = ", ".join(sorted(catalog.instances))
        errors.append(
            (("workers", "instance_type"), f"{scenario.workers.instance_type!r} is not in the catalog ({known})")
        )
    elif cost.market == "spot" and row.spot_price_per_gpu_hour_usd is None:
        errors.append((("cost", "market"), f"the catalog has no spot price for {scenario.workers.instance_type!r}"))
    return scenario
