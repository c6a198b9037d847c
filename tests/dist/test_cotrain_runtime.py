"""The co-training runtime inside one gloo world: TapChannel never deadlocks against the 1F1B schedule (1 to 8
microbatches; taps on the first, a middle and the last stage; local taps too), delivers taps bit for bit, and the
blocking baseline computes the same thing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.distributed import run_distributed

pytestmark = pytest.mark.dist

# 9 layers over 3 stages (0-2, 3-5, 6-8): taps 1, 4 and 7 sit on every stage.
BASE = [
    "model.num_layers=9",
    "draft.aux_layers=[1,4,7]",
    "cluster.gpus_per_node=3",
    "parallel.pp=3",
    "parallel.cp=1",
    "training.warmup_steps=0",
    "training.train_iters=2",
]


def _plan(overrides):
    from specdraft.assemble import compile
    from specdraft.spec.load import load_layout

    return compile(load_layout(None, [*BASE, *overrides]))


def _worker(rank, world_size, cases, root):
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from specdraft.runtime.context import RankContext
    from specdraft.runtime.workloads.cotrain import run

    ps.initialize_model_parallel(pipeline_model_parallel_size=3)
    out = []
    for name, plan, env in cases:
        os.environ.pop("SPECDRAFT_TAP_AUDIT", None)
        os.environ.pop("SPECDRAFT_TAPS_BLOCKING", None)
        os.environ.update(env)
        run_dir = Path(root) / name
        run_dir.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        ctx = RankContext(
            plan=plan,
            run_dir=run_dir,
            global_rank=rank,
            local_rank=rank,
            world_size=world_size,
            node=0,
            device="cpu",
            backend="gloo",
            steps=1,
            workload="cotrain",
        )
        out.append((name, run(ctx)["final"]))
    return out


def test_no_deadlock_for_any_microbatch_count_or_draft_stage(tmp_path):
    cases = []
    for stage in ("last", "first", "1"):
        for m in range(1, 9):
            cases.append((f"{stage}-m{m}", _plan([f"draft.stage={stage}", f"training.global_batch_size={m}"]), {}))
    results = run_distributed(_worker, 3, cases, str(tmp_path), timeout=240, daemon=False)  # checkpoint writers
    finals = dict(results[0])
    for name, _, _ in cases:
        final = finals[name]
        assert final["draft_loss"] is not None and final["draft_loss"] > 0, name
        assert len(final["acceptance"]) == 3
    # Where the draft sits changes nothing about the numbers: same data, weights and maths.
    for m in range(1, 9):
        ref = finals[f"last-m{m}"]
        for stage in ("first", "1"):
            other = finals[f"{stage}-m{m}"]
            assert other["target_loss"] == pytest.approx(ref["target_loss"], rel=1e-5)
            assert other["draft_loss"] == pytest.approx(ref["draft_loss"], rel=1e-4)


def test_taps_arrive_bit_for_bit_and_blocking_baseline_agrees(tmp_path):
    plan = _plan(["training.global_batch_size=4"])
    cases = [("audit", plan, {"SPECDRAFT_TAP_AUDIT": "1"}), ("blocking", plan, {"SPECDRAFT_TAPS_BLOCKING": "1"})]
    results = run_distributed(_worker, 3, cases, str(tmp_path), timeout=180, daemon=False)
    finals = dict(results[0])
    assert finals["blocking"]["draft_loss"] == pytest.approx(finals["audit"]["draft_loss"], rel=1e-6)
    records = []
    for path in sorted((tmp_path / "audit" / "taps").glob("rank-*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines()]
    sent = {(r["microbatch"], str(r["tap"]), r["src"], r["dst"]): r["sha256"] for r in records if r["kind"] == "sent"}
    received = {
        (r["microbatch"], str(r["tap"]), r["src"], r["dst"]): r["sha256"] for r in records if r["kind"] == "received"
    }
    # Draft on stage 2 (ranks 2): the embedding, tap 1 (stage 0) and tap 4 (stage 1) travel; tap 7 is local.
    expected = {(m, tap, src, 2) for m in range(4) for tap, src in (("embedding", 0), ("1", 0), ("4", 1))}
    assert set(received) == expected
    assert sent == received, "every tap the draft received equals, bit for bit, what its source sent"
