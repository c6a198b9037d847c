"""Activation bytes measured in the runtime: the unique storages autograd saves for backward per microbatch, which
plan.memory's activation estimate predicts (tests/support/memory_accuracy.py compares the two)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator

import torch

MEASURE_ENV = "SPECDRAFT_MEASURE_ACTIVATIONS"  # "1": measure the first step (`entry --measure-activations` sets it)
DEBUG_ENV = "SPECDRAFT_ACTIVATIONS_DEBUG"  # "1": also list each storage's shape, dtype, bytes and the saving line
Key = tuple[str, int]  # ("target" or "draft", microbatch index)


def requested() -> bool:
    return os.environ.get(MEASURE_ENV) == "1"


class SavedActivations:
    """Counts the bytes of the distinct storages saved for backward inside `scope(key)`, per key.

    A storage is counted once per key however many views of it are saved (the QKV split, a chunked fc1 output),
    with its whole size, since a view keeps all of it alive. Parameters and buffers are not activations: their
    storages (``exclude``) are never counted. Tensors saved inside a nested scope count for the inner key only
    (torch applies the innermost saved_tensors_hooks).
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = (), debug: bool | None = None):
        self._exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self._storages: dict[Key, dict[int, int]] = {}
        self.debug = os.environ.get(DEBUG_ENV) == "1" if debug is None else debug
        self.listing: dict[Key, list[tuple[tuple[int, ...], str, int, str]]] = {}

    @contextlib.contextmanager
    def scope(self, key: Key) -> Iterator[None]:
        seen = self._storages.setdefault(key, {})
        listing = self.listing.setdefault(key, [])

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            storage = tensor.untyped_storage()
            ptr = storage.data_ptr()
            if ptr not in self._exclude and ptr not in seen:
                seen[ptr] = storage.nbytes()
                if self.debug:
                    listing.append((tuple(tensor.shape), str(tensor.dtype), storage.nbytes(), _caller()))
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            yield

    def bytes(self, key: Key) -> int:
        return sum(self._storages.get(key, {}).values())

    def keys(self) -> list[Key]:
        return list(self._storages)


def _caller() -> str:
    """The innermost frame outside torch itself: the model code line whose op saved the tensor."""
    import traceback

    for frame in reversed(traceback.extract_stack()[:-2]):
        if "/torch/" not in frame.filename or "/torch/nn/modules/" in frame.filename:
            return f"{frame.filename.rsplit('/', 2)[-1]}:{frame.lineno} {frame.line}"
    return "?"
