"""Per-rank microbatches: a packed global row cut to this rank's zigzag CP shard, plus what the draft needs.

The draft's inputs are all derived from the global row before sharding (shifted token ids, positions p + j,
validity masks), so no CP communication is needed for them; only the target's logits cross ranks (halo.py).
The TTT steps' token streams x_{p+1+j} overlap almost entirely, so stage 0 embeds each needed token once
(`emb_ids`) and the draft rebuilds the S streams with `emb_index` (-1: past the end of the sequence).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdraft.runtime.attention.branch import with_host_values, zigzag_shard
from specdraft.runtime.attention.halo import local_global_rows, sequence_ends
from specdraft.runtime.train.data import Row, shifted


@dataclass
class Microbatch:
    index: int
    tokens: torch.Tensor  # (t,) local
    labels: torch.Tensor  # (t,)
    loss_mask: torch.Tensor  # (t,)
    positions: torch.Tensor  # (t,)
    cu_seqlens: torch.Tensor  # (n+1,) global, int32
    max_seqlen: int
    emb_ids: torch.Tensor  # (n,) the distinct tokens x_{p+1+j} the S streams need, in global row order
    emb_index: torch.Tensor  # (S, t) row of emb_ids feeding step j at local row p; -1 past the sequence end
    draft_positions: torch.Tensor  # (S, t) p + j
    draft_valid: torch.Tensor  # (S, t) 1 where the target row p+1+j has a next token

    def packed_seq_params(self):
        from megatron.core.packed_seq_params import PackedSeqParams

        cu = self.cu_seqlens
        return PackedSeqParams(
            qkv_format="thd",
            cu_seqlens_q=cu,
            cu_seqlens_kv=cu,
            cu_seqlens_q_padded=cu,
            cu_seqlens_kv_padded=cu,
            max_seqlen_q=self.max_seqlen,
            max_seqlen_kv=self.max_seqlen,
        )


def make_microbatch(index: int, row: Row, *, cp: int, cp_rank: int, steps: int, device) -> Microbatch:
    cu = row.cu_seqlens

    def shard(x: torch.Tensor) -> torch.Tensor:
        return zigzag_shard(x, cu, cp, cp_rank, dim=-1).to(device) if cp > 1 else x.to(device)

    emb_ids, emb_index = _embedding_rows(row, cp, cp_rank, steps)
    valid = torch.stack([shifted(row.loss_mask, cu, 1 + j) for j in range(steps)])
    positions = torch.stack([row.positions + j for j in range(steps)])
    lengths = (cu[1:] - cu[:-1]).tolist()
    return Microbatch(
        index=index,
        tokens=shard(row.tokens),
        labels=shard(row.labels),
        loss_mask=shard(row.loss_mask),
        positions=shard(row.positions),
        cu_seqlens=with_host_values(cu.to(device=device, dtype=torch.int32), cu.tolist()),
        max_seqlen=max(lengths),
        emb_ids=emb_ids.to(device),
        emb_index=emb_index.to(device),
        draft_positions=shard(positions),
        draft_valid=shard(valid),
    )


def _embedding_rows(row: Row, cp: int, cp_rank: int, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids to embed once, (S, t) index into them) for the streams x_{p+1+j} of this rank's rows."""
    cu = row.cu_seqlens.tolist()
    local = torch.tensor(local_global_rows(cu, cp, cp_rank), dtype=torch.long)  # (t,) global rows
    seq_end = sequence_ends(cu)
    wanted = torch.stack([local + 1 + j for j in range(steps)])  # (S, t)
    inside = wanted < seq_end[local][None, :]
    needed = torch.unique(wanted[inside])  # sorted global rows
    index = torch.full(wanted.shape, -1, dtype=torch.long)
    index[inside] = torch.searchsorted(needed, wanted[inside])
    return row.tokens[needed], index


def global_counts(rows: list[Row], steps: int) -> tuple[float, list[float]]:
    """Token counts of the whole global batch: target loss tokens, and valid draft positions per TTT step."""
    target = float(sum(r.loss_mask.sum() for r in rows))
    draft = [float(sum(shifted(r.loss_mask, r.cu_seqlens, 1 + j).sum() for r in rows)) for j in range(steps)]
    return target, draft
