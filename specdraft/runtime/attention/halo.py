"""Row shifts across zigzag CP shards: y[p] = x[p + s] within each sequence, for local rows p.

The draft's TTT step j is trained towards the target's distribution at row p+1+j, which may live on another CP
rank. Every row p+s (s <= max shift) lies in the first max-shift rows of some chunk, so one all-gather of each
chunk's head rows gives every rank all it needs (small: 2 * num_sequences * max_shift rows per rank).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from specdraft.runtime.attention.branch import host_values


def local_global_rows(cu: list[int], cp: int, rank: int) -> list[int]:
    """Global row index of every local row, in zigzag order (chunks r and 2cp-1-r of each sequence)."""
    rows: list[int] = []
    for start, end in zip(cu, cu[1:]):
        chunk = (end - start) // (2 * cp)
        for c in (rank, 2 * cp - 1 - rank) if cp > 1 else (0,):
            first = start + c * chunk
            rows.extend(range(first, first + (chunk if cp > 1 else end - start)))
    return rows


def sequence_ends(cu: list[int]) -> torch.Tensor:
    """(total,) the end row of the sequence each global row belongs to."""
    ends = torch.empty(cu[-1], dtype=torch.long)
    for start, end in zip(cu, cu[1:]):
        ends[start:end] = end
    return ends


def gather_shifted(x: torch.Tensor, shifts: list[int], cu_seqlens: torch.Tensor, cp_group=None):
    """(avail, index): avail = local rows + the chunk heads of every CP rank; index (len(shifts), t) is the row of
    avail holding x[p + s] for local row p, or -1 past its sequence's end. avail[index[i]] is the i-th shift.

    Index form lets a caller materialise one shift (or one token chunk of it) at a time.
    """
    cp = dist.get_world_size(cp_group) if cp_group is not None else 1
    rank = dist.get_rank(cp_group) if cp_group is not None else 0
    cu = host_values(cu_seqlens)
    local = local_global_rows(cu, cp, rank)
    if len(local) != x.shape[0]:
        raise ValueError(f"x has {x.shape[0]} rows but cu_seqlens gives {len(local)} local rows at cp={cp}")
    reach = max(shifts)
    if cp > 1:
        head_pos: list[int] = []  # local positions of each local chunk's first rows
        for start, end in zip(cu, cu[1:]):
            chunk = (end - start) // (2 * cp)
            base = start // cp  # local offset of this sequence's two chunks (earlier sequences hold start/cp rows)
            for slot in range(2):
                head_pos.extend(base + slot * chunk + i for i in range(min(reach, chunk)))
        heads = x[head_pos].contiguous()  # (n_heads, ...)
        gathered = [torch.empty_like(heads) for _ in range(cp)]
        dist.all_gather(gathered, heads, group=cp_group)
        head_rows = [local_global_rows(cu, cp, r) for r in range(cp)]
        avail_rows = local + [head_rows[r][p] for r in range(cp) for p in head_pos]
        avail = torch.cat([x] + gathered, dim=0)
    else:
        avail_rows, avail = local, x
    lookup = torch.full((cu[-1] + reach + 1,), -1, dtype=torch.long)
    lookup[torch.tensor(avail_rows, dtype=torch.long)] = torch.arange(len(avail_rows))
    seq_end = sequence_ends(cu)
    rows = torch.tensor(local, dtype=torch.long)
    index = torch.full((len(shifts), len(local)), -1, dtype=torch.long)
    for i, s in enumerate(shifts):
        target = rows + s
        inside = target < seq_end[rows]
        src = lookup[target.clamp(max=lookup.numel() - 1)]
        if bool(((src < 0) & inside).any()):
            raise RuntimeError("halo shift: a needed row is neither local nor in a gathered chunk head")
        index[i, inside] = src[inside]
    return avail, index.to(x.device)


def shift_rows(x: torch.Tensor, shifts: list[int], cu_seqlens: torch.Tensor, cp_group=None) -> torch.Tensor:
    """Shifted copies of local rows. x: (t, ...) local zigzag rows -> (len(shifts), t, ...); 0 past a sequence end."""
    avail, index = gather_shifted(x, shifts, cu_seqlens, cp_group)
    padded = torch.cat([avail, avail.new_zeros(1, *avail.shape[1:])])  # row -1 reads zeros
    return padded[index]
