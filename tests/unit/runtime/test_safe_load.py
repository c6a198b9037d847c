"""The guard around every checkpoint load in runtime/ (runtime/train/safe_load.py), with real torch objects: DCP
metadata unpickles only with the format's own globals and storage files of the manifest, every torch.load inside the
guard is weights_only (so a ShardedObject's bytes cannot run code either), and no other module loads a checkpoint."""

from __future__ import annotations

import ast
import io
import os
import pickle

import pytest
import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from specdraft.runs.dcp import UnsafeCheckpoint, check_metadata
from specdraft.runs.marker import CorruptCheckpoint
from specdraft.runtime.train import safe_load
from tests.support.paths import REPO


class Evil:
    def __init__(self, side):
        self.side = side

    def __reduce__(self):
        return (os.system, (f"touch {self.side}",))


def _metadata(relative_path: str = "__0_0.distcp") -> bytes:
    size = torch.Size([4, 2])
    tensor = TensorStorageMetadata(
        properties=TensorProperties(dtype=torch.bfloat16),
        size=size,
        chunks=[ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=size)],
    )
    index = MetadataIndex(fqn="w", offset=torch.Size([0, 0]), index=0)
    return pickle.dumps(
        Metadata(state_dict_metadata={"w": tensor}, storage_data={index: _StorageInfo(relative_path, 0, 64)})
    )


def test_real_metadata_passes_both_checks_and_a_crafted_one_neither(tmp_path):
    data = _metadata()
    check_metadata(data, "ok/.metadata")
    got = safe_load.read_metadata(data, "ok/.metadata", frozenset({"__0_0.distcp"}))
    assert got.state_dict_metadata["w"].size == torch.Size([4, 2])
    side = tmp_path / "pwned"
    for check in (
        lambda d: check_metadata(d, "bad/.metadata"),
        lambda d: safe_load.read_metadata(d, "bad/.metadata", frozenset()),
    ):
        with pytest.raises(UnsafeCheckpoint, match="bad/.metadata is refused: its pickle calls for posix.system"):
            check(pickle.dumps(Evil(side)))
        with pytest.raises(UnsafeCheckpoint, match="builtins.eval"):
            check(pickle.dumps(eval))
    assert not side.exists()


def test_metadata_may_name_only_storage_files_of_the_manifest():
    for relative in ("../other/__0_0.distcp", "/etc/passwd", "missing.distcp"):
        with pytest.raises(UnsafeCheckpoint, match="not a file of the checkpoint's manifest"):
            safe_load.read_metadata(_metadata(relative), "x/.metadata", frozenset({"__0_0.distcp"}))
    with pytest.raises(CorruptCheckpoint, match="pickled dict, not torch DCP metadata"):
        safe_load.read_metadata(pickle.dumps({}), "x/.metadata", frozenset())


def test_inside_the_guard_every_torch_load_is_weights_only_and_the_patches_go_away(tmp_path):
    from torch.distributed.checkpoint import filesystem

    side = tmp_path / "pwned"
    buffer = io.BytesIO()
    torch.save({"rng": torch.ones(3), "evil": Evil(side)}, buffer)
    original_read, original_load = filesystem.FileSystemReader.read_metadata, torch.load
    with safe_load._guarded(frozenset(), []):
        buffer.seek(0)
        with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
            torch.load(buffer, weights_only=False)  # what DefaultLoadPlanner.load_bytes asks for
        clean = io.BytesIO()
        torch.save({"rng": torch.ones(3)}, clean)
        clean.seek(0)
        assert torch.equal(torch.load(clean, weights_only=False)["rng"], torch.ones(3))
    assert filesystem.FileSystemReader.read_metadata is original_read and torch.load is original_load
    assert not side.exists()


def test_no_module_but_safe_load_loads_a_checkpoint():
    callers = []
    for path in sorted((REPO / "specdraft").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("load", "read_metadata"):
                owner = node.value
                name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
                if name in ("dist_checkpointing", "dcp", "FileSystemReader") or (
                    name == "pickle" and node.attr == "load"
                ):
                    callers.append(str(path.relative_to(REPO)))
    assert sorted(set(callers)) == ["specdraft/runtime/train/safe_load.py"], callers
