"""Slices of safetensors tensors read with pread straight into a rank's parameters: only the bytes of the slice
cross the file boundary (`bytes_read` counts them; so does the kernel's rchar), with no file mapping in memory.

A row range of a tensor is one contiguous read; a column range is one read per row. Where the parameter has the
checkpoint's dtype and lives in host memory the bytes land in it directly; otherwise they pass through a buffer of
at most BLOCK_BYTES and are converted on the copy.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from specdraft.hf_files import ITEMSIZE
from specdraft.runtime.models.hf.checkpoint import CheckpointError, HFCheckpoint
from specdraft.runtime.models.hf.mapping import Piece, Source, piece_shape

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
BLOCK_BYTES = 64 << 20  # the conversion buffer: bounds import memory above the parameters themselves


class Reader:
    """Open shards of one checkpoint; `fill` writes a parameter shard from its Source. Use as a context manager."""

    def __init__(self, checkpoint: HFCheckpoint):
        self.tensors = checkpoint.tensors
        self._fds: dict[Path, int] = {}
        self.bytes_read = 0

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _fd(self, path: Path) -> int:
        if path not in self._fds:
            self._fds[path] = os.open(path, os.O_RDONLY)
        return self._fds[path]

    @torch.no_grad()
    def fill(self, dest: torch.Tensor, source: Source, what: str) -> None:
        """Write ``dest`` (this rank's shard of the megatron parameter ``what``) from ``source``."""
        shapes = [piece_shape(p, self.tensors[p.name].shape) for p in source.pieces]
        rows = sum(s[0] for s in shapes) + source.pad_rows
        tail = {tuple(s[1:]) for s in shapes}
        if rows != dest.shape[0] or any(t != tuple(dest.shape[1:]) for t in tail):
            raise CheckpointError(
                f"parameter {what} has shape {list(dest.shape)} on this rank but its HF slices "
                f"{[p.name for p in source.pieces]} give {rows} rows of {sorted(tail)}",
                "this is a bug in specdraft's HF mapping; report it",
            )
        at = 0
        for piece, shape in zip(source.pieces, shapes):
            self.read(piece, dest.narrow(0, at, shape[0]))
            at += shape[0]
        if source.pad_rows:
            dest.narrow(0, at, source.pad_rows).zero_()

    def read(self, piece: Piece, dest: torch.Tensor) -> None:
        """Read ``piece`` into ``dest`` (its shape), in row blocks of at most BLOCK_BYTES."""
        info = self.tensors[piece.name]
        dtype, size = DTYPES[info.dtype], ITEMSIZE[info.dtype]
        full = info.shape
        row_elems = _numel(full[1:])
        r0, r1 = piece.rows or (0, full[0])
        c0, c1 = piece.cols or (0, row_elems if len(full) < 2 else full[1])
        inner = _numel(full[2:])  # elements per column entry (1 for a matrix)
        width = (c1 - c0) * inner * size  # bytes of one row of the slice
        rows_per_block = max(1, BLOCK_BYTES // max(width, 1))
        direct = dest.device.type == "cpu" and dest.dtype == dtype and dest.is_contiguous()
        fd = self._fd(info.file)
        for b0 in range(0, r1 - r0, rows_per_block):
            n = min(rows_per_block, r1 - r0 - b0)
            target = dest.narrow(0, b0, n)
            buf = target if direct else torch.empty(n * width // size, dtype=dtype)
            raw = buf.view(torch.uint8).numpy().data.cast("B")
            start = info.begin + (r0 + b0) * row_elems * size + c0 * inner * size
            if piece.cols is None or c1 - c0 == full[1]:
                self._pread(fd, raw, start, info.file)
            else:
                stride = row_elems * size
                for i in range(n):
                    self._pread(fd, raw[i * width : (i + 1) * width], start + i * stride, info.file)
            if not direct:
                target.copy_(buf.view(target.shape))

    def _pread(self, fd: int, buf: memoryview, offset: int, path: Path) -> None:
        done = 0
        while done < len(buf):
            got = os.preadv(fd, [buf[done:]], offset + done)
            if got <= 0:
                raise CheckpointError(f"{path} ended at byte {offset + done} inside a tensor", "copy the file again")
            done += got
        self.bytes_read += done


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
