"""Per-GPU memory estimate per pipeline stage: weights, grads, optimizer state, activations, and the draft.

Formulas follow Megatron-LM's megatron/training/theoretical_memory_usage.py and Korthikanti et al., "Reducing
Activation Recomputation in Large Transformer Models" (https://arxiv.org/abs/2205.05198), Table 2.
"""

from __future__ import annotations

from specdraft.plan.activations import DTYPE_BYTES, layer_bytes, stage_extra_bytes
from specdraft.plan.dims import ParallelDims
from specdraft.plan.model import StageMemory
from specdraft.spec.derived import aux_layers, draft_vocab_size, head_dim, kv_heads
from specdraft.spec.schema import LayoutSpec

# fp8 parameters (--fp8-param-gather): the fp8 weight and the transpose Hopper's fp8 GEMMs read for backward.
FP8_WEIGHT_BYTES = 2
HEAD_CHUNK_TOKENS = 2048  # the runtime's checkpointed LM-head/KL chunk (specdraft.runtime.models.vocab.parallel)


def attention_params(spec: LayoutSpec) -> int:
    """Q, K, V, O projections of one layer (GQA-aware) plus its two norms."""
    m = spec.model
    h, d = m.hidden_size, head_dim(m)
    return h * m.num_attention_heads * d * 2 + 2 * h * kv_heads(m) * d + 2 * h


def mlp_params(hidden: int, ffn: int, swiglu: bool) -> int:
    return (3 if swiglu else 2) * hidden * ffn


def bias_and_norm_params(spec: LayoutSpec) -> tuple[int, int, int]:
    """(TP-split, TP-replicated, expert) parameters of one target layer beyond its matrices and its two norm
    weights: biases (QKV and fc1 split over tp like their matrices; the attention output's and fc2's whole, as
    megatron's row-parallel layers keep them), LayerNorm's biases and the per-head QK norms."""
    m = spec.model
    h, d = m.hidden_size, head_dim(m)
    per_norm = 2 if m.normalization == "LayerNorm" else 1  # weight, and LayerNorm's bias
    split, replicated, expert = 0, (per_norm - 1) * 2 * h, 0
    if m.add_bias_linear or m.add_qkv_bias:
        split += (m.num_attention_heads + 2 * kv_heads(m)) * d
    if m.add_bias_linear:
        replicated += h  # the attention output projection
        width = (m.moe_ffn_hidden_size or 0) if m.num_experts else m.ffn_hidden_size
        mlp_bias = (2 if m.swiglu else 1) * width + h
        if m.num_experts:
            expert = m.num_experts * mlp_bias
        else:
            split, replicated = split + mlp_bias - h, replicated + h
    if m.qk_layernorm:
        replicated += 2 * d * per_norm
    return split, replicated, expert


def layer_params(spec: LayoutSpec) -> tuple[int, int]:
    """(dense params, expert params) of one transformer layer."""
    m = spec.model
    split, replicated, expert_extra = bias_and_norm_params(spec)
    extra = split + replicated
    if m.num_experts:
        experts = m.num_experts * mlp_params(m.hidden_size, m.moe_ffn_hidden_size or 0, m.swiglu) + expert_extra
        return attention_params(spec) + m.hidden_size * m.num_experts + extra, experts
    return attention_params(spec) + mlp_params(m.hidden_size, m.ffn_hidden_size, m.swiglu) + extra, 0


def replicated_params(spec: LayoutSpec) -> int:
    """The part of `layer_params`' dense count that every TP rank holds whole: the layer's two norms (and QK norms,
    LayerNorm biases, row-parallel biases) and, in an MoE layer, the router (num_experts x hidden); the other
    matrices are split over tp."""
    m = spec.model
    return 2 * m.hidden_size + bias_and_norm_params(spec)[1] + (m.hidden_size * m.num_experts if m.num_experts else 0)


def final_norm_params(spec: LayoutSpec) -> int:
    """The last stage's final norm: a weight, and LayerNorm's bias."""
    return spec.model.hidden_size * (2 if spec.model.normalization == "LayerNorm" else 1)


def draft_params(spec: LayoutSpec) -> int:
    """EAGLE-3 draft: fc over the concatenated taps, its decoder layer(s) (dense, the target's shape), LM head
    over the draft vocabulary (draft.vocab_size, else the target's), final norm.

    The token embeddings are the target's (shipped by the embedding tap), so they are not counted here; nor are
    d2t/t2d (buffers, no parameters).
    """
    m, d = spec.model, spec.draft
    h = m.hidden_size
    num_taps = len(aux_layers(spec))
    # The draft layer's attention input is [embedding ; hidden] (2h), as in EAGLE-3.
    layer = (
        attention_params(spec)
        + h * m.num_attention_heads * head_dim(m)
        + 2 * h * (kv_heads(m) * head_dim(m))
        + mlp_params(h, m.ffn_hidden_size, m.swiglu)
    )
    return num_taps * h * h + d.num_layers * layer + draft_vocab_size(spec) * h + 2 * h


def _state_bytes(spec: LayoutSpec) -> tuple[int, int, float]:
    """(weight bytes, grad bytes, optimizer bytes) per parameter before optimizer sharding."""
    dtype = spec.training.dtype
    if dtype == "fp32":
        return 4, 4, 8.0  # Adam m, v; no separate master copy
    grad = 2 if spec.training.grad_reduce_in_bf16 else 4
    if dtype == "fp8":
        return FP8_WEIGHT_BYTES, grad, 12.0  # fp8 weight (+ transpose), main grad, fp32 master + Adam m, v
    return 2, grad, 12.0  # bf16/fp16 weight, fp32 main grad, fp32 master + Adam m, v (Megatron's 18 bytes/param)


def activation_bytes_per_layer(
    spec: LayoutSpec, dims: ParallelDims, tokens: int, recompute: str | None = None, dense: bool = False
) -> float:
    """Activations one layer keeps for backward, for ``tokens`` local tokens (already divided by cp), under
    ``recompute`` (default: training.recompute); ``dense`` counts a dense MLP of ffn_hidden_size even for an MoE
    model (the draft's layer). Term by term in specdraft.plan.activations (Korthikanti et al. Table 2 for the
    kernels that run: no s^2 scores under flash attention, GQA-wide K and V, SwiGLU's 2*ffn-wide input)."""
    return layer_bytes(spec, dims, tokens, recompute or spec.training.recompute, dense)


def microbatch_activation_bytes(spec: LayoutSpec, dims: ParallelDims, layers: int, first: bool, last: bool) -> float:
    """What one microbatch leaves saved for backward on a stage of ``layers`` layers (with the embedding when
    ``first``, the output layer and the loss when ``last``): what the runtime measures
    (runtime/train/activations.py)."""
    tokens = dims.cp_tokens(spec.model.seq_length)
    return activation_bytes_per_layer(spec, dims, tokens) * layers + stage_extra_bytes(spec, dims, tokens, first, last)


def stage_memory(
    spec: LayoutSpec, dims: ParallelDims, stage_counts: list[int], draft_stage: int | None, draft_slots: int
) -> tuple[StageMemory, ...]:
    """The plan's `memory`: bytes per GPU for each pipeline stage of ``dims`` holding ``stage_counts`` layers."""
    from specdraft.spec.gpus import CATALOGUE

    m, p, t = spec.model, dims, spec.training
    tokens = p.cp_tokens(m.seq_length)
    vpp = p.num_chunks
    hbm = CATALOGUE[spec.cluster.gpu].hbm_bytes
    out = []
    for rank, layers in enumerate(stage_counts):
        first, last = rank == 0, rank == p.last_stage
        weights, grads, optimizer = _stage_states(spec, p, layers, first, last)
        # 1F1B: stage r holds (pp - r) microbatches in flight; interleaving adds (pp-1)/(pp*vpp) (Megatron-LM).
        in_flight = min(p.pp - rank, p.num_microbatches)
        if vpp > 1:
            in_flight = in_flight * (1 + (p.pp - 1) / (p.pp * vpp))
        activations = microbatch_activation_bytes(spec, p, layers, first, last) * in_flight
        if t.recompute == "full" and layers:
            # Full recompute re-materialises one layer's activations at a time during backward.
            activations += activation_bytes_per_layer(spec, p, tokens, recompute="none")
        draft = draft_memory(spec, p, tokens, draft_slots) if rank == draft_stage else 0
        total = weights + grads + optimizer + activations + draft
        out.append(
            StageMemory(
                pp=rank,
                weights=int(weights),
                grads=int(grads),
                optimizer=int(optimizer),
                activations=int(activations),
                draft=int(draft),
                total=int(total),
                hbm=hbm,
                fraction=round(total / hbm, 4),
            )
        )
    return tuple(out)


def _stage_states(
    spec: LayoutSpec, dims: ParallelDims, layers: int, first: bool, last: bool
) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes per GPU of a stage holding ``layers`` layers (and the embedding or
    output layer when it is the first or last stage); the optimizer is sharded by the distributed optimizer."""
    m, p, t = spec.model, dims, spec.training
    w_b, g_b, o_b = _state_bytes(spec)
    dense, expert = layer_params(spec)
    embed = m.vocab_size * m.hidden_size
    dense_params = (
        layers * dense + (embed if first else 0) + (embed if last and (not m.tie_embeddings or p.pp > 1) else 0)
    )
    # Norms and routers are TP-replicated; the last stage also holds the final norm.
    replicated = layers * replicated_params(spec) + (final_norm_params(spec) if last else 0)
    dense_local = (dense_params - layers * replicated_params(spec)) / p.tp + replicated
    expert_local = layers * expert / (p.etp * p.ep)
    opt_shard_dense = p.dp * p.cp if t.distributed_optimizer else 1
    opt_shard_expert = p.edp if t.distributed_optimizer else 1
    weights = (dense_local + expert_local) * w_b
    grads = (dense_local + expert_local) * g_b
    optimizer = dense_local * o_b / opt_shard_dense + expert_local * o_b / opt_shard_expert
    return weights, grads, optimizer


def peak_lower_bound(spec: LayoutSpec, dims: ParallelDims) -> float:
    """A lower bound on the heaviest stage's total over every layer split of ``dims`` (with ``spec``'s model and
    training settings).

    Some stage holds at least ceil(N / pp) layers, and that many layers' weights, grads, optimizer state and one
    microbatch of their activations are all terms of that stage's total in `stage_memory` (which only adds to
    them: more microbatches in flight, the embedding, the logits, the draft). A search drops a layout whose bound
    exceeds the HBM without building it; tests check bound <= the real peak.
    """
    m = spec.model
    layers = -(-m.num_layers // dims.pp)
    states = sum(_stage_states(spec, dims, layers, False, False))
    tokens = dims.cp_tokens(m.seq_length)
    return states + activation_bytes_per_layer(spec, dims, tokens) * layers


def draft_memory(spec: LayoutSpec, dims: ParallelDims, tokens: int, draft_slots: int) -> float:
    """Draft weights, grads, optimizer (own Adam, fp32 master), TTT activations and tap landing slots.

    As in specdraft's runtime, the draft's decoder layer(s) and LM head are tensor-parallel (heads, MLP and
    vocabulary split over tp) while the tap-fusion fc is replicated; it is replicated over dp/cp and its optimizer
    is not sharded.
    """
    m, p, t, d = spec.model, dims, spec.training, spec.draft
    w_b, g_b, o_b = _state_bytes(spec)
    num_taps = len(aux_layers(spec))
    fc = num_taps * m.hidden_size * m.hidden_size
    params = fc + (draft_params(spec) - fc) / p.tp
    state = params * (w_b + g_b + o_b)
    act_bytes = DTYPE_BYTES[t.dtype]
    vocab = draft_vocab_size(spec)
    logits = 4 * tokens * vocab / p.tp  # one fp32 vocab-parallel tensor over the draft vocabulary
    # The LM head and KL run in checkpointed token chunks (runtime/models/vocab/parallel.py), so per TTT step only the
    # output hidden state is kept; one chunk's logits, log-probs and target slice live transiently.
    chunk = 4 * min(tokens, HEAD_CHUNK_TOKENS) * vocab / p.tp
    per_step = (
        activation_bytes_per_layer(spec, dims, tokens, recompute="none", dense=True) * d.num_layers
        + tokens * 2 * m.hidden_size * act_bytes  # [embedding ; hidden] input of the draft layer
        + tokens * m.hidden_size * act_bytes
    )  # the step's output hidden state
    # The policy's log-probs restricted to the draft vocabulary and their halo copy, plus one chunk in flight; a
    # reduced vocabulary gathers one chunk of the selected columns from every TP rank (runtime/models/vocab/reduced.py).
    target_probs = 2 * logits + 3 * chunk + (chunk * p.tp if vocab != m.vocab_size else 0)
    fc_in = tokens * num_taps * m.hidden_size * act_bytes
    # A landing slot holds one microbatch's taps: the aux hidden states plus the token embeddings.
    slots = draft_slots * (num_taps + 1) * tokens * m.hidden_size * act_bytes
    return state + d.ttt_steps * per_step + target_probs + fc_in + slots
