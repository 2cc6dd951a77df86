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
