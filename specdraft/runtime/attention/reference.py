"""The plain-torch reference kernels of branch attention: score tiles, the zigzag ring pass over the trunk K/V and
its backward, the rank-local branch diagonal, and the autograd function that strings them together. The fused
kernels (ops.py) are tested against this path, which is itself tested against a dense float64 one."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

# Elements of one score tile (kv_heads, q_rows * steps * group, k_rows); bounds the per-tile workspace so memory
# does not grow with the square of a sequence. Tests shrink it to exercise multi-tile paths.
TILE_ELEMENTS = 1 << 22


def _tiles(cu_local: list[int], kind: str, block: int):
    """(q0, q1, k0, k1, causal, first) row ranges of the local shard for one ring step, per sequence.

    Local rows of a sequence are [chunk rank | chunk 2cp-1-rank], so local order is global order:
    'own'   local q vs local k, causal (tiles on and below the diagonal; q and k tiles share boundaries);
    'early' K/V of a lower rank: all q vs the first half of k (its second half lies in every query's future);
    'late'  K/V of a higher rank: second half of q vs all of k (the first half of q precedes all of it)."""
    for lo, hi in zip(cu_local, cu_local[1:]):
        mid = (lo + hi) // 2
        if kind == "own":
            for a in range(lo, hi, block):
                for b in range(lo, a + 1, block):
                    yield a, min(a + block, hi), b, min(b + block, hi), b == a, b == lo
            continue
        q_lo, k_hi = (lo, mid) if kind == "early" else (mid, hi)
        for a in range(q_lo, hi, block):
            for b in range(lo, k_hi, block):
                yield a, min(a + block, hi), b, min(b + block, k_hi), False, False


def block_rows(rows_per_token: int) -> int:
    return max(1, math.isqrt(max(1, TILE_ELEMENTS // rows_per_token)))


# ------------------------------------------------------------------------------------------------------ kernels
def heads_first(x: torch.Tensor, hkv: int, dtype=None, scale: float | None = None) -> torch.Tensor:
    """(S, T, H, D) -> new (Hkv, T, S*G, D), G = H // Hkv: each kv head's queries of all steps form one row block.
    Converts to `dtype` and multiplies by `scale` inside the one allocation."""
    S, T, H, D = x.shape
    g = H // hkv
    out = torch.empty((hkv, T, S * g, D), dtype=dtype or x.dtype, device=x.device)
    out.view(hkv, T, S, g, D).copy_(x.reshape(S, T, hkv, g, D).permute(2, 1, 0, 3, 4))
    return out if scale is None else out.mul_(scale)


def heads_last(x: torch.Tensor, steps: int, dtype=None) -> torch.Tensor:
    """Inverse of heads_first: (Hkv, T, S*G, D) -> new (S, T, H, D) in `dtype`."""
    hkv, T, M, D = x.shape
    out = torch.empty((steps, T, hkv * (M // steps), D), dtype=dtype or x.dtype, device=x.device)
    out.view(steps, T, hkv, M // steps, D).copy_(x.view(hkv, T, steps, M // steps, D).permute(2, 1, 0, 3, 4))
    return out


def _scores(qt: torch.Tensor, kt: torch.Tensor, causal: bool) -> torch.Tensor:
    # qt (hkv, bq, M, D) pre-scaled, kt (hkv, bk, D) -> (hkv, bq*M, bk)
    hkv, bq, m, d = qt.shape
    s = torch.matmul(qt.reshape(hkv, bq * m, d), kt.transpose(1, 2).to(qt.dtype))
    if causal:  # diagonal tile: q and k rows coincide, so key j is visible to query row i iff j <= i
        future = torch.ones(bq, kt.shape[1], dtype=torch.bool, device=s.device).triu_(1)
        s = s.view(hkv, bq, m, -1).masked_fill_(future[:, None], float("-inf")).view(hkv, bq * m, -1)
    return s


def merge(acc_o, acc_l, blk_o, blk_l, first: bool) -> None:
    """Fold a block's (out, lse) into the running fp32 (out, lse) in place; acc_o (..., D), acc_l (...).

    Same algebra as ring-flash-attention's `_update_out_and_lse` (zhuzilin/ring-flash-attention, utils.py):
    with new = logaddexp(lse, blk_lse), out' = e^(lse-new) out + e^(blk-new) blk_out, rewritten through sigmoid
    and logsigmoid so no exp overflows. The first block is assigned, since lse = -inf would give -inf + inf."""
    if first:
        acc_o.copy_(blk_o)
        acc_l.copy_(blk_l)
        return
    acc_o.sub_(torch.sigmoid(blk_l - acc_l).unsqueeze(-1) * (acc_o - blk_o))
    acc_l.sub_(F.logsigmoid(acc_l - blk_l))


def trunk_forward(qh, kv, cu_local, ring, block: int):
    """One zigzag ring pass of the trunk K/V against all stacked query rows.

    qh (Hkv, T, M, D) pre-scaled compute dtype; kv (2, Hkv, T, D) this rank's trunk K/V in the wire dtype.
    Returns (out, lse): (Hkv, T, M, D) and (Hkv, T, M) in qh's dtype."""
    acc_o = torch.empty_like(qh)
    acc_l = torch.empty(qh.shape[:-1], dtype=qh.dtype, device=qh.device)
    cur = kv
    for step in range(ring.size):
        nxt = ring.shift(cur, "fwd") if step + 1 < ring.size else None  # next hop in flight while we compute
        for a, a1, b, b1, causal, first in _tiles(cu_local, ring.kind(step), block):
            s = _scores(qh[:, a:a1], cur[0, :, b:b1], causal)  # (Hkv, rows, bk)
            mx = s.amax(-1, keepdim=True)  # finite: every row sees at least one key of every tile it is in
            p = s.sub_(mx).exp_()
            total = p.sum(-1, keepdim=True)
            o = torch.matmul(p, cur[1, :, b:b1].to(s.dtype)).div_(total)  # (Hkv, rows, D); normalise the small side
            lse = total.log_().add_(mx).squeeze(-1)
            shape = qh[:, a:a1].shape
            merge(acc_o[:, a:a1], acc_l[:, a:a1], o.view(shape), lse.view(shape[:-1]), first)
        if nxt is not None:
            cur = nxt.wait()
    return acc_o, acc_l


def pass_kv_grads(ring, dkv: torch.Tensor, carried):
    """One backward ring hop: add what earlier ranks accumulated for this same K/V block (the pending receive
    ``carried``) to this rank's ``dkv`` and send the sum on; after the last step the hop delivers to the owner."""
    if carried is not None:
        dkv += carried.wait()
    return ring.shift(dkv, "bwd")


def trunk_backward(qh, kv, doh, lse, delta, cu_local, ring, block: int):
    """Ring backward for the trunk (flash-attention style recompute: P = exp(S - lse), dS = P * (dP - delta)).

    K/V travel the ring again; a dK/dV accumulator follows one hop behind and ends at its owner after cp hops.
    Returns dqh (Hkv, T, M, D) with respect to the *pre-scaled* qh, and dkv (2, Hkv, T, D), both compute dtype."""
    dqh = torch.zeros_like(qh)
    cur, carried, dkv = kv, None, None
    for step in range(ring.size):
        nxt = ring.shift(cur, "bwd") if step + 1 < ring.size else None
        dkv = torch.zeros(kv.shape, dtype=qh.dtype, device=qh.device)  # (2, Hkv, T, D) for the held K/V
        for a, a1, b, b1, causal, _ in _tiles(cu_local, ring.kind(step), block):
            hkv, bq, m, d = qh[:, a:a1].shape
            q2, do2 = qh[:, a:a1].reshape(hkv, bq * m, d), doh[:, a:a1].reshape(hkv, bq * m, d)
            kt, vt = cur[0, :, b:b1].to(qh.dtype), cur[1, :, b:b1].to(qh.dtype)  # (Hkv, bk, D)
            p = _scores(qh[:, a:a1], kt, causal).sub_(lse[:, a:a1].reshape(hkv, -1, 1)).exp_()  # (Hkv, rows, bk)
            dkv[1, :, b:b1] += torch.matmul(p.transpose(1, 2), do2)
            ds = torch.matmul(do2, vt.transpose(1, 2)).sub_(delta[:, a:a1].reshape(hkv, -1, 1)).mul_(p)
            dqh[:, a:a1] += torch.matmul(ds, kt).view(hkv, bq, m, d)
            dkv[0, :, b:b1] += torch.matmul(ds.transpose(1, 2), q2)
        if ring.size > 1:
            carried = pass_kv_grads(ring, dkv, carried)
        if nxt is not None:
            cur = nxt.wait()
    return dqh, (carried.wait() if carried is not None else dkv)


def _branch_mask(n_q: int, n_k: int, first_step: int, device) -> torch.Tensor:
    # query of step first_step+j sees branch key of step i+1 iff i+1 <= first_step+j; (n_q, 1, n_k) over G
    j = torch.arange(n_q, device=device)[:, None] + first_step
    return (torch.arange(n_k, device=device)[None, :] + 1 > j)[:, None, :]


def branch_forward(q5, kb, vb, acc_o5, acc_l5, first_step: int) -> None:
    """Merge the rank-local diagonal into (acc_o5, acc_l5) in place, O(S^2 T H D).

    q5 (Hkv, T, J, G, D) pre-scaled queries of steps first_step.., kb/vb (Hkv, T, I, D) branch keys of steps 1..I,
    acc_o5 (Hkv, T, J, G, D), acc_l5 (Hkv, T, J, G). Every query step here sees at least branch key 1."""
    s = torch.einsum("ntjgd,ntid->ntjgi", q5, kb.to(q5.dtype))  # (Hkv, T, J, G, I)
    s.masked_fill_(_branch_mask(q5.shape[2], kb.shape[2], first_step, s.device), float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.einsum("ntjgi,ntid->ntjgd", s.sub_(lse[..., None]).exp_(), vb.to(q5.dtype))
    merge(acc_o5, acc_l5, o, lse, False)


def branch_backward(q5, kb, vb, do5, lse5, delta5, first_step: int):
    """Gradients of the diagonal part: (dq5 w.r.t. pre-scaled q5, dkb, dvb); shapes as in branch_forward."""
    kb, vb = kb.to(q5.dtype), vb.to(q5.dtype)
    s = torch.einsum("ntjgd,ntid->ntjgi", q5, kb)
    s.masked_fill_(_branch_mask(q5.shape[2], kb.shape[2], first_step, s.device), float("-inf"))
    p = s.sub_(lse5[..., None]).exp_()  # (Hkv, T, J, G, I)
    dvb = torch.einsum("ntjgi,ntjgd->ntid", p, do5)
    ds = torch.einsum("ntjgd,ntid->ntjgi", do5, vb).sub_(delta5[..., None]).mul_(p)
    return torch.einsum("ntjgi,ntid->ntjgd", ds, kb), torch.einsum("ntjgi,ntjgd->ntid", ds, q5), dvb


# ------------------------------------------------------------------------------------------------------ autograd
def branch_queries(q_steps: int, kv_steps: int) -> tuple[int, int]:
    """(index in q of the first query that sees branch keys, that query's TTT step).

    q holds the last q_steps of kv_steps steps (the TTT unroll calls with only its newest step); step 0, the
    trunk query, sees no branch key."""
    first_step = kv_steps - q_steps
    skip = 1 if first_step == 0 else 0
    return skip, first_step + skip


class ReferenceAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu, ring, scale):
        S, T, H, D = q.shape
        hkv = k.shape[2]
        cdt = torch.promote_types(q.dtype, torch.float32)  # accumulate in fp32 (fp64 stays fp64)
        qh = heads_first(q, hkv, cdt, scale)  # (Hkv, T, S*G, D)
        kv = torch.stack((k[0], v[0])).transpose(1, 2).contiguous()  # (2, Hkv, T, D): the only thing that travels
        cu_local = [c // ring.size for c in cu]
        out, lse = trunk_forward(qh, kv, cu_local, ring, block_rows(S * H))
        skip, first_step = branch_queries(S, k.shape[0])
        if k.shape[0] > 1 and S > skip:
            G = H // hkv
            kb, vb = (x[1:].permute(2, 1, 0, 3) for x in (k, v))  # (Hkv, T, S_kv-1, D): never leave the rank
            branch_forward(
                qh.view(hkv, T, S, G, D)[:, :, skip:],
                kb,
                vb,
                out.view(hkv, T, S, G, D)[:, :, skip:],
                lse.view(hkv, T, S, G)[:, :, skip:],
                first_step=first_step,
            )
        out = heads_last(out, S, q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.cu_local, ctx.ring, ctx.scale = cu_local, ring, scale
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        S, T, H, D = q.shape
        hkv, G = k.shape[2], H // k.shape[2]
        # rowsum(dO * O) first, while its (S, T, H, D) temporary does not yet sit beside qh, doh and dqh
        delta = heads_first((dout.to(lse.dtype) * out.to(lse.dtype)).sum(-1, keepdim=True), hkv)[..., 0]
        qh, doh = heads_first(q, hkv, lse.dtype, ctx.scale), heads_first(dout, hkv, lse.dtype)  # (Hkv, T, M, D)
        kv = torch.stack((k[0], v[0])).transpose(1, 2).contiguous()
        dqh, dkv = trunk_backward(qh, kv, doh, lse, delta, ctx.cu_local, ctx.ring, block_rows(S * H))
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        dk[0], dv[0] = dkv[0].transpose(0, 1), dkv[1].transpose(0, 1)
        skip, first_step = branch_queries(S, k.shape[0])
        if k.shape[0] > 1 and S > skip:
            kb, vb = (x[1:].permute(2, 1, 0, 3) for x in (k, v))
            view5 = (hkv, T, S, G, D)
            dq5, dkb, dvb = branch_backward(
                qh.view(view5)[:, :, skip:],
                kb,
                vb,
                doh.view(view5)[:, :, skip:],
                lse.view(view5[:-1])[:, :, skip:],
                delta.view(view5[:-1])[:, :, skip:],
                first_step,
            )
            dqh.view(view5)[:, :, skip:] += dq5
            dk[1:], dv[1:] = dkb.permute(2, 1, 0, 3), dvb.permute(2, 1, 0, 3)
        dq = heads_last(dqh.mul_(ctx.scale), S, q.dtype)  # chain rule through qh = q * scale
        return dq, dk, dv, None, None, None
