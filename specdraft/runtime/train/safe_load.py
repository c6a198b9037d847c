"""The one way runtime/ loads a checkpoint (resume, export, measure): megatron-core's dist_checkpointing.load with
every unpickling restricted, so a crafted checkpoint cannot run code on the ranks that load it; and quiet_writer,
the set-up the save and the load share."""

from __future__ import annotations

import contextlib
import pickle
import queue
import threading
import warnings
from pathlib import Path

from specdraft.runs.dcp import AllowlistUnpickler, UnsafeCheckpoint
from specdraft.runs.marker import CorruptCheckpoint
from specdraft.runs.paths import MAX_DCP_METADATA_BYTES

# Inside a load: torch DCP's .metadata, which torch reads with plain pickle (FileSystemReader.read_metadata, called
# several times by megatron's loaders), is unpickled from the bytes read once per call, finding only the format's
# own globals (runs/dcp.py), and may name only storage files of the manifest. Every torch.load inside (common.pt, and
# the ShardedObjects' byte items, which DefaultLoadPlanner.load_bytes reads with weights_only=False) runs
# weights_only. Both are patched for one load only, here; no other module calls dist_checkpointing.load (a test).
_LOCK = threading.Lock()  # one guarded load at a time: the patches are process-wide while it runs


@contextlib.contextmanager
def quiet_writer():
    """Synchronous saves without the writer's extra process, and without torch's deprecation chatter per rank.

    dist_checkpointing's torch_dist writer hands its results back through a queue it builds, on first use, with a
    *spawned* multiprocessing Manager: one more interpreter per rank, left orphaned when the rank leaves through
    os._exit (entry.exit_now) and killed by the USR2 Slurm sends to every process of the step. A synchronous save
    puts and gets in this same process, so a plain queue.Queue does the job (the writers it forks stay as they are).
    """
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if filesystem_async._results_queue is None:
        filesystem_async._results_queue = queue.Queue()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*(DTensor|load_state_dict).*")
        yield


class _Restricted(AllowlistUnpickler):
    def resolve(self, module: str, name: str):
        return pickle.Unpickler.find_class(self, module, name)  # the real class: this read builds the metadata


def read_metadata(data: bytes, source: str, files: frozenset[str]):
    """torch DCP Metadata from ``data``, refusing any other global and any storage file outside ``files``."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        metadata = _Restricted(data, source).load()
    except CorruptCheckpoint:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as err:
        raise CorruptCheckpoint(
            f"{source} is not torch DCP metadata ({type(err).__name__}: {str(err)[:120]})"
        ) from None
    if not isinstance(metadata, Metadata):
        raise CorruptCheckpoint(f"{source} is a pickled {type(metadata).__name__}, not torch DCP metadata")
    for info in (metadata.storage_data or {}).values():
        relative = getattr(info, "relative_path", None)
        if relative not in files:
            raise UnsafeCheckpoint(
                f"{source} is refused: it names the storage file {str(relative)[:80]!r}, which is not a file of "
                "the checkpoint's manifest"
            )
    return metadata


@contextlib.contextmanager
def _guarded(files: frozenset[str], refused: list[CorruptCheckpoint]):
    import torch
    from torch.distributed.checkpoint import filesystem
    from torch.distributed.checkpoint.metadata import StorageMeta

    original_read, original_load = filesystem.FileSystemReader.read_metadata, torch.load

    def safe_read_metadata(self, *args, **kwargs):
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as handle:
            data = handle.read(MAX_DCP_METADATA_BYTES + 1)
        try:
            if len(data) > MAX_DCP_METADATA_BYTES:
                raise CorruptCheckpoint(f"{path} is larger than {MAX_DCP_METADATA_BYTES:,} bytes")
            metadata = read_metadata(data, str(path), files)
        except CorruptCheckpoint as err:
            refused.append(err)
            raise
        if getattr(metadata, "storage_meta", None) is None:  # what torch's own reader does after unpickling
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def weights_only_load(*args, **kwargs):
        kwargs["weights_only"] = True
        return original_load(*args, **kwargs)

    with _LOCK:
        setattr(filesystem.FileSystemReader, "read_metadata", safe_read_metadata)  # noqa: B010 - a patch
        setattr(torch, "load", weights_only_load)  # noqa: B010
        try:
            yield
        finally:
            setattr(filesystem.FileSystemReader, "read_metadata", original_read)  # noqa: B010
            setattr(torch, "load", original_load)  # noqa: B010


def load(template: dict, folder: Path, meta: dict) -> dict:
    """``template`` (a sharded state dict) filled from the checkpoint ``folder`` whose checked marker is ``meta``.
    A refused metadata file raises its CorruptCheckpoint (whatever wrapper torch or megatron puts around it)."""
    from megatron.core import dist_checkpointing

    refused: list[CorruptCheckpoint] = []
    try:
        with quiet_writer(), _guarded(frozenset(meta["manifest"]), refused):
            return dist_checkpointing.load(template, str(folder))
    except BaseException:
        if refused:
            raise refused[0] from None
        raise
