"""training.recompute reaches megatron: the rank payload recomputes what Megatron-LM's flags say it would.

One process, one step of the built-in layout at pp = cp = 1, with a counter on the target's core attention (the
runtime's own `BranchCoreAttention`): full recompute runs every layer's forward again in backward (twice the calls),
selective recomputes core attention only (twice as well), none runs it once. Losses stay bit-identical (the
parity tests check recompute across layouts too), and each mode's bytes saved for backward per microbatch
(`--measure-activations`) match the plan's estimate for that mode within 5%.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.memory_accuracy import activation_errors
from tests.support.rank_procs import free_port, metrics, write_plan

pytestmark = pytest.mark.dist
COUNTING = """
import runpy, sys
import specdraft.runtime.models.core_attention as ca
forward = ca.BranchCoreAttention.forward
def counted(self, *args, **kwargs):
    print("CORE-ATTENTION-FORWARD", flush=True)
    return forward(self, *args, **kwargs)
ca.BranchCoreAttention.forward = counted
sys.argv = ["entry", sys.argv[1], "--workload", "cotrain", "--measure-activations"]
runpy.run_module("specdraft.runtime.entry", run_name="__main__")
"""


def _forwards(run_dir) -> int:
    env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    proc = subprocess.run(
        [sys.executable, "-c", COUNTING, str(run_dir / "plan.json")],
        capture_output=True,
        text=True,
        env=env,
        cwd=run_dir,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.count("CORE-ATTENTION-FORWARD")


def test_recompute_runs_the_forward_again_and_keeps_the_losses(tmp_path):
    base = [
        "cluster.gpus_per_node=1",
        "parallel.cp=1",
        "parallel.pp=1",
        "training.train_iters=1",
        "training.warmup_steps=0",
    ]
    counts, losses = {}, {}
    for mode in ("none", "selective", "full"):
        run_dir = tmp_path / mode
        write_plan(run_dir, [*base, f"training.recompute={mode}"])
        counts[mode] = _forwards(run_dir)
        losses[mode] = [(r["target_loss"], r["draft_loss"]) for r in metrics(run_dir)]
    layers = json.loads((tmp_path / "none" / "plan.json").read_text())["spec"]["model"]["num_layers"]
    assert counts["none"] > 0 and counts["none"] % layers == 0, counts
    assert counts["selective"] == counts["full"] == 2 * counts["none"], counts
    assert losses["selective"] == losses["full"] == losses["none"], losses
    # What each mode keeps for backward, measured by saved_tensors_hooks, is what the plan estimates for it.
    saved = {}
    for mode in counts:
        errors = activation_errors(tmp_path / mode)
        assert max(map(abs, errors.values())) <= 0.05, (mode, errors)
        result = json.loads(next((tmp_path / mode / "results").glob("rank-*.json")).read_text())
        saved[mode] = max(result["memory"]["activations_per_microbatch"])
    assert saved["full"] < saved["selective"] < saved["none"], saved
