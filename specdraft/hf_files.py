"""The JSON of a Hugging Face model folder as specdraft reads it, without torch: the shape of config.json's keys,
and a safetensors header and shard index held to safetensors' own rules (https://huggingface.co/docs/safetensors):
known dtypes, offsets from 0, contiguous, no overlap, every byte a tensor's, and bytes = prod(shape) x itemsize.
Shared by the layout's check (spec/checkpoints/), the launch's and the ranks' (runtime/models/hf/checkpoint.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdraft.jsonfile import ListOf, Obj, Opt, problems

# safetensors' dtypes of whole bytes and their sizes; F4 and F6 (sub-byte) are named but never read.
ITEMSIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "C64": 8,
}
SUB_BYTE = ("F4", "F6_E2M3", "F6_E3M2")
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")  # the weights specdraft loads (converted to the run's dtype)
METADATA = "__metadata__"

# config.json: the keys whose type a reader relies on (the rest are checked, value by value, where they are read).
CONFIG = Obj(
    {
        "architectures": Opt(ListOf(str)),
        "model_type": Opt(str),
        "hidden_act": Opt(str),
        "rope_scaling": Opt(Obj()),
        "rope_parameters": Opt(Obj()),
        "mlp_only_layers": Opt(ListOf(int)),
    }
)
INDEX = Obj({"weight_map": Obj(values=str), "metadata": Opt(Obj())})
_ENTRY = Obj(
    {"dtype": str, "shape": ListOf(int), "data_offsets": ListOf(int, 2)}, required=("dtype", "shape", "data_offsets")
)
HEADER = Obj({METADATA: Opt(Obj(values=str))}, values=_ENTRY)


@dataclass(frozen=True)
class Entry:
    """One tensor of a safetensors header: offsets relative to the end of the header."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def header_entries(header: Any, data_bytes: int) -> tuple[dict[str, Entry], list[str]]:
    """(tensor name -> Entry, what breaks safetensors' rules) of a parsed header whose file holds ``data_bytes``
    bytes after it. Every problem names the tensor; [] means safetensors' own loader would accept the layout."""
    found = problems(header, HEADER)
    if found:
        return {}, found
    out: dict[str, Entry] = {}
    bad: list[str] = []
    for name, entry in header.items():
        if name == METADATA:
            continue
        dtype, shape, offsets = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        if len(offsets) != 2:
            bad.append(f"tensor {name!r}: data_offsets {offsets!r} is not [begin, end]")
            continue
        begin, end = offsets
        if dtype not in ITEMSIZE:
            why = "a sub-byte dtype specdraft does not read" if dtype in SUB_BYTE else "not a safetensors dtype"
            bad.append(f"tensor {name!r}: dtype {dtype!r} is {why}")
            continue
        if any(d < 0 for d in shape) or not 0 <= begin <= end:
            bad.append(f"tensor {name!r}: shape {list(shape)} or data_offsets [{begin}, {end}] is negative or reversed")
            continue
        need = numel(shape) * ITEMSIZE[dtype]
        if end - begin != need:
            bad.append(
                f"tensor {name!r}: data_offsets [{begin}, {end}] hold {end - begin} bytes, but {dtype} "
                f"{list(shape)} needs {need}"
            )
            continue
        out[name] = Entry(dtype, shape, begin, end)
    if bad:
        return out, bad
    at, last = 0, ""  # safetensors: the tensors tile the data area from its first byte to its last, in offset order
    for name, e in sorted(out.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        if e.begin < at:
            bad.append(f"tensor {name!r}: data_offsets [{e.begin}, {e.end}] overlap tensor {last!r} (ends at {at})")
        elif e.begin > at:
            bad.append(f"tensor {name!r}: data_offsets start at {e.begin}, leaving bytes {at}..{e.begin} unused")
        if e.end >= at:
            at, last = e.end, name
    if at > data_bytes:
        bad.append(
            f"tensor {last!r} ends at byte {at} of the data, past the {data_bytes} bytes the file holds after its "
            "header (a cut-short copy?)"
        )
    elif at < data_bytes and not bad:
        bad.append(f"the tensors end at byte {at} of the data, but the file holds {data_bytes} bytes after the header")
    return out, bad
