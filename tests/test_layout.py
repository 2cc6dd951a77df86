"""The import rules of the layout (issue 13): the model depends on nothing built around it,
and the reference server on nothing at all of ours, so each can be read, tested and shipped
alone. Walks every import statement, including those inside functions."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {"servesim", "simulator", "calibrate", "reference_server", "dashboards"}

# package -> the packages of ours it may import (besides itself)
ALLOWED = {
    "simulator": set(),
    "reference_server": set(),
    "calibrate": {"simulator", "reference_server"},
    "dashboards": {"simulator", "calibrate"},
    "servesim": {"simulator", "calibrate", "reference_server"},
}


def imports_of(package: str) -> dict[str, set[str]]:
    """For each module of ``package``: the packages of ours it imports."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
        out[str(path.relative_to(ROOT))] = found & OURS
    return out


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_what_its_layer_allows(package):
    bad = {
        module: sorted(found - ALLOWED[package] - {package})
        for module, found in imports_of(package).items()
        if found - ALLOWED[package] - {package}
    }
    assert not bad, f"{package} may import only {sorted(ALLOWED[package])}: {bad}"


def test_every_package_of_ours_has_its_rule():
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()} - {"tests", "benchmarks"}
    assert packages == set(ALLOWED)


def test_python_m_servesim_is_the_command():
    proc = subprocess.run([sys.executable, "-m", "servesim", "--version"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("servesim ")


def test_the_map_in_simulator_readme_names_every_module_in_its_folder():
    import re

    text = (ROOT / "simulator/README.md").read_text(encoding="utf-8")
    tree = text[text.index("```\nsimulator/") : text.index("```", text.index("```\nsimulator/") + 3)]
    mapped, folder = set(), ""
    for line in tree.splitlines()[2:]:
        if m := re.match(r"^  (\w+)/", line):
            folder = m.group(1) + "/"
        elif m := re.match(r"^  (\w+\.py)\b", line):
            folder, name = "", m.group(1)
            mapped.add(name)
        elif m := re.match(r"^    (\w+\.py)\b", line):
            mapped.add(folder + m.group(1))
    modules = {
        str(p.relative_to(ROOT / "simulator")) for p in (ROOT / "simulator").rglob("*.py") if p.name != "__init__.py"
    }
    assert modules == mapped, f"not in the map: {sorted(modules - mapped)}; gone: {sorted(mapped - modules)}"


def test_the_public_api_is_documented_in_numpydoc_with_every_parameter():
    import inspect
    import re

    import simulator

    for name in simulator.__all__:
        obj = getattr(simulator, name)
        doc = inspect.getdoc(obj) or ""
        assert doc, f"simulator.{name} has no docstring"
        if inspect.isfunction(obj):
            sections = set(re.findall(r"^(\w+)\n-{3,}$", doc, flags=re.M))
            assert {"Parameters", "Returns"} <= sections, f"simulator.{name}: sections {sorted(sections)}"
            params = doc.split("Parameters\n----------\n", 1)[1].split("\n\n")[0]
            documented = set(re.findall(r"^(\w+) :", params, flags=re.M))
            wanted = set(inspect.signature(obj).parameters)
            assert wanted <= documented, f"simulator.{name}: undocumented {sorted(wanted - documented)}"
    run_doc = inspect.getdoc(simulator.Run)
    fields = set(simulator.Run.__dataclass_fields__)
    assert fields <= set(re.findall(r"^(\w+) :", run_doc, flags=re.M)), "Run's attributes are not all documented"


# the layers inside simulator/, bottom first: a module imports only its own layer and those
# below it. results/ holds what a run leaves (Records, Run) and the summaries of it, so it
# sits under the engine that produces them and never imports the engine (issue 27).
LAYERS = (
    {"ledger", "rng", "jit"},  # the bottom: outcomes, the serving columns, random streams, numba's start
    {"scenario"},
    {"stages"},
    {"serving"},
    {"results"},
    {"engine", "front", "back", "columns", "pieces", "streaming", "chunks"},
    {"planning"},
    {"__init__"},
)


def _simulator_imports(*, typing_only: bool = True) -> dict[str, set[str]]:
    """Module -> the simulator modules it imports (at the top or inside functions; with
    ``typing_only=False``, not those under ``if TYPE_CHECKING:``, which never run)."""
    out = {}
    for path in sorted((ROOT / "simulator").rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found = set()
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        if not typing_only:
            tree.body = [n for n in tree.body if not (isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            else:
                continue
            found |= {m for m in mods if m.startswith("simulator.")}
        out[name] = found
    return out


def _layer(module: str) -> int:
    part = module.split(".")[1] if "." in module else "__init__"
    return next(k for k, names in enumerate(LAYERS) if part in names)


def test_simulator_imports_only_downwards():
    bad = sorted(
        f"{m} imports {t}"
        for m, found in _simulator_imports().items()
        for t in found
        if _layer(t) > _layer(m) or (_layer(m) == 0 and m != t)
    )
    order = " → ".join("/".join(sorted(names)) for names in LAYERS)
    assert not bad, f"simulator's layers are {order}; upward imports: {bad}"


def test_simulator_has_no_import_cycles():
    """No cycle among the imports that run (a type named only for annotations, under
    ``TYPE_CHECKING``, may point back up: ``PoolRun.fleet`` names the fleet's log)."""
    graph = _simulator_imports(typing_only=False)
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph.get(m, ())):
            if t not in graph:  # a package's own name: its __init__
                t = f"{t}.__init__"
            if state.get(t) == 1:
                cycles.append(" → ".join([*path[path.index(t) :], t]))
            elif t in graph and not state.get(t):
                visit(t, [*path, t])
        state[m] = 2

    for m in sorted(graph):
        if not state.get(m):
            visit(m, [m])
    assert not cycles, cycles
