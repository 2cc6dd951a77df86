"""Scenario loading: YAML → validated :class:`~simulator.config.Scenario`, with line numbers.

Errors never surface as tracebacks: every problem (bad YAML, a wrong type, an unknown
key, a negative rate, a missing file) becomes a :class:`ScenarioError` whose lines name
the file, the YAML line and the dotted path of the field.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from simulator.catalog import load_catalog
from simulator.config import Scenario, Traffic
from simulator.distributions import Empirical, read_numbers
from simulator.servicetime import ProfileRef
from simulator.shapes import RateTrace


class ScenarioError(Exception):
    """A scenario that cannot be loaded; ``str(err)`` is the message for the user."""


Path_ = tuple[str | int, ...]


def _line_map(node: yaml.Node, path: Path_ = ()) -> dict[Path_, int]:
    """Map every dotted path in a composed YAML document to its 1-based line."""
    lines = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            k = key.value
            lines[(*path, k)] = key.start_mark.line + 1
            for sub, line in _line_map(value, (*path, k)).items():
                lines.setdefault(sub, line)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.update(_line_map(item, (*path, i)))
    return lines


def _dotted(path: Path_) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


def parse_set(expr: str) -> tuple[tuple[str, ...], Any]:
    """Parse ``dotted.path=value``; the value is read as YAML (numbers, lists, strings)."""
    if "=" not in expr:
        raise ScenarioError(f"--set {expr!r}: expected dotted.path=value")
    key, raw = expr.split("=", 1)
    parts = tuple(p for p in key.strip().split("."))
    if not all(parts):
        raise ScenarioError(f"--set {expr!r}: empty path component")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as err:
        raise ScenarioError(f"--set {expr!r}: value is not valid YAML ({err.problem})") from None
    return parts, value


def apply_overrides(data: dict, overrides: list[tuple[tuple[str, ...], Any]]) -> dict:
    """Return a copy of ``data`` with each (path, value) set, creating mappings on the way."""
    data = json.loads(json.dumps(data))  # deep copy of plain YAML data
    for parts, value in overrides:
        node = data
        for i, p in enumerate(parts[:-1]):
            nxt = node.get(p) if isinstance(node, dict) else None
            if nxt is None:
                nxt = node[p] = {}
            if not isinstance(nxt, dict):
                raise ScenarioError(f"--set {'.'.join(parts)}: {'.'.join(parts[: i + 1])} is not a mapping")
            node = nxt
        node[parts[-1]] = value
    return data


def _strip_tags(loc: tuple, data) -> tuple:
    """Drop the ``kind`` tags that discriminated unions insert into error locations."""
    out, node = [], data
    for i, p in enumerate(loc):
        tag = isinstance(node, dict) and node.get("kind") == p
        if tag and (p not in node or loc[i + 1 : i + 2] == (p,)):
            continue
        out.append(p)
        node = (
            node[p]
            if isinstance(node, dict) and p in node
            else (node[p] if isinstance(node, list) and isinstance(p, int) and p < len(node) else None)
        )
    return tuple(out)


def _format_validation(err: ValidationError, source: str, lines: dict, overridden: set, data: dict) -> str:
    out = [f"{source}: invalid scenario ({err.error_count()} problem{'s' * (err.error_count() > 1)})"]
    for e in err.errors(include_url=False):
        loc = _strip_tags(e["loc"], data)
        if e["type"] == "value_error":  # a cross-field check names the field it blames first
            named = re.search(r"[a-z_]+(?:\.[A-Za-z0-9_-]+)+", e["msg"])
            first = re.match(r"Value error, ([a-z_]+) ", e["msg"])  # or a top-level field, first word
            if named and tuple(named.group().split("."))[: len(loc)] == loc:
                loc = tuple(named.group().split("."))
            elif not loc and first and (first.group(1),) in lines:
                loc = (first.group(1),)
        where = loc
        while where and where not in lines:
            where = where[:-1]
        line = lines.get(where, lines.get((), 1))
        origin = " (from --set)" if any(loc[: len(o)] == o for o in overridden) else ""
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif e["type"] == "union_tag_invalid":
            msg = f"unknown kind {e['input'].get('kind') if isinstance(e['input'], dict) else e['input']!r}; " + (
                "expected one of " + e["ctx"]["expected_tags"]
            )
        elif "input" in e and not isinstance(e["input"], dict | list):
            msg += f" (got {e['input']!r})"
        out.append(f"  line {line}: {_dotted(loc)}: {msg}{origin}")
    return "\n".join(out)


def _resolve_files(model: BaseModel, base_dir: Path, path: Path_, errors: list[tuple[Path_, str]]) -> BaseModel:
    """Read the files a validated scenario names; collect (path, message) for failures."""
    if isinstance(model, Empirical | RateTrace) and model.file is not None:
        try:
            return model.resolve_files(base_dir)
        except (OSError, ValueError) as err:
            errors.append(((*path, "file"), _file_msg(err)))
            return model
    if isinstance(model, ProfileRef):
        try:
            return model.resolve(base_dir)
        except (OSError, ValueError) as err:
            errors.append(((*path, "path"), _file_msg(err)))
            return model
    if isinstance(model, Traffic) and model.arrivals_file is not None:
        target = (base_dir / model.arrivals_file).resolve()
        try:
            read_numbers(target)
        except (OSError, ValueError) as err:
            errors.append(((*path, "arrivals_file"), _file_msg(err)))
            return model
        return model.model_copy(update={"arrivals_file": str(target)})
    updates = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            new = _resolve_files(value, base_dir, (*path, name), errors)
            if new is not value:
                updates[name] = new
    return model.model_copy(update=updates) if updates else model


def _file_msg(err: Exception) -> str:
    if isinstance(err, FileNotFoundError):
        return f"file not found: {err.filename}"
    if isinstance(err, OSError):
        return f"cannot read {err.filename}: {err.strerror}"
    return str(err)


def load_scenario(
    source: str | Path,
    overrides: list[str] | None = None,
    *,
    text: str | None = None,
) -> Scenario:
    """Load and validate a scenario file (or ``text``), applying ``--set`` overrides.

    Raises
    ------
    ScenarioError
        With a message naming the YAML line and dotted path of each problem.
    """
    source = Path(source)
    if text is None:
        try:
            text = source.read_text()
        except OSError as err:
            raise ScenarioError(f"{source}: {_file_msg(err)}") from None
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        raise ScenarioError(f"{source}: {where}not valid YAML: {getattr(err, 'problem', err)}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: a scenario must be a YAML mapping")
    lines = _line_map(node) if node is not None else {}
    parsed = [parse_set(o) for o in overrides or []]
    data = apply_overrides(data, parsed)
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as err:
        raise ScenarioError(_format_validation(err, str(source), lines, {p for p, _ in parsed}, data)) from None
    errors: list[tuple[Path_, str]] = []
    scenario = _resolve_files(scenario, source.parent, (), errors)
    scenario = _check_pricing(scenario, source.parent, errors)
    if errors:
        msgs = []
        for path, msg in errors:
            where = path
            while where and where not in lines:
                where = where[:-1]
            msgs.append(f"  line {lines.get(where, 1)}: {_dotted(path)}: {msg}")
        raise ScenarioError(f"{source}: invalid scenario\n" + "\n".join(msgs))
    return scenario


def _check_pricing(scenario: Scenario, base_dir: Path, errors: list[tuple[Path_, str]]) -> Scenario:
    """Resolve ``cost.catalog`` and check that ``workers.instance_type`` has a price."""
    cost = scenario.cost
    if cost.price_per_hour_usd is not None:
        return scenario
    path = (base_dir / cost.catalog).resolve() if cost.catalog else None
    try:
        catalog = load_catalog(path)
    except (OSError, ValueError, yaml.YAMLError) as err:
        errors.append((("cost", "catalog"), _file_msg(err) if isinstance(err, OSError) else f"bad catalog: {err}"))
        return scenario
    row = catalog.instances.get(scenario.workers.instance_type)
    if row is None:
        known = ", ".join(sorted(catalog.instances))
        errors.append(
            (("workers", "instance_type"), f"{scenario.workers.instance_type!r} is not in the catalog ({known})")
        )
    elif cost.market == "spot" and row.spot_price_per_gpu_hour_usd is None:
        errors.append((("cost", "market"), f"the catalog has no spot price for {scenario.workers.instance_type!r}"))
    if path is not None:
        scenario = scenario.model_copy(update={"cost": cost.model_copy(update={"catalog": str(path)})})
    return scenario


def scenario_hash(scenario: Scenario) -> str:
    """A short stable hash of the validated scenario: with the seed, it identifies a run."""
    blob = json.dumps(scenario.model_dump(mode="json"), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]
