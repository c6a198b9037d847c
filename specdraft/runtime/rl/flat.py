"""One flat byte buffer of tensors of any dtypes, read back as views: one send instead of a pickle per tensor (the
engines' draft copy to rank 0 before a checkpoint, rl/instances/instances.py)."""

from __future__ import annotations

import math
from typing import Iterable, Iterator, Sequence

import torch

ALIGN = 8  # bytes: each tensor starts at a multiple, so a view of any dtype is aligned
# What a receiver needs to read a buffer back: (shape, dtype) per tensor, in packing order.
Spec = tuple[tuple[int, ...], torch.dtype]


def span(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """A tensor's bytes in the flat buffer, padded to ALIGN."""
    return -(-math.prod(shape) * dtype.itemsize // ALIGN) * ALIGN


def num_bytes(specs: Iterable[Spec]) -> int:
    return sum(span(shape, dtype) for shape, dtype in specs)


def pack(tensors: Sequence[torch.Tensor], device) -> torch.Tensor:
    """The buffer of ``tensors`` on ``device``: each one's bytes at its aligned offset."""
    buffer = torch.zeros(num_bytes((tuple(t.shape), t.dtype) for t in tensors), dtype=torch.uint8, device=device)
    at = 0
    for t in tensors:
        data = t.detach().contiguous().reshape(-1).view(torch.uint8)
        buffer[at : at + data.numel()] = data
        at += span(tuple(t.shape), t.dtype)
    return buffer


def views(buffer: torch.Tensor, specs: Iterable[Spec]) -> Iterator[torch.Tensor]:
    """The tensors of a buffer ``pack`` made, as views of it (no copy)."""
    at = 0
    for shape, dtype in specs:
        nbytes = math.prod(shape) * dtype.itemsize
        yield buffer[at : at + nbytes].view(dtype).reshape(shape)
        at += span(shape, dtype)
