"""Context-parallel attention for EAGLE-3 TTT drafts (one zigzag ring over the trunk K/V for all TTT steps, branch
keys merged rank-locally): owns zigzag_shard/unshard, input validation, the ring's neighbours and byte counters,
and branch_attention, which dispatches to the fused path (fused.py) or the reference one."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from specdraft.runtime.attention import backend as attention_backend
from specdraft.runtime.attention.fused import FusedAttention
from specdraft.runtime.attention.reference import ReferenceAttention

# Bytes handed to isend, per phase; off by default so the hot path only pays a dict lookup.
_SENT = {"enabled": False, "fwd": 0, "bwd": 0}


def count_bytes(enabled: bool = True) -> None:
    """Reset the send counters and switch counting on (or off)."""
    _SENT.update(enabled=enabled, fwd=0, bwd=0)


def bytes_sent() -> dict[str, int]:
    """Bytes this process sent through the ring since count_bytes(): {'fwd': ..., 'bwd': ...}."""
    return {"fwd": _SENT["fwd"], "bwd": _SENT["bwd"]}


# ---------------------------------------------------------------------------------------------------- validation
_HOST = "_specdraft_host_values"


def with_host_values(tensor: torch.Tensor, values=None) -> torch.Tensor:
    """Remember ``tensor``'s values (cu_seqlens, made once per microbatch; ``values``: the same values already on
    the host) on the tensor itself, so `host_values` reads them without a device-to-host sync in every attention
    call and halo shift of a CUDA step. The tensor must not be changed in place afterwards."""
    setattr(tensor, _HOST, tuple(int(v) for v in (values if values is not None else tensor.tolist())))
    return tensor


def host_values(tensor: torch.Tensor) -> list[int]:
    """``tensor.tolist()``, from the copy `with_host_values` kept when there is one."""
    kept = getattr(tensor, _HOST, None)
    return list(kept) if kept is not None else tensor.tolist()


def _bounds(cu_seqlens, multiple: int) -> list[int]:
    """cu_seqlens as Python ints after checking it is 1-D, integer, starts at 0, strictly increasing, and every
    length is a multiple of `multiple` (= 2 * cp_size). One host sync; the tile loop needs the lengths anyway."""
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1:
        got = tuple(cu_seqlens.shape) if isinstance(cu_seqlens, torch.Tensor) else type(cu_seqlens).__name__
        raise ValueError(f"cu_seqlens must be a 1-D integer tensor [0, len0, len0+len1, ...]; got {got}")
    if cu_seqlens.is_floating_point() or cu_seqlens.is_complex() or cu_seqlens.dtype == torch.bool:
        raise ValueError(f"cu_seqlens must have an integer dtype (int32/int64); got {cu_seqlens.dtype}")
    cu = host_values(cu_seqlens)
    if len(cu) < 2 or cu[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0 and hold at least one sequence; got {cu[:4]}")
    for b, (start, end) in enumerate(zip(cu, cu[1:])):
        if end <= start:
            raise ValueError(
                f"cu_seqlens must be strictly increasing; cu_seqlens[{b + 1}]={end} <= cu_seqlens[{b}]={start}"
            )
        if (end - start) % multiple:
            raise ValueError(
                f"sequence {b} has length {end - start}; expected a multiple of 2*cp_size={multiple} "
                f"(pad each sequence to a multiple of {multiple})"
            )
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
        raise ValueError(
            f"k/v shape {tuple(k.shape)} does not fit q {tuple(q.shape)}; expected (S_kv, {T}, Hkv, {D}) "
            f"with S_kv >= {S} (q holds the last S of the S_kv steps)"
        )
    if H % hkv:
        raise ValueError(f"q heads H={H} must be divisible by k/v heads Hkv={hkv} (GQA groups)")
    if not q.is_floating_point() or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one floating dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")
    cu = _bounds(cu_seqlens, 2 * cp)
    if cu[-1] != T * cp:
        raise ValueError(
            f"cu_seqlens[-1]={cu[-1]} must equal T*cp = {T}*{cp} = {T * cp} (cu_seqlens is global; "
            f"q holds this rank's zigzag shard)"
        )
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
        expected = parts[0].shape[:dim] + (local,) + parts[0].shape[dim + 1 :]
        if not isinstance(p, torch.Tensor) or p.shape != expected:
            got = tuple(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__
            raise ValueError(f"parts[{r}] has shape {got}; expected {tuple(expected)}")
    full = torch.cat(list(parts), dim)  # rank-major
    where = torch.empty(cu[-1], dtype=torch.long, device=full.device)
    for r in range(cp_size):
        where[_zigzag_rows(cu, cp_size, r, full.device)] = torch.arange(r * local, (r + 1) * local, device=full.device)
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
        reqs = dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, buf, self.next, self.group), dist.P2POp(dist.irecv, recv, self.prev, self.group)]
        )
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


def branch_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    cp_group=None,
    softmax_scale: float | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """EAGLE-3 TTT attention over a zigzag-sharded packed batch; returns out with q's shape and dtype.

    q (S, T, H, D), k/v (S, T, Hkv, D): step 0 is the trunk, 1..S-1 the branch steps, T this rank's tokens.
    Query (j, r) sees trunk keys r' <= r of its sequence and branch keys (i, r) for 1 <= i <= j, in one softmax.
    cu_seqlens is global. cp_group None or of size 1 computes locally. Bad input raises ValueError.
    q may also hold only the last S_q of the S steps of k/v (S_q <= S): a sequential TTT unroll passes just its
    newest step, so each step costs one ring pass with one query set.
    backend: 'auto' (default; also $SPECDRAFT_ATTENTION_BACKEND), 'reference', or a fused kernel name
    (attention_backend.BACKENDS). Every rank of the group picks the same one (the choice depends only on the
    device type, dtype, head_dim, the global cu_seqlens and the environment): the two paths lay out the K/V they
    send differently."""
    ring = _Ring(cp_group)
    cu = _check_inputs(q, k, v, cu_seqlens, ring.size)
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)
    kernel, _ = attention_backend.choose(q.device, q.dtype, q.shape[-1], _num_runs(cu), backend)
    if kernel is None:
        return ReferenceAttention.apply(q, k, v, cu, ring, scale)
    return FusedAttention.apply(q, k, v, cu, ring, scale, kernel)


def _num_runs(cu: list[int]) -> int:
    """Runs of consecutive equal-length sequences (a dense kernel's calls per block)."""
    lengths = [b - a for a, b in zip(cu, cu[1:])]
    return 1 + sum(a != b for a, b in zip(lengths, lengths[1:]))
