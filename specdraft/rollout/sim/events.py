"""The discrete-event core both rollout simulations run on: a time-ordered event queue and instance wake-ups.

Events are (time, push order, kind, argument): equal times run in the order they were pushed. An instance has at
most one live wake-up (its next finish or KV overflow); rescheduling it, cancelling it or retiring the instance
makes the older wake-ups stale, and `run` drops them unseen.
"""

from __future__ import annotations

import heapq
import math
from typing import Callable

from specdraft.rollout.sim.engine import EPS

WAKE = "inst"  # the kind of an instance wake-up; its argument is the instance index


class EventQueue:
    """Events of one simulation. The owner keeps the clock: `run` hands each live event to its handler."""

    def __init__(self) -> None:
        self._heap: list = []
        self._seq = 0
        self._stamp: dict[int, int] = {}  # instance index -> stamp of its live wake-up

    def push(self, t: float, kind: str, arg=None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, arg))

    def cancel(self, index: int) -> None:
        """Make instance ``index``'s pending wake-up stale (it was paused or evicted)."""
        self._stamp[index] = self._stamp.get(index, 0) + 1

    def retire(self, index: int) -> None:
        """Drop instance ``index`` for good (merged into a wider group): none of its wake-ups will run."""
        self._stamp.pop(index, None)

    def wake(self, inst, now: float) -> None:
        """Replace ``inst``'s wake-up by one at its next finish or KV overflow.

        An idle instance with queued work that is stalled (prefill, pause) looks again when the stall ends; one that
        is not stalled has just been offered its queue, so only a later event (a new policy version) can start it.
        """
        self.cancel(inst.index)
        t = inst.next_event()
        if inst.batch == 0 and inst.t > now + EPS and inst.queue:
            t = inst.t
        if t < math.inf:
            self.push(max(t, inst.t), WAKE, (inst.index, self._stamp[inst.index]))

    def run(self, handle: Callable[[float, str, object], None], done: Callable[[], bool]) -> None:
        """Pop events in order until none is left or ``done()``; each live one goes to ``handle(t, kind, arg)``.

        A wake-up's argument reaches the handler as the instance index.
        """
        while self._heap and not done():
            t, _, kind, arg = heapq.heappop(self._heap)
            if kind == WAKE:
                index, stamp = arg
                if self._stamp.get(index) != stamp:
                    continue
                arg = index
            handle(t, kind, arg)
