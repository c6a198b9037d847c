"""Checkpoints nobody can turn against the run, with one small real checkpoint (one process, two steps, torch DCP
through megatron-core) shared by every check here, each on its own copy of the run folder.

- The globals a real `.metadata` holds are exactly what runs/dcp.py allows.
- A crafted `.metadata` (a pickle that would run a shell command, its marker rewritten so the manifest matches) is
  refused by export, rollout measure, launch --resume and --resume-from and by the guarded load itself (every
  pre-check bypassed), and the command never runs.
- One flipped bit in tensor data: `status` says the checkpoint is damaged and names the file, export refuses it,
  launch --resume-from refuses it, and ranks started directly with --resume refuse it at load.
- A step-N that is a link out of the run folder: `status` names it, export and measure refuse it, and a resume takes
  the real checkpoint beside it, saves over the link's name without touching the link's target, and prunes around it.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specdraft.runs import checkpoints as files
from tests.support.distributed import run_distributed
from tests.support.rank_procs import RankRun

pytestmark = pytest.mark.dist
DCP_METADATA = ".metadata"
LAYOUT = [
    "cluster.gpus_per_node=1",
    "parallel.cp=1",
    "parallel.pp=1",
    "training.warmup_steps=1",
    "training.save_interval=1",
    "training.keep_checkpoints=2",
    "training.train_iters=2",
]
BIN = str(Path(sys.executable).with_name("specdraft"))


def cli(*args, cwd, timeout=240):
    env = {k: v for k, v in os.environ.items() if k != "SPECDRAFT_DEBUG"}
    return subprocess.run(
        [BIN, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("safety")
    plan = root / "plan.json"
    assert cli("plan", *LAYOUT, "-o", plan, cwd=root).returncode == 0
    proc = cli("launch", plan, "--run-dir", root / "run", "--executor", "local", cwd=root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert sorted(p.name for p in (root / "run" / "checkpoints").iterdir()) == ["step-1", "step-2"]
    return root


def _copy(run: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    shutil.copytree(run / "run", folder, symlinks=True)
    return folder


def _remark(folder: Path, **changes) -> None:
    """Rewrite ``folder``'s marker over its files as they are now (real hashes): what a careful forger does."""
    meta = json.loads((folder / files.MARKER).read_text())
    meta = {k: v for k, v in meta.items() if k not in ("format", "manifest")}
    (folder / files.MARKER).unlink()
    files.write_marker(folder, {**meta, **changes})


def _refused(proc, *parts):
    assert proc.returncode == 2, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr[-1500:]
    for part in parts:
        assert part in proc.stderr, (part, proc.stderr[-1500:])


class Evil:
    def __init__(self, side):
        self.side = side

    def __reduce__(self):
        return (os.system, (f"touch {self.side}",))


def test_a_real_checkpoint_holds_only_the_allowed_globals(run):
    from specdraft.runs.dcp import ALLOWED_GLOBALS

    seen = set()

    class Lister(pickle.Unpickler):
        def find_class(self, module, name):
            seen.add((module, name))
            return super().find_class(module, name)

    for step in ("step-1", "step-2"):
        with open(run / "run" / "checkpoints" / step / DCP_METADATA, "rb") as handle:
            Lister(handle).load()
    assert seen and seen <= ALLOWED_GLOBALS, sorted(seen - ALLOWED_GLOBALS)
    for step in ("step-1", "step-2"):
        files.check_checkpoint(run / "run" / "checkpoints" / step, hash_limit=float("inf"))


def _load_bypassing_every_check(rank, world, folder: str):
    """offline.load with the marker handed in, so only the guarded load stands between the file and pickle."""
    from specdraft.runtime.serve import offline

    plan = offline.read_run_plan(Path(folder).parent.parent)
    meta = json.loads((Path(folder) / files.MARKER).read_text())
    with offline.single_process():
        try:
            offline.load(plan, Path(folder), target=False, meta=meta)
        except offline.LoadError as err:
            return err.message
    return "loaded"


def test_a_crafted_metadata_is_refused_everywhere_and_runs_nothing(run, tmp_path):
    folder = _copy(run, tmp_path)
    side = tmp_path / "pwned"
    shutil.rmtree(folder / "checkpoints" / "step-1")
    step2 = folder / "checkpoints" / "step-2"
    (step2 / DCP_METADATA).write_bytes(pickle.dumps(Evil(side)))
    _remark(step2)
    why = "its pickle calls for posix.system"
    _refused(cli("export", folder, "-o", tmp_path / "out", cwd=tmp_path), why)
    _refused(cli("rollout", "measure", folder, "--prompts", "1", cwd=tmp_path), why)
    _refused(
        cli("launch", run / "plan.json", "--run-dir", folder, "--executor", "local", "--resume", cwd=tmp_path),
        "--resume: there is no complete checkpoint",
        why,
    )
    _refused(
        cli(
            *("launch", *LAYOUT, "--run-dir", tmp_path / "x", "--executor", "local", "--resume-from", step2),
            cwd=tmp_path,
        ),
        "is not a complete checkpoint",
        why,
    )
    status = cli("status", folder, cwd=tmp_path)
    assert status.returncode == 0 and "step-2 is damaged and does not count" in status.stdout, status.stdout
    message = run_distributed(_load_bypassing_every_check, 1, str(step2), timeout=200)[0]
    assert "is refused" in message and why in message, message
    assert not side.exists(), "the crafted pickle ran"
    assert not (tmp_path / "out").exists() and not (tmp_path / "x").exists()


def test_one_flipped_bit_is_named_by_status_export_and_resume(run, tmp_path):
    folder = _copy(run, tmp_path)
    step2 = folder / "checkpoints" / "step-2"
    shard = max(step2.glob("*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10  # one bit of some tensor's data; the size stays
    shard.write_bytes(bytes(data))
    damaged = f"{shard} is damaged: its content hash"
    status = cli("status", folder, cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    text = " ".join(status.stdout.split())  # rich wraps long lines
    assert "checkpoints/step-2 is damaged and does not count" in text and shard.name in text, status.stdout
    assert "checkpoints/step-1 is the newest complete one" in text
    _refused(cli("export", folder, "-o", tmp_path / "out", cwd=tmp_path), damaged)
    _refused(cli("export", folder, "--step", "2", "-o", tmp_path / "out", cwd=tmp_path), damaged)
    flags = ("--executor", "local", "--steps", "3", "--resume-from", step2)
    _refused(cli("launch", *LAYOUT, "--run-dir", tmp_path / "x", *flags, cwd=tmp_path), damaged)
    # The ranks check the hashes themselves before they load (the launcher's check is skipped here).
    shutil.rmtree(folder / "checkpoints" / "step-1")
    ranks = RankRun.start(folder, 1, "--workload", "cotrain", "--steps", "3", "--resume")
    assert ranks.wait() == [2], ranks.stderr_tail()
    err = (folder / "rank-0.err").read_text()
    assert "no checkpoint could be loaded" in err and damaged in err, err[-2000:]


def test_a_linked_step_folder_is_never_followed(run, tmp_path):
    folder = _copy(run, tmp_path)
    elsewhere = tmp_path / "elsewhere" / "step-3"
    shutil.copytree(folder / "checkpoints" / "step-2", elsewhere)
    _remark(elsewhere, step=3)
    (folder / "checkpoints" / "step-3").symlink_to(elsewhere)
    before = sorted(os.listdir(elsewhere))
    status = cli("status", folder, cwd=tmp_path)
    text = " ".join(status.stdout.split())
    assert status.returncode == 0 and "step-3 is a symbolic link" in text and "step-2 is the newest complete" in text
    for argv in (
        ("export", folder, "--step", "3", "-o", tmp_path / "out"),
        ("rollout", "measure", folder, "--step", "3"),
    ):
        _refused(cli(*argv, cwd=tmp_path), "step-3 is a symbolic link")
    proc = cli(
        "launch",
        run / "plan.json",
        "--run-dir",
        folder,
        "--executor",
        "local",
        "--resume",
        "--steps",
        "3",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"resuming from: {folder / 'checkpoints' / 'step-2'}" in proc.stderr
    assert sorted(os.listdir(elsewhere)) == before, "the link's target was touched"
    assert json.loads((elsewhere / files.MARKER).read_text())["step"] == 3
    # The save after step 3 replaced the link by a real folder; pruning (keep 2) dropped step-1.
    assert not (folder / "checkpoints" / "step-3").is_symlink()
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["step-2", "step-3"]
    files.check_checkpoint(folder / "checkpoints" / "step-3", hash_limit=float("inf"))
