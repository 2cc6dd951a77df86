"""Scenario loading: YAML → validated :class:`~simulator.scenario.config.Scenario`, with line numbers.

Errors never surface as tracebacks: every problem (bad YAML, a wrong type, an unknown
key, a negative rate, a missing file) becomes a :class:`ScenarioError` whose lines name
the file, the YAML line and the dotted path of the field.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from simulator.scenario.config import Scenario
from simulator.scenario.files import Path_, check_pricing, check_trace, file_msg, resolve_files
from simulator.scenario.fleet import BATCHING_KINDS
from simulator.scenario.llm import step_kind


class ScenarioError(Exception):
    """A scenario that cannot be loaded; ``str(err)`` is the message for the user."""


MAX_NODES = 200_000  # YAML nodes after aliases are expanded: the largest shipped scenario has ~3,000


def _line_map(node: yaml.Node, path: Path_ = (), seen: set | None = None) -> dict[Path_, int]:
    """Map every dotted path in a composed YAML document to its 1-based line.

    An aliased node is mapped once, where its anchor is (following aliases would walk an
    alias bomb's billions of paths). A key given twice in one mapping is refused."""
    seen = set() if seen is None else seen
    lines = {path: node.start_mark.line + 1}
    if id(node) in seen:
        return lines
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict = {}
        for key, value in node.value:
            k = key.value
            if key.tag != "tag:yaml.org,2002:merge" and isinstance(k, str):
                if k in first:
                    raise ScenarioError(
                        f"line {key.start_mark.line + 1}: {_dotted((*path, k))}: duplicate key "
                        f"(first given at line {first[k]}; YAML would silently keep the last)"
                    )
                first[k] = key.start_mark.line + 1
            lines[(*path, k)] = key.start_mark.line + 1
            for sub, line in _line_map(value, (*path, k), seen).items():
                lines.setdefault(sub, line)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.update(_line_map(item, (*path, i), seen))
    return lines


def _expanded_nodes(node: yaml.Node, memo: dict, limit: int = MAX_NODES) -> int:
    """How many nodes the document has once its aliases are expanded (memoized per node,
    so a billion-node alias bomb is counted in a few hundred steps), capped past ``limit``."""
    key = id(node)
    if key in memo:
        if memo[key] is None:
            raise ScenarioError(f"line {node.start_mark.line + 1}: an alias refers to itself (a recursive structure)")
        return memo[key]
    memo[key] = None
    total = 1
    if isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    elif isinstance(node, yaml.SequenceNode):
        children = node.value
    else:
        children = []
    for child in children:
        total += _expanded_nodes(child, memo, limit)
        if total > limit:
            break
    memo[key] = total
    return total


def read_scenario_text(source: Path) -> str:
    """The file as text: UTF-8 (a BOM allowed), or one clear error."""
    try:
        raw = source.read_bytes()
    except OSError as err:
        raise ScenarioError(f"{source}: {file_msg(err)}") from None
    if b"\0" in raw[:65536]:
        raise ScenarioError(f"{source}: a binary file, not a YAML scenario")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise ScenarioError(
            f"{source}: line {line}: not UTF-8 text (byte 0x{raw[err.start]:02x}); save the file as UTF-8"
        ) from None


def _numbers_check(value, raw, path: Path_, problems: list[tuple[Path_, str]]) -> None:
    """Walk the validated scenario beside the YAML it came from: every number must be
    finite, and a YAML boolean must not have become a count (``count: true`` is not 1)."""
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            sub = raw.get(name) if isinstance(raw, dict) else None
            _numbers_check(getattr(value, name), sub, (*path, name), problems)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            sub = raw[i] if isinstance(raw, list) and i < len(raw) else None
            _numbers_check(v, sub, (*path, i), problems)
    elif isinstance(value, dict):
        for k, v in value.items():
            sub = raw.get(k, raw.get(str(k))) if isinstance(raw, dict) else None
            _numbers_check(v, sub, (*path, k), problems)
    elif isinstance(value, float) and not math.isfinite(value):
        problems.append((path, f"must be a finite number (got {value})"))
    elif isinstance(raw, bool) and isinstance(value, int | float) and not isinstance(value, bool):
        problems.append((path, f"expected a number, got {str(raw).lower()}"))


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
        # the union's tag: the kind given, or the default kind of a union that has one
        default = None
        if loc[i - 1 : i] == ("batching",):
            default = BATCHING_KINDS[0]
        elif loc[i - 1 : i] == ("step_time",):
            default = step_kind(node)
        tag = isinstance(node, dict) and node.get("kind", default) == p
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
        if e["type"] in ("batching_kind", "step_time_kind"):  # a union's own tag check: blame its kind
            loc = (*loc, "kind")
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
        elif e["type"] == "batching_kind":
            msg = f"unknown kind {e['input'].get('kind')!r}; expected one of {', '.join(BATCHING_KINDS)}"
        elif e["type"] == "step_time_kind":
            msg = f"unknown kind {e['input'].get('kind')!r}; expected one of linear, roofline"
        elif "input" in e and not isinstance(e["input"], dict | list):
            msg += f" (got {e['input']!r})"
        out.append(f"  line {line}: {_dotted(loc)}: {msg}{origin}")
    return "\n".join(out)


def load_scenario(
    source: str | Path,
    overrides: list[str] | None = None,
    *,
    text: str | None = None,
) -> Scenario:
    """Load and validate a scenario file (or ``text``), applying ``--set`` overrides.

    Parameters
    ----------
    source : str or Path
        The scenario's YAML file; with ``text``, only names it in messages (and relative
        paths in it, such as ``cost.catalog``, resolve from its folder).
    overrides : list of str, optional
        ``path=value`` overrides applied before validation, as ``--set`` gives them (the
        value is YAML: ``workers.count=8``, ``router.shadow=null``).
    text : str, optional
        The YAML itself, instead of reading ``source``.

    Returns
    -------
    Scenario
        The validated, frozen scenario, its worker-hour price resolved from the catalog.

    Raises
    ------
    ScenarioError
        With a message naming the YAML line and dotted path of each problem.
    """
    source = Path(source)
    if text is None:
        text = read_scenario_text(source)
    try:
        node = yaml.compose(text)
        if node is not None and _expanded_nodes(node, {}) > MAX_NODES:
            raise ScenarioError(
                f"its aliases expand to more than {MAX_NODES:,} YAML nodes (an alias bomb?); "
                "a scenario needs a few thousand"
            )
        lines = _line_map(node) if node is not None else {}
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        raise ScenarioError(f"{source}: {where}not valid YAML: {getattr(err, 'problem', err)}") from None
    except ScenarioError as err:
        raise ScenarioError(f"{source}: {err}") from None
    except RecursionError:
        raise ScenarioError(f"{source}: nested too deeply to be a scenario") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: a scenario must be a YAML mapping")
    w = data.get("workers")
    if isinstance(w, dict) and w.get("measured_on") is None and isinstance(w.get("instance_type", "a100"), str):
        # the batch times are the file's: measured on the type the file names (an override of
        # instance_type then rescales them; see simulator/scenario/gputypes.py)
        w["measured_on"] = w.get("instance_type", "a100")
    parsed = [parse_set(o) for o in overrides or []]
    data = apply_overrides(data, parsed)
    cost = data.get("cost")
    if isinstance(cost, dict) and isinstance(cost.get("catalog"), str):  # relative to the file, as every path
        cost["catalog"] = str((source.parent / cost["catalog"]).resolve())
    overridden = {p for p, _ in parsed}
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as err:
        raise ScenarioError(_format_validation(err, str(source), lines, overridden, data)) from None
    errors: list[tuple[Path_, str]] = []
    _numbers_check(scenario, data, (), errors)
    if errors:
        raise ScenarioError(_format_errors(str(source), errors, lines, overridden))
    scenario = resolve_files(scenario, source.parent, (), errors)
    scenario = check_pricing(scenario, source.parent, errors)
    if not errors:
        check_trace(scenario, errors)
    if errors:
        raise ScenarioError(_format_errors(str(source), errors, lines, overridden))
    return scenario


def _format_errors(source: str, errors: list[tuple[Path_, str]], lines: dict, overridden: set) -> str:
    msgs = []
    for path, msg in errors:
        where = path
        while where and where not in lines:
            where = where[:-1]
        origin = " (from --set)" if any(path[: len(o)] == o for o in overridden) else ""
        msgs.append(f"  line {lines.get(where, 1)}: {_dotted(path)}: {msg}{origin}")
    n = len(errors)
    return f"{source}: invalid scenario ({n} problem{'s' * (n > 1)})\n" + "\n".join(msgs)


def scenario_hash(scenario: Scenario) -> str:
    """A short stable hash of the validated scenario: with the seed, it identifies a run.

    Parameters
    ----------
    scenario : Scenario
        A validated scenario.

    Returns
    -------
    str
        12 hex digits of the SHA-256 of its canonical JSON (field order does not matter).
    """
    blob = json.dumps(scenario.model_dump(mode="json"), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]
