"""Roofline cost model of one vLLM instance: decode/verify step time, prefill, all-reduce, KV capacity.

Every constant is either from the GPU catalogue (specdraft/spec/gpus.py) or calibrated below against the
public anchors collected in the shared notes (/work/shared/notes/field.md, "Rollout side").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specdraft.spec.gpus import CATALOGUE
from specdraft.spec.schema import LayoutSpec

# Achieved fraction of peak HBM bandwidth for decode GEMMs. Calibrated on microsoft/vidur's H100 profile of the
# Llama-2-7B MLP (270.6 MB of bf16 weights): 180 us at TP1 and 45 us at TP8 for <= 64 tokens. Solving
# t = W / (tp * eta * 3.35 TB/s) + c for both points gives eta = 0.52 and c = 25.7 us.
HBM_EFFICIENCY = 0.52
# Fixed cost of one GEMM block (attention or MLP) per layer: kernel launches and small ops (same fit as above).
BLOCK_OVERHEAD_S = 25.7e-6
# Achieved fraction of peak bf16 FLOP/s once compute-bound: the same vidur profile gives 375 us at TP1 for 512
# tokens, i.e. 2 * 135.3M params * 512 tokens / (375 - 25.7 us) = 397 TFLOP/s = 0.40 of the H100's 989.
FLOPS_EFFICIENCY = 0.40
# All-reduce: latency + ring traffic 2 (tp-1)/tp * bytes over the NVLink bandwidth. The latency puts 1M fp16
# elements at 34-38 us for TP2-TP8, the middle of the measured 30-45 us range quoted in the notes.
ALLREDUCE_LATENCY_S = 30e-6
# vLLM's long-standing default cap on concurrently running sequences (EngineArgs.max_num_seqs = 256).
MAX_NUM_SEQS = 256
# vLLM admits a request only while 1% of the KV blocks stay free (its watermark), which curbs preemption churn.
KV_WATERMARK = 0.01
ACT_BYTES = 2  # bf16 activations travel in the all-reduces
WEIGHT_BYTES = 2  # bf16 weights


def expected_accepted(acceptance: float, k: int) -> float:
    """Tokens per verify step with k drafts and per-token acceptance a: (1 - a^(k+1)) / (1 - a).

    Leviathan et al., "Fast Inference from Transformers via Speculative Decoding" (arXiv 2211.17192), eq. 1;
    it counts the bonus token the target emits after the accepted prefix.
    """
    if k <= 0:
        return 1.0
    if acceptance >= 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


@dataclass(frozen=True)
class ModelShape:
    """What the roofline needs of a transformer: per-layer GEMM params, head, KV bytes, attention width."""

    layers: int
    hidden: int
    attn_params: int  # Q, K, V, O of one layer
    mlp_params: int  # dense MLP of one layer (active experts only for MoE)
    mlp_weight_params: int  # MLP weights a decode step must read (every expert, once batches touch them all)
    head_params: int  # LM head (vocab x hidden)
    kv_bytes_per_token: int
    attn_width: int  # query heads x head_dim
    total_params: int


@dataclass(frozen=True)
class CostModel:
    """Per-step costs of one vLLM instance of the layout's model on the layout's GPU.

    Decode step (one token per running sequence, or k drafts + a (k+1)-token verify with speculation):
      per layer  max(weight bytes / tp / (eta_bw * BW), 2 * params * tokens / tp / (eta_f * peak)) + overhead
                 for the attention and the MLP block, plus 2 all-reduces of tokens x hidden (tp > 1);
      once       the KV cache of every running sequence read at eta_bw * BW (decode attention is memory-bound);
      + LM head, and with speculation the draft's k sequential forwards.
    The batch's KV read is linear in its total context, so a step costs a + b * total_context (see `affine`).
    """

    target: ModelShape
    draft: ModelShape | None
    hbm_bw: float
    peak_flops: float
    link_bw: float
    hbm_bytes: int
    gpu_memory_utilization: float
    num_speculative_tokens: int
    acceptance_rate: float
    speculative: bool
    max_model_len: int
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    # ---- primitives ------------------------------------------------------------------------------------
    def allreduce(self, tp: int, nbytes: float) -> float:
        if tp <= 1:
            return 0.0
        return ALLREDUCE_LATENCY_S + 2.0 * (tp - 1) / tp * nbytes / self.link_bw

    def _gemm(self, params: float, weight_params: float, tokens: float, tp: int) -> float:
        mem = weight_params * WEIGHT_BYTES / tp / (HBM_EFFICIENCY * self.hbm_bw)
        flops = 2.0 * params * tokens / tp / (FLOPS_EFFICIENCY * self.peak_flops)
        return max(mem, flops) + BLOCK_OVERHEAD_S

    def _forward(self, m: ModelShape, tokens: float, tp: int, layers: int | None = None) -> float:
        """Weight-side time of one forward over ``tokens`` tokens (no KV read), all layers + LM head."""
        n = m.layers if layers is None else layers
        per_layer = (self._gemm(m.attn_params, m.attn_params, tokens, tp)
                     # MoE: a step reads only the experts its tokens touch (at most every expert).
                     + self._gemm(m.mlp_params, min(m.mlp_weight_params, tokens * m.mlp_params), tokens, tp)
                     + 2 * self.allreduce(tp, tokens * m.hidden * ACT_BYTES))
        return n * per_layer + self._gemm(m.head_params, m.head_params, tokens, tp)

    def kv_read_per_token(self, tp: int, m: ModelShape | None = None) -> float:
        """Seconds to read one context token's KV (all layers) on one GPU of a tp group."""
        m = m or self.target
        return m.kv_bytes_per_token / tp / (HBM_EFFICIENCY * self.hbm_bw)

    # ---- decode ----------------------------------------------------------------------------------------
    def tokens_per_step(self, spec: bool) -> float:
        """Expected tokens a running sequence gains per step (verify step with speculation)."""
        return expected_accepted(self.acceptance_rate, self.num_speculative_tokens) if spec else 1.0

    def affine(self, tp: int, batch: int, spec: bool, context: float | None = None) -> tuple[float, float]:
        """(a, b): one step of ``batch`` running sequences costs a + b * (their total context tokens).

        ``context`` is unused here (the roofline is affine everywhere); a measured profile uses it to pick the
        local linear piece (profile.ProfileCost).
        """
        key = (tp, batch, spec)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        k = self.num_speculative_tokens
        q = k + 1 if spec else 1  # query tokens per sequence in the target pass (the verify grows with k+1)
        a = self._forward(self.target, batch * q, tp)
        b = self.kv_read_per_token(tp)
        if spec and self.draft is not None:
            # k sequential draft forwards of one token per sequence; the draft's own KV is read each time.
            a += k * self._forward(self.draft, batch, tp)
            b += k * self.kv_read_per_token(tp, self.draft)
        self._cache[key] = (a, b)
        return a, b

    def decode_step(self, tp: int, batch: int, total_context: float, spec: bool) -> float:
        a, b = self.affine(tp, batch, spec, total_context)
        return a + b * total_context

    def use_speculation(self, tp: int, batch: int, total_context: float) -> bool:
        """Speculate when it raises tokens per second at this batch (verify turns compute-bound at large batch)."""
        if not self.speculative or batch <= 0:
            return False
        spec = self.tokens_per_step(True) / self.decode_step(tp, batch, total_context, True)
        plain = 1.0 / self.decode_step(tp, batch, total_context, False)
        return spec > plain

    def speculation_threshold(self, tp: int, mean_context: float) -> int:
        """Largest batch (<= MAX_NUM_SEQS) at which speculation still pays, 0 when it never does."""
        if not self.speculative:
            return 0
        best = 0
        for batch in range(1, MAX_NUM_SEQS + 1):
            if self.use_speculation(tp, batch, batch * mean_context):
                best = batch
            elif best:
                break
        return best

    # ---- prefill ---------------------------------------------------------------------------------------
    def prefill(self, tp: int, tokens: float) -> float:
        """Prefill (or KV recompute) of ``tokens`` context tokens of one sequence: GEMMs + causal attention."""
        if tokens <= 0:
            return 0.0
        m = self.target
        attn_flops = 2.0 * m.layers * m.attn_width * tokens * tokens  # QK^T and PV over the causal half
        t = self._forward(m, tokens, tp) + attn_flops / tp / (FLOPS_EFFICIENCY * self.peak_flops)
        return t

    # ---- memory ----------------------------------------------------------------------------------------
    def weight_bytes(self) -> int:
        draft = self.draft.total_params if (self.draft is not None and self.speculative) else 0
        return (self.target.total_params + draft) * WEIGHT_BYTES

    def kv_capacity_tokens(self, tp: int) -> int:
        """Context tokens an instance of ``tp`` GPUs can hold after its weights (target + draft) are loaded."""
        per_gpu = self.hbm_bytes * self.gpu_memory_utilization - self.weight_bytes() / tp
        if per_gpu <= 0:
            return 0
        return int(per_gpu * tp / self.target.kv_bytes_per_token)


def _shape(spec: LayoutSpec, *, draft: bool) -> ModelShape:
    from specdraft.plan.memory import attention_params, draft_params, mlp_params
    from specdraft.rollout.instances import kv_bytes_per_token, model_params

    m = spec.model
    head_dim = m.kv_channels or m.hidden_size // m.num_attention_heads
    kv_heads = m.num_query_groups or m.num_attention_heads
    attn = attention_params(spec)
    if draft:
        layers = spec.draft.num_layers
        total = draft_params(spec)
        head = m.vocab_size * m.hidden_size
        # EAGLE-3 reads [embedding ; hidden] (2h) in its first layer and fuses three taps through `fc` (3h x h):
        # both are folded into the attention GEMM of the (usually single) draft layer.
        num_taps = len(spec.draft.aux_layers) if spec.draft.aux_layers is not None else 3
        fold = (num_taps * m.hidden_size * m.hidden_size + m.hidden_size * m.num_attention_heads * head_dim) / layers
        mlp = mlp_params(m.hidden_size, m.ffn_hidden_size, m.swiglu)
        return ModelShape(layers=layers, hidden=m.hidden_size, attn_params=int(attn + fold), mlp_params=mlp,
                          mlp_weight_params=mlp, head_params=head, total_params=total,
                          kv_bytes_per_token=2 * layers * kv_heads * head_dim * 2,
                          attn_width=m.num_attention_heads * head_dim)
    if m.num_experts:
        expert = mlp_params(m.hidden_size, m.moe_ffn_hidden_size or 0, m.swiglu)
        mlp_active, mlp_weights = m.moe_router_topk * expert, m.num_experts * expert
    else:
        mlp_active = mlp_weights = mlp_params(m.hidden_size, m.ffn_hidden_size, m.swiglu)
    return ModelShape(layers=m.num_layers, hidden=m.hidden_size, attn_params=attn, mlp_params=mlp_active,
                      mlp_weight_params=mlp_weights, head_params=m.vocab_size * m.hidden_size,
                      kv_bytes_per_token=kv_bytes_per_token(spec), attn_width=m.num_attention_heads * head_dim,
                      total_params=model_params(spec))


def from_spec(spec: LayoutSpec, *, acceptance_rate: float | None = None) -> CostModel:
    """The cost model of the layout's rollout instances (model, GPU, speculation settings)."""
    from specdraft.rollout.instances import max_model_len

    r = spec.rollout
    gpu = CATALOGUE[spec.cluster.gpu]
    speculative = r.speculative and spec.draft.enabled
    return CostModel(
        target=_shape(spec, draft=False),
        draft=_shape(spec, draft=True) if speculative else None,
        hbm_bw=gpu.hbm_bw, peak_flops=gpu.peak_flops, link_bw=gpu.link_bw, hbm_bytes=gpu.hbm_bytes,
        gpu_memory_utilization=r.gpu_memory_utilization,
        num_speculative_tokens=(r.num_speculative_tokens or spec.draft.ttt_steps) if speculative else 0,
        acceptance_rate=r.acceptance_rate if acceptance_rate is None else acceptance_rate,
        speculative=speculative,
        max_model_len=max_model_len(spec),
    )


def steps_time(a: float, b: float, s0: float, growth: float, n: float) -> float:
    """Time of n steps whose context starts at s0 and grows by ``growth`` per step: sum of a + b * s_j.

    Treated as a fluid (n may be fractional): n*a + b*(n*s0 + growth*n^2/2). The error is under one step.
    """
    return n * a + b * (n * s0 + growth * n * n / 2.0)


def steps_within(a: float, b: float, s0: float, growth: float, dt: float) -> float:
    """Inverse of `steps_time`: the (fractional) number of steps that fit in ``dt`` seconds."""
    if dt <= 0:
        return 0.0
    qa = b * growth / 2.0
    qb = a + b * s0
    if qa <= 1e-300:
        return dt / qb
    # Stable root of qa n^2 + qb n - dt = 0.
    return 2.0 * dt / (qb + math.sqrt(qb * qb + 4.0 * qa * dt))
