"""Time spent on the device by a region of the step (the draft's compute): CUDA events on GPU, where the host only
queues kernels and a host clock would measure the queueing, the host clock on CPU. Read once per step, after the
step's own synchronisation, so timing adds no host sync inside the step."""

from __future__ import annotations

import time

import torch


class DeviceTimer:
    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"
        self.reset()

    def reset(self) -> None:
        self._pairs: list = []  # CUDA: (start event, stop event) per region
        self._host_s = 0.0

    def start(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def stop(self, started) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._pairs.append((started, event))
        else:
            self._host_s += time.perf_counter() - started

    def seconds(self) -> float:
        """Total of the regions since reset (CUDA: waits for the last region's stop event)."""
        if not self.cuda:
            return self._host_s
        if self._pairs:
            self._pairs[-1][1].synchronize()
        return sum(a.elapsed_time(b) for a, b in self._pairs) / 1000.0
