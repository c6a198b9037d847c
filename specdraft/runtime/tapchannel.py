"""TapChannel: ships the draft's taps from the stages that hold them to the draft's stage, off the schedule.

Each (source rank, draft rank, source chunk) pair gets its own process group, so tap traffic never shares a
communicator (or, on NCCL, a stream) with Megatron's pipeline P2P. Sources isend from forward hooks; the draft
rank posts irecvs into a ring of landing slots, one slot per in-flight microbatch, and waits only when it runs
that microbatch's draft. Messages on one pair group are ordered (NCCL ignores tags), so both sides walk a
microbatch's taps in the same fixed order: embedding, layers ascending, logits.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist


def tap_order(tap) -> tuple[int, int]:
    if tap == "embedding":
        return (0, 0)
    if tap == "logits":
        return (2, 0)
    return (1, int(tap))


@dataclass(frozen=True)
class Incoming:
    tap: object
    src: int
    group: object
    shape: tuple


class TapChannel:
    """One rank's side of every tap route in the plan."""

    def __init__(self, plan: dict, rank: int, *, shapes: dict, dtype: torch.dtype, device: torch.device,
                 blocking: bool = False, audit_dir: Path | None = None):
        self.rank = rank
        self.dtype, self.device = dtype, device
        self.blocking = blocking
        self.slots = max(1, plan["draft"]["landing_slots"])
        self.audit_dir = audit_dir
        self.groups: dict[tuple[int, int, int], object] = {}
        routes = [r for r in plan["tap_routes"] if not r["local"]]
        # Every rank takes part in every new_group call, in the plan's order (a collective requirement).
        for r in routes:
            key = (r["src_rank"], r["dst_rank"], r["src_chunk"])
            if key not in self.groups:
                self.groups[key] = dist.new_group(ranks=sorted({r["src_rank"], r["dst_rank"]}))
        self.outgoing: dict[tuple[int, object], list[tuple[int, object]]] = defaultdict(list)
        incoming = []
        for r in routes:
            group = self.groups[(r["src_rank"], r["dst_rank"], r["src_chunk"])]
            if r["src_rank"] == rank:
                self.outgoing[(r["src_chunk"], r["tap"])].append((r["dst_rank"], group))
            if r["dst_rank"] == rank:
                incoming.append(Incoming(r["tap"], r["src_rank"], group, shapes[r["tap"]]))
        self.incoming = sorted(incoming, key=lambda i: (i.src, tap_order(i.tap)))
        self.local_taps = {r["tap"] for r in plan["tap_routes"] if r["local"] and r["dst_rank"] == rank}
        self.layer_taps = {r["tap"] for r in plan["tap_routes"]
                           if r["src_rank"] == rank and isinstance(r["tap"], int)}
        self.is_draft_rank = rank in plan["draft"]["ranks"]
        self.active = True
        self.current: dict[int, int] = {}
        self.bytes_sent = self.bytes_received = 0
        self._audit: list[dict] = []
        self.begin_step(0)

    # ------------------------------------------------------------------------------------------------ per step
    def begin_step(self, num_microbatches: int) -> None:
        self.num_microbatches = num_microbatches
        self._sends: list = []
        self._captured: set = set()
        self._local: dict[int, dict] = defaultdict(dict)
        self._buffers: dict[int, dict] = {}
        self._works: dict[int, list] = {}
        if self.is_draft_rank:
            # The blocking baseline pre-posts every microbatch: with a blocking send in the source's hook, a
            # receive posted only when the draft runs deadlocks against 1F1B (the draft stage first needs the
            # very activations the blocked source has not sent yet).
            for m in range(num_microbatches if self.blocking else min(self.slots, num_microbatches)):
                self._post(m)

    def end_step(self) -> None:
        """Wait for this rank's sends; every receive must have been consumed."""
        for work, _tensor in self._sends:
            work.wait()
        self._sends = []
        if self._works:
            raise RuntimeError(f"TapChannel: microbatches {sorted(self._works)} were received but never consumed")
        if self.audit_dir is not None and self._audit:
            self.audit_dir.mkdir(parents=True, exist_ok=True)
            with open(self.audit_dir / f"rank-{self.rank:05d}.jsonl", "a", encoding="utf-8") as handle:
                for record in self._audit:
                    handle.write(json.dumps(record) + "\n")
            self._audit = []

    # ------------------------------------------------------------------------------------------------ sources
    def set_microbatch(self, chunk: int, microbatch: int) -> None:
        self.current[chunk] = microbatch

    def hook_layers(self, chunk_module, chunk: int, first_layer: int) -> list:
        """Forward hooks on this chunk's tapped layers; returns the handles."""
        handles = []
        for index, layer in enumerate(chunk_module.decoder.layers):
            tap = first_layer + index
            if tap in self.layer_taps:
                handles.append(layer.register_forward_hook(self._hook(chunk, tap)))
        return handles

    def _hook(self, chunk: int, tap: int):
        def capture(module, inputs, output):
            hidden = output[0] if isinstance(output, tuple) else output  # (t, 1, h) in THD
            self.put(chunk, tap, hidden.detach().flatten(0, 1))
        return capture

    def put(self, chunk: int, tap, tensor: torch.Tensor) -> None:
        """Deliver one tap of the current microbatch: send it on every route, or keep it for the local draft."""
        if not self.active:
            return
        m = self.current.get(chunk, 0)
        if (chunk, m, tap) in self._captured:
            return  # activation recomputation re-runs forward; the tap already went out
        self._captured.add((chunk, m, tap))
        tensor = tensor.contiguous()
        if tap in self.local_taps:
            self._local[m][tap] = tensor
        for dst, group in self.outgoing.get((chunk, tap), ()):
            self._record("sent", m, tap, self.rank, dst, tensor)
            self.bytes_sent += tensor.numel() * tensor.element_size()
            if self.blocking:
                dist.send(tensor, dst=dst, group=group)
            else:
                self._sends.append((dist.isend(tensor, dst=dst, group=group), tensor))

    # ------------------------------------------------------------------------------------------------ the draft
    def _post(self, m: int) -> None:
        buffers, works = {}, []
        for inc in self.incoming:
            buf = torch.empty(inc.shape, dtype=self.dtype, device=self.device)
            buffers[(inc.src, inc.tap)] = buf
            works.append(dist.irecv(buf, src=inc.src, group=inc.group))
        self._buffers[m], self._works[m] = buffers, works

    def receive(self, m: int) -> dict:
        """Every tap of microbatch ``m`` for this draft rank (waits for its landing slot to fill)."""
        if m not in self._works:
            raise RuntimeError(f"TapChannel: microbatch {m} has no landing slot (slots={self.slots})")
        for work in self._works.pop(m):
            work.wait()
        taps = dict(self._local.pop(m, {}))
        for (src, tap), buf in self._buffers.pop(m).items():
            self._record("received", m, tap, src, self.rank, buf)
            self.bytes_received += buf.numel() * buf.element_size()
            taps[tap] = buf
        if not self.blocking and m + self.slots < self.num_microbatches:
            self._post(m + self.slots)  # the slot is free again: land microbatch m + slots in it
        return taps

    def _record(self, kind, m, tap, src, dst, tensor) -> None:
        if self.audit_dir is None:
            return
        digest = hashlib.sha256(tensor.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
        self._audit.append({"kind": kind, "microbatch": m, "tap": tap, "src": src, "dst": dst, "sha256": digest,
                            "shape": list(tensor.shape)})
