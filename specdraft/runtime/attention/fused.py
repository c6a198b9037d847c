"""The fused path of branch attention: the zigzag ring over the trunk K/V with one fused kernel call per block
(ops.py), the branch diagonal merged by log-sum-exp in bounded row chunks, and the autograd function
whose backward runs each block's flash backward from the merged out and lse."""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from specdraft.runtime.attention.ops import Layout, fold, pattern, unfold
from specdraft.runtime.attention.reference import branch_backward, branch_forward, branch_queries, merge, pass_kv_grads

# Elements of one fp32 query chunk of the branch diagonal (rows * J * H * D): bounds its temporaries, which at
# the GPU check's shape (32768 tokens, H=32, D=128) would otherwise be two fp32 copies of q.
DIAGONAL_ELEMENTS = 1 << 24


class _Acc:
    """Running (out, lse) of the folded queries, (T, Hf, D) and (T, Hf); allocated at the first block, which
    is adopted without a copy when it covers every row (cp = 1 with one run of equal-length sequences)."""

    def __init__(self, rows: int, dtype):
        self.rows, self.dtype, self.o, self.l = rows, dtype, None, None

    def put(self, o, lse, select, first: bool) -> None:
        """Merge block (o, lse) into the rows `select` picks from (T, ...) buffers (None: all rows)."""
        if self.o is None:
            if select is None and first:
                self.o = o.reshape(self.rows, *o.shape[-2:]).to(self.dtype).contiguous()
                self.l = lse.reshape(self.rows, -1).to(torch.promote_types(lse.dtype, torch.float32)).contiguous()
                return
            self.o = torch.empty((self.rows, *o.shape[-2:]), dtype=self.dtype, device=o.device)
            self.l = torch.empty(
                (self.rows, o.shape[-2]), dtype=torch.promote_types(lse.dtype, torch.float32), device=o.device
            )
        if select is None:
            merge(self.o.view(o.shape), self.l.view(lse.shape), o, lse, first)
        elif isinstance(select, torch.Tensor):  # gathered rows (varlen 'late' blocks)
            acc_o, acc_l = self.o.index_select(0, select), self.l.index_select(0, select)
            merge(acc_o, acc_l, o, lse, first)
            self.o.index_copy_(0, select, acc_o)
            self.l.index_copy_(0, select, acc_l)
        else:
            acc_o, acc_l = select(self.o), select(self.l)
            merge(acc_o, acc_l, o, lse, first)


def _run_view(r0: int, n: int, length: int, qsel: slice):
    """Selector of one run's query rows `qsel` from a (T, ...) tensor, as (n, rows, ...)."""
    return lambda x: x[r0 : r0 + n * length].view(n, length, *x.shape[1:])[:, qsel]


def trunk_forward(kernel, qf, kv, layout: Layout, ring, scale: float, acc_dtype):
    """One zigzag ring pass of the trunk K/V against the folded queries, one fused call per block.

    qf (T, Hf, D) in the input dtype; kv (2, T, Hkv, D) this rank's trunk K/V (what travels).
    Returns out (T, Hf, D) in acc_dtype and lse (T, Hf) fp32 (fp64 for fp64 inputs)."""
    acc, cur = _Acc(layout.rows, acc_dtype), kv
    for step in range(ring.size):
        nxt = ring.shift(cur, "fwd") if step + 1 < ring.size else None  # next hop in flight while we compute
        kind = ring.kind(step)
        if kernel.dense:
            for r0, n, length in layout.runs:
                qsel, ksel, causal = pattern(kind, length // 2)
                rows = _run_view(r0, n, length, qsel)
                keys = _run_view(r0, n, length, ksel)
                o, lse = kernel.forward(rows(qf), keys(cur[0]), keys(cur[1]), causal, scale)
                acc.put(o, lse, None if len(layout.runs) == 1 and kind == "own" else rows, kind == "own")
        else:
            o, lse, select = _varlen_forward(kernel, qf, cur, layout, kind, scale)
            acc.put(o, lse, select, kind == "own")
        if nxt is not None:
            cur = nxt.wait()
    return acc.o, acc.l


def _varlen_forward(kernel, qf, cur, layout: Layout, kind: str, scale: float):
    """One varlen call for a ring step; the 'early' keys and 'late' queries are gathered halves."""
    vl, full = layout.varlen(), layout.max_len
    if kind == "own":
        o, lse = kernel.forward(qf, cur[0], cur[1], vl["cu"], vl["cu"], full, full, True, scale)
        return o, lse, None
    if kind == "early":
        k, v = (cur[i].index_select(0, vl["first"]) for i in (0, 1))
        o, lse = kernel.forward(qf, k, v, vl["cu"], vl["half_cu"], full, vl["max_half"], False, scale)
        return o, lse, None
    q = qf.index_select(0, vl["second"])
    o, lse = kernel.forward(q, cur[0], cur[1], vl["half_cu"], vl["cu"], vl["max_half"], full, False, scale)
    return o, lse, vl["second"]


def trunk_backward(kernel, qf, kv, dof, of, lse, layout: Layout, ring, scale: float, acc_dtype):
    """Ring backward: K/V travel again, each block's fused backward runs from the merged (of, lse), and a dK/dV
    accumulator follows one hop behind, reaching its owner after cp hops.

    qf, dof, of (T, Hf, D) input dtype; lse (T, Hf). Returns dqf (T, Hf, D) and dkv (2, T, Hkv, D) in acc_dtype."""
    dq = _Grad(qf.shape, acc_dtype, qf.device)
    cur, carried, dkv = kv, None, None
    for step in range(ring.size):
        nxt = ring.shift(cur, "bwd") if step + 1 < ring.size else None
        kind = ring.kind(step)
        own = kind == "own"  # the own block covers every query and key row once: assign instead of add
        alloc = torch.empty if own else torch.zeros
        dkv = alloc(kv.shape, dtype=acc_dtype, device=kv.device)  # (2, T, Hkv, D) for the held K/V
        if kernel.dense:
            whole = own and len(layout.runs) == 1
            for r0, n, length in layout.runs:
                qsel, ksel, causal = pattern(kind, length // 2)
                rows = _run_view(r0, n, length, qsel)
                keys = _run_view(r0, n, length, ksel)
                dqb, dkb, dvb = kernel.backward(
                    rows(dof), rows(qf), keys(cur[0]), keys(cur[1]), rows(of), rows(lse), causal, scale
                )
                dq.put(None if whole else rows, dqb, own)
                for target, grad in ((keys(dkv[0]), dkb), (keys(dkv[1]), dvb)):
                    target.copy_(grad) if own else target.add_(grad)
        else:
            _varlen_backward(kernel, qf, cur, dof, of, lse, layout, kind, scale, dq, dkv)
        if ring.size > 1:
            carried = pass_kv_grads(ring, dkv, carried)
        if nxt is not None:
            cur = nxt.wait()
    return dq.t, (carried.wait() if carried is not None else dkv)


class _Grad:
    """The dq accumulator (T, Hf, D): a block covering every row at the own step is adopted without a copy (cp = 1,
    one call); otherwise allocated once and assigned (own step) or added to (later steps)."""

    def __init__(self, shape, dtype, device):
        self.shape, self.dtype, self.device, self.t = shape, dtype, device, None

    def put(self, select, grad, own: bool) -> None:
        if self.t is None and select is None and own:
            self.t = grad.reshape(self.shape).to(self.dtype)
            return
        if self.t is None:
            self.t = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        if isinstance(select, torch.Tensor):  # gathered rows (varlen 'late' blocks)
            self.t.index_add_(0, select, grad.to(self.dtype))
            return
        target = self.t if select is None else select(self.t)
        target.copy_(grad) if own else target.add_(grad)


def _varlen_backward(kernel, qf, cur, dof, of, lse, layout: Layout, kind: str, scale: float, dq: _Grad, dkv) -> None:
    vl, full = layout.varlen(), layout.max_len
    if kind == "own":
        dqb, dkb, dvb = kernel.backward(dof, qf, cur[0], cur[1], of, lse, vl["cu"], vl["cu"], full, full, True, scale)
        dq.put(None, dqb, True)
        dkv[0].copy_(dkb)
        dkv[1].copy_(dvb)
    elif kind == "early":
        first = vl["first"]
        k, v = (cur[i].index_select(0, first) for i in (0, 1))
        dqb, dkb, dvb = kernel.backward(
            dof, qf, k, v, of, lse, vl["cu"], vl["half_cu"], full, vl["max_half"], False, scale
        )
        dq.put(None, dqb, False)
        dkv[0].index_add_(0, first, dkb.to(dkv.dtype))
        dkv[1].index_add_(0, first, dvb.to(dkv.dtype))
    else:
        second = vl["second"]
        q, do, o, lse2 = (x.index_select(0, second) for x in (qf, dof, of, lse))
        dqb, dkb, dvb = kernel.backward(
            do, q, cur[0], cur[1], o, lse2, vl["half_cu"], vl["cu"], vl["max_half"], full, False, scale
        )
        dq.put(second, dqb, False)
        dkv[0].add_(dkb)
        dkv[1].add_(dvb)


# ----------------------------------------------------------------------------------------------- branch diagonal
def _diagonal_views(q, k, v, skip: int, acc):
    """(q5: (Hkv, T, J, G, D) view of the branch queries; kb, vb: (Hkv, T, I, D); each (T, Hf, ...) tensor of acc
    as (Hkv, T, J, G, ...))."""
    S, T, H, D = q.shape
    hkv = k.shape[2]
    g = H // hkv
    q5 = q.reshape(S, T, hkv, g, D)[skip:].permute(2, 1, 0, 3, 4)
    kb, vb = (x[1:].permute(2, 1, 0, 3) for x in (k, v))
    five = [a.view(T, hkv, S, g, *a.shape[2:]).transpose(0, 1)[:, :, skip:] for a in acc]
    return q5, kb, vb, five


def _chunks(rows: int, per_row: int):
    step = max(1, DIAGONAL_ELEMENTS // max(1, per_row))
    for a in range(0, rows, step):
        yield a, min(rows, a + step)


def diagonal_forward(q, k, v, out_f, lse, skip: int, first_step: int, scale: float) -> None:
    """Merge the rank-local branch diagonal into the folded (out_f (T, Hf, D), lse (T, Hf)) in place, in row chunks.
    q (S_q, T, H, D) unscaled input; k/v (S_kv, T, Hkv, D)."""
    cdt = lse.dtype
    q5, kb, vb, (o5, l5) = _diagonal_views(q, k, v, skip, (out_f, lse))
    for a, b in _chunks(q.shape[1], q5.shape[2] * q.shape[2] * q.shape[3]):
        qc = q5[:, a:b].to(cdt) * scale  # (Hkv, t, J, G, D) pre-scaled, as the reference kernels take it
        branch_forward(qc, kb[:, a:b], vb[:, a:b], o5[:, a:b], l5[:, a:b], first_step)


def diagonal_backward(q, k, v, dout, out, lse, dqf, dk, dv, skip: int, first_step: int, scale: float) -> None:
    """Add the diagonal's gradients: into dqf (T, Hf, D) (folded), and into dk[1:], dv[1:] (assigned)."""
    cdt = lse.dtype
    q5, kb, vb, (dq5, l5) = _diagonal_views(q, k, v, skip, (dqf, lse))
    hkv, g = k.shape[2], q.shape[2] // k.shape[2]
    do5, o5 = (x.reshape(*x.shape[:2], hkv, g, x.shape[3])[skip:].permute(2, 1, 0, 3, 4) for x in (dout, out))
    for a, b in _chunks(q.shape[1], q5.shape[2] * q.shape[2] * q.shape[3]):
        qc, doc = q5[:, a:b].to(cdt) * scale, do5[:, a:b].to(cdt)
        delta = (doc * o5[:, a:b].to(cdt)).sum(-1)  # rowsum(dO * O), as the fused backward computes it
        dqc, dkb, dvb = branch_backward(qc, kb[:, a:b], vb[:, a:b], doc, l5[:, a:b], delta, first_step)
        dq5[:, a:b] += dqc.mul_(scale)  # chain rule through the pre-scaled queries
        dk[1:, a:b], dv[1:, a:b] = dkb.permute(2, 1, 0, 3), dvb.permute(2, 1, 0, 3)


# ------------------------------------------------------------------------------------------------------ autograd
class FusedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu, ring, scale, kernel):
        S, T, H, D = q.shape
        hkv = k.shape[2]
        # One block per call at cp = 1: its output is final, so no fp32 copy; a ring merges in fp32.
        acc_dtype = q.dtype if ring.size == 1 else torch.promote_types(q.dtype, torch.float32)
        layout = Layout([c // ring.size for c in cu], q.device)
        kv = torch.stack((k[0], v[0]))  # (2, T, Hkv, D): the only thing that travels
        out_f, lse = trunk_forward(kernel, fold(q, hkv), kv, layout, ring, scale, acc_dtype)
        skip, first_step = branch_queries(S, k.shape[0])
        if k.shape[0] > 1 and S > skip:
            diagonal_forward(q, k, v, out_f, lse, skip, first_step, scale)
        out = unfold(out_f, S, hkv, q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout, ctx.ring, ctx.scale, ctx.kernel, ctx.acc_dtype = layout, ring, scale, kernel, acc_dtype
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        S, hkv = q.shape[0], k.shape[2]
        kv = torch.stack((k[0], v[0]))
        dqf, dkv = trunk_backward(
            ctx.kernel,
            fold(q, hkv),
            kv,
            fold(dout, hkv),
            fold(out, hkv),
            lse,
            ctx.layout,
            ctx.ring,
            ctx.scale,
            ctx.acc_dtype,
        )
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        dk[0], dv[0] = dkv[0], dkv[1]
        skip, first_step = branch_queries(S, k.shape[0])
        if k.shape[0] > 1 and S > skip:
            diagonal_backward(q, k, v, dout, out, lse, dqf, dk, dv, skip, first_step, ctx.scale)
        else:
            dk[1:], dv[1:] = 0, 0
        return unfold(dqf, S, hkv, q.dtype), dk, dv, None, None, None, None
