"""Layering: every import in every module (function-level ones included) points down, and nothing forms a cycle.

Layers, lowest first: the base modules (errors, file helpers), spec, plan, runs (the run-folder protocol), perf
(the step-time model), rollout, render, assemble, search, execute, cli.
`runtime` (the job) reads only the plan and the run folder: it may import the base, plan, runs, rollout's schedules
(the offline dispatch the job runs is the simulator's own code, pure Python) and itself. Inside it the sub-packages are
layered too, lowest first: its base modules (context, cpu_compat, tool, folders), attention (the kernels), models,
train, serve, rl, workloads, entry, starter (which forks ranks that run the entry). No
layer but runtime and execute imports torch, megatron, submitit, transformers or tokenizers (execute only submitit);
a CLI run in a fresh process proves none is loaded.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.paths import REPO

ROOT = REPO / "specdraft"
HEAVY = ("torch", "megatron", "submitit", "transformers", "tokenizers")
RANK = {
    "base": 0,
    "spec": 1,
    "plan": 2,
    "runs": 3,
    "perf": 4,
    "rollout": 5,
    "render": 6,
    "assemble": 7,
    "search": 8,
    "execute": 9,
    "cli": 10,
}
BASE = {"specdraft", "specdraft.errors", "specdraft.fsutil"}
# What of the CLI side's layers the job runs: the rollout schedules (and the workload records they take).
RUNTIME_MAY_USE = ("specdraft.rollout.schedule", "specdraft.rollout.model.workload", "specdraft.rollout.model.kchoice")
RUNTIME_RANK = {
    "base": 0,
    "attention": 1,
    "models": 2,
    "train": 3,
    "serve": 4,
    "rl": 5,
    "workloads": 6,
    "entry": 7,
    "starter": 8,
}


def runtime_part(module: str) -> str:
    """The runtime sub-package (or its base, or entry) a specdraft.runtime module belongs to."""
    parts = module.split(".")
    if len(parts) < 3:
        return "base"
    return parts[2] if parts[2] in RUNTIME_RANK else "base"


LIGHT = {"base", "spec", "plan", "runs", "perf", "rollout", "render", "assemble", "search", "cli"}


def layer(module: str) -> str:
    if module in BASE:
        return "base"
    part = module.split(".")[1]
    return part if part in RANK or part == "runtime" else "base"


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, package: str | None = None) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement anywhere in the file, resolved to module names."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if package is None:
        package = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                # `from specdraft.spec import derived` imports a module; `from x.y import name` imports x.y.
                candidate = f"{base}.{alias.name}"
                is_module = (ROOT.parent / Path(*candidate.split("."))).with_suffix(".py").exists() or (
                    ROOT.parent / Path(*candidate.split("."))
                ).is_dir()
                found.append((candidate if is_module else base, node.lineno))
    return found


def graph() -> dict[str, list[tuple[str, int]]]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        out[module_name(path)] = [(m, line) for m, line in imports_of(path)]
    return out


def test_every_import_points_down():
    wrong = []
    for module, imports in graph().items():
        here = layer(module)
        for target, line in imports:
            top = target.split(".")[0]
            if here in LIGHT and top in HEAVY:
                wrong.append(f"{module}:{line} imports {target} ({here} must not import {top})")
            if top != "specdraft":
                continue
            there = layer(target)
            if here == "runtime" and there == "runtime":
                ok = RUNTIME_RANK[runtime_part(target)] <= RUNTIME_RANK[runtime_part(module)]
            elif here == "runtime":
                ok = there in ("base", "plan", "runs") or target.startswith(RUNTIME_MAY_USE)
            elif there == "runtime":
                ok = False
            else:
                ok = RANK[there] <= RANK[here]
            if not ok:
                wrong.append(f"{module}:{line} imports {target} ({here} -> {there})")
    assert not wrong, "imports that point up a layer:\n" + "\n".join(wrong)


def test_no_import_cycles():
    known = graph_modules()
    edges = {m: sorted({t for t, _ in imports if t in known and t != m}) for m, imports in graph().items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in edges.get(node, []):
            if state.get(nxt) == 1:
                cycles.append(
                    " -> ".join(stack[stack.index(nxt) :] + [node, nxt]) if nxt in stack else f"{node} -> {nxt}"
                )
            elif nxt not in state:
                visit(nxt, stack + [node])
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def graph_modules() -> set[str]:
    return {module_name(p) for p in ROOT.rglob("*.py")}


def test_the_checker_sees_function_level_and_relative_imports(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text(
        textwrap.dedent("""
        def f():
            from specdraft.cli import boundary
            import torch
            from ..render import sbatch
    """)
    )
    found = {m for m, _ in imports_of(source, package="specdraft.plan")}
    assert {"specdraft.cli.boundary", "torch", "specdraft.render.sbatch"} <= found
    assert layer("specdraft.render.sbatch") == "render" and layer("specdraft.errors") == "base"
    assert runtime_part("specdraft.runtime.models.hf.export") == "models"
    assert runtime_part("specdraft.runtime.context") == "base" and runtime_part("specdraft.runtime.entry") == "entry"


PROBE = textwrap.dedent("""
    import importlib, pkgutil, sys
    import specdraft
    import specdraft.datafile
    for layer in ("spec", "plan", "runs", "perf", "render", "rollout", "search"):
        package = importlib.import_module(f"specdraft.{layer}")
        for info in pkgutil.walk_packages(package.__path__, prefix=f"specdraft.{layer}."):
            importlib.import_module(info.name)
    import specdraft.cli.main as cli
    from specdraft.assemble import compile
    from specdraft.spec.load import load_layout
    compile(load_layout(None))
    # Run real commands in-process (plan text and json, validate, --help) through the CLI entry point.
    nemo_rl = ["render", "--to", "nemo-rl", "draft.enabled=false", "rollout.max_policy_lag=0"]  # one it accepts
    for argv in (["plan"], ["plan", "--format", "json"], ["validate"], nemo_rl, ["--help"]):
        sys.argv = ["specdraft", *argv]
        try:
            cli.main()
        except SystemExit as exit:
            assert exit.code in (0, None), (argv, exit.code)
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY})
    print("HEAVY:" + ",".join(heavy))
""").replace("{HEAVY}", repr(set(HEAVY)))


def test_core_layers_import_no_torch_megatron_or_submitit():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line = [x for x in out.stdout.splitlines() if x.startswith("HEAVY:")][-1]
    assert line == "HEAVY:", f"heavy modules imported: {line}"
