"""The EAGLE-3 draft: fc over the concatenated taps, decoder layer(s) with TTT branch attention, a final norm and
an LM head over the (possibly reduced) draft vocabulary; the forward is vLLM's and SpecForge's (DraftLayer).

Training-time test (TTT) unrolls S steps: step j's input at row p is [emb(x_{p+1+j}) ; h_j(p)], where h_0 is the
fused taps and h_j the draft's own step j-1 output (after the final norm under norm_output, EAGLE-3.1); it is
trained towards the (detached) target distribution at row p+1+j by forward KL. The query of step j attends to the
trunk (step 0) keys causally and to the branch keys of steps 1..j at its own row, in one softmax:
`branch_attention` (zigzag ring under CP). EAGLE-3: https://arxiv.org/abs/2503.01840; EAGLE-3.1's norm_output:
vLLM's llama_eagle3 and speculators; mask as in SpecForge's generate_eagle3_mask.

Like the target, the draft is tensor-parallel: heads, MLP and a vocab-parallel LM head are split over tp with
megatron-core's Column/RowParallelLinear, and the KL is computed on vocab shards (vocab_parallel.py); a reduced
vocabulary restricts the target's distribution to it (vocab_map.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from specdraft.plan.model import LaunchPlan, RopeScaling
from specdraft.runtime.attention.branch import branch_attention
from specdraft.runtime.models.hf.mapping import padded_vocab
from specdraft.runtime.models.vocab.parallel import mask_padding


@dataclass(frozen=True, kw_only=True)
class DraftShape:
    hidden: int
    num_taps: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int  # the draft LM head's vocabulary (draft.vocab_size, else the target's)
    target_vocab: int
    num_layers: int
    tp: int = 1
    rope_base: float = 10000.0  # the target's model.rotary_base (EAGLE-3 drafts keep the target's rope_theta)
    norm_eps: float = 1e-5  # the target's model.norm_epsilon (EAGLE-3 drafts keep its rms_norm_eps)
    rope_scaling: Optional[RopeScaling] = None  # the target's Llama-3.1 scaling, as the draft's config.json has it
    norm_before_residual: bool = False  # layer 0's residual is hidden_norm's output (draft.norm_before_residual)
    norm_output: bool = False  # a TTT step after the first reads the previous one's post-norm output (EAGLE-3.1)

    @property
    def reduced_vocab(self) -> bool:
        return self.vocab != self.target_vocab


def inverse_frequencies(d: int, base: float, scaling: RopeScaling | None, device=None) -> torch.Tensor:
    """(d/2,) RoPE inverse frequencies, with Llama-3.1's scaling when given (transformers'
    _compute_llama3_parameters, megatron-core's RotaryEmbedding._apply_scaling): wavelengths past
    original/low_freq_factor are divided by factor, those under original/high_freq_factor kept, those between
    blended."""
    inv = 1.0 / base ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
    if scaling is None:
        return inv
    original = scaling.original_max_position_embeddings
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > original / scaling.low_freq_factor, inv / scaling.factor, inv)
    smooth = (original / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= original / scaling.high_freq_factor) & (wavelen <= original / scaling.low_freq_factor)
    return torch.where(medium, blended, scaled)


def rope(x: torch.Tensor, positions: torch.Tensor, base: float, scaling: RopeScaling | None = None) -> torch.Tensor:
    """Rotate-half RoPE. x: (t, h, d); positions: (t,) global positions within each sequence."""
    d = x.shape[-1]
    inv = inverse_frequencies(d, base, scaling, x.device)  # (d/2,)
    angles = positions.to(torch.float32)[:, None] * inv[None, :]  # (t, d/2)
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)[:, None, :].to(x.dtype)  # (t, 1, d)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)[:, None, :].to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class RMSNorm(nn.Module):
    """Llama's RMSNorm as vLLM and SpecForge compute it: normalise in fp32, cast back, then scale by the weight."""

    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def _column(config, fan_in: int, fan_out: int):
    from megatron.core.tensor_parallel import ColumnParallelLinear

    return ColumnParallelLinear(
        fan_in, fan_out, config=config, init_method=nn.init.zeros_, bias=False, gather_output=False
    )


def _row(config, fan_in: int, fan_out: int):
    from megatron.core.tensor_parallel import RowParallelLinear

    return RowParallelLinear(
        fan_in,
        fan_out,
        config=config,
        init_method=nn.init.zeros_,
        bias=False,
        input_is_parallel=True,
        skip_bias_add=True,
    )


class DraftLayer(nn.Module):
    """One EAGLE-3 decoder layer (vLLM llama_eagle3.LlamaDecoderLayer, SpecForge llama3_eagle.LlamaDecoderLayer).

    Layer 0 normalises the token embedding (input_layernorm) and the incoming hidden state (hidden_norm) separately
    and attends over their concatenation (2h wide q/k/v inputs); its residual is the *un-normalised* hidden state,
    or hidden_norm's output under norm_before_residual (vLLM's and speculators' flag of that name).
    A later layer normalises its h-wide input with input_layernorm, as a Llama layer does. Then o_proj plus the
    residual, post_attention_layernorm, SwiGLU MLP plus the residual. Names are EAGLE-3's, so the export only
    renames `layers.0.` to `midlayer.`.
    """

    def __init__(self, shape: DraftShape, config, first: bool):
        super().__init__()
        h, d = shape.hidden, shape.head_dim
        self.shape = shape
        self.first = first
        in_dim = 2 * h if first else h
        self.input_layernorm = RMSNorm(h, shape.norm_eps)
        if first:
            self.hidden_norm = RMSNorm(h, shape.norm_eps)
        self.q_proj = _column(config, in_dim, shape.heads * d)
        self.k_proj = _column(config, in_dim, shape.kv_heads * d)
        self.v_proj = _column(config, in_dim, shape.kv_heads * d)
        self.o_proj = _row(config, shape.heads * d, h)
        self.post_attention_layernorm = RMSNorm(h, shape.norm_eps)
        self.gate_proj = _column(config, h, shape.ffn)
        self.up_proj = _column(config, h, shape.ffn)
        self.down_proj = _row(config, shape.ffn, h)

    def attention_input(self, hidden: torch.Tensor, emb: torch.Tensor | None) -> torch.Tensor:
        """(t, h) hidden [and (t, h) embeddings] -> (t, 2h) for layer 0, (t, h) after."""
        if self.first:
            return torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], dim=-1)  # (t, 2h)
        return self.input_layernorm(hidden)

    def project(self, hidden: torch.Tensor, emb: torch.Tensor | None, positions: torch.Tensor):
        """q, k, v of one TTT step on this rank's heads. hidden, emb: (t, h) -> q (t, H/tp, d), k, v (t, Hkv/tp, d)."""
        s = self.shape
        x = self.attention_input(hidden, emb)
        t = x.shape[0]
        q = rope(self.q_proj(x)[0].view(t, s.heads // s.tp, s.head_dim), positions, s.rope_base, s.rope_scaling)
        k = rope(self.k_proj(x)[0].view(t, s.kv_heads // s.tp, s.head_dim), positions, s.rope_base, s.rope_scaling)
        v = self.v_proj(x)[0].view(t, s.kv_heads // s.tp, s.head_dim)
        return q, k, v

    def finish(self, hidden: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual + SwiGLU MLP. hidden: the layer's input (t, h); attn: (t, H/tp, d) -> (t, h), reduced over tp by
        the row-parallel layers."""
        residual = self.hidden_norm(hidden) if self.first and self.shape.norm_before_residual else hidden
        out = residual + self.o_proj(attn.flatten(1))[0]
        x = self.post_attention_layernorm(out)
        return out + self.down_proj(F.silu(self.gate_proj(x)[0]) * self.up_proj(x)[0])[0]


class VocabMap(nn.Module):
    """The reduced draft vocabulary (SpecForge's buffers): draft id i is target id i + d2t[i]; t2d[v] says whether
    target id v is in the draft vocabulary. Buffers, so checkpoints carry the mapping the draft was trained with."""

    def __init__(self, draft_vocab: int, target_vocab: int):
        super().__init__()
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(target_vocab, dtype=torch.bool))

    def set(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def target_ids(self) -> torch.Tensor:
        """(Vd,) the target id of every draft id (ascending)."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t


class Eagle3Draft(nn.Module):
    def __init__(self, shape: DraftShape, config):
        super().__init__()
        self.shape = shape
        self.fc = nn.Linear(shape.num_taps * shape.hidden, shape.hidden, bias=False)
        self.layers = nn.ModuleList(DraftLayer(shape, config, first=i == 0) for i in range(shape.num_layers))
        self.norm = RMSNorm(shape.hidden, shape.norm_eps)
        # padded to a tp multiple like the target's output layer; the padding's logits are masked in `head`
        self.lm_head = _column(config, shape.hidden, padded_vocab(shape.vocab, shape.tp))
        self.tp_rank = _tp_rank(shape.tp)
        self.vocab = VocabMap(shape.vocab, shape.target_vocab) if shape.reduced_vocab else None

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None) -> dict:
        """dist_checkpointing's view of the draft: megatron's Column/RowParallelLinear shard themselves over tp (the
        global tensor is the same at any tp); fc and the norms are replicated, written once (tp rank 0, dp-cp 0).
        Keys are the parameters' own names, so a draft saved at one layout loads into any other."""
        from megatron.core import parallel_state as ps
        from megatron.core.transformer.utils import sharded_state_dict_default

        # Without the TP group, megatron would give every TP rank replica id 0 for the replicated tensors.
        tp_group = ps.get_tensor_model_parallel_group()
        children = [
            (f"{name}.{i}.{child_name}", child)
            for name, module in self.named_children()
            if isinstance(module, nn.ModuleList)
            for i, layer in enumerate(module)
            for child_name, child in layer.named_children()
        ]
        children += [(name, m) for name, m in self.named_children() if not isinstance(m, nn.ModuleList)]
        out: dict = {}
        for name, module in children:
            out.update(sharded_state_dict_default(module, f"{prefix}{name}.", sharded_offsets, metadata, tp_group))
        # The head's rows are padded to a multiple of tp, so its global shape depends on tp: like megatron's own
        # vocab-parallel weights, a checkpoint of another tp loads the common rows (the rest stay zero).
        out[f"{prefix}lm_head.weight"].allow_shape_mismatch = True
        return out

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """(rows, h) -> (rows, vocab/tp) vocab-parallel logits (the vocabulary's padding masked)."""
        return mask_padding(self.lm_head(self.norm(hidden))[0], self.shape.vocab, self.tp_rank)

    def carry(self, hidden: torch.Tensor) -> torch.Tensor:
        """What the next TTT step reads of a step's output ``hidden``: EAGLE-3 feeds it as it is, EAGLE-3.1
        (norm_output) after the final norm. Un-normalised, each step adds its update to a residual that already
        holds every earlier step's, so later steps drift towards step 0's prediction."""
        return self.norm(hidden) if self.shape.norm_output else hidden

    def ttt(
        self, aux: torch.Tensor, emb: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor, cp_group=None
    ) -> list[torch.Tensor]:
        """Unroll the S TTT steps; return each step's output hidden state (apply `head` for its logits).

        aux: (n_taps, t, h) target hidden states; emb: (S, t, h) embeddings of x_{p+1+j}; positions: (S, t) RoPE
        positions p + j. Returns S tensors (t, h).
        """
        steps = emb.shape[0]
        hidden = self.fc(aux.permute(1, 0, 2).flatten(1))  # (t, n_taps*h) -> (t, h)
        ks: list[list[torch.Tensor]] = [[] for _ in self.layers]
        vs: list[list[torch.Tensor]] = [[] for _ in self.layers]
        outputs = []
        for j in range(steps):
            x = hidden
            for i, layer in enumerate(self.layers):
                q, k, v = layer.project(x, emb[j] if i == 0 else None, positions[j])
                ks[i].append(k)
                vs[i].append(v)
                # Only step j's queries (its input depends on step j-1's output) against the k/v of steps 0..j:
                # trunk keys (step 0) ride the ring, branch keys 1..j stay on this rank.
                attn = branch_attention(q[None], torch.stack(ks[i]), torch.stack(vs[i]), cu_seqlens, cp_group=cp_group)[
                    0
                ]  # (t, H/tp, d)
                x = layer.finish(x, attn)
            outputs.append(x)  # `head` normalises it for the logits
            hidden = self.carry(x)
        return outputs


def _tp_rank(tp: int) -> int:
    from megatron.core import parallel_state as ps

    return ps.get_tensor_model_parallel_rank() if tp > 1 else 0


def draft_shape(plan: LaunchPlan, tp: int | None = None) -> DraftShape:
    """The draft's shape for ``plan`` (at the plan's tp unless ``tp`` is given: 1 to load it whole)."""
    m = plan.model
    return DraftShape(
        hidden=m.hidden_size,
        num_taps=len(plan.draft.aux_layers),
        heads=m.num_attention_heads,
        kv_heads=m.num_query_groups,
        head_dim=m.head_dim,
        ffn=m.ffn_hidden_size,
        vocab=plan.draft.vocab_size,
        target_vocab=m.vocab_size,
        num_layers=plan.draft.num_layers,
        tp=plan.parallel.tp if tp is None else tp,
        rope_base=float(m.rotary_base),
        norm_eps=m.norm_epsilon,
        rope_scaling=m.rope_scaling,
        norm_before_residual=plan.draft.norm_before_residual,
        norm_output=plan.draft.norm_output,
    )
