"""Calibrated roofline cost model of one vLLM instance: decode/verify step time, prefill, all-reduce, KV capacity.

Every constant is either from the GPU catalogue (specdraft/spec/gpus.py) or calibrated below against published
measurements (microsoft/vidur's H100 profiles, vLLM's custom all-reduce as SGLang PR #2904 measures it); docs/rollout.md
has the table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specdraft.plan.memory import attention_params, draft_params, mlp_params
from specdraft.rollout.model.instances import draft_kv_bytes_per_token, kv_bytes_per_token, max_model_len, model_params
from specdraft.spec import derived
from specdraft.spec.gpus import CATALOGUE
from specdraft.spec.schema import LayoutSpec

# ---- calibration (H100 SXM; docs/rollout.md "Cost model") ------------------------------------------------------
# microsoft/vidur's H100 profile of Llama-2-7B (data/profiling/compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv) times
# every token-wise op of one decoder layer: QKV and O projections, rope, both norms, the gated MLP and the residual
# adds (vidur/profiling/mlp/mlp_impl.py::GPTBlock; only the attention kernel and the all-reduces are left out).
# Its "MLP per layer" figures: ~180 us at TP1 and ~45 us at TP8 for <= 64 tokens, 375 us at TP1 for 512.
# The layer reads 202.4M bf16 params (404.8 MB). A memory-bound layer costs W / (tp * eta_bw * BW) + floor; the two
# <= 64-token points give eta_bw * 3.35 TB/s = 404.8 MB * 7/8 / 135 us, i.e. eta_bw = 0.783, and floor = 25.7 us.
# The additive floor (not max(roofline, floor)) is what the profile shows in between: it predicts 103 us at TP2 and
# 64 us at TP4 against vidur's 101-111 us and 64-73 us, where a max() floor would give 90 us and 45 us.
HBM_EFFICIENCY = 0.783
LAYER_FLOOR_S = 25.7e-6
# Compute-bound once tokens are many: 375 us at TP1 for 512 tokens is 2 * 202.4M * 512 FLOPs in (375 - 25.7) us,
# i.e. 593 TFLOP/s = 0.60 of the H100's 989.
FLOPS_EFFICIENCY = 0.60
# Fixed cost of one lone GEMM outside a layer (the LM head): the per-GEMM intercepts of the same profile (TP1 vs TP8
# of attn_pre_proj, attn_post_proj, mlp_up_proj, mlp_down_proj at 64 tokens) are 3.4-6.6 us.
GEMM_FLOOR_S = 5e-6
# Decode attention per layer: the KV read at eta_bw (assumed: it streams HBM like the GEMMs above) plus a floor of
# three small kernels (KV-cache write, paged decode attention, split-KV merge), each at the ~4 us every small kernel
# costs in the same vidur profile (input_layernorm / post_attention_layernorm at <= 64 tokens: 4 us).
ATTN_FLOOR_S = 12e-6
# All-reduce of a step's activations (tokens x hidden x 2 bytes: 8 KB for one token of an 8B model, 8 MB for 1024).
# vLLM runs its custom all-reduce below 8 MiB (CustomAllreduce(max_size=8192 * 1024), TP 2, 4, 6 or 8 on NVLink) and
# NCCL above. The custom kernel costs latency + bytes / bandwidth, per TP, fitted (least squares on relative error)
# to the H100 latencies of vLLM's kernel in SGLang PR #2904 (sgl-kernel/tests/test_trt_reduce.py: float32 tensors of
# 512 to 1M elements, i.e. 2 KB to 4 MB): TP2 9.5, 8.8, 8.7, 12.9, 17.7, 26.6 us; TP4 9.1, 8.5, 9.2, 20.6, 26.9,
# 40.2 us; TP8 10.1, 9.3, 11.8, 24.1, 30.4, 45.0 us. The fit is within -17% .. +10% of every point (worst at 1 MB,
# where the kernel switches from one-shot to two-shot). docs/rollout.md has the table.
CUSTOM_ALLREDUCE = {2: (8.7e-6, 238e9), 4: (8.7e-6, 120e9), 8: (10.0e-6, 106e9)}  # tp -> (latency s, bytes/s)
CUSTOM_ALLREDUCE_MAX_BYTES = 8 * 2**20
# NCCL (8 MiB and more, other TP sizes, the LM head's logits gather): latency + ring traffic 2 (tp-1)/tp * bytes over
# NVLink. 1M fp16 elements then cost 34-38 us at TP2-8, inside vidur's measured 34-43 us (its
# network/h100_dgx/all_reduce.csv medians).
NCCL_LATENCY_S = 30e-6
# vLLM admits a request only while 1% of the KV blocks stay free (its watermark), which curbs preemption churn.
KV_WATERMARK = 0.01
ACT_BYTES = 2  # bf16 activations travel in the all-reduces and the logits gather
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
    """What the cost model needs of a transformer: per-layer GEMM params, head, KV bytes, attention width."""

    layers: int
    hidden: int
    attn_params: int  # Q, K, V, O of one layer
    mlp_params: int  # dense MLP of one layer (active experts only for MoE)
    mlp_weight_params: int  # MLP weights a decode step must read (every expert, once batches touch them all)
    head_params: int  # LM head (vocab x hidden)
    kv_bytes_per_token: int  # K and V of every layer, every KV head
    attn_width: int  # query heads x head_dim
    total_params: int
    kv_heads: int = 1 << 30  # KV heads; a TP wider than this replicates them (vLLM), so the KV stops sharding
    vocab: int = 0


@dataclass(frozen=True)
class CostModel:
    """Per-step costs of one vLLM instance of the layout's model on the layout's GPU.

    Forward over ``tokens`` tokens on a tp group (`forward`):
      per layer   sum over the attention and MLP blocks of max(weight bytes / tp / (eta_bw BW),
                  2 params tokens / tp / (eta_f peak)) + LAYER_FLOOR_S, + 2 all-reduces of tokens x hidden (tp > 1);
      once        the embedding's all-reduce (vocab-parallel, tp > 1), the LM head GEMM + GEMM_FLOOR_S and the
                  gather of its vocab-parallel logits (tp > 1).
    Decode attention: per layer ATTN_FLOOR_S, plus the batch's KV read at eta_bw (linear in its total context).
    A step (one token per sequence, or k draft forwards + one (k+1)-token verify) costs a + b * total_context.
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
    max_num_seqs: int  # sequences one instance runs at once (rollout.max_num_seqs)
    _cache: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    # ---- primitives ------------------------------------------------------------------------------------
    def nccl_allreduce(self, tp: int, nbytes: float) -> float:
        if tp <= 1:
            return 0.0
        return NCCL_LATENCY_S + 2.0 * (tp - 1) / tp * nbytes / self.link_bw

    def allreduce(self, tp: int, nbytes: float) -> float:
        """All-reduce of ``nbytes`` over a tp group, as vLLM runs it: its custom kernel below 8 MiB, else NCCL."""
        nccl = self.nccl_allreduce(tp, nbytes)
        custom = CUSTOM_ALLREDUCE.get(tp)
        if custom is None or nbytes >= CUSTOM_ALLREDUCE_MAX_BYTES:
            return nccl
        latency, bandwidth = custom
        # The line is fitted up to 4 MB, where the measured kernel is no slower than NCCL's ring (TP8: 45.0 vs 45.6
        # us, TP4: 40.2 vs 44.0 us); extrapolated further it would overtake the ring, so the cheaper of the two.
        return min(latency + nbytes / bandwidth, nccl)

    def gather(self, tp: int, nbytes: float) -> float:
        """Gather of ``nbytes`` in total, 1/tp from each rank (the LM head's vocab-parallel logits, over NCCL)."""
        if tp <= 1:
            return 0.0
        return NCCL_LATENCY_S + (tp - 1) / tp * nbytes / self.link_bw

    def _gemm(self, params: float, weight_params: float, tokens: float, tp: int) -> float:
        """Roofline of one GEMM block without its floor: memory- or compute-bound, whichever is slower."""
        mem = weight_params * WEIGHT_BYTES / tp / (HBM_EFFICIENCY * self.hbm_bw)
        flops = 2.0 * params * tokens / tp / (FLOPS_EFFICIENCY * self.peak_flops)
        return max(mem, flops)

    def layer_s(self, m: ModelShape, tokens: float, tp: int) -> float:
        """Token-wise ops of one layer (what vidur's per-layer profile times): GEMMs, norms, rope, adds."""
        # MoE: a step reads only the experts its tokens touch (at most every expert).
        mlp_weights = min(m.mlp_weight_params, tokens * m.mlp_params)
        return (
            self._gemm(m.attn_params, m.attn_params, tokens, tp)
            + self._gemm(m.mlp_params, mlp_weights, tokens, tp)
            + LAYER_FLOOR_S
        )

    def forward(self, m: ModelShape, tokens: float, tp: int) -> float:
        """Weight-side time of one forward over ``tokens`` tokens (no attention), all layers + embedding + head."""
        act = tokens * m.hidden * ACT_BYTES
        per_layer = self.layer_s(m, tokens, tp) + 2 * self.allreduce(tp, act)
        head = (
            self._gemm(m.head_params, m.head_params, tokens, tp)
            + GEMM_FLOOR_S
            + self.gather(tp, tokens * m.vocab * ACT_BYTES)
        )
        return m.layers * per_layer + self.allreduce(tp, act) + head

    def kv_shards(self, tp: int, m: ModelShape | None = None) -> int:
        """How many ways the KV cache splits over a tp group (KV heads replicate beyond tp = kv_heads)."""
        m = m or self.target
        return max(1, min(tp, m.kv_heads))

    def kv_read_per_token(self, tp: int, m: ModelShape | None = None) -> float:
        """Seconds to read one context token's KV (all layers) on one GPU of a tp group."""
        m = m or self.target
        return m.kv_bytes_per_token / self.kv_shards(tp, m) / (HBM_EFFICIENCY * self.hbm_bw)

    # ---- decode ----------------------------------------------------------------------------------------
    def tokens_per_step(self, speculative: bool) -> float:
        """Expected tokens a running sequence gains per step (verify step with speculation)."""
        return expected_accepted(self.acceptance_rate, self.num_speculative_tokens) if speculative else 1.0

    def affine(self, tp: int, batch: int, speculative: bool, context: float | None = None) -> tuple[float, float]:
        """(a, b): one step of ``batch`` running sequences costs a + b * (their total context tokens).

        ``context`` is unused here (the model is affine everywhere); a measured profile uses it to pick the local
        linear piece (profile.ProfileCost).
        """
        key = (tp, batch, speculative)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        k = self.num_speculative_tokens
        q = k + 1 if speculative else 1  # query tokens per sequence in the target pass (the verify grows with k+1)
        a = self.forward(self.target, batch * q, tp) + self.target.layers * ATTN_FLOOR_S
        b = self.kv_read_per_token(tp)
        if speculative and self.draft is not None:
            # k sequential draft forwards of one token per sequence; the draft's own KV is read each time.
            a += k * (self.forward(self.draft, batch, tp) + self.draft.layers * ATTN_FLOOR_S)
            b += k * self.kv_read_per_token(tp, self.draft)
        self._cache[key] = (a, b)
        return a, b

    def decode_step(self, tp: int, batch: int, total_context: float, speculative: bool) -> float:
        a, b = self.affine(tp, batch, speculative, total_context)
        return a + b * total_context

    def use_speculation(self, tp: int, batch: int, total_context: float) -> bool:
        """Speculate when it raises tokens per second at this batch (verify turns compute-bound at large batch)."""
        if not self.speculative or batch <= 0:
            return False
        with_drafts = self.tokens_per_step(True) / self.decode_step(tp, batch, total_context, True)
        plain = 1.0 / self.decode_step(tp, batch, total_context, False)
        return with_drafts > plain

    def speculation_threshold(self, tp: int, mean_context: float) -> int:
        """Largest batch (<= max_num_seqs) at which speculation still pays, 0 when it never does."""
        if not self.speculative:
            return 0
        best = 0
        for batch in range(1, self.max_num_seqs + 1):
            if self.use_speculation(tp, batch, batch * mean_context):
                best = batch
            elif best:
                break
        return best

    # ---- prefill ---------------------------------------------------------------------------------------
    def prefill_floor_s(self) -> float:
        """A lower bound on any `prefill`: every layer's fixed floors, which no TP or token count removes."""
        return self.target.layers * (LAYER_FLOOR_S + ATTN_FLOOR_S)

    def prefill(self, tp: int, tokens: float) -> float:
        """Prefill (or KV recompute) of ``tokens`` context tokens of one sequence: GEMMs + causal attention."""
        if tokens <= 0:
            return 0.0
        m = self.target
        attn_flops = 2.0 * m.layers * m.attn_width * tokens * tokens  # QK^T and PV over the causal half
        return (
            self.forward(m, tokens, tp)
            + m.layers * ATTN_FLOOR_S
            + attn_flops / tp / (FLOPS_EFFICIENCY * self.peak_flops)
        )

    # ---- memory ----------------------------------------------------------------------------------------
    def weight_bytes(self) -> int:
        """bf16 weights of one instance: the target, plus the EAGLE-3 draft when it speculates."""
        draft = self.draft.total_params if (self.draft is not None and self.speculative) else 0
        return (self.target.total_params + draft) * WEIGHT_BYTES

    def kv_bytes_per_token_per_gpu(self, tp: int) -> float:
        """KV bytes one context token holds on each GPU: the target's and, when speculating, the draft's layers."""
        per = self.target.kv_bytes_per_token / self.kv_shards(tp)
        if self.draft is not None and self.speculative:
            per += self.draft.kv_bytes_per_token / self.kv_shards(tp, self.draft)
        return per

    def kv_capacity_tokens(self, tp: int) -> int:
        """Context tokens an instance of ``tp`` GPUs can hold after its weights (target + draft) are loaded."""
        per_gpu = self.hbm_bytes * self.gpu_memory_utilization - self.weight_bytes() / tp
        if per_gpu <= 0:
            return 0
        return int(per_gpu / self.kv_bytes_per_token_per_gpu(tp))


def _shape(spec: LayoutSpec, *, draft: bool) -> ModelShape:
    m = spec.model
    head_dim, kv_heads = derived.head_dim(m), derived.kv_heads(m)
    attn = attention_params(spec)
    common = dict(
        hidden=m.hidden_size,
        head_params=m.vocab_size * m.hidden_size,
        kv_heads=kv_heads,
        attn_width=m.num_attention_heads * head_dim,
        vocab=m.vocab_size,
    )
    if draft:
        layers = spec.draft.num_layers
        # EAGLE-3 reads [embedding ; hidden] (2h) in its first layer and fuses three taps through `fc` (3h x h):
        # both are folded into the attention GEMM of the (usually single) draft layer.
        num_taps = len(derived.aux_layers(spec))
        fold = (num_taps * m.hidden_size * m.hidden_size + m.hidden_size * m.num_attention_heads * head_dim) / layers
        mlp = mlp_params(m.hidden_size, m.ffn_hidden_size, m.swiglu)
        return ModelShape(
            layers=layers,
            attn_params=int(attn + fold),
            mlp_params=mlp,
            mlp_weight_params=mlp,
            total_params=draft_params(spec),
            kv_bytes_per_token=draft_kv_bytes_per_token(spec),
            **common,
        )
    if m.num_experts:
        expert = mlp_params(m.hidden_size, m.moe_ffn_hidden_size or 0, m.swiglu)
        mlp_active, mlp_weights = m.moe_router_topk * expert, m.num_experts * expert
    else:
        mlp_active = mlp_weights = mlp_params(m.hidden_size, m.ffn_hidden_size, m.swiglu)
    return ModelShape(
        layers=m.num_layers,
        attn_params=attn,
        mlp_params=mlp_active,
        mlp_weight_params=mlp_weights,
        kv_bytes_per_token=kv_bytes_per_token(spec),
        total_params=model_params(spec),
        **common,
    )


def from_spec(spec: LayoutSpec, *, acceptance_rate: float | None = None) -> CostModel:
    """The cost model of the layout's rollout instances (model, GPU, speculation settings)."""
    r = spec.rollout
    gpu = CATALOGUE[spec.cluster.gpu]
    speculative = r.speculative and spec.draft.enabled
    return CostModel(
        target=_shape(spec, draft=False),
        draft=_shape(spec, draft=True) if speculative else None,
        hbm_bw=gpu.hbm_bw,
        peak_flops=gpu.peak_flops,
        link_bw=gpu.link_bw,
        hbm_bytes=gpu.hbm_bytes,
        gpu_memory_utilization=r.gpu_memory_utilization,
        num_speculative_tokens=derived.num_speculative_tokens(spec) if speculative else 0,
        acceptance_rate=r.acceptance_rate if acceptance_rate is None else acceptance_rate,
        speculative=speculative,
        max_model_len=max_model_len(spec),
        max_num_seqs=r.max_num_seqs,
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
