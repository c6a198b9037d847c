"""torch DCP's `.metadata` as untrusted data: the pickle globals the torch_dist format holds, and a check of a file's
bytes against them without torch (each global a stand-in: nothing is called). runtime/train/safe_load.py unpickles
with the same list; the launcher, `status`, export and measure check here first, before any rank starts."""

from __future__ import annotations

import io
import pickle

from specdraft.runs.marker import CorruptCheckpoint

DCP_METADATA = ".metadata"
# torch's own reader unpickles .metadata with plain pickle: a crafted checkpoint would run code on every rank that
# loads it. The list is what find_class sees unpickling real checkpoints of this runtime (fp32, bf16 and fp16; tp,
# cp and pp; a reduced draft vocabulary: tests/dist/test_checkpoint_safety.py), plus the remaining torch dtypes.
_DTYPES = (
    "float32 float64 float16 bfloat16 complex64 complex128 uint8 uint16 uint32 uint64 int8 int16 int32 int64 bool "
    "float8_e4m3fn float8_e5m2 float8_e4m3fnuz float8_e5m2fnuz"
).split()
ALLOWED_GLOBALS = frozenset(
    {("torch", "Size"), ("torch.serialization", "_get_layout")}
    | {("torch", dtype) for dtype in _DTYPES}
    | {
        ("torch.distributed.checkpoint.metadata", name)
        for name in (
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        )
    }
    | {("torch.distributed.checkpoint.filesystem", "_StorageInfo")}
    | {
        ("torch.distributed.checkpoint.planner", name)
        for name in ("SavePlan", "WriteItem", "WriteItemType", "TensorWriteData", "BytesIOWriteData")
    }
)


class UnsafeCheckpoint(CorruptCheckpoint):
    """A checkpoint file whose pickle names a global the checkpoint format never holds: it could run code."""


def refuse_global(module: str, name: str, source: str) -> UnsafeCheckpoint:
    return UnsafeCheckpoint(
        f"{source} is refused: its pickle calls for {module[:80]}.{name[:80]}, which a torch DCP checkpoint never "
        "holds (it would run code when loaded); a checkpoint from someone else may be crafted: do not load it"
    )


def allowed(module: str, name: str) -> bool:
    return (module, name) in ALLOWED_GLOBALS


class _StandIn:
    """What every allowed global becomes in the check: calling, constructing and setting state do nothing."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass


class AllowlistUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata ``data`` naming only ALLOWED_GLOBALS; `resolve` says what an allowed global becomes."""

    def __init__(self, data: bytes, source: str):
        super().__init__(io.BytesIO(data))
        self.source = source

    def find_class(self, module: str, name: str):
        if not allowed(module, name):
            raise refuse_global(module, name, self.source)
        return self.resolve(module, name)

    def resolve(self, module: str, name: str):
        return _StandIn  # the check calls nothing

    def persistent_load(self, pid):
        raise UnsafeCheckpoint(f"{self.source} is refused: it holds a persistent id, which DCP metadata never does")


def check_metadata(data: bytes, source: str) -> None:
    """Refuse (UnsafeCheckpoint, CorruptCheckpoint) DCP metadata bytes that name a global the format never holds or
    are not a pickle at all; nothing in them is called."""
    try:
        AllowlistUnpickler(data, source).load()
    except CorruptCheckpoint:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as err:
        raise CorruptCheckpoint(
            f"{source} is not torch DCP metadata ({type(err).__name__}: {str(err)[:120]})"
        ) from None
    except RecursionError:
        raise CorruptCheckpoint(f"{source} is not torch DCP metadata (nested too deeply)") from None
