"""TapChannel: ships the draft's taps from the stages that hold them to the draft's stage, off the schedule.

Each (source rank, draft rank, source chunk) pair gets its own process group, so tap traffic never shares a
communicator (or, on NCCL, a stream) with Megatron's pipeline P2P. Forward hooks collect a microbatch's taps;
when the chunk's forward returns they leave as ONE isend per pair (the logits, produced later by the loss, as a
second). The draft rank posts irecvs into a ring of landing slots, one per in-flight microbatch, and waits only
when it runs that microbatch's draft. Messages on one pair group are matched in order (NCCL ignores tags), so
both sides lay a message out identically: embedding, then layers ascending; logits alone.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from specdraft.plan.model import LaunchPlan
from specdraft.runs import files as runfiles


def tap_order(tap) -> tuple[int, int]:
    return (0, 0) if tap == "embedding" else (2, 0) if tap == "logits" else (1, int(tap))


@dataclass(frozen=True)
class Message:
    """What one pair group carries per microbatch: these taps, flattened and concatenated in this order."""

    src: int
    group: object
    taps: tuple


class TapChannel:
    """One rank's side of every tap route in the plan."""

    def __init__(
        self,
        plan: LaunchPlan,
        rank: int,
        *,
        shape,
        dtype: torch.dtype,
        device: torch.device,
        blocking: bool = False,
        synthetic: bool = False,
        audit_dir: Path | None = None,
    ):
        self.rank = rank
        # shape(tap, microbatch) -> the tap's tensor shape (the embedding tap's row count varies with the data).
        self.dtype, self.device, self.shape = dtype, device, shape
        self.blocking = blocking
        # Benchmark control: nothing travels and the draft gets random taps of the right shapes ("equal work").
        self.synthetic = synthetic
        self.slots = max(1, plan.draft.landing_slots)
        self.audit_dir = audit_dir
        groups: dict[tuple[int, int, int], object] = {}
        routes = [r for r in plan.tap_routes if not r.local]
        # Every rank takes part in every new_group call, in the plan's order (a collective requirement).
        for r in routes:
            key = (r.src_rank, r.dst_rank, r.src_chunk)
            if key not in groups:
                groups[key] = dist.new_group(ranks=sorted({r.src_rank, r.dst_rank}))
        self.outgoing: dict[tuple[int, object], list[tuple[int, object]]] = defaultdict(list)
        inbound: dict[tuple[int, int, bool], list] = defaultdict(list)
        for r in routes:
            group = groups[(r.src_rank, r.dst_rank, r.src_chunk)]
            if r.src_rank == rank:
                self.outgoing[(r.src_chunk, r.tap)].append((r.dst_rank, group))
            if r.dst_rank == rank:
                inbound[(r.src_rank, r.src_chunk, r.tap == "logits")].append((r.tap, group))
        self.messages = []
        for (src, _chunk, _logits), taps in sorted(inbound.items()):
            taps.sort(key=lambda item: tap_order(item[0]))
            self.messages.append(Message(src=src, group=taps[0][1], taps=tuple(t for t, _ in taps)))
        self.local_taps = {r.tap for r in plan.tap_routes if r.local and r.dst_rank == rank}
        self.layer_taps = {r.tap for r in plan.tap_routes if r.src_rank == rank and isinstance(r.tap, int)}
        self.is_draft_rank = rank in plan.draft.ranks
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
        self._pending: dict[tuple[int, int, object], list] = defaultdict(list)
        self._local: dict[int, dict] = defaultdict(dict)
        self._buffers: dict[int, list] = {}
        self._works: dict[int, list] = {}
        if self.is_draft_rank and not self.synthetic:
            # The blocking baseline pre-posts every microbatch: with a blocking send in the source's forward, a
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
            fd = runfiles.open_append(self.audit_dir, f"rank-{self.rank:05d}.jsonl")  # no link followed
            with os.fdopen(fd, "a", encoding="utf-8") as handle:
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
        """Take one tap of the current microbatch: keep it for a local draft and queue it for every route."""
        if not self.active or self.synthetic:
            return
        m = self.current.get(chunk, 0)
        if (chunk, m, tap) in self._captured:
            return  # activation recomputation re-runs forward; the tap already went out
        self._captured.add((chunk, m, tap))
        if tap in self.local_taps:
            self._local[m][tap] = tensor
        for dst, group in self.outgoing.get((chunk, tap), ()):
            self._record("sent", m, tap, self.rank, dst, tensor)
            self._pending[(chunk, dst, group)].append((tap_order(tap), tensor))
        if tap == "logits":
            self.flush(chunk)  # produced by the loss, after the chunk's forward: a message of its own

    def flush(self, chunk: int) -> None:
        """Send what this chunk's forward queued: one message per destination (called after the forward)."""
        for c, dst, group in [key for key in self._pending if key[0] == chunk]:
            parts = sorted(self._pending.pop((c, dst, group)), key=lambda item: item[0])
            flat = torch.cat([t.reshape(-1) for _, t in parts]).to(self.dtype)
            self.bytes_sent += flat.numel() * flat.element_size()
            if self.blocking:
                dist.send(flat, dst=dst, group=group)
            else:
                self._sends.append((dist.isend(flat, dst=dst, group=group), flat))

    # ------------------------------------------------------------------------------------------------ the draft
    def _post(self, m: int) -> None:
        buffers, works = [], []
        for msg in self.messages:
            numel = sum(math.prod(self.shape(tap, m)) for tap in msg.taps)
            buf = torch.empty(numel, dtype=self.dtype, device=self.device)
            buffers.append((msg, buf))
            works.append(dist.irecv(buf, src=msg.src, group=msg.group))
        self._buffers[m], self._works[m] = buffers, works

    def receive(self, m: int) -> dict:
        """Every tap of microbatch ``m`` for this draft rank (waits for its landing slot to fill)."""
        if self.synthetic:
            # Random normals, not zeros: all-zero inputs make the draft's arithmetic itself cheaper on CPU.
            g = torch.Generator(device=self.device).manual_seed(m)
            return {
                tap: torch.randn(self.shape(tap, m), generator=g, dtype=self.dtype, device=self.device)
                for tap in {*self.local_taps, *(t for msg in self.messages for t in msg.taps)}
            }
        if m not in self._works:
            raise RuntimeError(f"TapChannel: microbatch {m} has no landing slot (slots={self.slots})")
        for work in self._works.pop(m):
            work.wait()
        taps = dict(self._local.pop(m, {}))
        for msg, buf in self._buffers.pop(m):
            self.bytes_received += buf.numel() * buf.element_size()
            offset = 0
            for tap in msg.taps:
                shape = self.shape(tap, m)
                n = math.prod(shape)
                taps[tap] = buf[offset : offset + n].view(shape)
                offset += n
                self._record("received", m, tap, msg.src, self.rank, taps[tap])
        if not self.blocking and m + self.slots < self.num_microbatches:
            self._post(m + self.slots)  # the slot is free again: land microbatch m + slots in it
        return taps

    def _record(self, kind, m, tap, src, dst, tensor) -> None:
        if self.audit_dir is None:
            return
        digest = hashlib.sha256(tensor.detach().to(self.dtype).cpu().contiguous().numpy().tobytes()).hexdigest()
        self._audit.append(
            {
                "kind": kind,
                "microbatch": m,
                "tap": tap,
                "src": src,
                "dst": dst,
                "sha256": digest,
                "shape": list(tensor.shape),
            }
        )
