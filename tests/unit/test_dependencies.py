"""Every third-party package a specdraft module imports (function-level imports included) is declared in
pyproject.toml, in [project] dependencies or an optional extra, under the distribution that provides it."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from functools import cache

from tests.support.paths import REPO

ROOT = REPO / "specdraft"
# Imported only where the user's cluster has it, behind an ImportError check (render/vllm.py): vLLM pins a CUDA
# torch, so no extra can declare it without breaking the CPU install. Nothing else belongs here.
UNDECLARED_BY_DESIGN = {"vllm"}


def normalise(name: str) -> str:
    """A distribution name as PEP 503 compares them (PyYAML, pyyaml and py_yaml are one)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, f"pyproject.toml: cannot read the name of requirement {requirement!r}"
    return normalise(match.group(1))


def declared() -> dict[str, set[str]]:
    """Declared distribution -> where ("dependencies" or "extra NAME")."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    out: dict[str, set[str]] = {}
    for requirement in project.get("dependencies", []):
        out.setdefault(requirement_name(requirement), set()).add("dependencies")
    for extra, requirements in project.get("optional-dependencies", {}).items():
        for requirement in requirements:
            out.setdefault(requirement_name(requirement), set()).add(f"extra {extra}")
    return out


@cache
def imported() -> dict[str, frozenset[str]]:
    """Top-level third-party names imported anywhere under specdraft/ -> the modules that import them."""
    out: dict[str, set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != "specdraft" and top not in sys.stdlib_module_names:
                    out.setdefault(top, set()).add(path.relative_to(REPO).as_posix())
    return {name: frozenset(modules) for name, modules in out.items()}


def test_the_scan_sees_function_level_imports():
    found = imported()
    assert "yaml" in found and "specdraft/spec/source/text.py" in found["yaml"]  # imported inside functions only
    assert "torch" in found and "typer" in found


def test_every_imported_package_is_declared():
    have = declared()
    providers = importlib.metadata.packages_distributions()
    problems = []
    for name, modules in sorted(imported().items()):
        if name in UNDECLARED_BY_DESIGN:
            continue
        where = f"{name} (imported by {', '.join(sorted(modules))})"
        dists = providers.get(name)
        if not dists:
            problems.append(f"{where}: no installed distribution provides it, so it cannot be checked; install it")
        elif not any(normalise(d) in have for d in dists):
            problems.append(
                f"{where}: its distribution {' or '.join(sorted(set(dists)))} is not declared in pyproject.toml; "
                "add it to [project] dependencies, or to the runtime extra if only the job imports it"
            )
    assert not problems, "\n".join(problems)


def test_the_design_exceptions_are_still_imported():
    """An exception that nothing imports any more is dropped from the list, so the list cannot hide a new one."""
    assert UNDECLARED_BY_DESIGN <= set(imported())
