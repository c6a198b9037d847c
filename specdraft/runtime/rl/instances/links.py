"""The refit's transport between one sending trainer rank and one rollout instance's engine.

A vLLM engine runs in its own process (and its tensor-parallel workers in theirs), outside the trainer's world, so
each (sender, instance) pair gets a process group of its own: the sender is rank 0 and the instance's tp workers
ranks 1..tp, rendezvousing on a TCPStore the sender hosts (one store per sender, a key prefix per instance), and
every bucket is one broadcast from the sender. On CPU that group is gloo (ProcessGroupGloo); on CUDA it is NCCL
through vLLM's StatelessProcessGroup and PyNcclCommunicator, as NeMo-RL's refit does, except for a sender that shares
a GPU with the instance (colocated), which NCCL refuses to put twice in one communicator: that pair stages its
buckets through host memory over gloo. The built-in engine lives in its lead rank's own process: there the
trainer's own world carries the buckets (one send/recv each), and the lead's own slices need no transfer at all.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
import torch.distributed as dist

from specdraft.runtime.rl.instances.buckets import Assembler, Bucket, receive_size

REFIT_TIMEOUT_S = 1800.0  # a pair waits this long for its other end: an engine start and a slow bucket fit in it
KEY_PREFIX = "specdraft-refit"


@dataclass(frozen=True)
class Rendezvous:
    """What a member needs to join one pair's group (picklable: it travels to the engine's workers)."""

    host: str
    port: int
    instance: int
    size: int  # 1 + the instance's tp
    backend: str  # "gloo" or "nccl"


def advertised_host() -> str:
    """This node's address as the other ranks reach it: loopback for a one-node world (MASTER_ADDR local), else the
    address of the interface that routes to MASTER_ADDR (no packet is sent)."""
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    if master in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((master, int(os.environ.get("MASTER_PORT", "29500"))))
        return str(s.getsockname()[0])


def host_store() -> tuple[dist.TCPStore, str, int]:
    """A TCPStore served by this (sending) rank on a free port: (store, host, port)."""
    host = advertised_host()
    timeout = datetime.timedelta(seconds=REFIT_TIMEOUT_S)
    store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timeout)
    return store, host, int(store.port)


class PairGroup:
    """One pair's process group: ``rank`` 0 the sender, 1..tp the engine's workers; broadcast from rank 0."""

    def __init__(self, rv: Rendezvous, rank: int, device, store: dist.Store | None = None):
        timeout = datetime.timedelta(seconds=REFIT_TIMEOUT_S)
        if store is None:  # an engine worker: a client of the sender's store
            store = dist.TCPStore(rv.host, rv.port, is_master=False, timeout=timeout)
        self.store = store
        prefixed = dist.PrefixStore(f"{KEY_PREFIX}/{rv.instance}", store)
        self.backend = rv.backend
        self.device = torch.device(device) if rv.backend == "nccl" else torch.device("cpu")
        if rv.backend == "nccl":
            from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
            from vllm.distributed.utils import StatelessProcessGroup

            group = StatelessProcessGroup(rank=rank, world_size=rv.size, store=prefixed)
            self.comm = PyNcclCommunicator(group, device=self.device)
        else:
            self.pg = dist.ProcessGroupGloo(prefixed, rank, rv.size, timeout)

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        """Rank 0's ``tensor`` into every member's ``tensor`` (same byte size everywhere)."""
        if self.backend == "nccl":
            self.comm.broadcast(tensor, src=0, stream=torch.cuda.current_stream())
        else:
            opts = dist.BroadcastOptions()
            opts.rootRank, opts.rootTensor = 0, 0
            self.pg.broadcast([tensor], opts).wait()  # type: ignore[attr-defined]  # the C++ binding's
        return tensor


class WorldLink:
    """The trainer's own world as a pair's transport (the built-in engine in its lead's process): the sender's
    buckets go to the lead by send/recv; when the lead is the sender, its packed bucket is read in place."""

    def __init__(self, sender: int, lead: int, me: int):
        self.sender, self.lead, self.me = sender, lead, me

    def send(self, buffer: torch.Tensor) -> None:
        dist.send(buffer, dst=self.lead)

    def receive(self, buffer: torch.Tensor) -> torch.Tensor:
        dist.recv(buffer, src=self.sender)
        return buffer


def received(
    links: Sequence[tuple[object, Sequence[Bucket]]], device, local=None
) -> Iterator[tuple[str, torch.Tensor]]:
    """The engine side of one refit: each link's buckets in order (a PairGroup's broadcast, a WorldLink's recv, or
    ``local(bucket)`` for a link that is None: the receiver's own packed bucket), assembled into whole HF tensors,
    each yielded as it completes. One receive buffer of the largest bucket, reused."""
    assembler = Assembler(device)
    size = max((receive_size(buckets) for _, buckets in links), default=0)
    buffers: dict[torch.device, torch.Tensor] = {}

    def buffer_on(where: torch.device, nbytes: int) -> torch.Tensor:
        if where not in buffers:
            buffers[where] = torch.empty(size, dtype=torch.uint8, device=where)
        return buffers[where][:nbytes]

    for link, buckets in links:
        for bucket in buckets:
            if link is None:
                data = local(bucket)
            elif isinstance(link, PairGroup):
                data = link.broadcast(buffer_on(link.device, bucket.nbytes))
            else:
                assert isinstance(link, WorldLink)
                data = link.receive(buffer_on(torch.device(device), bucket.nbytes))
            yield from assembler.feed(data, bucket)
    assembler.finish()
