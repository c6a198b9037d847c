"""Consumers of a LaunchPlan read its resolved sections, never `plan.spec` (kept in the contract for provenance).

Every module of the packages that get a plan (render, runtime, execute, cli, runs) is parsed with ast, and any read
of a `.spec` attribute fails the test unless its receiver is one of the few named below that are not plans.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import REPO

CONSUMERS = ("render", "runtime", "execute", "cli", "runs")
# Receivers whose `.spec` is not a plan's. Every other receiver is refused, not only ones named like a plan:
# an alias (`one = plan; one.spec`, `p.spec`) would slip past a name-based rule.
NOT_PLANS = {
    # specdraft.search.ranking.Row.spec: the candidate layout a search row shows (cli/search.py), not a plan.
    "row",
    # The package itself in a dotted module path (`specdraft.spec.load`).
    "specdraft",
}
# megatron-core's layer specs (ModuleSpec) are built by functions and passed by name in runtime/models/; none is
# read as a `.spec` attribute today. If one ever is, name its receiver above with the reason.


def spec_reads(source: str) -> list[tuple[int, str]]:
    """(line, expression) of every `.spec` read (attribute or getattr) whose receiver is not in NOT_PLANS."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "spec" and isinstance(node.ctx, ast.Load):
            if ast.unparse(node.value) not in NOT_PLANS:
                found.append((node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value == "spec"
        ):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_consumer_reads_the_plans_spec():
    bad = []
    for package in CONSUMERS:
        for path in sorted((REPO / "specdraft" / package).rglob("*.py")):
            for line, expr in spec_reads(path.read_text(encoding="utf-8")):
                bad.append(f"{path.relative_to(REPO)}:{line}: {expr}")
    assert not bad, "read the plan's resolved sections (model, cluster, parallel, training, slurm, draft, ...):\n" + (
        "\n".join(bad)
    )


def test_the_check_catches_every_way_a_plan_is_reached():
    source = """
def f(plan, ctx, self, row, launch_plan):
    plan.spec.training.seed
    ctx.plan.spec.cluster
    self.plan.spec
    one = launch_plan
    one.spec.slurm
    getattr(plan, "spec")
    row.spec.parallel
    import specdraft.spec.load
    plan.specdraft_version
"""
    flagged = sorted(expr for _, expr in spec_reads(source))
    assert flagged == sorted(["plan.spec", "ctx.plan.spec", "self.plan.spec", "one.spec", "getattr(plan, 'spec')"])


def test_every_consumer_package_exists():
    assert all(Path(REPO / "specdraft" / p).is_dir() for p in CONSUMERS)
