"""The EAGLE-3 draft: fc over the concatenated taps, decoder layer(s) with TTT branch attention, an LM head.

Training-time test (TTT) unrolls S steps: step j's input at row p is [emb(x_{p+1+j}) ; h_j(p)], where h_0 is the
fused taps and h_j the draft's own step j-1 output; it is trained towards the (detached) target distribution at
row p+1+j by forward KL. The query of step j attends to the trunk (step 0) keys causally and to the branch keys of
steps 1..j at its own row, in one softmax: `branch_attention` (zigzag ring under CP). EAGLE-3:
https://arxiv.org/abs/2503.01840; mask as in SpecForge's generate_eagle3_mask.

Like the target, the draft is tensor-parallel: heads, MLP and a vocab-parallel LM head are split over tp with
megatron-core's Column/RowParallelLinear, and the KL is computed on vocab shards (vocab_parallel.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specdraft.runtime.branch_attention import branch_attention


@dataclass(frozen=True, kw_only=True)
class DraftShape:
    hidden: int
    num_taps: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    num_layers: int
    tp: int = 1
    rope_base: float = 10000.0


def rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate-half RoPE. x: (t, h, d); positions: (t,) global positions within each sequence."""
    d = x.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)  # (d/2,)
    angles = positions.to(torch.float32)[:, None] * inv[None, :]  # (t, d/2)
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)[:, None, :].to(x.dtype)  # (t, 1, d)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)[:, None, :].to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def _column(config, fan_in: int, fan_out: int):
    from megatron.core.tensor_parallel import ColumnParallelLinear

    return ColumnParallelLinear(fan_in, fan_out, config=config, init_method=nn.init.zeros_, bias=False,
                                gather_output=False)


def _row(config, fan_in: int, fan_out: int):
    from megatron.core.tensor_parallel import RowParallelLinear

    return RowParallelLinear(fan_in, fan_out, config=config, init_method=nn.init.zeros_, bias=False,
                             input_is_parallel=True, skip_bias_add=True)


class DraftLayer(nn.Module):
    """One pre-norm decoder layer whose attention is TTT branch attention; layer 0 reads [emb ; hidden] (2h)."""

    def __init__(self, shape: DraftShape, config, first: bool):
        super().__init__()
        h, d = shape.hidden, shape.head_dim
        self.shape = shape
        self.first = first
        in_dim = 2 * h if first else h
        if first:
            self.emb_norm = nn.RMSNorm(h)
        self.hidden_norm = nn.RMSNorm(h)
        self.q = _column(config, in_dim, shape.heads * d)
        self.k = _column(config, in_dim, shape.kv_heads * d)
        self.v = _column(config, in_dim, shape.kv_heads * d)
        self.o = _row(config, shape.heads * d, h)
        self.mlp_norm = nn.RMSNorm(h)
        self.gate = _column(config, h, shape.ffn)
        self.up = _column(config, h, shape.ffn)
        self.down = _row(config, shape.ffn, h)

    def project(self, hidden: torch.Tensor, emb: torch.Tensor | None, positions: torch.Tensor):
        """q, k, v of one TTT step on this rank's heads. hidden, emb: (t, h) -> q (t, H/tp, d), k, v (t, Hkv/tp, d)."""
        s = self.shape
        x = self.hidden_norm(hidden)
        if self.first:
            x = torch.cat([self.emb_norm(emb), x], dim=-1)  # (t, 2h)
        t = x.shape[0]
        q = rope(self.q(x)[0].view(t, s.heads // s.tp, s.head_dim), positions, s.rope_base)
        k = rope(self.k(x)[0].view(t, s.kv_heads // s.tp, s.head_dim), positions, s.rope_base)
        v = self.v(x)[0].view(t, s.kv_heads // s.tp, s.head_dim)
        return q, k, v

    def finish(self, hidden: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual + SwiGLU MLP. attn: (t, H/tp, d) -> (t, h), reduced over tp by the row-parallel layers."""
        out = hidden + self.o(attn.flatten(1))[0]
        x = self.mlp_norm(out)
        return out + self.down(F.silu(self.gate(x)[0]) * self.up(x)[0])[0]


class Eagle3Draft(nn.Module):
    def __init__(self, shape: DraftShape, config):
        super().__init__()
        self.shape = shape
        self.fc = nn.Linear(shape.num_taps * shape.hidden, shape.hidden, bias=False)
        self.layers = nn.ModuleList(DraftLayer(shape, config, first=i == 0) for i in range(shape.num_layers))
        self.norm = nn.RMSNorm(shape.hidden)
        self.lm_head = _column(config, shape.hidden, shape.vocab)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None) -> dict:
        """dist_checkpointing's view of the draft: megatron's Column/RowParallelLinear shard themselves over tp (the
        global tensor is the same at any tp); fc and the norms are replicated, written once (tp rank 0, dp-cp 0).
        Keys are the parameters' own names, so a draft saved at one layout loads into any other."""
        from megatron.core import parallel_state as ps
        from megatron.core.transformer.utils import sharded_state_dict_default

        # Without the TP group, megatron would give every TP rank replica id 0 for the replicated tensors.
        tp_group = ps.get_tensor_model_parallel_group()
        children = [(f"{name}.{i}.{child_name}", child) for name, module in self.named_children()
                    if isinstance(module, nn.ModuleList) for i, layer in enumerate(module)
                    for child_name, child in layer.named_children()]
        children += [(name, m) for name, m in self.named_children() if not isinstance(m, nn.ModuleList)]
        out: dict = {}
        for name, module in children:
            out.update(sharded_state_dict_default(module, f"{prefix}{name}.", sharded_offsets, metadata, tp_group))
        return out

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """(rows, h) -> (rows, vocab/tp) vocab-parallel logits."""
        return self.lm_head(self.norm(hidden))[0]

    def ttt(self, aux: torch.Tensor, emb: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor,
            cp_group=None) -> list[torch.Tensor]:
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
                attn = branch_attention(q[None], torch.stack(ks[i]), torch.stack(vs[i]), cu_seqlens,
                                        cp_group=cp_group)[0]  # (t, H/tp, d)
                x = layer.finish(x, attn)
            hidden = x
            outputs.append(hidden)
        return outputs


def draft_shape(plan: LaunchPlan) -> DraftShape:
    m = plan.model
    return DraftShape(hidden=m.hidden_size, num_taps=len(plan.draft.aux_layers), heads=m.num_attention_heads,
                      kv_heads=m.num_query_groups, head_dim=m.head_dim, ffn=m.ffn_hidden_size,
                      vocab=m.vocab_size, num_layers=plan.spec.draft.num_layers, tp=plan.parallel.tp)
