"""Checkpoint folders made without torch, for the tests of what counts, what a resume takes and what status shows:
a shard, a common file, a `.metadata` pickle with no globals (what runs/dcp.py allows), and a marker of the current
format (real hashes) unless the folder is to look half-written."""

from __future__ import annotations

import pickle
from pathlib import Path

from specdraft.runs import checkpoints as files


def marker_fields(plan=None, step: int = 0, **overrides) -> dict:
    """What runtime/train/checkpoint.save records besides the manifest; ``plan`` None gives a layout-free marker."""
    described = (
        files.describe(plan)
        if plan is not None
        else {
            "name": "tiny",
            "spec_sha256": "0" * 64,
            "specdraft_version": "0.1.0",
            "world_size": 2,
            "parallel": {},
            "model": {},
            "draft": {},
        }
    )
    return {
        **described,
        "step": step,
        "target_optimizer_step": step,
        "draft_optimizer_step": 0,
        "main_weights": False,
        "loss_scale": None,
        **overrides,
    }


def fake_checkpoint(folder: Path, plan=None, step: int = 0, *, complete: bool = True, shard: bytes = b"", **meta):
    """``folder`` (created) as a checkpoint of ``plan`` after ``step`` steps; returns it."""
    folder = Path(folder)
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(shard or b"x" * (10 + step))
    (folder / "common.pt").write_bytes(b"c")
    (folder / ".metadata").write_bytes(pickle.dumps({"state_dict_metadata": {}, "storage_data": {}}))
    if complete:
        files.write_marker(folder, marker_fields(plan, step, **meta))
    return folder
