"""Refit a vLLM engine opened by hand from named tensors held in the test process, through the same path the
trainer ranks use (runtime/rl/instances: flat buckets broadcast over a gloo group of this process and the engine's
workers, hosted on a TCPStore here), so engine-level tests need no trainer."""

from __future__ import annotations

import torch

from specdraft.runtime.rl.instances.buckets import Packer, layout
from specdraft.runtime.rl.instances.links import PairGroup, Rendezvous, host_store
from specdraft.runtime.rl.instances.sources import whole_slices


class Pusher:
    """One sender (this process) joined to ``engine``'s refit groups, with the layouts of ``shapes`` (policy and
    draft tensors as {name: tensor}: only their names, shapes and dtypes are used here)."""

    def __init__(self, engine, shapes: dict[str, dict[str, torch.Tensor]], bound: int = 1 << 16, tp: int = 1):
        self.bound = bound
        self.layouts = {which: layout(whole_slices(named), bound)[0] for which, named in shapes.items()}
        self.store, host, port = host_store()
        rv = Rendezvous(host, port, 0, 1 + tp, "gloo")
        self.engine = engine
        engine.begin("connect", [(rv, {w: self.layouts.get(w, []) for w in ("policy", "draft")})])
        self.group = PairGroup(rv, 0, "cpu", store=self.store)
        engine.end("connect")
        self.packer = Packer("cpu")

    def push(self, which: str, named: dict[str, torch.Tensor]) -> float:
        """The engine's seconds for one refit of ``named`` (the shapes it was laid out for)."""
        buckets, sources = layout(whole_slices(named), self.bound)
        assert buckets == self.layouts[which], "the tensors must have the shapes the pusher was made with"
        self.engine.begin("receive", which)
        for bucket, source in zip(buckets, sources):
            self.group.broadcast(self.packer.pack(bucket, source))
        return self.engine.end("receive")
