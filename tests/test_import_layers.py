"""Layering: spec, plan, render, rollout and the CLI's start-up never import torch, megatron or submitit."""

from __future__ import annotations

import subprocess
import sys
import textwrap

HEAVY = ("torch", "megatron", "submitit")

PROBE = textwrap.dedent("""
    import importlib, pkgutil, sys
    import specdraft
    for layer in ("spec", "plan", "render", "rollout"):
        package = importlib.import_module(f"specdraft.{layer}")
        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"specdraft.{layer}.{info.name}")
    import specdraft.cli.main as cli
    from specdraft.plan.compile import compile
    from specdraft.spec.load import load_layout
    compile(load_layout(None))
    # Run real commands in-process (plan text and json, validate, --help) through the CLI entry point.
    for argv in (["plan"], ["plan", "--format", "json"], ["validate"], ["render", "--to", "nemo-rl"], ["--help"]):
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
