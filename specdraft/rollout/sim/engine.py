"""One vLLM-like instance as a fluid continuous-batching process: KV-capped admission, LIFO preemption, speculation.

Between events (a sequence finishes, the KV cache overflows, a request is admitted) the batch is fixed, so the
step time is affine in the batch's total context and the instance advances in closed form (costmodel.steps_*).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Callable

from specdraft.rollout.model.costmodel import KV_WATERMARK, steps_time, steps_within

EPS = 1e-9


class Req:
    """One sample (one response of one prompt) as it moves through an instance."""

    __slots__ = (
        "rid",
        "prompt",
        "sample",
        "step",
        "prompt_len",
        "length",
        "predicted",
        "generated",
        "base",
        "admit_version",
        "first_admit",
        "finish_time",
        "instance",
        "preemptions",
        "minibatch",
        "running",
        "order",
    )

    def __init__(self, rid: int, prompt: int, sample: int, step: int, prompt_len: int, length: int, predicted: float):
        self.rid, self.prompt, self.sample, self.step = rid, prompt, sample, step
        self.prompt_len, self.length, self.predicted = prompt_len, length, predicted
        self.generated = 0.0  # tokens generated so far (kept across preemption: vLLM recomputes their KV)
        self.base = 0.0  # instance progress counter value at which this request had generated nothing
        self.admit_version = -1
        self.first_admit = math.nan
        self.finish_time = math.nan
        self.instance = -1
        self.preemptions = 0
        self.minibatch = -1
        self.running = False
        self.order = 0


class Instance:
    """A tp-GPU instance. ``t`` is when it can next make decode progress (prefill and pauses push it forward)."""

    def __init__(
        self,
        index: int,
        tp: int,
        cost,
        *,
        speculative_mode: str = "auto",
        capacity_tokens: int | None = None,
        prefix_cache: bool = True,
    ):
        self.index, self.tp, self.cost = index, tp, cost
        self.speculative_mode = speculative_mode  # auto: speculate when the cost model says it pays; on; off
        self.max_seqs = cost.max_num_seqs  # vLLM max_num_seqs
        self.cap = capacity_tokens if capacity_tokens is not None else cost.kv_capacity_tokens(tp)
        self.prefix_cache = prefix_cache
        self.t = 0.0
        self.progress = 0.0  # fluid counter: tokens every running sequence has gained since creation
        self.heap: list = []  # (finish threshold on `progress`, order, req)
        self.stack: list[Req] = []  # running requests in admission order (LIFO preemption victim on top)
        self.batch = 0
        self.peak_batch = 0
        self.ksum = 0.0  # sum of (prompt_len - base) over running: total context = ksum + batch * progress
        self.queue: deque[Req] = deque()
        self.speculating = False
        self._prefilled: set[int] = set()  # prompts whose prefix sits in this instance's prefix cache
        self._order = 0
        self.tokens = 0.0  # tokens generated (for conservation checks)
        self.preemptions = 0
        self.prefill_s = 0.0

    # ---- state -----------------------------------------------------------------------------------------
    def context(self) -> float:
        return self.ksum + self.batch * self.progress

    def busy(self, now: float) -> bool:
        return self.batch > 0 or self.t > now + EPS

    def _coeffs(self) -> tuple[float, float, float]:
        """(a, b, tokens per step) for the current batch, deciding speculation for this segment."""
        if self.speculative_mode == "on":
            self.speculating = self.cost.speculative
        elif self.speculative_mode == "off":
            self.speculating = False
        else:
            self.speculating = self.cost.use_speculation(self.tp, self.batch, self.context())
        a, b = self.cost.affine(self.tp, self.batch, self.speculating, self.context())
        return a, b, self.cost.tokens_per_step(self.speculating)

    # ---- time ------------------------------------------------------------------------------------------
    def next_event(self) -> float:
        """Absolute time of the next finish or KV overflow (inf when nothing runs)."""
        if self.batch == 0:
            return math.inf
        while self.heap and not self._live(self.heap[0]):
            heapq.heappop(self.heap)
        a, b, e = self._coeffs()
        steps = max((self.heap[0][0] - self.progress) / e, 0.0)
        growth = self.batch * e
        room = self.cap - self.context()
        if self.batch > 1 and room < growth * steps:  # the cache fills before the next finish: stop, preempt
            steps = max(room / growth, 0.0)
        return self.t + steps_time(a, b, self.context(), growth, steps)

    def advance(self, now: float) -> None:
        """Decode (as a fluid) from ``t`` up to ``now``; a stalled instance (prefill, pause) does not move."""
        if now <= self.t:
            return
        if self.batch:
            a, b, e = self._coeffs()
            n = steps_within(a, b, self.context(), self.batch * e, now - self.t)
            self.progress += n * e
            self.tokens += n * e * self.batch
        self.t = now

    def pause(self, now: float, seconds: float) -> None:
        """Freeze for ``seconds`` from ``now`` (weight sync, colocated training, reconfiguration)."""
        self.advance(now)
        self.t = max(self.t, now) + seconds

    # ---- events ----------------------------------------------------------------------------------------
    def collect(self, now: float) -> list[Req]:
        """Advance to ``now`` and pop every request whose length is reached; preempt on KV overflow."""
        self.advance(now)
        done = []
        while self.heap:
            thr, _, req = self.heap[0]
            if not self._live(self.heap[0]):
                heapq.heappop(self.heap)
                continue
            if thr > self.progress + 1e-6:
                break
            heapq.heappop(self.heap)
            # The fluid may overshoot a threshold by a fraction of a step; book exactly `length` tokens.
            self.tokens -= self.progress - thr
            self._remove(req)
            req.generated = float(req.length)
            req.finish_time = max(now, self.t)
            done.append(req)
        while self.batch > 1 and self.context() >= self.cap - 0.5:
            self._preempt(self.stack[-1])
        return done

    def admit(self, now: float, allowed: Callable[[Req], bool], version: int) -> list[Req]:
        """Admit queued requests in order while they are allowed, fit max_num_seqs and the KV watermark."""
        self.advance(now)
        admitted = []
        prefill = 0.0
        limit = self.cap * (1.0 - KV_WATERMARK)
        while self.queue and self.batch < self.max_seqs:
            req = self.queue[0]
            if not allowed(req):
                break  # head-of-line: the controller releases a request only once its step is open
            need = req.prompt_len + req.generated
            if self.batch and self.context() + need > limit:
                break
            self.queue.popleft()
            cached = self.prefix_cache and req.prompt in self._prefilled and req.generated == 0
            tokens = (0 if cached else req.prompt_len) + req.generated
            prefill += self.cost.prefill(self.tp, tokens)
            self._prefilled.add(req.prompt)
            self._start(req, version)
            if math.isnan(req.first_admit):
                req.first_admit = now
            admitted.append(req)
        if prefill:
            self.prefill_s += prefill
            self.pause(now, prefill)
        return admitted

    @staticmethod
    def _live(entry) -> bool:
        """A heap entry is stale once its request stopped or was re-admitted (preemption) under a new order."""
        return entry[2].running and entry[2].order == entry[1]

    def _start(self, req: Req, version: int) -> None:
        req.base = self.progress - req.generated
        req.running = True
        req.instance = self.index
        if req.admit_version < 0:
            req.admit_version = version
        self._order += 1
        req.order = self._order
        heapq.heappush(self.heap, (req.base + req.length, self._order, req))
        self.stack.append(req)
        self.batch += 1
        self.peak_batch = max(self.peak_batch, self.batch)
        self.ksum += req.prompt_len - req.base

    def _remove(self, req: Req) -> None:
        req.running = False
        self.batch -= 1
        self.ksum -= req.prompt_len - req.base
        self.stack.remove(req)
        if self.batch == 0:
            self.ksum = 0.0  # drop accumulated float error

    def _preempt(self, req: Req) -> None:
        """vLLM's recompute preemption: drop the newest request's KV; it re-queues first with its tokens kept."""
        req.generated = min(self.progress - req.base, float(req.length))
        self._remove(req)
        req.preemptions += 1
        self.preemptions += 1
        self.queue.appendleft(req)

    def evict(self, now: float) -> None:
        """Drop every running request's KV (vLLM sleep mode frees the cache for colocated training)."""
        self.advance(now)
        for req in reversed(list(self.stack)):
            self._preempt(req)
        self._prefilled.clear()

    # ---- reconfiguration (adaptive TP) -----------------------------------------------------------------
    def drain(self, now: float) -> tuple[list[Req], list[Req]]:
        """Stop at ``now`` and hand back (running requests with their progress, queued requests)."""
        self.advance(now)
        running = list(self.stack)
        for req in running:
            req.generated = min(self.progress - req.base, float(req.length))
            self._remove(req)
        self.heap.clear()
        queued = list(self.queue)
        self.queue.clear()
        return running, queued

    def adopt(self, running: list[Req], queued: list[Req], version: int) -> None:
        """Take over requests whose KV has been moved here (migrated or recomputed by the caller)."""
        for req in running:
            self._start(req, version)
        self.queue.extend(queued)
