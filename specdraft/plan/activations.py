"""Bytes one transformer layer saves for backward, per microbatch: Korthikanti et al. 2022 Table 2
(https://arxiv.org/abs/2205.05198) term by term, for the kernels that actually run (derivation: docs/plan.md).

Two variants. "te" (TE) is what Megatron-LM builds on GPUs with TransformerEngine (the render target): fused
norms that save their input and output, flash attention (q, k, v, output and the fp32 softmax statistics; no s^2
scores), a fused SwiGLU that saves only its 2*ffn-wide input, fused RoPE. "local-spec" (LOCAL) is megatron-core's
local layer spec on unfused torch ops, what specdraft's runtime runs on CPU (cluster.gpu=cpu); each of its
differences is a named term below, and tests/dist measure it with saved_tensors_hooks (runtime/train/activations.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from specdraft.plan.dims import ParallelDims
from specdraft.spec.derived import head_dim, kv_heads
from specdraft.spec.schema import LayoutSpec

# Activation bytes per element; fp8 keeps bf16 activations outside the GEMM inputs (see `_gemm_input`).
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 2}
FP32 = 4
MASK = 1  # a dropout mask: one bool per element
INDEX = 8  # an int64 token id or label
TE, LOCAL = "te", "local-spec"  # the two variants (module docstring)


@dataclass(frozen=True)
class PerToken:
    """Bytes per token, by how tensor parallelism splits them: `norm_like` tensors are full-width on every TP rank
    unless sequence parallelism shards the tokens; `split` ones are heads or MLP columns, always divided by tp;
    `whole` ones are per-token tensors of the full (gathered) sequence that tp never divides."""

    norm_like: float = 0.0
    split: float = 0.0
    whole: float = 0.0

    def __add__(self, other: "PerToken") -> "PerToken":
        return PerToken(self.norm_like + other.norm_like, self.split + other.split, self.whole + other.whole)

    def bytes(self, tokens: float, dims: ParallelDims) -> float:
        norm_like = self.norm_like / dims.tp if dims.sequence_parallel else self.norm_like
        return tokens * (norm_like + self.split / dims.tp + self.whole)


def variant(spec: LayoutSpec) -> str:
    """The variant: te on GPU clusters (Megatron-LM with TransformerEngine), local on cluster.gpu=cpu (the runtime)."""
    from specdraft.spec.gpus import CATALOGUE

    return TE if CATALOGUE[spec.cluster.gpu].is_gpu else LOCAL


def norm_bytes(spec: LayoutSpec, kind: str) -> float:
    """What one norm saves beyond its output (which the next GEMM saves): its input and per-token statistics.
    torch's composite rms_norm (local) upcasts to fp32 and keeps both the fp32 input and the fp32 normalised rows
    whatever the model dtype; torch's layer_norm, like TE's norms, keeps the input and fp32 mean/rstd."""
    m = spec.model
    b = DTYPE_BYTES[spec.training.dtype]
    if kind == LOCAL and m.normalization == "RMSNorm":
        return 2 * FP32 * m.hidden_size + FP32
    return b * m.hidden_size + (2 if m.normalization == "LayerNorm" else 1) * FP32


def _gemm_input(spec: LayoutSpec, kind: str, width: float) -> float:
    """A GEMM's saved input: TransformerEngine keeps the fp8 cast it fed the GEMM (one byte) under fp8."""
    return width * (1 if kind == TE and spec.training.dtype == "fp8" else DTYPE_BYTES[spec.training.dtype])


def attention_per_token(spec: LayoutSpec, kind: str, recompute: str) -> PerToken:
    """The attention half of a layer: input norm, QKV input, core attention, the output projection's input and
    the residual's dropout mask (only when model.hidden_dropout > 0: torch's dropout at p=0 returns its input)."""
    m = spec.model
    b, h, d = DTYPE_BYTES[spec.training.dtype], m.hidden_size, head_dim(m)
    q, kv = m.num_attention_heads * d, kv_heads(m) * d
    norm_like = norm_bytes(spec, kind) + _gemm_input(spec, kind, h) + (MASK * h if m.hidden_dropout > 0 else 0)
    if recompute == "selective":
        # The checkpointed core attention keeps its inputs q, k, v; the projection keeps the output it is fed.
        split = b * (q + 2 * kv) + _gemm_input(spec, kind, q)
    else:
        # Flash attention keeps q, k, v, its output (also the projection's input, shared unless the projection
        # keeps an fp8 copy) and the fp32 softmax log-sum-exp per head.
        fp8_copy = _gemm_input(spec, kind, q) if spec.training.dtype == "fp8" and kind == TE else 0
        split = b * (2 * q + 2 * kv) + fp8_copy + FP32 * m.num_attention_heads
    whole = 0.0
    if kind == LOCAL:
        # megatron's unfused RoPE makes new rotated q and k, and v stays a view of the QKV output, so that whole
        # output stays alive beside them: (q + kv) more; cos and sin are cast per call, for q and for k.
        split += b * (q + kv)
        whole += 4 * b * d
    if m.qk_layernorm:
        # The per-head norms keep fp32 statistics per head, and their inputs: on the local spec those are views of
        # the QKV output (already kept); TE's norms copy them contiguous first.
        per_head = 2 if m.normalization == "LayerNorm" else 1
        split += FP32 * per_head * (m.num_attention_heads + kv_heads(m)) + (b * (q + kv) if kind == TE else 0)
    return PerToken(norm_like=norm_like, split=split, whole=whole)


def mlp_saved(spec: LayoutSpec, kind: str, width: float) -> float:
    """Bytes an MLP of ``width`` saves per row it processes beyond its input. GeLU keeps fc1's output and fc2 its
    input (2 * width). SwiGLU: the fused kernel (te) keeps its 2 * width input and fc2 its width input, 3 * width
    in all (Megatron-LM's 4 * ffn / h is the GeLU count); megatron's unfused glu (local) also keeps silu's output
    and `x_linear + glu_linear_offset`, both width wide, 5 * width."""
    m = spec.model
    b = DTYPE_BYTES[spec.training.dtype]
    if not m.swiglu:
        return b * width + _gemm_input(spec, kind, width)
    extra = 2 * b * width if kind == LOCAL else 0
    return 2 * b * width + extra + _gemm_input(spec, kind, width)


def mlp_per_token(spec: LayoutSpec, kind: str, dense: bool = False, etp: int = 1) -> PerToken:
    """The MLP half: pre-MLP norm, fc1 input (the router's, for MoE), the MLP itself, the dropout mask."""
    m = spec.model
    h = m.hidden_size
    norm_like = norm_bytes(spec, kind) + _gemm_input(spec, kind, h) + (MASK * h if m.hidden_dropout > 0 else 0)
    if dense or not m.num_experts:
        return PerToken(norm_like=norm_like, split=mlp_saved(spec, kind, m.ffn_hidden_size))
    return PerToken(norm_like=norm_like + routed_bytes(spec, kind, etp))


def routed_bytes(spec: LayoutSpec, kind: str, etp: int = 1) -> float:
    """An MoE layer's routing and experts, per token entering it. Each token becomes top-k rows, gathered over the
    etp ranks that split an expert's columns: each row keeps the permuted input (h), the expert MLP's share
    (1/etp of its width) and its fp32 routing probability; megatron applies the probabilities after the
    activation, whose unfused product (local) keeps one more width-wide tensor. The router keeps its fp32 scores
    (num_experts) and, as measured on megatron-core 0.16, 52 bytes per top-k slot of indices and probabilities."""
    m = spec.model
    b, width = DTYPE_BYTES[spec.training.dtype], m.moe_ffn_hidden_size or 0
    expert = mlp_saved(spec, kind, width) + (b * width if kind == LOCAL else 0)
    row = b * m.hidden_size + expert / etp + FP32
    return m.moe_router_topk * etp * row + FP32 * (m.num_experts or 0) + 52 * m.moe_router_topk


def layer_bytes(spec: LayoutSpec, dims: ParallelDims, tokens: float, recompute: str, dense: bool = False) -> float:
    """Bytes one layer saves for ``tokens`` local tokens (already divided by cp) of one microbatch. Full
    recompute keeps only the layer's input (megatron checkpoints every layer, uniform, one per checkpoint)."""
    kind = variant(spec)
    if recompute == "full":
        return PerToken(norm_like=DTYPE_BYTES[spec.training.dtype] * spec.model.hidden_size).bytes(tokens, dims)
    per = attention_per_token(spec, kind, recompute) + mlp_per_token(spec, kind, dense, dims.etp)
    return per.bytes(tokens, dims)


def stage_extra_bytes(spec: LayoutSpec, dims: ParallelDims, tokens: float, first: bool, last: bool) -> float:
    """A stage's microbatch beyond its layers. The first stage's embedding keeps the int64 token ids. The last
    keeps the final norm, the output layer's input, the fp32 logits megatron's vocab-parallel cross-entropy
    exponentiates in place (over the vocabulary padded to a tp multiple, as the runtime pads it), and the labels'
    int64 ids, bool mask and fp32 loss mask. Under full recompute every checkpointed layer is handed the same fp32
    RoPE table (seq_length x head_dim), which the checkpoints keep once per microbatch."""
    m = spec.model
    b = DTYPE_BYTES[spec.training.dtype]
    vocab = -(-m.vocab_size // dims.tp)
    out = tokens * INDEX if first else 0.0
    if last:
        per = PerToken(norm_like=norm_bytes(spec, variant(spec)) + b * m.hidden_size, whole=INDEX + MASK + FP32)
        out += per.bytes(tokens, dims) + tokens * FP32 * vocab
    if spec.training.recompute == "full":
        out += FP32 * m.seq_length * head_dim(m)
    return out
