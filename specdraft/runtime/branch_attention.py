"""Context-parallel attention for EAGLE-3 TTT drafts: zigzag sharding, one zigzag ring over the trunk K/V for all
TTT steps, and the branch (diagonal) keys merged rank-locally. Owns zigzag_shard/unshard and branch_attention."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

# Elements of one score tile (kv_heads, q_rows * steps * group, k_rows); bounds the per-tile workspace so memory
# does not grow with the square of a sequence. Tests shrink it to exercise multi-tile paths.
TILE_ELEMENTS = 1 << 22

# Bytes handed to isend, per phase; off by default so the hot path only pays a dict lookup.
_SENT = {"enabled": False, "fwd": 0, "bwd": 0}


def count_bytes(enabled: bool = True) -> None:
    """Reset the send counters and switch counting on (or off)."""
    _SENT.update(enabled=enabled, fwd=0, bwd=0)


def bytes_sent() -> dict[str, int]:
    """Bytes this process sent through the ring since count_bytes(): {'fwd': ..., 'bwd': ...}."""
    return {"fwd": _SENT["fwd"], "bwd": _SENT["bwd"]}


# ---------------------------------------------------------------------------------------------------- validation
def _bounds(cu_seqlens, multiple: int) -> list[int]:
    """cu_seqlens as Python ints after checking it is 1-D, integer, starts at 0, strictly increasing, and every
    length is a multiple of `multiple` (= 2 * cp_size). One host sync; the tile loop needs the lengths anyway."""
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1:
        got = tuple(cu_seqlens.shape) if isinstance(cu_seqlens, torch.Tensor) else type(cu_seqlens).__name__
        raise ValueError(f"cu_seqlens must be a 1-D integer tensor [0, len0, len0+len1, ...]; got {got}")
    if cu_seqlens.is_floating_point() or cu_seqlens.is_complex() or cu_seqlens.dtype == torch.bool:
        raise ValueError(f"cu_seqlens must have an integer dtype (int32/int64); got {cu_seqlens.dtype}")
    cu = cu_seqlens.tolist()
    if len(cu) < 2 or cu[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0 and hold at least one sequence; got {cu[:4]}")
    for b, (start, end) in enumerate(zip(cu, cu[1:])):
        if end <= start:
            raise ValueError(f"cu_seqlens must be strictly increasing; cu_seqlens[{b + 1}]={end} <= "
                             f"cu_seqlens[{b}]={start}")
        if (end - start) % multiple:
            raise ValueError(f"sequence {b} has length {end - start}; expected a multiple of 2*cp_size={multiple} "
                             f"(pad each sequence to a multiple of {multiple})")
    return cu


def _check_cp(cp_size: int, cp_rank: int | None = None) -> None:
    if not isinstance(cp_size, int) or cp_size < 1:
        raise ValueError(f"cp_size must be a positive int; got {cp_size!r}")
    if cp_rank is not None and (not isinstance(cp_rank, int) or not 0 <= cp_rank < cp_size):
        raise ValueError(f"cp_rank must be an int in [0, {cp_size}); got {cp_rank!r}")


def _check_dim(x: torch.Tensor, dim: int, name: str) -> int:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    if not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim={dim!r} is out of range for {name} with shape {tuple(x.shape)}")
    return dim % x.dim()


def _check_inputs(q, k, v, cu_seqlens, cp: int) -> list[int]:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-D tensor (steps, tokens, heads, head_dim); got {got}")
    S, T, H, D = q.shape
    if min(S, T, H, D) == 0:
        raise ValueError(f"q must have non-empty dimensions (S, T, H, D); got {tuple(q.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got k {tuple(k.shape)}, v {tuple(v.shape)}")
    hkv = k.shape[2]
    if k.shape[0] < S or (k.shape[1], k.shape[3]) != (T, D) or hkv == 0:
        raise ValueError(f"k/v shape {tuple(k.shape)} does not fit q {tuple(q.shape)}; expected (S_kv, {T}, Hkv, {D}) "
                         f"with S_kv >= {S} (q holds the last S of the S_kv steps)")
    if H % hkv:
        raise ValueError(f"q heads H={H} must be divisible by k/v heads Hkv={hkv} (GQA groups)")
    if not q.is_floating_point() or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one floating dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")
    cu = _bounds(cu_seqlens, 2 * cp)
    if cu[-1] != T * cp:
        raise ValueError(f"cu_seqlens[-1]={cu[-1]} must equal T*cp = {T}*{cp} = {T * cp} (cu_seqlens is global; "
                         f"q holds this rank's zigzag shard)")
    return cu


# ------------------------------------------------------------------------------------------------------- zigzag
def _zigzag_rows(cu: list[int], cp: int, rank: int, device) -> torch.Tensor:
    """Global row indices this rank holds, in shard order: chunks rank and 2cp-1-rank of every sequence."""
    pieces = []
    for start, end in zip(cu, cu[1:]):
        c = (end - start) // (2 * cp)
        for chunk in (rank, 2 * cp - 1 - rank):
            pieces.append(torch.arange(start + chunk * c, start + (chunk + 1) * c, device=device))
    return torch.cat(pieces)


def zigzag_shard(x: torch.Tensor, cu_seqlens: torch.Tensor, cp_size: int, cp_rank: int, dim: int) -> torch.Tensor:
    """This rank's zigzag shard of the packed batch x along its token dimension `dim`."""
    _check_cp(cp_size, cp_rank)
    dim = _check_dim(x, dim, "x")
    cu = _bounds(cu_seqlens, 2 * cp_size)
    if cu[-1] != x.shape[dim]:
        raise ValueError(f"x.shape[{dim}]={x.shape[dim]} must equal cu_seqlens[-1]={cu[-1]} (x is the whole batch)")
    return x.index_select(dim, _zigzag_rows(cu, cp_size, cp_rank, x.device))


def zigzag_unshard(parts, cu_seqlens: torch.Tensor, cp_size: int, dim: int) -> torch.Tensor:
    """Inverse of zigzag_shard: `parts` holds every rank's shard in rank order."""
    _check_cp(cp_size)
    if len(parts) != cp_size:
        raise ValueError(f"parts must hold one shard per rank: expected {cp_size}, got {len(parts)}")
    dim = _check_dim(parts[0], dim, "parts[0]")
    cu = _bounds(cu_seqlens, 2 * cp_size)
    local = cu[-1] // cp_size
    for r, p in enumerate(parts):
        expected = parts[0].shape[:dim] + (local,) + parts[0].shape[dim + 1:]
        if not isinstance(p, torch.Tensor) or p.shape != expected:
            got = tuple(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__
            raise ValueError(f"parts[{r}] has shape {got}; expected {tuple(expected)}")
    full = torch.cat(list(parts), dim)  # rank-major
    where = torch.empty(cu[-1], dtype=torch.long, device=full.device)
    for r in range(cp_size):
        where[_zigzag_rows(cu, cp_size, r, full.device)] = torch.arange(r * local, (r + 1) * local,
                                                                        device=full.device)
    return full.index_select(dim, where)


# --------------------------------------------------------------------------------------------------------- ring
class _Ring:
    """Neighbours of this rank in a CP group (global ranks, so CP subgroups of a larger world work)."""

    def __init__(self, group):
        self.group = group
        self.size = 1 if group is None else dist.get_world_size(group)
        self.rank = 0 if group is None else dist.get_rank(group)
        if self.size > 1:
            self.next = dist.get_global_rank(group, (self.rank + 1) % self.size)
            self.prev = dist.get_global_rank(group, (self.rank - 1) % self.size)

    def shift(self, buf: torch.Tensor, phase: str) -> "_Pending":
        """Post send(buf -> next) and recv(<- prev) as one batch; returns a handle whose wait() gives the recv."""
        recv = torch.empty_like(buf)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, buf, self.next, self.group),
                                       dist.P2POp(dist.irecv, recv, self.prev, self.group)])
        if _SENT["enabled"]:
            _SENT[phase] += buf.numel() * buf.element_size()
        return _Pending(buf, recv, reqs)

    def kind(self, step: int) -> str:
        """Which zigzag block pattern applies when holding the K/V of rank (rank - step)."""
        if step == 0:
            return "own"
        return "early" if (self.rank - step) % self.size < self.rank else "late"


class _Pending:
    def __init__(self, sent, recv, reqs):
        self.sent, self.recv, self.reqs = sent, recv, reqs  # keep the send buffer alive until completion

    def wait(self) -> torch.Tensor:
        for r in self.reqs:
            r.wait()
        return self.recv


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


def _block_rows(rows_per_token: int) -> int:
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


def _merge(acc_o, acc_l, blk_o, blk_l, first: bool) -> None:
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


def trunk_forward(qh, kv, cu_local, ring: _Ring, block: int):
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
            _merge(acc_o[:, a:a1], acc_l[:, a:a1], o.view(shape), lse.view(shape[:-1]), first)
        if nxt is not None:
            cur = nxt.wait()
    return acc_o, acc_l


def trunk_backward(qh, kv, doh, lse, delta, cu_local, ring: _Ring, block: int):
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
            if carried is not None:  # what earlier ranks accumulated for this same K/V
                dkv += carried.wait()
            carried = ring.shift(dkv, "bwd")  # after the last step this hop delivers to the owner
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
    _merge(acc_o5, acc_l5, o, lse, False)


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
def _branch_queries(q_steps: int, kv_steps: int) -> tuple[int, int]:
    """(index in q of the first query that sees branch keys, that query's TTT step).

    q holds the last q_steps of kv_steps steps (the TTT unroll calls with only its newest step); step 0, the
    trunk query, sees no branch key."""
    first_step = kv_steps - q_steps
    skip = 1 if first_step == 0 else 0
    return skip, first_step + skip


class _BranchAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu, ring, scale):
        S, T, H, D = q.shape
        hkv = k.shape[2]
        cdt = torch.promote_types(q.dtype, torch.float32)  # accumulate in fp32 (fp64 stays fp64)
        qh = heads_first(q, hkv, cdt, scale)  # (Hkv, T, S*G, D)
        kv = torch.stack((k[0], v[0])).transpose(1, 2).contiguous()  # (2, Hkv, T, D): the only thing that travels
        cu_local = [c // ring.size for c in cu]
        out, lse = trunk_forward(qh, kv, cu_local, ring, _block_rows(S * H))
        skip, first_step = _branch_queries(S, k.shape[0])
        if k.shape[0] > 1 and S > skip:
            G = H // hkv
            kb, vb = (x[1:].permute(2, 1, 0, 3) for x in (k, v))  # (Hkv, T, S_kv-1, D): never leave the rank
            branch_forward(qh.view(hkv, T, S, G, D)[:, :, skip:], kb, vb, out.view(hkv, T, S, G, D)[:, :, skip:],
                           lse.view(hkv, T, S, G)[:, :, skip:], first_step=first_step)
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
        dqh, dkv = trunk_backward(qh, kv, doh, lse, delta, ctx.cu_local, ctx.ring, _block_rows(S * H))
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        dk[0], dv[0] = dkv[0].transpose(0, 1), dkv[1].transpose(0, 1)
        skip, first_step = _branch_queries(S, k.shape[0])
        if k.shape[0] > 1 and S > skip:
            kb, vb = (x[1:].permute(2, 1, 0, 3) for x in (k, v))
            view5 = (hkv, T, S, G, D)
            dq5, dkb, dvb = branch_backward(qh.view(view5)[:, :, skip:], kb, vb, doh.view(view5)[:, :, skip:],
                                            lse.view(view5[:-1])[:, :, skip:], delta.view(view5[:-1])[:, :, skip:],
                                            first_step)
            dqh.view(view5)[:, :, skip:] += dq5
            dk[1:], dv[1:] = dkb.permute(2, 1, 0, 3), dvb.permute(2, 1, 0, 3)
        dq = heads_last(dqh.mul_(ctx.scale), S, q.dtype)  # chain rule through qh = q * scale
        return dq, dk, dv, None, None, None


def branch_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                     cp_group=None, softmax_scale: float | None = None) -> torch.Tensor:
    """EAGLE-3 TTT attention over a zigzag-sharded packed batch; returns out with q's shape and dtype.

    q (S, T, H, D), k/v (S, T, Hkv, D): step 0 is the trunk, 1..S-1 the branch steps, T this rank's tokens.
    Query (j, r) sees trunk keys r' <= r of its sequence and branch keys (i, r) for 1 <= i <= j, in one softmax.
    cu_seqlens is global. cp_group None or of size 1 computes locally. Bad input raises ValueError.
    q may also hold only the last S_q of the S steps of k/v (S_q <= S): a sequential TTT unroll passes just its
    newest step, so each step costs one ring pass with one query set."""
    ring = _Ring(cp_group)
    cu = _check_inputs(q, k, v, cu_seqlens, ring.size)
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)
    return _BranchAttention.apply(q, k, v, cu, ring, scale)
