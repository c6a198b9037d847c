"""The draft's weights from a published EAGLE-3 checkpoint (draft.path): its config.json checked against the plan
(plan/draft_checkpoint.py), the tensor names of the three layouts mapped to the draft's, and each rank reading
only its tensor-parallel slice of each tensor (hf/reader.py: pread of the slice's bytes, no whole-file read).

Names: vLLM and SpecForge write `midlayer.*` (vLLM maps it to `layers.0.`), speculators `layers.N.*`; the
attention and MLP projections sit under `self_attn.` and `mlp.`. fc's input blocks are in ascending layer order
(the order vLLM and SGLang capture the taps in); the draft's are in draft.aux_layers order, so they are permuted.
The draft embeds tokens with the policy's embedding: a checkpoint's own `embed_tokens` is not read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from specdraft.eagle3_checkpoint import DraftConfig
from specdraft.hf_files import FLOAT_DTYPES
from specdraft.plan.draft_checkpoint import review
from specdraft.plan.model import LaunchPlan
from specdraft.runtime.models.hf.checkpoint import (
    CheckpointError,
    HFCheckpoint,
    TensorInfo,
    dtype_problem,
    read_tensors,
)
from specdraft.runtime.models.hf.mapping import Piece, Source
from specdraft.runtime.models.hf.reader import DTYPES, Reader

# Tensors a draft checkpoint may hold that specdraft's draft has no use for: its own copy of the policy's embedding
# (SpecForge, speculators), speculators' frozen copies of the verifier's final norm and head.
UNUSED = ("embed_tokens.weight", "verifier_norm.weight", "verifier_lm_head.weight")
TOP = {"fc.weight": "fc.weight", "norm.weight": "norm.weight", "lm_head.weight": "lm_head.weight"}
VOCAB = {"d2t": "vocab.d2t", "t2d": "vocab.t2d"}
LAYER_RE = re.compile(r"^(?:midlayer|layers\.(\d+))\.(?:self_attn\.|mlp\.)?([a-z_]+)\.weight$")
LAYER_PARTS = ("input_layernorm", "hidden_norm", "post_attention_layernorm") + tuple(
    f"{p}_proj" for p in ("q", "k", "v", "o", "gate", "up", "down")
)
FIX = "use a draft checkpoint trained for this policy, or leave draft.path out (random weights)"
# The dtypes each draft tensor is read in: weights are floats (converted to the run's dtype), d2t holds signed offsets,
# t2d flags; anything else (an int8 or fp8 weight) is refused by name, never converted.
READ_AS = {"vocab.d2t": ("I64", "I32", "I16", "I8"), "vocab.t2d": ("BOOL", "U8")}


@dataclass(frozen=True)
class DraftSource:
    """A checked draft checkpoint: draft parameter name -> the checkpoint tensor it comes from."""

    folder: Path
    config: DraftConfig
    tensors: dict[str, TensorInfo]  # checkpoint name -> header entry (for Reader)
    names: dict[str, str]  # draft name -> checkpoint name


def draft_name(name: str) -> str | None:
    """The draft's parameter name of checkpoint tensor ``name``; None for one it has no use for."""
    if name in UNUSED:
        return None
    if name in TOP:
        return TOP[name]
    if name in VOCAB:
        return VOCAB[name]
    hit = LAYER_RE.match(name)
    if hit is None or hit.group(2) not in LAYER_PARTS:
        return ""
    return f"layers.{hit.group(1) or 0}.{hit.group(2)}.weight"


def shapes(plan: LaunchPlan, reduced: bool) -> dict[str, tuple[int, ...]]:
    """Every draft tensor's whole (tp 1, unpadded) shape, as a checkpoint stores it."""
    m, d = plan.model, plan.draft
    h, q, kv = m.hidden_size, m.num_attention_heads * m.head_dim, m.num_query_groups * m.head_dim
    out: dict[str, tuple[int, ...]] = {"fc.weight": (h, len(d.aux_layers) * h), "norm.weight": (h,)}
    out["lm_head.weight"] = (d.vocab_size, h)
    for i in range(d.num_layers):
        w = 2 * h if i == 0 else h
        p = f"layers.{i}."
        out |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)}
        if i == 0:
            out[p + "hidden_norm.weight"] = (h,)
        out |= {p + "q_proj.weight": (q, w), p + "k_proj.weight": (kv, w), p + "v_proj.weight": (kv, w)}
        out |= {p + "o_proj.weight": (h, q), p + "gate_proj.weight": (m.ffn_hidden_size, h)}
        out |= {p + "up_proj.weight": (m.ffn_hidden_size, h), p + "down_proj.weight": (h, m.ffn_hidden_size)}
    if reduced:
        out |= {"vocab.d2t": (d.vocab_size,), "vocab.t2d": (m.vocab_size,)}
    return out


def open_source(plan: LaunchPlan) -> DraftSource | None:
    """The checked checkpoint the plan's draft starts from (config.json and safetensors headers; no tensor read),
    or None without draft.path. CheckpointError names every mismatch."""
    if plan.draft.path is None or not plan.draft.enabled:
        return None
    folder = Path(plan.draft.path)
    found, findings, _ = review(plan)
    if found is None or findings:
        raise CheckpointError("draft.path: " + "; ".join(f.rule for f in findings), findings[0].fix)
    tensors = read_tensors(folder)
    reduced = plan.draft.vocab_size != plan.model.vocab_size
    want = shapes(plan, reduced)
    names: dict[str, str] = {}
    unknown, wrong = [], []
    for name, info in sorted(tensors.items()):
        mine = draft_name(name)
        if mine == "":
            unknown.append(name)
        elif mine is not None and (mine in want or not mine.startswith("vocab.")):
            if mine not in want or tuple(info.shape) != want[mine]:
                wrong.append(f"{name} {list(info.shape)} (the draft's {mine}: {list(want.get(mine, ()))})")
            names[mine] = name
    missing = sorted(set(want) - set(names) - ({"vocab.t2d"} if "vocab.d2t" in names else set()))
    problems = []
    for mine, name in sorted(names.items()):
        allowed = READ_AS.get(mine, FLOAT_DTYPES)
        if tensors[name].dtype not in allowed:
            problems.append(dtype_problem(tensors[name], name, allowed))
    if unknown:
        problems.append(f"tensors specdraft's draft has no place for: {', '.join(unknown[:10])}")
    if wrong:
        problems.append(f"tensors whose shape is not the plan's draft's: {', '.join(wrong[:10])}")
    if missing:
        problems.append(f"tensors missing: {', '.join(missing[:10])}")
    if problems:
        raise CheckpointError(f"draft.path {folder}: " + "; ".join(problems), FIX)
    return DraftSource(folder=folder, config=found, tensors=tensors, names=names)


@torch.no_grad()
def load(draft, source: DraftSource, plan: LaunchPlan, tp_rank: int) -> int:
    """Fill ``draft`` (this rank's Eagle3Draft, its tensor-parallel shards) from ``source``; returns the bytes read.
    Column-parallel weights take their rows of the checkpoint tensor, row-parallel ones their columns, the padded
    LM head its rows (zero past the draft vocabulary), fc its blocks in draft.aux_layers order."""
    tp = draft.shape.tp
    aux = list(plan.draft.aux_layers)
    rank_of = {layer: i for i, layer in enumerate(sorted(aux))}  # fc block of each tap in the checkpoint
    with Reader(HFCheckpoint(source.folder, {}, "", source.tensors)) as reader:
        for mine, param in draft.named_parameters():
            name = source.names[mine]
            full = source.tensors[name].shape
            if mine == "fc.weight":
                h = full[0]
                for i, layer in enumerate(aux):
                    c0 = rank_of[layer] * h
                    reader.read(Piece(name, cols=(c0, c0 + h)), param.data.narrow(1, i * h, h))
            elif not getattr(param, "tensor_model_parallel", False):
                reader.fill(param.data, Source((Piece(name),)), mine)
            elif param.partition_dim == 1:
                per = full[1] // tp
                reader.fill(param.data, Source((Piece(name, cols=(tp_rank * per, (tp_rank + 1) * per)),)), mine)
            else:
                per = param.shape[0]  # the LM head: padded_vocab(rows, tp) // tp
                r0, r1 = min(tp_rank * per, full[0]), min((tp_rank + 1) * per, full[0])
                pieces = (Piece(name, rows=(r0, r1)),) if r1 > r0 else ()
                reader.fill(param.data, Source(pieces, pad_rows=per - (r1 - r0)), mine)
        if draft.vocab is not None:
            d2t, t2d = vocab_mapping(reader, source, plan)
            draft.vocab.set(d2t.to(draft.vocab.d2t.device), t2d.to(draft.vocab.t2d.device))
        return reader.bytes_read


def vocab_mapping(reader: Reader, source: DraftSource, plan: LaunchPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) of a reduced draft vocabulary: t2d from d2t where the checkpoint has none (vLLM reads d2t only);
    refused unless the draft ids are ascending target ids (specdraft's restriction of the policy's logits needs
    them so) and t2d agrees."""
    vd, v = plan.draft.vocab_size, plan.model.vocab_size
    d2t = _whole(reader, source, "vocab.d2t", (vd,)).to(torch.int64)
    ids = torch.arange(vd) + d2t
    where = f"draft.path {source.folder}: d2t"
    if ids.min() < 0 or ids.max() >= v or (vd > 1 and not bool((ids[1:] > ids[:-1]).all())):
        raise CheckpointError(f"{where} maps draft ids to target ids that are not ascending ids below {v}", FIX)
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[ids] = True
    if "vocab.t2d" in source.names:
        stored = _whole(reader, source, "vocab.t2d", (v,)).to(torch.bool)
        if not torch.equal(stored, t2d):
            raise CheckpointError(f"{where} and t2d name different draft vocabularies", FIX)
    return d2t, t2d


def _whole(reader: Reader, source: DraftSource, mine: str, shape: tuple[int, ...]) -> torch.Tensor:
    name = source.names[mine]
    out = torch.empty(shape, dtype=DTYPES[source.tensors[name].dtype])
    reader.read(Piece(name), out)
    return out
