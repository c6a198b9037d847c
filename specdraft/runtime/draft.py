"""The EAGLE-3 draft: fc over the concatenated taps, decoder layer(s) with TTT branch attention, an LM head.

Training-time test (TTT) unrolls S steps: step j's input at row p is [emb(x_{p+1+j}) ; h_j(p)], where h_0 is the
fused taps and h_j the draft's own step j-1 output; it is trained towards the (detached) target distribution at
row p+1+j by forward KL. The query of step j attends to the trunk (step 0) keys causally and to the branch keys of
steps 1..j at its own row, in one softmax: `branch_attention` (zigzag ring under CP). EAGLE-3:
https://arxiv.org/abs/2503.01840; mask as in SpecForge's generate_eagle3_mask.
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


class DraftLayer(nn.Module):
    """One pre-norm decoder layer whose attention is TTT branch attention; layer 0 reads [emb ; hidden] (2h)."""

    def __init__(self, shape: DraftShape, first: bool):
        super().__init__()
        h, d = shape.hidden, shape.head_dim
        self.shape = shape
        self.first = first
        in_dim = 2 * h if first else h
        if first:
            self.emb_norm = nn.RMSNorm(h)
        self.hidden_norm = nn.RMSNorm(h)
        self.q = nn.Linear(in_dim, shape.heads * d, bias=False)
        self.k = nn.Linear(in_dim, shape.kv_heads * d, bias=False)
        self.v = nn.Linear(in_dim, shape.kv_heads * d, bias=False)
        self.o = nn.Linear(shape.heads * d, h, bias=False)
        self.mlp_norm = nn.RMSNorm(h)
        self.gate_up = nn.Linear(h, 2 * shape.ffn, bias=False)
        self.down = nn.Linear(shape.ffn, h, bias=False)

    def project(self, hidden: torch.Tensor, emb: torch.Tensor | None, positions: torch.Tensor):
        """q, k, v of one TTT step. hidden, emb: (t, h) -> q (t, H, d), k and v (t, Hkv, d)."""
        s = self.shape
        x = self.hidden_norm(hidden)
        if self.first:
            x = torch.cat([self.emb_norm(emb), x], dim=-1)  # (t, 2h)
        t = x.shape[0]
        q = rope(self.q(x).view(t, s.heads, s.head_dim), positions, s.rope_base)
        k = rope(self.k(x).view(t, s.kv_heads, s.head_dim), positions, s.rope_base)
        v = self.v(x).view(t, s.kv_heads, s.head_dim)
        return q, k, v

    def finish(self, hidden: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual + SwiGLU MLP. attn: (t, H, d) -> (t, h)."""
        out = hidden + self.o(attn.flatten(1))
        gate, up = self.gate_up(self.mlp_norm(out)).chunk(2, dim=-1)
        return out + self.down(F.silu(gate) * up)


class Eagle3Draft(nn.Module):
    def __init__(self, shape: DraftShape):
        super().__init__()
        self.shape = shape
        self.fc = nn.Linear(shape.num_taps * shape.hidden, shape.hidden, bias=False)
        self.layers = nn.ModuleList(DraftLayer(shape, first=i == 0) for i in range(shape.num_layers))
        self.norm = nn.RMSNorm(shape.hidden)
        self.lm_head = nn.Linear(shape.hidden, shape.vocab, bias=False)

    @torch.no_grad()
    def init_(self, seed: int, std: float = 0.02) -> None:
        """Deterministic init by parameter name, identical on every rank and layout."""
        import zlib

        for name, param in self.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
            else:
                g = torch.Generator().manual_seed(seed ^ zlib.crc32(f"draft.{name}".encode()))
                param.copy_(torch.randn(param.shape, generator=g) * std)

    def ttt(self, aux: torch.Tensor, emb: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor,
            cp_group=None) -> list[torch.Tensor]:
        """Unroll the S TTT steps; return the draft logits of each step.

        aux: (n_taps, t, h) target hidden states; emb: (S, t, h) embeddings of x_{p+1+j}; positions: (S, t) RoPE
        positions p + j. Returns S tensors (t, vocab).
        """
        steps = emb.shape[0]
        hidden = self.fc(aux.permute(1, 0, 2).flatten(1))  # (t, n_taps*h) -> (t, h)
        qs: list[list[torch.Tensor]] = [[] for _ in self.layers]
        ks: list[list[torch.Tensor]] = [[] for _ in self.layers]
        vs: list[list[torch.Tensor]] = [[] for _ in self.layers]
        logits = []
        for j in range(steps):
            x = hidden
            for i, layer in enumerate(self.layers):
                q, k, v = layer.project(x, emb[j] if i == 0 else None, positions[j])
                qs[i].append(q)
                ks[i].append(k)
                vs[i].append(v)
                # (j+1, t, H, d): the query of step j sees trunk keys (step 0) and branch keys 1..j.
                attn = branch_attention(torch.stack(qs[i]), torch.stack(ks[i]), torch.stack(vs[i]),
                                        cu_seqlens, cp_group=cp_group)[j]
                x = layer.finish(x, attn)
            hidden = x
            logits.append(self.lm_head(self.norm(hidden)))
        return logits


def kl_and_matches(draft_logits: list[torch.Tensor], target_logp: torch.Tensor, valid: torch.Tensor):
    """Per TTT step: sum over valid rows of KL(target || draft) and the top-1 match indicators.

    target_logp: (S, t, V) detached target log-probs at row p+1+j; valid: (S, t) 0/1.
    """
    kl_sums, matches = [], []
    for j, logits in enumerate(draft_logits):
        logp = F.log_softmax(logits.float(), dim=-1)  # (t, V)
        tgt = target_logp[j]
        kl = (tgt.exp() * (tgt - logp)).sum(-1)  # (t,)
        kl_sums.append((kl * valid[j]).sum())
        matches.append((logits.argmax(-1) == tgt.argmax(-1)) & valid[j].bool())
    return kl_sums, matches


def accept_length(matches: list[torch.Tensor], valid0: torch.Tensor) -> tuple[float, float]:
    """(sum over positions of tokens accepted per verify step, number of positions).

    A verify step accepts the longest prefix of draft tokens that match the target's top-1, plus the target's
    own (bonus) token: 1 + the count of leading matching TTT steps at that position.
    """
    run = torch.ones_like(matches[0], dtype=torch.bool)
    total = valid0.sum()
    accepted = valid0.clone()
    for m in matches:
        run = run & m
        accepted = accepted + run.to(accepted.dtype)
    return float(accepted.sum()), float(total)


def draft_shape(plan: dict) -> DraftShape:
    m, d = plan["spec"]["model"], plan["spec"]["draft"]
    heads = m["num_attention_heads"]
    return DraftShape(hidden=m["hidden_size"], num_taps=len(plan["draft"]["aux_layers"]), heads=heads,
                      kv_heads=m["num_query_groups"] or heads,
                      head_dim=m["kv_channels"] or m["hidden_size"] // heads, ffn=m["ffn_hidden_size"],
                      vocab=m["vocab_size"], num_layers=d["num_layers"])

