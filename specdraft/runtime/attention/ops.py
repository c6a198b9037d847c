"""Fused per-block attention kernels for the branch-attention ring: the CPU flash, cuDNN and varlen-flash ops of
torch itself, each called once per (ring step, block pattern) with every TTT query step folded into the heads,
returning (out, lse); and their backward from the *merged* out and lse, as ring-flash-attention does."""

from __future__ import annotations

import torch

# Query heads of the folded layout are ordered (kv head, TTT step, group), so head h uses kv head h // (S*G):
# exactly the GQA rule of every op below, which keeps all S steps of one block in one call without repeating K/V.


def fold(x: torch.Tensor, hkv: int) -> torch.Tensor:
    """(S, T, H, D) -> (T, Hkv*S*G, D) contiguous; a view when S == 1 and x is contiguous."""
    S, T, H, D = x.shape
    g = H // hkv
    return x.reshape(S, T, hkv, g, D).permute(1, 2, 0, 3, 4).reshape(T, hkv * S * g, D).contiguous()


def unfold(xf: torch.Tensor, steps: int, hkv: int, dtype) -> torch.Tensor:
    """Inverse of fold: (T, Hf, D) -> (S, T, H, D) of `dtype`; a view when S == 1 (no conversion, contiguous),
    else a new tensor written in one pass."""
    T, hf, D = xf.shape
    if steps == 1 and xf.dtype == dtype and xf.is_contiguous():
        return xf.view(1, T, hf, D)
    g = hf // (hkv * steps)
    out = torch.empty((steps, T, hkv * g, D), dtype=dtype, device=xf.device)
    out.view(steps, T, hkv, g, D).copy_(xf.view(T, hkv, steps, g, D).permute(2, 0, 1, 3, 4))
    return out


class Layout:
    """The local packed shard's sequences, as the kernels need them (built once per call, on the host).

    runs: maximal runs (first_row, num_seqs, local_len) of consecutive sequences of equal local length, so a dense
    (batch, len, heads, dim) op covers a run with a view; device index tensors for the varlen op come lazily."""

    def __init__(self, cu_local: list[int], device):
        self.cu, self.device, self.rows = cu_local, device, cu_local[-1]
        lengths = [b - a for a, b in zip(cu_local, cu_local[1:])]
        self.max_len = max(lengths)
        self.runs: list[tuple[int, int, int]] = []
        for start, n in zip(cu_local, lengths):
            if self.runs and self.runs[-1][2] == n:
                r0, count, _ = self.runs[-1]
                self.runs[-1] = (r0, count + 1, n)
            else:
                self.runs.append((start, 1, n))
        self._varlen: dict | None = None

    def varlen(self) -> dict:
        """int32 cumulative lengths (whole and half sequences) and the row indices of every first/second half."""
        if self._varlen is None:
            halves = [(a, (a + b) // 2, b) for a, b in zip(self.cu, self.cu[1:])]
            half_cu = [0]
            for a, mid, _ in halves:
                half_cu.append(half_cu[-1] + mid - a)
            cat = torch.cat
            self._varlen = {
                "cu": torch.tensor(self.cu, dtype=torch.int32, device=self.device),
                "half_cu": torch.tensor(half_cu, dtype=torch.int32, device=self.device),
                "first": cat([torch.arange(a, mid) for a, mid, _ in halves]).to(self.device),
                "second": cat([torch.arange(mid, b) for _, mid, b in halves]).to(self.device),
                "max_half": self.max_len // 2,
            }
        return self._varlen


# Zigzag block patterns along a run's (n, local_len) view: (query rows, key rows, causal). Local rows are
# [chunk r | chunk 2cp-1-r], so 'own' is plain causal, 'early' (K/V of a lower rank) sees only the first half of
# the keys, 'late' (K/V of a higher rank) serves only the second half of the queries (docs/branch_attention.md).
def pattern(kind: str, half: int) -> tuple[slice, slice, bool]:
    everything = slice(None)
    if kind == "own":
        return everything, everything, True
    if kind == "early":
        return everything, slice(0, half), False
    return slice(half, None), everything, False


# ------------------------------------------------------------------------------------------------ block kernels
class CpuFlash:
    """aten::_scaled_dot_product_flash_attention_for_cpu and its backward: dense (B, H, L, D), strided inputs,
    native GQA, lse natural-log (B, H, L) in fp32 (fp64 for fp64), causal top-left; verified against the reference
    in tests/unit/runtime/test_fused_attention.py. Not varlen, so a run of equal-length sequences is one call."""

    name, dense = "fused-cpu-flash", True

    @staticmethod
    def available() -> str | None:
        ops = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward")
        missing = [op for op in ops if not hasattr(torch.ops.aten, op)]
        return f"torch {torch.__version__} lacks aten::{missing[0]}" if missing else None

    def forward(self, q, k, v, causal, scale):
        # q (n, Lq, Hf, D), k/v (n, Lk, Hkv, D) -> out (n, Lq, Hf, D), lse (n, Lq, Hf)
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0.0, causal, scale=scale
        )
        return o.transpose(1, 2), lse.transpose(1, 2)

    def backward(self, do, q, k, v, o, lse, causal, scale):
        t = [x.transpose(1, 2) for x in (do, q, k, v, o)]
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            *t, lse.transpose(1, 2).contiguous(), 0.0, causal, scale=scale
        )
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


class CudnnDense:
    """aten::_scaled_dot_product_cudnn_attention(compute_log_sumexp=True) and ..._backward(out, logsumexp, ...):
    SDPA's default backend on Hopper, 1.58x faster than FlashAttention-2 on the benchmark shape (measured on an H200),
    so it is preferred on CUDA. Dense (B, H, L, D) with strided views; lse (B, H, L, 1) fp32. The varlen
    aten::_cudnn_attention_forward (torch >= 2.13) is not used: torch's own varlen_attn rejects GQA on it and keeps
    it switched off. Conventions (lse shape, philox tensors) are taken from a probe call (backend.py)."""

    name, dense = "fused-cudnn", True
    _OPS = ("_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward")
    # Leading positional arguments the calls below rely on, by name, as in torch 2.11-2.13's schemas.
    _FWD_ARGS = ("query", "key", "value", "attn_bias", "compute_log_sumexp", "dropout_p", "is_causal")
    _BWD_ARGS = (
        "grad_out",
        "query",
        "key",
        "value",
        "out",
        "logsumexp",
        "philox_seed",
        "philox_offset",
        "attn_bias",
        "cum_seq_q",
        "cum_seq_k",
        "max_q",
        "max_k",
        "dropout_p",
        "is_causal",
    )

    def __init__(self):
        self.philox: dict = {}  # device -> (seed, offset) tensors from a forward call; unused at dropout 0

    @classmethod
    def available(cls) -> str | None:
        if not torch.backends.cudnn.is_available():
            return "cuDNN is not available"
        return _schema_problem(cls._OPS, (cls._FWD_ARGS, cls._BWD_ARGS), "scale")

    def forward(self, q, k, v, causal, scale):
        n, lq, hf, _ = q.shape
        r = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, True, 0.0, causal, False, scale=scale
        )
        self.philox.setdefault(q.device, (r[6], r[7]))
        return r[0].transpose(1, 2), r[1].reshape(n, hf, lq).transpose(1, 2)

    def backward(self, do, q, k, v, o, lse, causal, scale):
        n, lq, hf, _ = q.shape
        seed, offset = self.philox[q.device]
        # contiguous lse: torch's own ring attention notes numerical errors with a strided one
        lse_in = lse.transpose(1, 2).contiguous().unsqueeze(-1)  # (n, Hf, Lq, 1), as the forward returns it
        t = [x.transpose(1, 2) for x in (do, q, k, v, o)]
        dq, dk, dv = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            *t, lse_in, seed, offset, None, None, None, lq, k.shape[1], 0.0, causal, scale=scale
        )
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


class FlashVarlen:
    """aten::_flash_attention_forward/_backward with cu_seqlens (FlashAttention-2 in torch): one call for all packed
    sequences, native GQA, lse (Hf, total_q) fp32, causal bottom-right (only used with equal q/k lengths). 1.41x
    the cuDNN floor on the benchmark shape (measured on an H200): the fallback when cuDNN fails its probe."""

    name, dense = "fused-flash", False
    _OPS = ("_flash_attention_forward", "_flash_attention_backward")
    _FWD_ARGS = (
        "query",
        "key",
        "value",
        "cum_seq_q",
        "cum_seq_k",
        "max_q",
        "max_k",
        "dropout_p",
        "is_causal",
        "return_debug_mask",
    )
    _BWD_ARGS = (
        "grad_out",
        "query",
        "key",
        "value",
        "out",
        "logsumexp",
        "cum_seq_q",
        "cum_seq_k",
        "max_q",
        "max_k",
        "dropout_p",
        "is_causal",
        "rng_state",
        "unused",
    )

    def __init__(self):
        self.rng: dict = {}  # device -> (rng_state, unused) from a forward call; unused at dropout 0

    @classmethod
    def available(cls) -> str | None:
        return _schema_problem(cls._OPS, (cls._FWD_ARGS, cls._BWD_ARGS), "scale")

    def forward(self, q, k, v, cu_q, cu_k, max_q, max_k, causal, scale):
        # q (Tq, Hf, D), k/v (Tk, Hkv, D) contiguous -> out (Tq, Hf, D), lse (Tq, Hf)
        o, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False, scale=scale
        )
        if lse.shape != (q.shape[1], q.shape[0]):  # older FlashAttention padded it to (B, H, max_q)
            raise RuntimeError(
                f"unexpected varlen logsumexp shape {tuple(lse.shape)}; expected {(q.shape[1], q.shape[0])}"
            )
        self.rng.setdefault(q.device, (rng, unused))
        return o, lse.t()

    def backward(self, do, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, causal, scale):
        rng, unused = self.rng[q.device]
        return torch.ops.aten._flash_attention_backward(
            do, q, k, v, o, lse.t().contiguous(), cu_q, cu_k, max_q, max_k, 0.0, causal, rng, unused, scale=scale
        )


def _schema_problem(ops, expected, keyword: str) -> str | None:
    """Why these aten ops cannot be called as written (missing, or leading arguments renamed), or None."""
    for op, names in zip(ops, expected):
        packet = getattr(torch.ops.aten, op, None)
        if packet is None:
            return f"torch {torch.__version__} lacks aten::{op}"
        args = packet.default._schema.arguments
        got = tuple(a.name for a in args[: len(names)])
        if got != names or keyword not in {a.name for a in args if a.kwarg_only}:
            return f"aten::{op} schema differs in torch {torch.__version__}: {packet.default._schema}"
    return None
