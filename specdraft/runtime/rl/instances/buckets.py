"""The refit's flat buckets: a sending rank's slices of HF tensors laid out as buckets of bounded bytes (a slice
bigger than a bucket split by rows), packed one bucket at a time into the one buffer the sender reuses, and, on the
engine's side, whole HF tensors assembled from the pieces as they arrive. The layout (names, shapes, dtypes, rows,
columns, offsets) is exchanged once, when the instances open; a refit then moves only bucket bytes."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import torch

from specdraft.runtime.rl.flat import ALIGN

# slime's default update_weight_buffer_size: large enough that a bucket's fixed cost (one collective) is small
# against its bytes, small enough that the sender's one extra buffer is a sliver of its memory
BUCKET_BYTES = 512 << 20
BUCKET_BYTES_ENV = "SPECDRAFT_REFIT_BUCKET_BYTES"  # tests: a small bound forces many buckets and split slices


def bucket_bound() -> int:
    """The bucket bound in bytes: BUCKET_BYTES, or SPECDRAFT_REFIT_BUCKET_BYTES when set."""
    raw = os.environ.get(BUCKET_BYTES_ENV)
    if raw is None:
        return BUCKET_BYTES
    if not raw.isdigit() or int(raw) < ALIGN:
        raise ValueError(f"{BUCKET_BYTES_ENV}={raw!r}: must be a whole number of bytes >= {ALIGN}")
    return int(raw)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


@dataclass(frozen=True)
class Item:
    """One piece of one HF tensor in a bucket: rows [r0, r1) (dim 0) and columns [c0, c1) (dim 1; None: all) of the
    whole tensor ``shape``, at byte ``offset`` of the bucket."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    rows: tuple[int, int]
    cols: Optional[tuple[int, int]]
    offset: int

    @property
    def piece_shape(self) -> tuple[int, ...]:
        rest = list(self.shape[1:])
        if self.cols is not None:
            rest[0] = self.cols[1] - self.cols[0]
        return (self.rows[1] - self.rows[0], *rest)

    @property
    def nbytes(self) -> int:
        return math.prod(self.piece_shape) * self.dtype.itemsize


@dataclass(frozen=True)
class Bucket:
    """What one transfer carries: ``nbytes`` bytes holding ``items``."""

    nbytes: int
    items: tuple[Item, ...]


@dataclass(frozen=True)
class Slice:
    """A sender's source for one HF slice: rows [r0, r1) and columns ``cols`` of the HF tensor ``name`` (whole shape
    ``shape``) are rows [at, at + r1 - r0) of the local ``tensor``, sent as ``dtype``."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    rows: tuple[int, int]
    cols: Optional[tuple[int, int]]
    tensor: torch.Tensor
    at: int


# Where an item's bytes come from on the sender: (local tensor, its first row, number of rows).
Source = tuple[torch.Tensor, int, int]


def layout(slices: Sequence[Slice], bound: int) -> tuple[list[Bucket], list[list[Source]]]:
    """Buckets of at most ``bound`` bytes (or one row, where a single row is larger) holding ``slices`` in order, and
    per bucket the local sources of its items. A slice that does not fit what is left of a bucket fills it by rows and
    continues in the next."""
    buckets: list[Bucket] = []
    sources: list[list[Source]] = []
    items: list[Item] = []
    here: list[Source] = []
    used = 0

    def close() -> None:
        nonlocal items, here, used
        if items:
            buckets.append(Bucket(used, tuple(items)))
            sources.append(here)
        items, here, used = [], [], 0

    for s in slices:
        width = (s.cols[1] - s.cols[0]) if s.cols is not None else (s.shape[1] if len(s.shape) > 1 else 1)
        row_bytes = width * math.prod(s.shape[2:]) * s.dtype.itemsize
        r0, r1 = s.rows
        while r0 < r1:
            room = bound - used
            rows = min(r1 - r0, room // row_bytes) if row_bytes else r1 - r0
            if rows < 1:
                if items:  # this bucket is full: the rest goes on in the next one
                    close()
                    continue
                rows = 1  # one row larger than the bound travels alone
            items.append(Item(s.name, s.shape, s.dtype, (r0, r0 + rows), s.cols, used))
            here.append((s.tensor, s.at + r0 - s.rows[0], rows))
            used += _aligned(rows * row_bytes)
            r0 += rows
            if used >= bound:
                close()
    close()
    return buckets, sources


class Packer:
    """The sender's one bucket buffer, allocated once at the largest bucket and reused for every bucket of every
    refit; ``allocated`` records each allocation's bytes (a refit test reads it)."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.buffer: torch.Tensor | None = None
        self.allocated: list[int] = []

    def reserve(self, nbytes: int) -> None:
        if self.buffer is None or self.buffer.numel() < nbytes:
            self.buffer = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            self.allocated.append(nbytes)

    @torch.no_grad()
    def pack(self, bucket: Bucket, sources: Sequence[Source]) -> torch.Tensor:
        """The bucket's bytes (a view of the reused buffer): each source's rows, cast to the item's dtype."""
        self.reserve(bucket.nbytes)
        assert self.buffer is not None
        out = self.buffer[: bucket.nbytes]
        for item, (tensor, at, rows) in zip(bucket.items, sources):
            view = out[item.offset : item.offset + item.nbytes].view(item.dtype).view(item.piece_shape)
            view.copy_(tensor.detach().narrow(0, at, rows))  # casts in place: no copy of the slice is made
        return out


class Assembler:
    """The engine side: whole HF tensors filled from bucket pieces, each handed on as soon as its last piece is in
    (vLLM's layerwise reload then processes a layer as soon as its tensors are complete)."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.pending: dict[str, list] = {}  # name -> [tensor, elements filled]

    @torch.no_grad()
    def feed(self, buffer: torch.Tensor, bucket: Bucket) -> Iterator[tuple[str, torch.Tensor]]:
        for item in bucket.items:
            piece = buffer[item.offset : item.offset + item.nbytes].view(item.dtype).view(item.piece_shape)
            entry = self.pending.get(item.name)
            if entry is None:
                entry = self.pending[item.name] = [torch.empty(item.shape, dtype=item.dtype, device=self.device), 0]
            target = entry[0][item.rows[0] : item.rows[1]]
            if item.cols is not None:
                target = target[:, item.cols[0] : item.cols[1]]
            target.copy_(piece)
            entry[1] += piece.numel()
            if entry[1] == entry[0].numel():
                del self.pending[item.name]
                yield item.name, entry[0]

    def finish(self) -> None:
        """Every tensor begun was completed: a missing piece would otherwise leave part of a weight unwritten."""
        if self.pending:
            name, (tensor, filled) = next(iter(self.pending.items()))
            raise ValueError(
                f"refit: {len(self.pending)} tensors arrived incomplete, e.g. {name!r} ({filled} of "
                f"{tensor.numel()} elements): the senders' slices do not cover them"
            )


def receive_size(buckets: Sequence[Bucket]) -> int:
    return max((b.nbytes for b in buckets), default=0)
