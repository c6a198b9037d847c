"""The CLI as users run it: exit codes, one clear message, no traceback without debug.

Most cases run in this process through the CLI's own app and error boundary (tests/support/cli.py); the ones
about the process itself run the real interpreter: the exit status it returns, a traceback under SPECDRAFT_DEBUG,
tables piped to a file, and output that is identical across processes (each with its own hash seed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.cli import run_cli
from tests.support.paths import REPO

ROOT = REPO
BROKEN = ROOT / "examples" / "broken.yaml"


def run_process(*args, env=None, cwd=None):
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    full_env.pop("SPECDRAFT_DEBUG", None) if not (env and "SPECDRAFT_DEBUG" in env) else None
    return subprocess.run(
        [sys.executable, "-m", "specdraft.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd or ROOT,
        timeout=120,
    )


def run(*args):
    return run_cli(*args, cwd=ROOT, env={"COLUMNS": "200"})


def test_plan_default_prints_summary():
    out = run("plan")
    assert out.returncode == 0, out.stderr
    for needle in (
        "layout tiny-cpu",
        "pipeline stages",
        "TapChannel routes",
        "zigzag_ring_branch_merge",
        "--context-parallel-size 2",
    ):
        assert needle in out.stdout


def test_tables_piped_to_a_file_are_not_cut_to_80_columns():
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "SPECDRAFT_DEBUG")}
    out = subprocess.run(
        [sys.executable, "-m", "specdraft.cli", "plan"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "microbatches" in out.stdout and "weights" in out.stdout and "…" not in out.stdout


def test_plan_json_is_byte_identical_and_written_atomically(tmp_path):
    first = run_process("plan", "--format", "json")
    second = run_process("plan", "--format", "json")
    assert first.returncode == 0 and first.stdout == second.stdout
    data = json.loads(first.stdout)
    for key in (
        "parallel",
        "cluster",
        "training",
        "ranks",
        "stages",
        "model",
        "memory",
        "warnings",
        "spec_sha256",
        "slurm",
        "tap_routes",
        "draft",
        "renders",
    ):
        assert key in data
    target = tmp_path / "plan.json"
    written = run("plan", "--format", "json", "-o", str(target))  # in this process: the same bytes
    assert written.returncode == 0 and target.read_text() == first.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"], "no temp file left behind"


def test_validate_broken_example_lists_every_problem_with_exit_2():
    out = run_process("validate", str(BROKEN))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr + out.stdout
    assert out.stderr.count("\n  - ") >= 5, out.stderr
    for needle in ("parallel.tp = 6", "must divide model.num_attention_heads", "use one of"):
        assert needle in out.stderr


def test_debug_env_shows_the_traceback():
    out = run_process("validate", str(BROKEN), env={"SPECDRAFT_DEBUG": "1"})
    assert out.returncode != 0 and "Traceback" in out.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (("validate", "missing.yaml"), "layout file not found"),
        (("plan", "parallel.cpp=2"), "unknown field"),
        (("plan", "--format", "xml"), "--format"),
        (("explain", "parallel.cpx"), "no layout field"),
        (("render", "--to", "pdf"), "not a render target"),
        (("plan", "layouts/tiny-cpu.yaml", "oops"), "KEY=VALUE"),
    ],
)
def test_user_errors_exit_2_without_traceback(args, needle):
    out = run(*args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert needle in out.stderr and "Traceback" not in out.stderr


def test_yaml_syntax_error_is_one_clear_message(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: {num_layers: 2\n")
    out = run("validate", str(bad))
    assert out.returncode == 2 and "YAML syntax error" in out.stderr and "Traceback" not in out.stderr


def test_validate_every_shipped_layout():
    for layout in sorted((ROOT / "layouts").glob("*.yaml")):
        out = run("validate", str(layout))
        assert out.returncode == 0, (layout, out.stderr)
        assert "valid:" in out.stdout


def test_explain_prints_doc_type_and_default():
    out = run("explain", "parallel.cp")
    assert out.returncode == 0 and "Context-parallel size" in out.stdout and "default 1" in out.stdout
    gpus = run("explain", "cluster.gpu")
    assert "h200-141gb" in gpus.stdout and "4.80 TB/s" in gpus.stdout


def test_render_targets(tmp_path):
    plan_file = tmp_path / "plan.json"
    assert run("plan", "layouts/qwen3-8b.yaml", "-o", str(plan_file), "--format", "json").returncode == 0
    megatron = run("render", str(plan_file), "--to", "megatron")
    assert megatron.returncode == 0 and megatron.stdout.startswith("# Megatron-LM flags of layout qwen3-8b")
    assert "\n--tensor-model-parallel-size 2 \\\n" in megatron.stdout
    nemo = run("render", str(plan_file), "--to", "nemo-rl")  # an online draft with packing: NeMo-RL refuses it
    assert nemo.returncode == 2 and "does not support sequence packing yet" in nemo.stderr
    vllm = run("render", str(plan_file), "--to", "vllm")
    assert vllm.returncode == 0 and json.loads(vllm.stdout)["speculative_config"]["method"] == "eagle3"
    overrides = run("render", str(plan_file), "parallel.cp=2", "--to", "vllm")
    assert overrides.returncode == 2 and "not to a compiled plan.json" in overrides.stderr


def test_a_vllm_check_that_cannot_run_is_not_a_pass(monkeypatch):
    # vLLM's own check (runtime/serve/vllm_check.py) runs in tests/dist/test_vllm_check.py; here vLLM is missing.
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    out = run("render", "layouts/qwen3-8b.yaml", "--to", "vllm", "--check")
    assert out.returncode == 2 and json.loads(out.stdout)["tensor_parallel_size"] == 1
    assert "--check did not run: vLLM is not installed here, so nothing checked the settings" in out.stderr


def test_balance_flag_applies_the_suggested_split():
    plain = run("plan", "layouts/qwen3-8b.yaml")
    assert "balance:" in plain.stdout and "parallel.last_stage_layers=" in plain.stdout
    balanced = json.loads(run("plan", "layouts/qwen3-8b.yaml", "--balance", "--format", "json").stdout)
    original = json.loads(run("plan", "layouts/qwen3-8b.yaml", "--format", "json").stdout)
    assert balanced["spec"]["parallel"]["last_stage_layers"] is not None
    assert max(s["total"] for s in balanced["memory"]) < max(s["total"] for s in original["memory"])
