"""A crafted checkpoint cannot run code: its `.metadata` pickle calls os.system (and its marker is rewritten so the
manifest matches), and every reader that checks a checkpoint before a load refuses it by name without calling
anything: the resume choice (launcher and ranks), `status`, export and measure. The loads themselves are guarded
too (tests/unit/runtime/test_safe_load.py, tests/dist/test_checkpoint_safety.py)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from specdraft.assemble import compile
from specdraft.errors import UserError
from specdraft.execute import launch, monitor
from specdraft.runs import checkpoints as files
from specdraft.runs import dcp
from specdraft.runs.rundir import claim_run_dir
from specdraft.runtime.serve import offline
from specdraft.spec.load import load_layout
from tests.support.checkpoints import fake_checkpoint, marker_fields


class Evil:
    """Unpickled with plain pickle, this runs a shell command that writes ``side``."""

    def __init__(self, side: Path):
        self.side = side

    def __reduce__(self):
        return (os.system, (f"touch {self.side}",))


def craft(folder: Path, plan, step: int, side: Path) -> Path:
    """``folder``'s .metadata replaced by the crafted pickle, the marker rewritten to match (hashes included)."""
    (folder / dcp.DCP_METADATA).write_bytes(pickle.dumps(Evil(side)))
    (folder / files.MARKER).unlink()
    files.write_marker(folder, marker_fields(plan, step))
    return folder


@pytest.fixture(scope="module")
def plan():
    return compile(load_layout(None, ["training.save_interval=2"]))


def test_the_check_names_the_global_and_calls_nothing(tmp_path, plan):
    side = tmp_path / "pwned"
    folder = craft(fake_checkpoint(tmp_path / "step-2", plan, 2), plan, 2, side)
    with pytest.raises(dcp.UnsafeCheckpoint, match=r"\.metadata is refused: its pickle calls for posix\.system"):
        files.check_checkpoint(folder, hash_limit=float("inf"))
    for data in (b"not a pickle", pickle.dumps(Evil(side))[:20], b"\x80\x04K\x01."):  # garbage, cut, a bare int
        try:
            dcp.check_metadata(data, "x/.metadata")
        except files.CorruptCheckpoint as err:
            assert "x/.metadata" in str(err)
    assert not side.exists()


def test_resume_status_export_and_measure_refuse_it(tmp_path, plan):
    side = tmp_path / "pwned"
    run = tmp_path / "run"
    claim_run_dir(run)
    (run / "plan.json").write_text(plan.to_json())
    craft(fake_checkpoint(run / "checkpoints" / "step-2", plan, 2), plan, 2, side)
    with pytest.raises(UserError, match="there is no complete checkpoint .*posix.system"):
        launch.check_resume(plan, str(run), "cotrain", True, None, 10)
    with pytest.raises(files.ResumeError, match="posix.system"):  # what rank 0 decides for every rank
        files.choose(run, plan, "newest", None, print)
    with pytest.raises(UserError, match="--resume-from .* is not a complete checkpoint: .*posix.system"):
        launch.check_resume(plan, str(tmp_path / "other"), "cotrain", False, str(run / "checkpoints" / "step-2"), 10)
    newest, _, problems = monitor.checkpoint_report(run)
    assert newest is None and "posix.system" in problems[0]
    for step in (None, 2):  # export and measure choose their checkpoint through offline.checkpoint
        with pytest.raises(offline.LoadError, match="cannot be used: .*posix.system"):
            offline.checkpoint(run, step)
    assert not side.exists()
