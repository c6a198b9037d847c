"""Inside specdraft.rollout the imports form a DAG, all at module level (no function-level back-imports)."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter

from tests.support.paths import REPO

PACKAGE = REPO / "specdraft" / "rollout"
PREFIX = "specdraft.rollout"
PACKAGES = {f"{PREFIX}.{d.name}" for d in PACKAGE.iterdir() if (d / "__init__.py").exists()}


def _rollout_imports(tree: ast.Module) -> list[tuple[str, bool]]:
    """(imported rollout module, at module level?) for every import of a specdraft.rollout module."""
    out = []
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == PREFIX or node.module in PACKAGES:  # from specdraft.rollout.model import costmodel
                names = [f"{node.module}.{a.name}" for a in node.names]
            elif node.module.startswith(PREFIX + "."):
                names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith(PREFIX + ".")]
        out += [(name.split(".")[-1], id(node) in top) for name in names]
    return out


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        imports = _rollout_imports(ast.parse(path.read_text(), filename=str(path)))
        nested = [name for name, top in imports if not top]
        assert not nested, f"{path.name} imports rollout modules inside functions: {nested}; import them at the top"
        edges[path.stem] = {name for name, _ in imports}
    return edges


def test_rollout_imports_form_a_dag():
    edges = graph()
    assert "asp" in edges["scheduler"] and "scheduler" not in edges["asp"]
    assert {"events"} <= edges["simulator"] & edges["generation"]
    try:
        order = list(TopologicalSorter(edges).static_order())
    except CycleError as err:
        raise AssertionError(f"import cycle inside specdraft.rollout: {err.args[1]}") from None
    assert set(order) >= set(edges)


def test_the_checker_sees_a_cycle_and_a_nested_import():
    """The test above can fail: a back-import inside a function and a two-module cycle are both caught."""
    tree = ast.parse("import math\n\ndef f():\n    from specdraft.rollout.schedule.asp import asp_schedule\n")
    assert _rollout_imports(tree) == [("asp", False)]
    try:
        list(TopologicalSorter({"asp": {"scheduler"}, "scheduler": {"asp"}}).static_order())
    except CycleError:
        return
    raise AssertionError("a two-module cycle went unnoticed")
