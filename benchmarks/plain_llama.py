"""A plain PyTorch Llama-style training step (RMSNorm, fused QKV, RoPE, SDPA causal GQA attention, SwiGLU MLP,
untied LM head), the yardstick the GPU check times beside specdraft's co-training step: bf16 autocast over fp32
parameters and fused AdamW on CUDA, plain fp32 on CPU. Also the nominal model FLOPs both are measured against."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def matmul_params(self) -> int:
        """Weights that take part in a matmul per token: attention, MLP, LM head (embeddings are lookups)."""
        d = self.head_dim
        per_layer = self.hidden * (self.heads + 2 * self.kv_heads) * d + self.heads * d * self.hidden
        return self.layers * (per_layer + 3 * self.hidden * self.ffn) + self.hidden * self.vocab

    def step_flops(self, tokens: int, seq_len: int) -> float:
        """Forward + backward FLOPs of `tokens` tokens in causal rows of `seq_len`: 6 per matmul weight and token,
        plus causal attention (QK^T and PV at seq_len/2 keys on average, backward twice the forward)."""
        return 6.0 * self.matmul_params() * tokens + 6.0 * self.layers * self.heads * self.head_dim * seq_len * tokens


def _rope_tables(seq_len: int, head_dim: int, device):
    inv = 1.0 / 10000 ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv)  # (s, d/2)
    return torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)  # (s, d) each


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class _Block(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.s = s
        d = s.head_dim
        self.attn_norm, self.mlp_norm = nn.RMSNorm(s.hidden), nn.RMSNorm(s.hidden)
        self.qkv = nn.Linear(s.hidden, (s.heads + 2 * s.kv_heads) * d, bias=False)
        self.out = nn.Linear(s.heads * d, s.hidden, bias=False)
        self.gate_up = nn.Linear(s.hidden, 2 * s.ffn, bias=False)
        self.down = nn.Linear(s.ffn, s.hidden, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        s, d = self.s, self.s.head_dim
        q, k, v = self.qkv(self.attn_norm(x)).split([s.heads * d, s.kv_heads * d, s.kv_heads * d], -1)
        q, k, v = (y.view(b, t, -1, d).transpose(1, 2) for y in (q, k, v))  # (b, heads, t, d)
        a = F.scaled_dot_product_attention(_rope(q, cos, sin), _rope(k, cos, sin), v, is_causal=True, enable_gqa=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, t, -1))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, -1)
        return x + self.down(F.silu(gate) * up)


class PlainLlama(nn.Module):
    def __init__(self, s: Shape, seq_len: int, device):
        super().__init__()
        self.embed = nn.Embedding(s.vocab, s.hidden)
        self.blocks = nn.ModuleList(_Block(s) for _ in range(s.layers))
        self.norm = nn.RMSNorm(s.hidden)
        self.head = nn.Linear(s.hidden, s.vocab, bias=False)
        cos, sin = _rope_tables(seq_len, s.head_dim, device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, ids):  # (b, t) -> (b, t, vocab)
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        return self.head(self.norm(x))


def plain_step_seconds(s: Shape, seq_len: int, rows: int, device, steps: int, warmup: int) -> float:
    """Median seconds of one optimizer step over `rows` microbatches of one `seq_len`-token row each."""
    device = torch.device(device)
    torch.manual_seed(0)
    model = PlainLlama(s, seq_len, device).to(device)
    cuda = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    ids = torch.randint(0, s.vocab, (rows, 1, seq_len + 1), device=device)

    def step():
        for i in range(rows):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                logits = model(ids[i, :, :-1])
            F.cross_entropy(logits.float().view(-1, s.vocab), ids[i, :, 1:].reshape(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = []
    for i in range(warmup + steps):
        if cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]
