"""Co-training parity through the real launch path: every layout gives the single-process run's losses.

Same seed and data under (pp=2, cp=2), (pp=2, cp=1), (pp=1, cp=2), (tp=2, pp=1), interleaved (pp=2, vpp=2) and a
draft on the first stage must reproduce the target and draft losses of (tp=1, cp=1, pp=1) within float32 tolerance:
that checks the ring attention, the TapChannel routes, the halo shift and the tensor-parallel draft together, with
megatron's activation recomputation (full at pp2-cp2, selective at tp2-pp1; none elsewhere), and each stage's bytes
saved for backward per microbatch must match the plan's activation estimate within 5% (memory_accuracy.py). A
reduced draft vocabulary (the policy's distribution restricted to it over tp, its top-1 mask shifted over cp) is
checked the same way under (tp=2, cp=2), and so are a LayerNorm model with biases, QK norms and Llama-3.1's RoPE
scaling under (tp=2, cp=2) with sequence parallelism.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.memory_accuracy import MEASURE, assert_activations_match_plan, assert_memory_matches_plan

pytestmark = pytest.mark.dist
STEPS = 3
COMMON = ["training.warmup_steps=0", "--workload", "cotrain", "--steps", str(STEPS), "--executor", "local"]
LAYOUTS = {
    "pp2-cp2": ["cluster.gpus_per_node=4", "training.recompute=full"],  # every layer recomputed in backward
    "pp2-cp1": ["cluster.gpus_per_node=2", "parallel.cp=1"],
    "pp1-cp2": ["cluster.gpus_per_node=2", "parallel.pp=1"],
    "tp2-pp1": [
        "cluster.gpus_per_node=2",
        "parallel.tp=2",
        "parallel.cp=1",
        "parallel.pp=1",
        "training.recompute=selective",
    ],  # core attention recomputed
    "pp2-vpp2": ["cluster.gpus_per_node=2", "parallel.cp=1", "parallel.vpp=2"],
    "draft-first": ["cluster.gpus_per_node=2", "parallel.cp=1", "draft.stage=first"],
}
SINGLE = ["cluster.gpus_per_node=1", "parallel.cp=1", "parallel.pp=1"]
REDUCED = ["draft.vocab_size=48"]
SEMANTICS = [
    "model.normalization=LayerNorm",
    "model.norm_epsilon=1e-6",
    "model.add_bias_linear=true",
    "model.qk_layernorm=true",
    "model.rotary_base=500000",
    "model.rope_scaling={factor: 8.0}",
]


def metrics(specdraft_cli, folder: Path, overrides: list[str]) -> list[dict]:
    proc = specdraft_cli("launch", *overrides, *COMMON, "--run-dir", folder, timeout=240, env=MEASURE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(STEPS))
    return rows


def _single(tmp_path_factory, extra: list[str]) -> list[dict]:
    import subprocess

    from tests.conftest import SPECDRAFT_BIN

    folder = tmp_path_factory.mktemp("single") / "run"
    proc = subprocess.run(
        [str(SPECDRAFT_BIN), "launch", *SINGLE, *extra, *COMMON, "--run-dir", str(folder)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=folder.parent,
        env={**os.environ, **MEASURE},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return _single(tmp_path_factory, [])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_losses_match_the_single_process_run(name, reference, specdraft_cli, tmp_path):
    rows = metrics(specdraft_cli, tmp_path / name, LAYOUTS[name])
    for got, want in zip(rows, reference):
        assert got["target_loss"] == pytest.approx(want["target_loss"], rel=2e-5), (name, got["step"])
        assert got["draft_loss"] == pytest.approx(want["draft_loss"], rel=2e-4, abs=1e-6), (name, got["step"])
        assert len(got["acceptance"]) == len(want["acceptance"]) == 3
    assert reference[-1]["target_loss"] < reference[0]["target_loss"], "the target trains"
    assert_memory_matches_plan(tmp_path / name)  # the plan's weights, grads and optimizer bytes per rank
    assert_activations_match_plan(tmp_path / name)  # and the bytes each stage saves for backward per microbatch


@pytest.mark.timeout(400)
def test_reduced_vocabulary_matches_the_single_process_run(tmp_path_factory, specdraft_cli, tmp_path):
    want = _single(tmp_path_factory, REDUCED)
    rows = metrics(
        specdraft_cli,
        tmp_path / "reduced",
        ["cluster.gpus_per_node=4", "parallel.tp=2", "parallel.cp=2", "parallel.pp=1", *REDUCED],
    )
    for got, ref in zip(rows, want):
        assert got["target_loss"] == pytest.approx(ref["target_loss"], rel=2e-5), got["step"]
        assert got["draft_loss"] == pytest.approx(ref["draft_loss"], rel=2e-4, abs=1e-6), got["step"]
        assert got["acceptance"] == pytest.approx(ref["acceptance"], abs=1e-6), got["step"]


@pytest.mark.timeout(400)
def test_model_semantics_match_the_single_process_run(tmp_path_factory, specdraft_cli, tmp_path):
    want = _single(tmp_path_factory, SEMANTICS)
    rows = metrics(
        specdraft_cli,
        tmp_path / "semantics",
        [
            "cluster.gpus_per_node=4",
            "parallel.tp=2",
            "parallel.cp=2",
            "parallel.pp=1",
            "parallel.sequence_parallel=true",
            *SEMANTICS,
        ],
    )
    for got, ref in zip(rows, want):
        assert got["target_loss"] == pytest.approx(ref["target_loss"], rel=2e-5), got["step"]
        assert got["draft_loss"] == pytest.approx(ref["draft_loss"], rel=2e-4, abs=1e-6), got["step"]
    assert want[-1]["target_loss"] < want[0]["target_loss"], "the target trains"
    assert_memory_matches_plan(tmp_path / "semantics")
    assert_activations_match_plan(tmp_path / "semantics")
