"""Checkpoints and resume through the real rank payload: several processes, real signals, real files.

- Exact resume (tp1 cp2 pp2, 4 ranks, fp32 CPU): a run stopped by USR2 on ONE rank (every rank agrees on the step,
  saves, exits 75), resumed with --resume, SIGKILLed on every rank mid-run, and resumed again ends with the
  uninterrupted run's metrics.jsonl: bit-identical losses, acceptance, accept_len and tap bytes, each step once.
- Resume under another layout (--resume-from the 4-rank run's step-3): tp2 pp1 on 2 ranks and a single process
  continue within the parity tolerances of tests/test_cotrain_parity.py (target rel 2e-5, draft rel 2e-4).
- Damaged checkpoints (half-written, truncated shard, unreadable metadata) are skipped with a warning naming each,
  and the previous complete one gives a bit-identical continuation; refusals exit 2 with the reason.
"""

from __future__ import annotations

import shutil
import signal

import pytest

from specdraft.plan.checkpoints import MARKER
from specdraft.runtime.preempt import PREEMPTED_EXIT
from tests.rank_procs import RankRun, metrics, result, without_timing, write_plan

pytestmark = pytest.mark.dist
STEPS = 8
# Saves after steps 3, 6 and 8 (the last); the draft joins after 2 warm-up steps, so step-3 holds both optimizers.
COMMON = ["training.warmup_steps=2", "training.save_interval=3", "training.keep_checkpoints=3",
          f"training.train_iters={STEPS}"]
COTRAIN = ("--workload", "cotrain")
SINGLE = ["cluster.gpus_per_node=1", "parallel.cp=1", "parallel.pp=1"]
TP2 = ["cluster.gpus_per_node=2", "parallel.tp=2", "parallel.cp=1", "parallel.pp=1"]


def _rows(run_dir) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.timeout(900)
def test_preempted_and_killed_runs_resume_exactly_and_reshard(tmp_path):
    # The uninterrupted reference.
    ref_dir = tmp_path / "reference"
    write_plan(ref_dir, COMMON)
    run = RankRun.start(ref_dir, 4, *COTRAIN)
    assert run.wait() == [0] * 4, run.stderr_tail()
    ref = metrics(ref_dir)
    assert [r["step"] for r in ref] == list(range(STEPS)) and ref[-1]["draft_loss"] is not None
    assert sorted(p.name for p in (ref_dir / "checkpoints").iterdir()) == ["step-3", "step-6", "step-8"]

    # USR2 to rank 3 alone: all four stop after the same step k, save step-k and exit with the preempted code.
    run_dir = tmp_path / "interrupted"
    write_plan(run_dir, COMMON)
    run = RankRun.start(run_dir, 4, *COTRAIN)
    run.wait_for(lambda: _rows(run_dir) >= 1, what="a first step")
    run.kill(signal.SIGUSR2, ranks=[3])
    assert run.wait() == [PREEMPTED_EXIT] * 4, run.stderr_tail()
    records = [result(run_dir, r) for r in range(4)]
    k = records[0]["preempted"]["step"]
    assert 1 <= k < STEPS and {r["preempted"]["step"] for r in records} == {k}
    assert all(r["terminated"] and not r["ok"] and r["preempted"]["signal"] == "SIGUSR2" for r in records)
    assert records[0]["preempted"]["requeue"]["requeued"] is False  # not a Slurm job
    assert (run_dir / "checkpoints" / f"step-{k}" / MARKER).is_file()
    assert without_timing(metrics(run_dir)) == without_timing(ref[:k])

    # --resume, then SIGKILL on every rank once the next periodic checkpoint is complete.
    after = (k // 3 + 1) * 3
    run = RankRun.start(run_dir, 4, *COTRAIN, "--resume")
    run.wait_for(lambda: (run_dir / "checkpoints" / f"step-{after}" / MARKER).is_file(), what=f"step-{after}")
    run.kill(signal.SIGKILL)
    assert run.wait() == [-signal.SIGKILL] * 4, "killed mid-run, before the last step"
    assert result(run_dir, 0)["preempted"]["step"] == k, "the killed attempt wrote no result of its own"

    run = RankRun.start(run_dir, 4, *COTRAIN, "--resume")
    assert run.wait() == [0] * 4, run.stderr_tail()
    assert result(run_dir, 0)["resumed_step"] == after
    assert without_timing(metrics(run_dir)) == without_timing(ref), "bit-identical, every step exactly once"

    # The reference's step-3 under other layouts: history carried over as is, the next steps within tolerance.
    for name, overrides, world in (("tp2-pp1", TP2, 2), ("single", SINGLE, 1)):
        other = tmp_path / name
        write_plan(other, COMMON + overrides)
        run = RankRun.start(other, world, *COTRAIN, "--resume-from", str(ref_dir / "checkpoints" / "step-3"))
        assert run.wait() == [0] * world, run.stderr_tail()
        rows = metrics(other)
        assert [r["step"] for r in rows] == list(range(STEPS))
        assert rows[:3] == ref[:3]
        for got, want in zip(rows[3:], ref[3:]):
            assert got["target_loss"] == pytest.approx(want["target_loss"], rel=2e-5), (name, got["step"])
            assert got["draft_loss"] == pytest.approx(want["draft_loss"], rel=2e-4, abs=1e-6), (name, got["step"])


@pytest.mark.timeout(600)
def test_damaged_checkpoints_are_skipped_and_refusals_say_why(tmp_path):
    overrides = SINGLE + ["training.warmup_steps=1", "training.save_interval=1", "training.keep_checkpoints=4",
                          "training.train_iters=4"]
    run_dir = tmp_path / "run"
    write_plan(run_dir, overrides)
    run = RankRun.start(run_dir, 1, *COTRAIN)
    assert run.wait() == [0], run.stderr_tail()
    ref = metrics(run_dir)
    root = run_dir / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step-1", "step-2", "step-3", "step-4"]

    # step-5: half-written (no marker); step-4: a shard cut short; step-3: metadata overwritten in place.
    shutil.copytree(root / "step-4", root / "step-5")
    (root / "step-5" / MARKER).unlink()
    shard = sorted((root / "step-4").glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    metadata = root / "step-3" / ".metadata"
    metadata.write_bytes(b"\0" * metadata.stat().st_size)
    run = RankRun.start(run_dir, 1, *COTRAIN, "--resume")
    assert run.wait() == [0], run.stderr_tail()
    err = (run_dir / "rank-0.err").read_text()
    assert f"skipping checkpoint {root / 'step-5'}: it has no completion marker" in err
    assert f"skipping checkpoint {root / 'step-4'}: {shard.name} has 100 bytes" in err
    assert f"skipping checkpoint {root / 'step-3'}: it could not be loaded" in err
    assert result(run_dir, 0)["resumed_step"] == 2
    assert without_timing(metrics(run_dir)) == without_timing(ref)

    fresh = tmp_path / "fresh"
    write_plan(fresh, overrides)
    run = RankRun.start(fresh, 1, *COTRAIN, "--resume")
    assert run.wait() == [2]
    assert "--resume: there is no complete checkpoint in" in (fresh / "rank-0.err").read_text()

    other = tmp_path / "other-shape"
    write_plan(other, overrides + ["model.hidden_size=32", "model.ffn_hidden_size=128"])
    run = RankRun.start(other, 1, *COTRAIN, "--resume-from", str(root / "step-2"))
    assert run.wait() == [2]
    err = (other / "rank-0.err").read_text()
    assert "holds another model shape" in err and "model.hidden_size: checkpoint 64, this plan 32" in err
    assert "model.ffn_hidden_size: checkpoint 256, this plan 128" in err and "model.head_dim" in err
