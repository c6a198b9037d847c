"""`rollout measure --engine vllm` against the built-in engine, on one briefly co-trained run (one process, hidden
128 over 4 heads: head_dim 32, which vLLM's CPU attention needs), the same held-out prompts and k:

- vLLM's accept length (its spec_decode counters) is within 2% of the built-in figure, and so is each position's
  acceptance: both count a verify step as 1 + its accepted drafts, the last one whole (vllm_engine.py);
- vLLM's greedy tokens with speculation equal those without it and specdraft's own greedy decode, token for token;
- the exports vLLM served stay cached under the run and are reused while the checkpoint is the same;
- a run without a draft, or with a head size the CPU backend cannot serve, is refused by name (exit 2).

One `--engine vllm` measurement (its two engines, plain and speculative) for the module. Skipped without vLLM.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.support.vllm_runs import SERVABLE, requires_vllm, specdraft

# Engine starts and decode steps crawl on a loaded 2-core machine; the module takes about a minute when idle.
pytestmark = [pytest.mark.dist, requires_vllm, pytest.mark.timeout(900)]
MEASURE = ["--prompts", "8", "--max-new-tokens", "16", "--k", "3", "--format", "json"]
STEPS = 40


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    root = tmp_path_factory.mktemp("measure")
    run = root / "run"
    launch = ["--workload", "cotrain", "--steps", STEPS, "--executor", "local", "--run-dir", run]
    specdraft("launch", *SERVABLE, f"training.save_interval={STEPS}", "training.warmup_steps=5", *launch, cwd=root)
    builtin = json.loads(specdraft("rollout", "measure", run, *MEASURE, cwd=root))
    served = json.loads(specdraft("rollout", "measure", run, "--engine", "vllm", *MEASURE, cwd=root, timeout=600))
    return run, builtin, served


def test_vllm_measures_the_builtin_accept_length(measured):
    _, builtin, served = measured
    assert builtin["engine"] == "builtin" and served["engine"] == "vllm"
    assert builtin["accept_len"] > 1.3, "the briefly trained draft must accept something for the comparison to bite"
    assert min(builtin["acceptance"]) < 0.9, "and be rejected somewhere"
    assert served["accept_len"] == pytest.approx(builtin["accept_len"], rel=0.02)
    assert served["acceptance"] == pytest.approx(builtin["acceptance"], abs=0.02)
    assert served["accept_len"] == pytest.approx(1 + sum(served["acceptance"]), abs=1e-5)
    for key in ("k", "prompts", "new_tokens", "prompt_length", "max_new_tokens", "data_step", "dtype"):
        assert served[key] == builtin[key], key
    for r in (builtin, served):
        assert r["plain_tokens_per_s"] > 0 and r["speculative_tokens_per_s"] > 0 and r["speedup_wall"] > 0


def test_vllm_greedy_output_is_lossless_and_equals_specdraft_decode(measured):
    _, builtin, served = measured
    assert builtin["lossless"] is True and served["lossless"] is True
    assert len(served["greedy_tokens"]) == 8 and all(len(t) == 16 for t in served["greedy_tokens"])
    assert served["greedy_tokens"] == builtin["greedy_tokens"], "vLLM's greedy decode of the export = specdraft's"


def test_the_served_exports_are_cached_and_reused(measured):
    from specdraft.runtime.serve import offline, vllm_engine

    run, _, served = measured
    assert {kind: served["exports"][kind]["reused"] for kind in ("policy", "draft")} == {
        "policy": False,
        "draft": False,
    }
    plan = offline.read_run_plan(run)
    checkpoint = offline.checkpoint(run, None)
    before = {p: p.stat().st_mtime_ns for p in (run / "serve-cache" / "vllm").rglob("*")}
    again = vllm_engine.exports(run, plan, checkpoint, checkpoint)
    assert again["policy"]["reused"] and again["draft"]["reused"]
    assert {p: p.stat().st_mtime_ns for p in (run / "serve-cache" / "vllm").rglob("*")} == before
    marker = json.loads((run / "serve-cache" / "vllm" / "policy" / "specdraft-export.json").read_text())
    assert marker["checkpoint_sha256"] == vllm_engine.checkpoint_sha256(checkpoint[1])


def test_what_vllm_cannot_serve_is_refused_by_name(measured, specdraft_cli, tmp_path):
    from tests.support.rank_procs import write_plan

    run, _, served = measured
    for name, overrides, message in (
        ("nodraft", [*SERVABLE, "draft.enabled=false"], "trained no draft"),
        ("head16", ["cluster.gpus_per_node=1", "parallel.cp=1", "parallel.pp=1"], "head_dim is 16"),
    ):
        if name == "head16" and served["device"] != "cpu":
            continue  # the head size rule is the CPU backend's
        other = tmp_path / name
        other.mkdir()
        for item in (".specdraft-run", "run.json"):
            shutil.copy(run / item, other / item)
        write_plan(other, overrides)
        proc = specdraft_cli("rollout", "measure", other, "--engine", "vllm", timeout=200)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
