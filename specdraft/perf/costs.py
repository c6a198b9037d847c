"""Per-microbatch costs on one rank: GEMMs at a calibrated efficiency, attention, elementwise traffic, TP/SP
collectives, the CP ring, the MoE all-to-all, pipeline P2P, the LM head and the EAGLE-3 draft.

FLOP counts follow Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (https://arxiv.org/abs/2104.04473, appendix: 2mnk per GEMM, backward twice the forward); attention is
causal over each packed sequence; collective volumes are NCCL's ring volumes (all-gather and reduce-scatter move
(n-1)/n of the buffer, all-reduce twice that). Every term is cached per `Shape` (the sizes one rank's work depends on).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from specdraft.plan.dims import ParallelDims
from specdraft.plan.memory import DTYPE_BYTES
from specdraft.spec.derived import aux_layers, draft_vocab_size, head_dim, kv_heads
from specdraft.spec.gpus import CATALOGUE
from specdraft.spec.schema import LayoutSpec

ATTENTION_BACKWARD = 2.5  # flash attention's backward runs 5 matmul-sized steps to the forward's 2
PASSES = 3  # forward + backward (dgrad and wgrad) of a GEMM or of an elementwise op, in forward units
CE_BYTES_PER_LOGIT = 16  # fp32 logits written, read for softmax, written as grad, read back: 4 passes x 4 bytes


@dataclass(frozen=True, kw_only=True)
class Efficiency:
    """The estimate's constants: what fraction of a roofline the kernels and the links reach.

    `gemm_bf16` is a measurement (an 8192^3 bf16 matmul reached 790 TFLOP/s on an H200, 80% of its 989 TFLOP/s
    dense peak, in this project's GPU probe); `gemm_fp8` and `attention` are fitted by benchmarks/calibrate.py to
    NVIDIA's published H100 Megatron figures (benchmarks/calibration_h100.yaml); the rest are priors: NCCL's usual
    share of link bandwidth, and overlap fractions for pipeline (TapChannel) and DP communication. Which TP
    collectives stay exposed follows megatron-core's and TransformerEngine's overlap (`CostModel._tp_exposed`).
    """

    gemm_bf16: float = 0.80  # of the bf16 dense peak, for large GEMMs (measured, above)
    gemm_fp8: float = 0.55  # of the fp8 dense peak, for large GEMMs (casts and scaling included); fitted
    gemm_knee: float = 128.0  # a GEMM whose smallest side is this wide runs at half its large-GEMM efficiency
    attention: float = 0.45  # flash attention forward, of the bf16 dense peak (attention stays bf16 under fp8); fitted
    attention_knee: float = 512.0  # attention over blocks this many tokens long runs at half that efficiency
    elementwise: float = 0.70  # of HBM bandwidth, for norms, residuals, activations, casts, cross-entropy
    link: float = 0.80  # of NVLink bandwidth that NCCL's collectives reach
    network: float = 0.85  # of the per-GPU network bandwidth
    p2p_exposed: float = 0.5  # of TapChannel send time on the critical path (pipeline sends: plan.estimate)
    dp_exposed: float = 0.2  # of the distributed optimizer's reduce-scatter + all-gather not hidden
    p2p_latency_s: float = 20e-6  # one pipeline or CP ring send's fixed cost
    layer_overhead_s: float = 0.0  # fixed cost per layer per microbatch (kernel launches), forward + backward


class Shape(NamedTuple):
    """The cache key of the per-rank costs: the part of a layout's ParallelDims (and its recompute mode) that shapes
    one rank's work. Build it with `Shape.of`; pp, dp and the split only matter through the bandwidths."""

    tp: int
    cp: int
    sequence_parallel: bool
    recompute: str
    micro_batch_size: int
    ep: int
    etp: int

    @classmethod
    def of(cls, dims: ParallelDims, recompute: str) -> "Shape":
        d = dims
        return cls(d.tp, d.cp, d.sequence_parallel, recompute, d.micro_batch_size, d.ep, d.etp)


class LayerCost(NamedTuple):
    """Seconds per microbatch (forward + backward, recompute included) of one transformer layer."""

    compute: float
    tp_comm: float  # exposed TP/SP collective time
    cp_ring: float  # exposed CP ring time
    ep_a2a: float  # MoE dispatch + combine all-to-all


class Bandwidths(NamedTuple):
    """Bytes/s each rank reaches in its groups (collectives are ring volumes over these)."""

    tp: float
    cp: float
    ep: float
    dp: float  # the distributed optimizer's dp x cp group
    edp: float
    p2p: float  # to the next pipeline stage


class CostModel:
    """The costs of one spec's model, training settings and GPU; everything else comes in as a Shape."""

    def __init__(self, spec: LayoutSpec, eff: Efficiency):
        m, t = spec.model, spec.training
        self.eff = eff
        self.gpu = CATALOGUE[spec.cluster.gpu]
        self.fp8 = t.dtype == "fp8"
        self.act_bytes = DTYPE_BYTES[t.dtype]
        self.num_layers = m.num_layers
        self.h, self.heads, self.groups, self.d = m.hidden_size, m.num_attention_heads, kv_heads(m), head_dim(m)
        self.ffn, self.vocab, self.seq = m.ffn_hidden_size, m.vocab_size, m.seq_length
        self.gated = m.swiglu
        # None follows NVIDIA's performance recipes (on; Shape's tp and sp decide where it applies), GPUs only.
        self.tp_overlap = self.gpu.is_gpu and t.tp_comm_overlap is not False
        self.experts, self.topk, self.moe_ffn = m.num_experts, m.moe_router_topk, m.moe_ffn_hidden_size or 0
        lengths = t.sequence_lengths or [m.seq_length]
        # Causal attention over packed sequences: a token attends to half its sequence on average, so the
        # attention work per token is proportional to sum(l^2) / sum(l).
        self.span = sum(n * n for n in lengths) / sum(lengths)
        self.draft_enabled = spec.draft.enabled
        self.ttt_steps, self.draft_layers = spec.draft.ttt_steps, spec.draft.num_layers
        self.num_taps = len(aux_layers(spec)) if spec.draft.enabled else 0
        self.draft_vocab = draft_vocab_size(spec)
        peak = self.gpu.fp8_flops if self.fp8 and self.gpu.fp8_flops else self.gpu.peak_flops
        self.gemm_peak = peak * (eff.gemm_fp8 if self.fp8 and self.gpu.fp8_flops else eff.gemm_bf16)
        self.bf16_gemm_peak = self.gpu.peak_flops * eff.gemm_bf16
        self.hbm = self.gpu.hbm_bw * eff.elementwise
        self._cache: dict[tuple, object] = {}

    # ---- kernels -------------------------------------------------------------------------------------------
    def _gemm(self, rows: float, cols: float, inner: float, peak: float | None = None) -> float:
        """Forward + backward seconds of one (rows x inner) @ (inner x cols) GEMM; small sides run slower."""
        side = min(rows, cols, inner)
        if side <= 0:
            return 0.0
        knee = self.eff.gemm_knee
        return PASSES * 2.0 * rows * cols * inner / ((peak or self.gemm_peak) * side / (side + knee))

    def _attention(self, tokens: float, heads: float, cp: int, steps: int = 1) -> float:
        """Forward seconds of causal attention for ``tokens`` local queries (x ``steps`` stacked TTT queries).

        A rank holds 2 chunks of l / 2cp tokens of every sequence (zigzag) and runs attention block by block, so
        short blocks (short sequences, high cp) run below the kernel's long-sequence efficiency.
        """
        flops = 2.0 * tokens * steps * heads * self.d * self.span
        block = self.span / cp
        return flops / (self.gpu.peak_flops * self.eff.attention * block / (block + self.eff.attention_knee))

    def collective(self, nbytes: float, size: int, bw: float, allreduce: bool = False) -> float:
        if size <= 1:
            return 0.0
        return (2.0 if allreduce else 1.0) * (size - 1) / size * nbytes / bw

    # ---- one transformer layer -----------------------------------------------------------------------------
    def layer(self, shape: Shape, bw: Bandwidths) -> LayerCost:
        key = ("layer", shape, bw)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._layer(shape, bw)
        return hit

    def _layer(self, s: Shape, bw: Bandwidths) -> LayerCost:
        tp, h, d = s.tp, self.h, self.d
        tokens = s.micro_batch_size * self.seq / s.cp  # this rank's sequence share; every tp rank works on all of it
        q, kv = self.heads * d, self.groups * d
        gemm = self._gemm(tokens, (q + 2 * kv) / tp, h) + self._gemm(tokens, h, q / tp)
        mlp_rows, mlp_ffn = tokens, self.ffn
        if self.experts:
            # Balanced routing: each rank computes topk * tokens / tp token-expert pairs, split over its
            # E/ep local experts and sharded etp ways (Megatron's expert layout).
            pairs = tokens * self.topk * s.etp / tp
            mlp_rows, mlp_ffn = pairs / max(self.experts // s.ep, 1), self.moe_ffn
            per_expert = self._gemm(mlp_rows, (2 if self.gated else 1) * mlp_ffn / s.etp, h) + self._gemm(
                mlp_rows, h, mlp_ffn / s.etp
            )
            gemm += per_expert * max(self.experts // s.ep, 1) + self._gemm(tokens / tp, self.experts, h)
        else:
            gemm += self._gemm(tokens, (2 if self.gated else 1) * mlp_ffn / tp, h) + self._gemm(tokens, h, mlp_ffn / tp)
        attn_fwd = self._attention(tokens, self.heads / tp, s.cp)
        elem_fwd = self._elementwise_bytes(s, tokens) / self.hbm
        forward = gemm / PASSES + attn_fwd + elem_fwd
        compute = gemm + attn_fwd * (1 + ATTENTION_BACKWARD) + elem_fwd * PASSES
        if s.recompute == "full":
            compute += forward
        elif s.recompute == "selective":
            compute += attn_fwd  # Megatron's selective recompute reruns core attention
        act = tokens * h * self.act_bytes
        # One all-gather (or reduce-scatter) of each block's activation over its TP group: the attention block's
        # and the MLP's (a MoE layer's routed tokens over etp, when etp > 1).
        passes = 3 if s.recompute == "full" else 2
        attention_c = self.collective(act, tp, bw.tp)
        mlp_c, mlp_tp = attention_c, tp
        if self.experts:
            mlp_c, mlp_tp = self.collective(act * self.topk / tp * s.etp, s.etp, bw.ep), s.etp
        tp_comm = self._tp_exposed(attention_c, tp, s.sequence_parallel, passes) + self._tp_exposed(
            mlp_c, mlp_tp, s.sequence_parallel, passes
        )
        ep_a2a = 0.0
        if self.experts and s.ep > 1:
            # Dispatch and combine, forward and backward: each rank sends its sequence-parallel token shard.
            routed = tokens / tp * self.topk * h * self.act_bytes
            ep_a2a = 2 * passes * (s.ep - 1) / s.ep * routed / bw.ep
        return LayerCost(
            compute=compute + self.eff.layer_overhead_s,
            tp_comm=tp_comm,
            cp_ring=self._cp_ring(s, tokens, attn_fwd, bw, steps=1),
            ep_a2a=ep_a2a,
        )

    def _tp_exposed(self, c: float, tp: int, sp: bool, passes: int) -> float:
        """Exposed seconds of one block's TP collectives (a column-parallel GEMM in, a row-parallel GEMM out) per
        microbatch; ``c`` is one all-gather or reduce-scatter of its activation, an all-reduce two.

        - TP overlap (TransformerEngine userbuffers; NVIDIA's H100 recipes run forward and dgrad as ring exchanges
          and wgrad as bulk overlaps): of the forward reduce-scatter's ring only the last step shows, c / tp
          (Megatron-Bridge performance guide: "a 1x ReduceScatter chunk remains exposed");
        - sequence parallelism without it: the forward all-gather and reduce-scatter block; backward overlaps the
          column-parallel GEMM's input all-gather and dgrad reduce-scatter with its other GEMM, while the
          row-parallel GEMM's grad-output all-gather blocks (c);
        - no sequence parallelism: the forward all-reduce blocks (2c); backward's overlaps the wgrad GEMM.
        A full recompute runs the forward twice.
        """
        forwards = passes - 1
        if sp and self.tp_overlap:
            return forwards * c / tp
        if sp:
            return forwards * 2 * c + c
        return forwards * 2 * c

    def _elementwise_bytes(self, s: Shape, tokens: float) -> float:
        """Forward HBM bytes of one layer's non-GEMM ops (PASSES x this for forward + backward).

        Norms and residual adds (20 h bytes per token in bf16) run on the sequence-parallel shard, else
        replicated on every tp rank; RoPE and the MLP activation are tp-sharded; fp8 casts each GEMM input.
        """
        h, tp = self.h, s.tp
        replicated = 20 * h * (tokens / tp if s.sequence_parallel else tokens)
        rope = 4 * (self.heads + self.groups) * self.d / tp * tokens
        ffn = self.moe_ffn * self.topk if self.experts else self.ffn
        act = (6 if self.gated else 4) * ffn / tp * tokens
        casts = 3 * (2 * h + (self.heads * self.d + ffn) / tp) * tokens if self.fp8 else 0.0
        moe = 4 * tokens * self.topk * h * self.act_bytes / tp if self.experts else 0.0  # permute + unpermute
        return replicated + rope + act + casts + moe

    def _cp_ring(self, s: Shape, tokens: float, attn_fwd: float, bw: Bandwidths, steps: int) -> float:
        """Exposed seconds of the zigzag ring: K/V (and dK/dV backward) per step against that step's compute.

        ``steps`` TTT queries share one pass of the trunk K/V (the draft's branch attention), so their compute
        hides more of it.
        """
        if s.cp <= 1:
            return 0.0
        kv = 2 * tokens * self.groups / s.tp * self.d * self.act_bytes
        per_step_fwd = attn_fwd * steps / s.cp
        # Each ring step also pays one send's fixed latency, not hidden (the step's kernels wait for it).
        latency = self.eff.p2p_latency_s
        fwd = (s.cp - 1) * (max(0.0, kv / bw.cp - per_step_fwd) + latency)
        bwd = (s.cp - 1) * (max(0.0, 2 * kv / bw.cp - per_step_fwd * ATTENTION_BACKWARD) + latency)
        reruns = 1 if s.recompute in ("selective", "full") else 0
        return fwd * (1 + reruns) + bwd

    # ---- ends of the pipeline ----------------------------------------------------------------------------
    def head(self, s: Shape, bw: Bandwidths) -> float:
        """Output layer (bf16 GEMM, vocab-parallel) and cross-entropy on the last stage, per microbatch."""
        key = ("head", s, bw)
        hit = self._cache.get(key)
        if hit is None:
            tokens = s.micro_batch_size * self.seq / s.cp
            gemm = self._gemm(tokens, self.vocab / s.tp, self.h, self.bf16_gemm_peak)
            ce = CE_BYTES_PER_LOGIT * tokens * self.vocab / s.tp / self.hbm
            # Under SP the output layer (megatron's own ColumnParallelLinear, outside TE's overlap) all-gathers its
            # input, blocking; backward's reduce-scatter overlaps the wgrad GEMM.
            gather = self.collective(tokens * self.h * self.act_bytes, s.tp, bw.tp) if s.sequence_parallel else 0.0
            hit = self._cache[key] = gemm + ce + gather
        return hit

    def embedding(self, s: Shape, bw: Bandwidths) -> float:
        """Embedding lookup and its gradient (memory bound), plus the vocab-parallel reduction of its output: a
        reduce-scatter into the SP shard (and the gradient's all-gather back), or an all-reduce; both block."""
        tokens = s.micro_batch_size * self.seq / s.cp
        lookup = PASSES * tokens * self.h * self.act_bytes / self.hbm
        scatter = self.collective(tokens * self.h * self.act_bytes, s.tp, bw.tp) * 2
        return lookup + scatter

    def p2p_send(self, s: Shape, bw: Bandwidths) -> float:
        """One pipeline send (activation forward or its gradient backward), the whole transfer: which sends the
        schedule hides is decided by specdraft.perf.estimate."""
        tokens = s.micro_batch_size * self.seq / s.cp / (s.tp if s.sequence_parallel else 1)
        return tokens * self.h * self.act_bytes / bw.p2p + self.eff.p2p_latency_s

    # ---- the draft -----------------------------------------------------------------------------------------
    def draft(self, s: Shape, bw: Bandwidths) -> tuple[float, float, float]:
        """(compute, tp collectives, CP ring) seconds of the EAGLE-3 draft per microbatch on its stage.

        fc over the concatenated taps (replicated, as in the runtime), then per TTT step its decoder layer(s)
        with a [embedding ; hidden] (2h) input, an LM head and the KL against the policy (memory bound like
        cross-entropy); the trunk K/V ride the CP ring once for all steps.
        """
        key = ("draft", s, bw)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if not self.draft_enabled:
            self._cache[key] = (0.0, 0.0, 0.0)
            return self._cache[key]
        tp, h, d, steps = s.tp, self.h, self.d, self.ttt_steps
        tokens = s.micro_batch_size * self.seq / s.cp
        q, kv = self.heads * d, self.groups * d
        bf16 = self.bf16_gemm_peak
        layer = (
            self._gemm(tokens, (q + 2 * kv) / tp, 2 * h, bf16)
            + self._gemm(tokens, h, q / tp, bf16)
            + self._gemm(tokens, (2 if self.gated else 1) * self.ffn / tp, h, bf16)
            + self._gemm(tokens, h, self.ffn / tp, bf16)
        )
        attn_fwd = self._attention(tokens, self.heads / tp, s.cp)
        elem = self._elementwise_bytes(s._replace(recompute="none"), tokens) / self.hbm * PASSES
        per_step = (
            self.draft_layers * (layer + attn_fwd * (1 + ATTENTION_BACKWARD) + elem)
            + self._gemm(tokens, self.draft_vocab / tp, h, bf16)
            + CE_BYTES_PER_LOGIT * tokens * self.draft_vocab / tp / self.hbm
        )
        compute = self._gemm(tokens, h, self.num_taps * h, bf16) + steps * per_step
        act = tokens * h * self.act_bytes
        # The runtime's draft layers are megatron's Column/RowParallelLinear without SP or TE's overlap: two blocks
        # (attention, MLP) per layer and TTT step, exposed as the target's are without SP.
        comm = steps * self.draft_layers * 2 * self._tp_exposed(self.collective(act, tp, bw.tp), tp, sp=False, passes=2)
        ring = self.draft_layers * self._cp_ring(s._replace(recompute="none"), tokens, attn_fwd, bw, steps=steps)
        hit = self._cache[key] = (compute, comm, ring)
        return hit

    def tap_bytes(self, s: Shape, logits: bool) -> tuple[float, float]:
        """(hidden-state tap, logits tap) bytes one route carries per microbatch (as specdraft.plan.taps)."""
        tokens = s.micro_batch_size * self.seq // s.cp
        hidden = (tokens // s.tp if s.sequence_parallel else tokens) * self.h * self.act_bytes
        return hidden, (tokens * (self.vocab // s.tp) * self.act_bytes if logits else 0.0)

    # ---- per step ------------------------------------------------------------------------------------------
    def model_flops_per_token(self) -> float:
        """Training FLOPs per token of the target (forward + backward, no recompute): the MFU numerator."""
        q, kv, h = self.heads * self.d, self.groups * self.d, self.h
        mlp = (3 if self.gated else 2) * h * (self.moe_ffn * self.topk if self.experts else self.ffn)
        per_layer = 2 * (h * (q + 2 * kv) + q * h + mlp) + 2 * self.heads * self.d * self.span
        return PASSES * (self.num_layers * per_layer + 2 * h * self.vocab)
