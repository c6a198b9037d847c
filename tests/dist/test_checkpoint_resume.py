"""Checkpoints and resume through the real rank payload: several processes, real signals, real files.

- Exact resume (tp1 cp2 pp2, 4 ranks, fp32 CPU): a run SIGKILLed on every rank mid-run, two steps past its newest
  checkpoint, and resumed with --resume ends with a metrics.jsonl equal, step for step, to what the run computed
  before the kill without interruption: bit-identical losses, acceptance, accept_len and tap bytes, each step
  once. The killed run is its own reference: the two steps it logged after the checkpoint are the uninterrupted
  values the resume must reproduce (the first checks the restored weights, the second the restored optimizers).
- Resume under another layout (--resume-from that run's step-2): tp2 pp1 on 2 ranks and a single process continue
  within the parity tolerances of tests/dist/test_cotrain_parity.py (target rel 2e-5, draft rel 2e-4).
- Damaged checkpoints (half-written, truncated shard, metadata that is no pickle) are skipped with a warning naming
  each, and the previous complete one gives a bit-identical continuation; a resume with nothing to resume exits 2.

A stop by USR2 on one rank (all ranks agree on the step, save, exit 75) and its resume run through the CLI in
tests/dist/test_launch_resume.py, and on Slurm in tests/slurm/test_preempt_slurm.py; the refusals of another spec or
model shape are checked there too, by the launcher, before any rank starts (the ranks apply the same
runs/checkpoints.choose). One 4-rank run serves every check here, so this file starts 11 rank processes.
"""

from __future__ import annotations

import shutil
import signal

import pytest

from specdraft.runs.checkpoints import MARKER
from tests.support.rank_procs import RankRun, metrics, result, without_timing, write_plan

pytestmark = pytest.mark.dist
STEPS = 5
# Saves after steps 2, 4 and 5 (the last); the draft joins after 1 warm-up step, so step-2 holds both optimizers.
COMMON = [
    "training.warmup_steps=1",
    "training.save_interval=2",
    "training.keep_checkpoints=3",
    f"training.train_iters={STEPS}",
]
COTRAIN = ("--workload", "cotrain")
PAUSE = {"SPECDRAFT_STEP_PAUSE_S": "1.5"}  # after each step's metrics, before its save: the kill's place
SINGLE = ["cluster.gpus_per_node=1", "parallel.cp=1", "parallel.pp=1"]
TP2 = ["cluster.gpus_per_node=2", "parallel.tp=2", "parallel.cp=1", "parallel.pp=1"]


def _rows(run_dir) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.timeout(900)
def test_a_killed_run_resumes_exactly_and_reshards(tmp_path):
    # SIGKILL on every rank in the pause after step 4's metrics (index 3), before the save after it: the newest
    # complete checkpoint is step-2, and steps 2 and 3 were computed and logged past it.
    run_dir = tmp_path / "killed"
    write_plan(run_dir, COMMON)
    run = RankRun.start(run_dir, 4, *COTRAIN, env=PAUSE)
    run.wait_for(lambda: _rows(run_dir) >= 4, what="four steps logged")
    run.kill(signal.SIGKILL)
    assert run.wait() == [-signal.SIGKILL] * 4, "killed mid-run, before the last step"
    uninterrupted = metrics(run_dir)
    assert [r["step"] for r in uninterrupted] == [0, 1, 2, 3] and uninterrupted[-1]["draft_loss"] is not None
    complete = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if (p / MARKER).is_file())
    assert complete == ["step-2"], complete

    run = RankRun.start(run_dir, 4, *COTRAIN, "--resume")
    assert run.wait() == [0] * 4, run.stderr_tail()
    assert result(run_dir, 0)["resumed_step"] == 2
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(STEPS)), "every step exactly once"
    assert without_timing(rows[:4]) == without_timing(uninterrupted), "bit-identical to the uninterrupted steps"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-2", "step-4", "step-5"]

    # step-2 under other layouts: history carried over as is, the next steps within tolerance.
    for name, overrides, world in (("tp2-pp1", TP2, 2), ("single", SINGLE, 1)):
        other = tmp_path / name
        write_plan(other, COMMON + overrides)
        run = RankRun.start(other, world, *COTRAIN, "--resume-from", str(run_dir / "checkpoints" / "step-2"))
        assert run.wait() == [0] * world, run.stderr_tail()
        resharded = metrics(other)
        assert [r["step"] for r in resharded] == list(range(STEPS))
        assert resharded[:2] == rows[:2]
        for got, want in zip(resharded[2:], rows[2:]):
            assert got["target_loss"] == pytest.approx(want["target_loss"], rel=2e-5), (name, got["step"])
            assert got["draft_loss"] == pytest.approx(want["draft_loss"], rel=2e-4, abs=1e-6), (name, got["step"])


@pytest.mark.timeout(600)
def test_damaged_checkpoints_are_skipped_and_refusals_say_why(tmp_path):
    overrides = SINGLE + [
        "training.warmup_steps=1",
        "training.save_interval=1",
        "training.keep_checkpoints=4",
        "training.train_iters=4",
    ]
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
    assert f"skipping checkpoint {root / 'step-3'}: {metadata} is not torch DCP metadata" in err
    assert result(run_dir, 0)["resumed_step"] == 2
    assert without_timing(metrics(run_dir)) == without_timing(ref)

    fresh = tmp_path / "fresh"
    write_plan(fresh, overrides)
    run = RankRun.start(fresh, 1, *COTRAIN, "--resume")
    assert run.wait() == [2]
    assert "--resume: there is no complete checkpoint in" in (fresh / "rank-0.err").read_text()
