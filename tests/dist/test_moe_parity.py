"""MoE co-training parity through the real launch path: every expert layout gives the single-process run's losses.

The model is the shipped layouts/mixtral-tiny-cpu.yaml (8 experts, top-2, load-balancing loss on). ep1 and ep2
over two data-parallel ranks (ep1: expert grads summed over the expert data-parallel group; ep2: tokens cross ranks
through megatron's all-to-all dispatcher), ep2 with pp2, ep2 across the cp2 ranks, and the shipped layout itself
(tp2 cp2 pp2 vpp2 ep2 etp1, sequence parallel, expert dp 2) must reproduce the target loss, the draft loss and
the load-balancing loss of one process, and the measured weights, grads and optimizer state of every rank, and the
bytes each stage saves for backward per microbatch, must match the plan's memory estimate
(tests/support/memory_accuracy.py).

Tolerance: the dense path's (2e-5 relative on the target loss, 2e-4 on the draft's) and 2e-5 on the
load-balancing loss. Routing is discontinuous (top-2 of 8 router scores), so a score tie within float32 rounding
could route a token differently in one layout; with these seeds none occurs, the losses agree to about 1e-7.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import SPECDRAFT_BIN
from tests.support.memory_accuracy import MEASURE, assert_activations_match_plan, assert_memory_matches_plan
from tests.support.paths import SHIPPED

pytestmark = pytest.mark.dist
LAYOUT = SHIPPED / "mixtral-tiny-cpu.yaml"
STEPS = 3
COMMON = ["training.warmup_steps=0", "--workload", "cotrain", "--steps", str(STEPS), "--executor", "local"]
# Every override starts from the single-process shape, so each layout names all it changes.
SINGLE = [
    "cluster.gpus_per_node=1",
    "parallel.tp=1",
    "parallel.cp=1",
    "parallel.pp=1",
    "parallel.vpp=null",
    "parallel.ep=1",
    "parallel.etp=null",
    "parallel.sequence_parallel=false",
]
LAYOUTS = {
    "ep1-dp2": [*SINGLE, "cluster.gpus_per_node=2"],
    "ep2-dp2": [*SINGLE, "cluster.gpus_per_node=2", "parallel.ep=2"],
    "ep2-pp2": [*SINGLE, "cluster.gpus_per_node=4", "parallel.ep=2", "parallel.pp=2"],
    "ep2-cp2": [*SINGLE, "cluster.gpus_per_node=2", "parallel.ep=2", "parallel.cp=2"],
    "mixtral-tiny-cpu": [],  # the shipped layout as it is
}
TARGET_RTOL, DRAFT_RTOL, AUX_RTOL = 2e-5, 2e-4, 2e-5


def launch(folder: Path, overrides: list[str]) -> list[dict]:
    proc = subprocess.run(
        [str(SPECDRAFT_BIN), "launch", str(LAYOUT), *overrides, *COMMON, "--run-dir", str(folder)],
        capture_output=True,
        text=True,
        timeout=420,
        cwd=folder.parent,
        env={**os.environ, **MEASURE},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(STEPS))
    return rows


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    folder = tmp_path_factory.mktemp("single") / "run"
    rows = launch(folder, SINGLE)
    assert_memory_matches_plan(folder)
    assert_activations_match_plan(folder)
    return rows


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_moe_losses_match_the_single_process_run(name, reference, tmp_path):
    folder = tmp_path / name
    rows = launch(folder, LAYOUTS[name])
    for got, want in zip(rows, reference):
        step = (name, got["step"])
        assert got["target_loss"] == pytest.approx(want["target_loss"], rel=TARGET_RTOL), step
        assert got["draft_loss"] == pytest.approx(want["draft_loss"], rel=DRAFT_RTOL, abs=1e-6), step
        assert got["moe_aux_loss"] == pytest.approx(want["moe_aux_loss"], rel=AUX_RTOL), step
    assert 0.9 < reference[0]["moe_aux_loss"] < 2.0, "1.0 is perfect balance; 8 experts top-2 start near it"
    assert reference[-1]["target_loss"] < reference[0]["target_loss"], "the target trains"
    assert_memory_matches_plan(folder)
    assert_activations_match_plan(folder)  # a stage's mean over its ranks: routing differs per rank
