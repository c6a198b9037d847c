"""The fused block kernels in-process: the CPU flash op's conventions, folding, every zigzag block pattern (own,
early, late) through a loopback ring against a dense float64 reference (dense runs and the varlen step logic),
bf16, and the backend selection with its reasons and override."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.runtime.attention import backend as ab
from specdraft.runtime.attention import branch as ba
from specdraft.runtime.attention.fused import FusedAttention
from specdraft.runtime.attention.ops import CpuFlash, fold, unfold
from specdraft.runtime.attention.reference import ReferenceAttention


def test_cpu_flash_lse_is_natural_log_per_batch_head_row():
    """The merge and the backward rely on it: lse = log(sum(exp(scores))), shape (B, H, L), natural log."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 5, 8, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    for causal in (False, True):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=0.3)
        s = q @ k.repeat_interleave(2, 1).transpose(-1, -2) * 0.3  # GQA: query head h uses kv head h // 2
        if causal:
            s = s.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), -math.inf)
        assert lse.shape == (2, 4, 5)
        torch.testing.assert_close(lse, torch.logsumexp(s, -1), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(out, torch.softmax(s, -1) @ v.repeat_interleave(2, 1), rtol=1e-12, atol=1e-12)


def test_fold_orders_heads_kv_step_group_and_unfold_inverts_it():
    S, T, hkv, g, D = 3, 4, 2, 2, 1
    x = torch.arange(S * T * hkv * g, dtype=torch.float32).view(S, T, hkv * g, D)
    f = fold(x, hkv)  # (T, Hkv*S*G, D)
    for h in range(hkv * S * g):
        kv, step, group = h // (S * g), (h // g) % S, h % g
        assert torch.equal(f[:, h], x[step, :, kv * g + group])  # so head h // (S*G) is its kv head (GQA rule)
    assert torch.equal(unfold(f, S, hkv, torch.float32), x)


class CpuVarlen:
    """The varlen kernel contract of attention_ops.FlashVarlen (one call over packed sequences given int32
    cu_seqlens; out (Tq, Hf, D), lse (Tq, Hf); backward from an external out and lse), served per sequence by the
    CPU flash op, so fused_attention's varlen ring steps (gathered halves, index_add) run on CPU."""

    name, dense, flash = "cpu-varlen", False, CpuFlash()

    @staticmethod
    def _pairs(cu_q, cu_k):
        a, b = cu_q.tolist(), cu_k.tolist()
        return list(zip(zip(a, a[1:]), zip(b, b[1:])))

    def forward(self, q, k, v, cu_q, cu_k, max_q, max_k, causal, scale):
        assert cu_q.dtype == cu_k.dtype == torch.int32
        parts = [
            self.flash.forward(q[None, a:b], k[None, c:d], v[None, c:d], causal, scale)
            for (a, b), (c, d) in self._pairs(cu_q, cu_k)
        ]
        return torch.cat([o[0] for o, _ in parts]), torch.cat([lse[0] for _, lse in parts])

    def backward(self, do, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, causal, scale):
        grads = [
            self.flash.backward(
                do[None, a:b], q[None, a:b], k[None, c:d], v[None, c:d], o[None, a:b], lse[None, a:b], causal, scale
            )
            for (a, b), (c, d) in self._pairs(cu_q, cu_k)
        ]
        return tuple(torch.cat([g[i][0] for g in grads]) for i in range(3))


def loopback_dense(q, k, v, local_cu, scale):
    """Dense float64 attention for the LoopbackRing's three blocks of this rank's own trunk K/V, all in one softmax:
    own (causal), early (first half of each sequence's keys, every query), late (every key, second-half queries),
    plus the branch diagonal; q holds the last S_q of the S_kv steps."""
    sq, T, H, D = q.shape
    skv, g = k.shape[0], H // k.shape[2]
    seq = torch.repeat_interleave(torch.arange(len(local_cu) - 1), torch.tensor(local_cu).diff())
    mid = torch.tensor([(a + b) // 2 for a, b in zip(local_cu, local_cu[1:])])[seq]
    row = torch.arange(T)
    same = seq[:, None] == seq[None, :]
    blocks = [
        same & (row[None, :] <= row[:, None]),
        same & (row[None, :] < mid[:, None]),
        same & (row[:, None] >= mid[:, None]),
    ]
    keys = [k[0]] * 3 + list(k[1:])
    values = [v[0]] * 3 + list(v[1:])
    out = []
    for j in range(sq):
        step = skv - sq + j
        masks = blocks + [torch.eye(T, dtype=torch.bool) & (i <= step) for i in range(1, skv)]
        s = torch.cat([torch.einsum("thd,uhd->htu", q[j], kk.repeat_interleave(g, 1)) * scale for kk in keys], -1)
        s = s.masked_fill(~torch.cat(masks, -1)[None], -math.inf)
        p = torch.softmax(s, -1)
        out.append(torch.einsum("htu,uhd->thd", p, torch.cat([vv.repeat_interleave(g, 1) for vv in values])))
    return torch.stack(out)


@contextlib.contextmanager
def one_thread():
    """Tiny tensors gain nothing from threads, and on a loaded 2-core machine OpenMP's spinning threads made each
    small matmul ~500x slower; restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _grads(fn, q, k, v, dout):
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = fn(*leaves)
    return [out.detach(), *torch.autograd.grad(out, leaves, dout)]


CASE = st.fixed_dictionaries(
    {
        "steps": st.sampled_from([(1, 1), (2, 2), (3, 3), (4, 4), (3, 1), (4, 2)]),  # (S_kv, S_q)
        "heads": st.sampled_from([(2, 2), (4, 2), (4, 1), (6, 3)]),
        "D": st.sampled_from([4, 8]),
        "halves": st.lists(st.integers(1, 4), min_size=1, max_size=5),  # local length = 2 * half
        "seed": st.integers(0, 2**31 - 1),
    }
)


@settings(max_examples=25, derandomize=True, deadline=None)
@given(case=CASE)
def test_every_block_pattern_matches_dense_float64(case):
    """Dense runs (CPU flash) and the varlen step logic (per-sequence stand-in) against loopback_dense, and the
    reference kernels too, through own/early/late blocks, GQA, 1-5 sequences of equal or mixed length."""
    (skv, sq), (H, hkv), D = case["steps"], case["heads"], case["D"]
    local = [0]
    for h in case["halves"]:
        local.append(local[-1] + 2 * h)
    T, ring = local[-1], ab.LoopbackRing()
    g = torch.Generator().manual_seed(case["seed"])
    q, dout = (torch.randn(sq, T, H, D, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(skv, T, hkv, D, generator=g, dtype=torch.float64) for _ in range(2))
    cu, scale = [c * ring.size for c in local], 0.4
    with one_thread():
        want = _grads(lambda *x: loopback_dense(*x, local, scale), q, k, v, dout)
    runs = {
        "reference": lambda *x: ReferenceAttention.apply(*x, cu, ring, scale),
        "dense runs": lambda *x: FusedAttention.apply(*x, cu, ring, scale, CpuFlash()),
        "varlen": lambda *x: FusedAttention.apply(*x, cu, ring, scale, CpuVarlen()),
    }
    for name, fn in runs.items():
        with one_thread():
            got = _grads(fn, q, k, v, dout)
        for what, a, b in zip(("out", "dq", "dk", "dv"), got, want):
            err = ((a - b).norm() / b.norm()).item()
            assert err < 1e-12, f"{name} {what}: relative error {err:.3g}"


def test_cp1_equal_lengths_single_run_and_bf16():
    """cp = 1 with equal-length sequences (one dense call covers all rows, its output adopted without a copy), in
    float64 against the dense reference; in bfloat16 the fused error stays within 2x plain bfloat16 math's."""
    from tests.unit.runtime.test_branch_attention import dense_attention

    g = torch.Generator().manual_seed(3)
    S, N, H, hkv, D = 3, 48, 4, 2, 16
    cu = [0, 16, 32, 48]
    q, dout = (torch.randn(S, N, H, D, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(S, N, hkv, D, generator=g, dtype=torch.float64) for _ in range(2))

    def fused(*x):
        return ba.branch_attention(*x, torch.tensor(cu), backend="fused-cpu-flash")

    low = [x.bfloat16() for x in (q, k, v, dout)]
    with one_thread():
        want = _grads(lambda *x: dense_attention(*x, cu), q, k, v, dout)
        got, got16 = _grads(fused, q, k, v, dout), _grads(fused, *low)
        plain = _grads(lambda *x: dense_attention(*x, cu), *low)
    for what, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert ((a - b).norm() / b.norm()).item() < 1e-12, what
    for what, a, p, b in zip(("out", "dq", "dk", "dv"), got16, plain, want):
        err, yardstick = ((x.double() - b).norm() / b.norm() for x in (a, p))
        assert a.dtype == torch.bfloat16 and err <= 2 * yardstick, f"bf16 {what}: {err:.3g} vs plain {yardstick:.3g}"


def test_backend_selection_reports_and_overrides(monkeypatch):
    monkeypatch.delenv(ab.ENV, raising=False)
    assert ab.verdict("fused-cpu-flash", torch.device("cpu"), torch.float32, 8) is None  # probe passed
    assert ab.describe("cpu", torch.float32, 64) == "fused-cpu-flash"
    assert ab.describe("cpu", torch.float16, 64).startswith("reference (fused-cpu-flash: fused-cpu-flash takes")
    assert ab.choose("cpu", torch.float32, 8, backend="reference") == (None, "reference")
    assert "does not run on cpu" in ab.verdict("fused-cudnn", torch.device("cpu"), torch.bfloat16, 64)
    with pytest.raises(ValueError, match="fused-cudnn cannot run here: fused-cudnn does not run on cpu"):
        ab.choose("cpu", torch.bfloat16, 64, backend="fused-cudnn")
    monkeypatch.setenv(ab.ENV, "flash-9")
    with pytest.raises(ValueError, match="attention backend 'flash-9' is unknown; use auto or one of"):
        ab.choose("cpu", torch.float32, 8)
    monkeypatch.setenv(ab.ENV, "reference")
    assert ab.describe("cpu", torch.float32, 64) == "reference"


def test_probe_rejects_a_kernel_that_disagrees_with_the_reference(monkeypatch):
    """A kernel with a wrong convention (here lse in log2) is caught by the probe, with the reason."""

    class Log2Lse(CpuFlash):
        def forward(self, q, k, v, causal, scale):
            out, lse = super().forward(q, k, v, causal, scale)
            return out, lse / math.log(2)

    monkeypatch.setitem(ab._instances, "fused-cpu-flash", Log2Lse())
    why = ab._probe("fused-cpu-flash", torch.device("cpu"), torch.float32, 8)
    assert why is not None and "differs from the reference" in why


def test_cuda_order_cudnn_for_single_length_calls_else_varlen_flash(monkeypatch):
    """The CUDA preference as choose() applies it, with the probe verdicts set by hand (no GPU here): cuDNN for a
    call whose sequences share one length, varlen flash for mixed lengths, the reference when neither passed."""
    monkeypatch.delenv(ab.ENV, raising=False)
    cuda = torch.device("cuda")
    verdicts = {("fused-cudnn", cuda, torch.bfloat16, 128): None, ("fused-flash", cuda, torch.bfloat16, 128): None}
    monkeypatch.setattr(ab, "_verdicts", verdicts)
    assert ab.choose(cuda, torch.bfloat16, 128, num_runs=1)[1] == "fused-cudnn"
    assert ab.choose(cuda, torch.bfloat16, 128, num_runs=3)[1] == "fused-flash"
    verdicts[("fused-flash", cuda, torch.bfloat16, 128)] = "fused-flash probe: out differs"
    assert ab.choose(cuda, torch.bfloat16, 128, num_runs=3)[1] == "fused-cudnn"  # dense runs still beat the reference
    verdicts[("fused-cudnn", cuda, torch.bfloat16, 128)] = "cuDNN is not available"
    assert ab.choose(cuda, torch.bfloat16, 128)[1] == "reference"
    assert ab.describe(cuda, torch.bfloat16, 128) == (
        "reference (fused-cudnn: cuDNN is not available; fused-flash: fused-flash probe: out differs)"
    )
    assert "takes torch.bfloat16, torch.float16, not torch.float32" in ab.verdict("fused-flash", cuda, torch.float32, 8)
