"""A HF checkpoint folder read without torch: config.json, the safetensors index and every shard's header, checked
against the plan's model before any rank starts (architecture, shards, tensor names, shapes and dtypes).

safetensors' layout (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length, a JSON header
{name: {dtype, shape, data_offsets: [begin, end]}} (offsets relative to the end of the header), then the bytes.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from specdraft import hf_files, jsonfile
from specdraft.errors import SpecdraftError, UserError
from specdraft.fsutil import file_kind, read_regular_file
from specdraft.hf_files import FLOAT_DTYPES
from specdraft.plan.model import LaunchPlan, ModelShape
from specdraft.runtime.models.hf.mapping import FAMILIES, IGNORED, Family, Geometry, hf_tensors

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
MAX_HEADER = 100 << 20  # safetensors' own limit on the JSON header
MAX_JSON_BYTES = 64 << 20  # config.json is a few KB; an index lists every tensor name once
MAX_LISTED = 20
# Tokenizer and generation files an export copies beside the weights (those that exist).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)


class CheckpointError(SpecdraftError):
    """A HF folder the runtime cannot initialise the policy from (the user's to fix: exit 2)."""

    def __init__(self, message: str, fix: str = ""):
        self.message, self.fix = message, fix
        super().__init__(message)

    def __str__(self) -> str:
        return f"{self.message}; {self.fix}" if self.fix else self.message


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute byte offsets in ``file``
    end: int


@dataclass(frozen=True)
class HFCheckpoint:
    folder: Path
    config: dict
    architecture: str
    tensors: dict[str, TensorInfo]

    @property
    def family(self) -> Family:
        return FAMILIES[self.architecture]

    @property
    def dtype(self) -> str:
        """The safetensors dtype most of the weights are stored in (an export writes the same)."""
        return stored_dtype(self.tensors)


def stored_dtype(tensors: dict[str, TensorInfo]) -> str:
    """The safetensors dtype most of ``tensors`` are stored in."""
    counts: dict[str, int] = {}
    for info in tensors.values():
        counts[info.dtype] = counts.get(info.dtype, 0) + 1
    return max(counts, key=lambda k: counts[k]) if counts else "F32"


def folder_of(model_path: str | None) -> Path | None:
    """The HF folder ``model.path`` names (a directory holding config.json), else None: unset, a hub id, a path that
    is not there, or a folder of tokenizer files only (the layout then writes the model fields). A directory with
    safetensors weights but no config.json is refused."""
    if model_path is None:
        return None
    path = Path(model_path).expanduser()
    if not path.is_dir():
        return None
    if not (path / CONFIG).is_file():
        if not any(path.glob("*.safetensors")) and not (path / "model.safetensors.index.json").exists():
            return None
        raise CheckpointError(
            f"model.path {str(path)!r} is a folder without {CONFIG}, so it is no Hugging Face checkpoint",
            "name a folder written by save_pretrained (config.json + safetensors), or a path that does not exist "
            "for random weights",
        )
    return path.absolute()


def plan_checkpoint(plan: LaunchPlan) -> HFCheckpoint | None:
    """The checked HF checkpoint ``plan``'s policy starts from, or None for random weights (model.path unset, or a
    folder of tokenizer files beside a written-out model section). A model.path that is no folder on this node is
    refused: the ranks download nothing, and random weights are never a silent stand-in for a checkpoint."""
    path = plan.model.path
    if path is not None and not Path(path).expanduser().is_dir():
        raise CheckpointError(
            f"model.path {path!r} is not a folder on this node: the policy's weights are read from a local Hugging "
            "Face folder (nothing is downloaded), so it would start from random weights",
            "put the checkpoint where every node sees it and set model.path to that absolute path, or leave "
            "model.path unset to train from random weights",
        )
    folder = folder_of(path)
    return None if folder is None else open_checkpoint(plan.model, folder)


def read_json(path: Path, shape, what: str, fix: str):
    """A JSON file of the checkpoint (a regular file, bounded) through the bounded parser and its shape check."""
    try:
        data = read_regular_file(path, MAX_JSON_BYTES, what)
    except UserError as err:
        raise CheckpointError(err.message, fix) from None
    try:
        return jsonfile.load(data, str(path), shape, fix)
    except jsonfile.BadJson as err:
        raise CheckpointError(err.message, fix) from None


def read_config(folder: Path) -> dict:
    return read_json(folder / CONFIG, hf_files.CONFIG, CONFIG, "restore the checkpoint's config.json")


def architecture(config: dict, where: Path) -> str:
    """config.json's `architectures[0]`; a config without one (a bare config class's save) goes by model_type."""
    names = config.get("architectures")
    name = names[0] if isinstance(names, list) and names and isinstance(names[0], str) else None
    if not names:
        name = next((a for a, f in FAMILIES.items() if config.get("model_type") in f.model_types), None)
    if name not in FAMILIES:
        supported = ", ".join(f"{k} ({f.name})" for k, f in FAMILIES.items())
        raise CheckpointError(
            f"{where / CONFIG}: architectures {names!r} (model_type {config.get('model_type')!r}) is not a family "
            f"specdraft imports; supported: {supported}",
            "convert the model to one of those, or train from random weights (a model.path that is not a folder)",
        )
    return name


def config_problems(config: dict, family: Family, where: Path) -> list[str]:
    """Settings of a supported architecture that specdraft's model does not build (each would change the forward)."""
    problems = []
    if config.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {config.get('hidden_act')!r} (specdraft builds SwiGLU with silu)")
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key):
            problems.append(f"{key} true (specdraft's linears have no bias)")
    if config.get("use_sliding_window") or (family.moe and config.get("sliding_window") is not None):
        problems.append(f"sliding_window {config.get('sliding_window')!r} (specdraft attends over the whole sequence)")
    return [f"{where / CONFIG}: {p}" for p in problems]


def read_header(path: Path) -> dict[str, TensorInfo]:
    """The tensors one safetensors file holds, held to safetensors' rules (hf_files.header_entries); CheckpointError
    naming the file and the tensor for a file that is missing, not a regular file, cut short or malformed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing", _REWRITE) from None
    except OSError as err:
        raise CheckpointError(f"{path} cannot be read: {err.strerror or err}", _REWRITE) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # a FIFO is refused, never waited on
            raise CheckpointError(f"{path} is {file_kind(info.st_mode)}, not a safetensors file", _REWRITE)
        size = info.st_size
        head = os.pread(fd, 8, 0)
        if len(head) < 8:
            raise CheckpointError(f"{path} is {size} bytes, too short for a safetensors file", _REWRITE)
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_HEADER, size - 8):
            raise CheckpointError(f"{path}: header length {length} is past the file's {size} bytes", _REWRITE)
        text = _pread_all(fd, length, 8)
    except OSError as err:
        raise CheckpointError(f"{path} cannot be read: {err.strerror or err}", _REWRITE) from None
    finally:
        os.close(fd)
    try:
        header = jsonfile.parse(text, f"{path}'s header", _REWRITE)
    except jsonfile.BadJson as err:
        raise CheckpointError(f"{path} is not a readable safetensors file: {err.why}", _REWRITE) from None
    base = 8 + length
    entries, problems = hf_files.header_entries(header, size - base)
    if problems:
        shown = "; ".join(problems[:MAX_LISTED]) + (
            f" (and {len(problems) - MAX_LISTED} more)" if len(problems) > MAX_LISTED else ""
        )
        raise CheckpointError(f"{path}: {shown}", _REWRITE)
    return {n: TensorInfo(path, e.dtype, e.shape, base + e.begin, base + e.end) for n, e in entries.items()}


def _pread_all(fd: int, length: int, offset: int) -> bytes:
    chunks, done = [], 0
    while done < length:
        chunk = os.pread(fd, length - done, offset + done)
        if not chunk:
            break
        chunks.append(chunk)
        done += len(chunk)
    return b"".join(chunks)


_REWRITE = "copy the checkpoint again, or re-save it with save_pretrained(safe_serialization=True)"


def read_tensors(folder: Path) -> dict[str, TensorInfo]:
    """Every tensor of the folder's safetensors: through model.safetensors.index.json, else model.safetensors."""
    index = folder / INDEX
    if not index.is_file():
        if not (folder / SINGLE).is_file():
            if any(folder.glob("*.bin")) or any(folder.glob("*.safetensors")) or any(folder.glob("*.pt")):
                raise CheckpointError(
                    f"{folder} has neither {SINGLE} nor {INDEX}",
                    "specdraft reads safetensors only: re-save the model with save_pretrained(safe_serialization=True)",
                )
            raise CheckpointError(
                f"{folder} holds {CONFIG} and no weights: neither {SINGLE} nor {INDEX} (with its shards) is there",
                f"put the checkpoint's weights in {folder}, or leave model.path unset to train from random weights",
            )
        return read_header(folder / SINGLE)
    found = read_json(index, hf_files.INDEX, INDEX, _REWRITE)
    if "weight_map" not in found:
        raise CheckpointError(f"{index} has no weight_map", _REWRITE)
    weight_map = found["weight_map"]
    files = sorted(set(weight_map.values()))
    outside = [f for f in files if Path(f).name != f or f in ("", ".", "..")]
    if outside:
        raise CheckpointError(f"{index} maps tensors to {outside[0]!r}, which is not a file name in {folder}", _REWRITE)
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        named = {f: sorted(n for n, g in weight_map.items() if g == f) for f in missing}
        detail = "; ".join(f"{f} (holds {named[f][0]!r} and {len(named[f]) - 1} more)" for f in missing[:MAX_LISTED])
        raise CheckpointError(f"{index} names shards that are not in {folder}: {detail}", "copy the missing shards")
    tensors: dict[str, TensorInfo] = {}
    for name in files:
        tensors.update(read_header(folder / name))
    wrong = [n for n, f in weight_map.items() if n not in tensors or tensors[n].file.name != f]
    if wrong:
        raise CheckpointError(f"{index} maps {wrong[0]!r} (and {len(wrong) - 1} more) to shards without it", _REWRITE)
    return tensors


def geometry(model: ModelShape, family: Family) -> Geometry:
    return Geometry(shape=model, family=family, qk_norm=model.qk_layernorm)


def open_checkpoint(model: ModelShape, folder: Path) -> HFCheckpoint:
    """The checkpoint in ``folder``, checked against the plan's ``model``: one CheckpointError lists every problem."""
    config = read_config(folder)
    arch = architecture(config, folder)
    family = FAMILIES[arch]
    problems = config_problems(config, family, folder)
    m = model
    if family.moe != bool(m.num_experts):
        problems.append(
            f"{folder / CONFIG}: {arch} is {'an MoE' if family.moe else 'a dense'} model but the plan's model has "
            f"num_experts {m.num_experts}"
        )
    if family.qk_norm and not m.qk_layernorm:
        problems.append(
            f"{folder / CONFIG}: {arch} normalises q and k per head (q_norm/k_norm), which the plan's model does "
            "not build (model.qk_layernorm)"
        )
    if not m.swiglu:
        problems.append(f"{folder / CONFIG}: {arch} has a gated MLP but the plan's model.swiglu is false")
    if m.add_bias_linear or m.add_qkv_bias:
        problems.append(
            f"{folder / CONFIG}: {arch} has no linear biases but the plan's model has them "
            f"(model.add_bias_linear {m.add_bias_linear}, model.add_qkv_bias {m.add_qkv_bias})"
        )
    if m.normalization != "RMSNorm":
        problems.append(
            f"{folder / CONFIG}: {arch} uses RMSNorm but the plan's model.normalization is {m.normalization}"
        )
    tensors = read_tensors(folder)
    if not problems:
        problems += tensor_problems(tensors, geometry(model, family))
    if problems:
        shown = "\n  - ".join(problems[:MAX_LISTED])
        more = f"\n  (and {len(problems) - MAX_LISTED} more)" if len(problems) > MAX_LISTED else ""
        raise CheckpointError(
            f"model.path {folder} cannot initialise the plan's model ({len(problems)} problem"
            f"{'s' if len(problems) != 1 else ''}):\n  - {shown}{more}",
            "fix the spec's model section to match the checkpoint's config.json, or fix the checkpoint",
        )
    return HFCheckpoint(folder, config, arch, tensors)


def tensor_problems(tensors: dict[str, TensorInfo], g: Geometry) -> list[str]:
    want = hf_tensors(g)
    tied = g.shape.tie_embeddings
    problems = []
    for name, shape in want.items():
        info = tensors.get(name)
        if info is None:
            problems.append(f"tensor {name!r} is missing (expected shape {list(shape)})")
        elif info.shape != shape:
            problems.append(
                f"{info.file.name}: tensor {name!r} has shape {list(info.shape)}, the plan's model needs {list(shape)}"
            )
        elif info.dtype not in FLOAT_DTYPES:
            problems.append(dtype_problem(info, name, FLOAT_DTYPES))
    extra = [n for n in tensors if n not in want and not IGNORED.search(n) and not (tied and n == "lm_head.weight")]
    for name in extra:
        problems.append(f"{tensors[name].file.name}: tensor {name!r} is not part of the model specdraft builds")
    return problems


def dtype_problem(info: TensorInfo, name: str, allowed: tuple[str, ...]) -> str:
    """A tensor stored in a dtype the import does not read: refused, never converted (an int8 or fp8 weight would
    need its quantisation scales, which specdraft does not apply)."""
    return (
        f"{info.file.name}: tensor {name!r} is {info.dtype}; specdraft reads it as {' or '.join(allowed)} only "
        "(a quantised checkpoint needs its scales: dequantise it to bf16 or fp32 first)"
    )


def tokenizer_files(folder: Path) -> list[Path]:
    return [folder / name for name in TOKENIZER_FILES if (folder / name).is_file()]
