"""The flat byte buffer (runtime/rl/flat.py, read back as views): tensors of mixed dtypes
and odd byte sizes come back equal, each at an aligned offset, so a uint8 tensor before a float32 one cannot break
the float32 view."""

from __future__ import annotations

import torch

from specdraft.runtime.rl.flat import ALIGN, pack, views


def test_mixed_dtypes_round_trip_through_one_aligned_buffer():
    tensors = [
        torch.arange(3, dtype=torch.uint8),
        torch.randn(2, 3),
        torch.randn(5).to(torch.bfloat16),
        torch.tensor([True, False, True]),
        torch.randn(4, 2, dtype=torch.float64)[:, 0],  # not contiguous
    ]
    buffer = pack(tensors, "cpu")
    assert buffer.dtype == torch.uint8 and buffer.numel() % ALIGN == 0
    back = list(views(buffer, [(tuple(t.shape), t.dtype) for t in tensors]))
    assert len(back) == len(tensors)
    for got, want in zip(back, tensors):
        assert got.dtype == want.dtype and got.equal(want)
    assert pack([], "cpu").numel() == 0
