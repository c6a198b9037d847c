"""HF tensor names <-> megatron-core GPTModel parameter names, and which slice of which HF tensors one rank's shard of a
megatron parameter is (pure Python: the launch-time check runs it without torch).

Layouts (megatron-core 0.16, `get_gpt_layer_local_spec` and TE's spec):
- `linear_qkv` is interleaved per query group: for each group g, [q heads of g (heads/groups * d rows); k_g (d);
  v_g (d)], and tp rank r holds groups [r G/tp, (r+1) G/tp), so its shard is 3 * G/tp contiguous row ranges of
  q_proj, k_proj and v_proj (NeMo-RL PR 2802: a plain [q; k; v] concatenation trains a model that is not the HF one).
- `linear_fc1` is [gate; up] *per tp shard*: rank r holds [gate rows of r; up rows of r].
- row-parallel `linear_proj` (o_proj) and `linear_fc2` (down_proj, w2) are split by columns.
- the vocabulary (embedding, output layer) is split by rows after padding to a tp multiple: padded rows are zero.
- experts are split over etp like a dense MLP over tp; expert e of a layer is HF's experts.e on its ep rank.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from specdraft.plan.model import ModelShape


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    moe: bool = False
    qk_norm: bool = False


# config.json `architectures[0]` -> what specdraft builds for it
FAMILIES = {
    "LlamaForCausalLM": Family("Llama 3.x", ("llama",)),
    "Qwen3ForCausalLM": Family("Qwen3 (dense)", ("qwen3",), qk_norm=True),
    "MixtralForCausalLM": Family("Mixtral", ("mixtral",), moe=True),
}
# HF tensors a checkpoint may carry that describe nothing specdraft learns (RoPE's cached frequencies).
IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")


def global_name(name: str, offset: int) -> str:
    """`decoder.layers.3.mlp...` on a stage whose first layer is 16 -> `decoder.layers.19.mlp...`."""
    parts = name.split(".")
    if len(parts) > 2 and parts[0] == "decoder" and parts[1] == "layers":
        parts[2] = str(int(parts[2]) + offset)
    return ".".join(parts)


def padded_vocab(vocab_size: int, tp: int) -> int:
    """The vocabulary as the runtime's vocab-parallel layers hold it: rounded up to a multiple of tp."""
    return -(-vocab_size // tp) * tp


@dataclass(frozen=True)
class Geometry:
    """What the mapping needs of the model: the plan's shape, the family and whether q/k norms exist."""

    shape: ModelShape
    family: Family
    qk_norm: bool

    @property
    def heads_per_group(self) -> int:
        return self.shape.num_attention_heads // self.shape.num_query_groups


@dataclass(frozen=True)
class Piece:
    """One slice of one HF tensor: rows [r0, r1) and columns [c0, c1) (None: all of that dimension)."""

    name: str
    rows: Optional[tuple[int, int]] = None
    cols: Optional[tuple[int, int]] = None


@dataclass(frozen=True)
class Source:
    """How one rank's shard of a megatron parameter is made: ``pieces`` concatenated along rows (dim 0), then
    ``pad_rows`` zero rows (the vocabulary's padding to a tp multiple)."""

    pieces: tuple[Piece, ...]
    pad_rows: int = 0


@dataclass(frozen=True)
class Shard:
    """A tensor-parallel split: ``size`` ranks, this one ``rank``."""

    size: int = 1
    rank: int = 0

    def range(self, n: int) -> tuple[int, int]:
        per = n // self.size
        return self.rank * per, (self.rank + 1) * per


def hf_tensors(g: Geometry) -> dict[str, tuple[int, ...]]:
    """Every tensor the HF checkpoint must hold, with its shape (the HF model of the plan's shape)."""
    m = g.shape
    h, d, v = m.hidden_size, m.head_dim, m.vocab_size
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not m.tie_embeddings:
        out["lm_head.weight"] = (v, h)
    for layer in range(m.num_layers):
        p = f"model.layers.{layer}."
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "post_attention_layernorm.weight"] = (h,)
        out[p + "self_attn.q_proj.weight"] = (m.num_attention_heads * d, h)
        out[p + "self_attn.k_proj.weight"] = (m.num_query_groups * d, h)
        out[p + "self_attn.v_proj.weight"] = (m.num_query_groups * d, h)
        out[p + "self_attn.o_proj.weight"] = (h, m.num_attention_heads * d)
        if g.qk_norm:
            out[p + "self_attn.q_norm.weight"] = (d,)
            out[p + "self_attn.k_norm.weight"] = (d,)
        if g.family.moe:
            f, experts = m.moe_ffn_hidden_size or 0, m.num_experts or 0
            out[p + "block_sparse_moe.gate.weight"] = (experts, h)
            for e in range(experts):
                q = f"{p}block_sparse_moe.experts.{e}."
                out[q + "w1.weight"] = (f, h)
                out[q + "w3.weight"] = (f, h)
                out[q + "w2.weight"] = (h, f)
        else:
            out[p + "mlp.gate_proj.weight"] = (m.ffn_hidden_size, h)
            out[p + "mlp.up_proj.weight"] = (m.ffn_hidden_size, h)
            out[p + "mlp.down_proj.weight"] = (h, m.ffn_hidden_size)
    return out


_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight$")
# megatron layer-local name -> HF layer-local name, for the parameters that are copied whole
_WHOLE = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",  # TE's fused norm + linear
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "mlp.router.weight": "block_sparse_moe.gate.weight",
}


class UnmappedParameter(KeyError):
    """A megatron parameter with no HF counterpart (a layer feature the families do not have)."""


def source(name: str, g: Geometry, tp: Shard, etp: Shard, tied_output: bool = False) -> Source:
    """This rank's shard of the megatron parameter ``name`` (global layer and expert indices) as HF slices.

    ``tp`` splits dense parameters, ``etp`` expert ones. ``tied_output``: the output layer is a copy of the
    embedding (tied embeddings, the last stage's copy at pp > 1).
    """
    m = g.shape
    if name == "embedding.word_embeddings.weight" or (name == "output_layer.weight" and tied_output):
        return _vocab_rows("model.embed_tokens.weight", m.vocab_size, tp)
    if name == "output_layer.weight":
        return _vocab_rows("lm_head.weight", m.vocab_size, tp)
    if name == "decoder.final_layernorm.weight":
        return Source((Piece("model.norm.weight"),))
    found = _LAYER.match(name)
    if found is None:
        raise UnmappedParameter(name)
    prefix, local = f"model.layers.{found.group(1)}.", found.group(2)
    if local in _WHOLE and _has_whole(local, g):
        return Source((Piece(prefix + _WHOLE[local]),))
    if local == "self_attention.linear_qkv.weight":
        return _qkv(prefix + "self_attn.", g, tp)
    if local == "self_attention.linear_proj.weight":
        return Source((Piece(prefix + "self_attn.o_proj.weight", cols=tp.range(m.num_attention_heads * m.head_dim)),))
    if not g.family.moe and local == "mlp.linear_fc1.weight":
        return _gate_up(prefix + "mlp.gate_proj.weight", prefix + "mlp.up_proj.weight", m.ffn_hidden_size, tp)
    if not g.family.moe and local == "mlp.linear_fc2.weight":
        return Source((Piece(prefix + "mlp.down_proj.weight", cols=tp.range(m.ffn_hidden_size)),))
    expert = _EXPERT.match(local) if g.family.moe else None
    if expert is not None:
        q, f = f"{prefix}block_sparse_moe.experts.{expert.group(1)}.", m.moe_ffn_hidden_size or 0
        if expert.group(2) == "linear_fc1":
            return _gate_up(q + "w1.weight", q + "w3.weight", f, etp)
        return Source((Piece(q + "w2.weight", cols=etp.range(f)),))
    raise UnmappedParameter(name)


def _has_whole(local: str, g: Geometry) -> bool:
    """q/k norms exist only with QK norm, the router only in an MoE family."""
    if local in ("self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight"):
        return g.qk_norm
    return local != "mlp.router.weight" or g.family.moe


def _vocab_rows(hf_name: str, vocab: int, tp: Shard) -> Source:
    lo, hi = tp.range(padded_vocab(vocab, tp.size))
    real = (min(lo, vocab), min(hi, vocab))
    pieces = (Piece(hf_name, rows=real),) if real[1] > real[0] else ()
    return Source(pieces, pad_rows=(hi - lo) - (real[1] - real[0]))


def _qkv(prefix: str, g: Geometry, tp: Shard) -> Source:
    m, d = g.shape, g.shape.head_dim
    per_group = g.heads_per_group * d
    lo, hi = tp.range(m.num_query_groups)
    pieces: list[Piece] = []
    for group in range(lo, hi):
        pieces.append(Piece(prefix + "q_proj.weight", rows=(group * per_group, (group + 1) * per_group)))
        pieces.append(Piece(prefix + "k_proj.weight", rows=(group * d, (group + 1) * d)))
        pieces.append(Piece(prefix + "v_proj.weight", rows=(group * d, (group + 1) * d)))
    return Source(tuple(pieces))


def _gate_up(gate: str, up: str, rows: int, shard: Shard) -> Source:
    span = shard.range(rows)
    return Source((Piece(gate, rows=span), Piece(up, rows=span)))


def piece_shape(piece: Piece, full: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of ``piece`` cut from a tensor of shape ``full``."""
    shape = list(full)
    if piece.rows is not None:
        shape[0] = piece.rows[1] - piece.rows[0]
    if piece.cols is not None:
        shape[1] = piece.cols[1] - piece.cols[0]
    return tuple(shape)
