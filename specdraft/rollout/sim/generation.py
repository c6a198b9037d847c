"""Synchronous generation of one RL step on a node's GPUs: static TP groups, or adaptive TP driven by the planner.

Every sample is dispatched at t = 0 (longest-processing-time first over the groups, as asp does, or VeRL's equal
shares); the makespan is the last finish. With a planner, check-points every N decode steps may merge groups
(adaptive_tp); `choose_start` picks the start by dry runs on the predicted lengths.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace

from specdraft.rollout.model.costmodel import KV_WATERMARK
from specdraft.rollout.model.workload import Prompt
from specdraft.rollout.schedule.adaptive_tp import Plan, PlannerConfig, group_requests, merge_overhead, plan_node
from specdraft.rollout.schedule.dispatch import even_shares, hint_from_cost, lpt
from specdraft.rollout.sim.engine import Instance, Req
from specdraft.rollout.sim.events import WAKE, EventQueue

DRY_RUN_CHECK_FACTOR = 4  # choose_start's adaptive dry runs check this many times as rarely as the real run


@dataclass(frozen=True)
class GenConfig:
    cost: object
    gpus_per_node: int
    num_nodes: int = 1
    speculative_mode: str = "auto"
    check_every_steps: int = 64  # check-point period, in decode steps of a lone sequence at the starting tp
    planner: PlannerConfig | None = None
    timeline: bool = False
    # Scripted switches instead of the planner: at each (time s, tp), every aligned block of a node becomes one
    # tp group (groups already that wide stay). Used to search switch schedules in hindsight (benchmarks/).
    script: tuple = ()
    # A heterogeneous start instead of uniform tp groups: group sizes in node order (aligned, widest first), with
    # the ``wide_first`` predicted-longest samples on the widest groups and the rest placed sample by sample
    # (longest-processing-time first) on the others. Used to search such starts (benchmarks/rollout_tp_regimes.py).
    start_groups: tuple = ()
    wide_first: int = 0
    # How the samples reach the groups: "lpt" (longest predicted processing time first, as asp), "even" (VeRL's
    # equal contiguous shares in dataloader order, the `verl` baseline) or "round_robin" (whole prompts dealt in
    # turn, the GRPO job's fifo schedule).
    dispatch: str = "lpt"


@dataclass
class GenResult:
    makespan_s: float
    switches: list
    finished: int
    requests: int
    generated_tokens: float
    accounted_tokens: float
    overhead_s: float  # seconds of stall charged to merged groups, summed over switches
    start_tp: int = 0  # the TP every group started at
    timeline: list = field(default_factory=list, repr=False)
    finish_counts: dict = field(default_factory=dict, repr=False)


class _Gen:
    def __init__(self, cfg: GenConfig, prompts: list[Prompt], tp: int):
        self.cfg = cfg
        sizes = tuple(cfg.start_groups) or (tp,) * (cfg.gpus_per_node // tp)
        mixed = cfg.start_groups and (list(sizes) != sorted(sizes, reverse=True) or any(s & (s - 1) for s in sizes))
        if sum(sizes) != cfg.gpus_per_node or mixed:
            # A mixed start of powers of two, widest first, keeps every group an aligned block, as merges assume.
            raise ValueError(
                f"start groups {sizes} must fill a node of {cfg.gpus_per_node} GPUs (a mixed start: "
                "powers of two, widest first)"
            )
        self.start_tp = sizes[0]
        self.insts: dict[int, Instance] = {}
        self.where: dict[int, tuple[int, int]] = {}  # instance id -> (node, offset)
        self.next_id = 0
        for node in range(cfg.num_nodes):
            offset = 0
            for size in sizes:
                self._add(Instance(self.next_id, size, cfg.cost, speculative_mode=cfg.speculative_mode), node, offset)
                offset += size
        self.reqs: list[Req] = []
        order = sorted(self.insts)
        hint = hint_from_cost(cfg.cost, tp, max(1, sum(len(p.lengths) for p in prompts) // max(len(order), 1)))
        if cfg.dispatch not in ("lpt", "even", "round_robin"):
            raise ValueError(f"dispatch {cfg.dispatch!r}: use lpt, even or round_robin")
        if cfg.start_groups:
            self._place_by_sample(prompts, hint)
        elif cfg.dispatch == "round_robin":
            for j, p in enumerate(prompts):
                for s in range(len(p.lengths)):
                    self._queue(order[j % len(order)], p, s)
        elif cfg.dispatch == "even":
            samples = [(p, s) for p in prompts for s in range(len(p.lengths))]  # a prompt's n samples side by side
            for gid, share in zip(order, even_shares(samples, len(order))):
                for p, s in share:
                    self._queue(gid, p, s)
        else:
            for gid, group in zip(order, lpt(prompts, [0.0] * len(order), hint)):
                for p in group:
                    for s in range(len(p.lengths)):
                        self._queue(gid, p, s)
        self.events = EventQueue()
        self.now = 0.0
        self.switches: list = []
        self.overhead = 0.0
        self.done = 0
        self.finish_counts: dict[int, int] = {}
        self.timeline: list = []
        self.retired_tokens = 0.0
        self.period = 0.0  # the planner's check-point period (seconds)

    def _queue(self, gid: int, p: Prompt, s: int) -> None:
        req = Req(len(self.reqs), p.pid, s, p.step, p.prompt_len, p.lengths[s], p.predicted[s])
        self.reqs.append(req)
        self.insts[gid].queue.append(req)

    def _place_by_sample(self, prompts: list[Prompt], hint) -> None:
        """The heterogeneous start's placement: the wide_first predicted-longest samples round-robin on the widest
        groups, the rest longest-processing-time first, sample by sample, on the narrower ones (see GenConfig)."""
        for p in prompts:
            for s, length in enumerate(p.lengths):
                self.reqs.append(Req(len(self.reqs), p.pid, s, p.step, p.prompt_len, length, p.predicted[s]))
        ids = sorted(self.insts, key=lambda g: self.where[g])
        wide = [g for g in ids if self.insts[g].tp == self.start_tp]
        narrow = [g for g in ids if self.insts[g].tp < self.start_tp] or wide
        ranked = sorted(self.reqs, key=lambda r: (-r.predicted, r.rid))
        for j, req in enumerate(ranked[: self.cfg.wide_first]):
            self.insts[wide[j % len(wide)]].queue.append(req)
        loads = [(0.0, g) for g in narrow]
        for req in ranked[self.cfg.wide_first :]:
            load, g = heapq.heappop(loads)
            self.insts[g].queue.append(req)
            heapq.heappush(loads, (load + hint.sample(req.predicted, req.prompt_len) / self.insts[g].tp, g))

    def _add(self, inst: Instance, node: int, offset: int) -> None:
        inst.index = self.next_id
        self.next_id += 1
        self.insts[inst.index] = inst
        self.where[inst.index] = (node, offset)

    def _collect(self, inst: Instance) -> None:
        for req in inst.collect(self.now):
            self.done += 1
            self.finish_counts[req.rid] = self.finish_counts.get(req.rid, 0) + 1
        inst.admit(max(self.now, inst.t), lambda r: True, 0)

    def _snapshot(self) -> None:
        if not self.cfg.timeline:
            return
        gpus = []
        for _gid, inst in sorted(self.insts.items(), key=lambda kv: self.where[kv[0]]):
            gpus.extend([(inst.tp, inst.batch, inst.busy(self.now))] * inst.tp)
        self.timeline.append((self.now, gpus))

    def _handle(self, t: float, kind: str, arg) -> None:
        self.now = t
        if kind == WAKE:
            inst = self.insts[arg]
            self._collect(inst)
            self.events.wake(inst, self.now)
        elif kind == "script":
            self._scripted(arg)
        else:
            self._check()
            if self.done < len(self.reqs):
                self.events.push(t + self.period, "check")
        self._snapshot()

    def run(self) -> GenResult:
        for inst in self.insts.values():
            inst.admit(0.0, lambda r: True, 0)
            self.events.wake(inst, self.now)
        cfg = self.cfg
        if cfg.planner is not None:
            tp0 = next(iter(self.insts.values())).tp
            ctx = self.reqs[0].prompt_len if self.reqs else 1
            self.period = cfg.check_every_steps * cfg.cost.decode_step(tp0, 1, ctx, cfg.cost.speculative)
            self.events.push(self.period, "check")
        for t, tp in cfg.script:
            self.events.push(t, "script", tp)
        self._snapshot()
        total = len(self.reqs)
        self.events.run(self._handle, lambda: self.done >= total)
        if self.done < total:
            raise RuntimeError("generation simulation stalled with unfinished requests; this is a bug")
        return GenResult(
            makespan_s=max(r.finish_time for r in self.reqs) if self.reqs else 0.0,
            switches=self.switches,
            finished=self.done,
            requests=total,
            generated_tokens=self.retired_tokens + sum(i.tokens for i in self.insts.values()),
            accounted_tokens=sum(r.length for r in self.reqs),
            overhead_s=self.overhead,
            start_tp=self.start_tp,
            timeline=self.timeline,
            finish_counts=self.finish_counts,
        )

    def _check(self) -> None:
        cfg = self.cfg
        for inst in list(self.insts.values()):
            self._collect(inst)
            self.events.wake(inst, self.now)
        for node in range(cfg.num_nodes):
            ids = [g for g, (n, _) in self.where.items() if n == node and g in self.insts]
            groups = {g: self.insts[g] for g in ids}
            offsets = {g: self.where[g][1] for g in ids}
            plan = plan_node(cfg.planner, cfg.cost, groups, offsets, cfg.gpus_per_node)
            if plan is None:
                continue
            for offset, size, inside, ov in plan.merges:
                self._merge(node, offset, size, inside, ov, plan)

    def _scripted(self, size: int) -> None:
        """Merge every aligned block of ``size`` GPUs into one group (a scripted switch), charging its overhead."""
        cost = self.cfg.cost
        for inst in list(self.insts.values()):
            self._collect(inst)
            self.events.wake(inst, self.now)
        for node in range(self.cfg.num_nodes):
            for offset in range(0, self.cfg.gpus_per_node, size):
                inside = [
                    g
                    for g, (n, o) in self.where.items()
                    if n == node and g in self.insts and offset <= o < offset + size
                ]
                if not inside or (len(inside) == 1 and self.insts[inside[0]].tp >= size):
                    continue
                if any(self.insts[g].tp > size for g in inside):
                    continue  # scripted switches only merge
                items = [it for g in inside for it in group_requests(self.insts[g])]
                ctx = sum(req.prompt_len + gen for req, gen, _ in items)
                if len(items) > cost.max_num_seqs or ctx > cost.kv_capacity_tokens(size) * (1.0 - KV_WATERMARK):
                    continue  # the same limits the planner keeps: the merged group must hold every request
                ov = merge_overhead(
                    cost,
                    [self.insts[g].tp for g in inside],
                    size,
                    [(req.rid, tp, req.prompt_len + gen) for req, gen, tp in items],
                )
                self._merge(node, offset, size, inside, ov, Plan(math.nan, math.nan, []))

    def _merge(self, node, offset, size, inside, ov, plan) -> None:
        running, queued = [], []
        before = []
        for g in inside:
            inst = self.insts.pop(g)
            self.events.retire(g)
            before.append(
                {
                    "gpus": [offset_gpu for offset_gpu in range(self.where[g][1], self.where[g][1] + inst.tp)],
                    "tp": inst.tp,
                    "running": inst.batch,
                }
            )
            r, q = inst.drain(self.now)
            self.retired_tokens += inst.tokens
            running += r
            queued += q
        merged = Instance(0, size, self.cfg.cost, speculative_mode=self.cfg.speculative_mode)
        merged.t = self.now  # a new group starts its clock at the switch, not at 0
        self._add(merged, node, offset)
        merged.adopt(running, queued, 0)
        merged.pause(self.now, ov.total_s)  # the stall the planner charged: reshard + groups + KV moves
        self.overhead += ov.total_s
        mean_ctx = merged.context() / merged.batch if merged.batch else 0.0
        self.switches.append(
            {
                "time_s": self.now,
                "node": node,
                "from": before,
                "to": {"gpus": list(range(offset, offset + size)), "tp": size, "running": merged.batch},
                "predicted_makespan_s": {"stay": plan.predicted_now_s, "switch": plan.predicted_after_s},
                "overhead_s": {
                    "reshard": ov.reshard_s,
                    "group_setup": ov.group_setup_s,
                    "kv": ov.kv_s,
                    "total": ov.total_s,
                },
                "requests": [{"request": rid, "action": action, "seconds": sec} for rid, action, sec in ov.moves],
                "speculation_below_batch": self.cfg.cost.speculation_threshold(size, mean_ctx or 1.0),
            }
        )
        self.events.wake(merged, self.now)


def simulate_generation(cfg: GenConfig, prompts: list[Prompt], tp: int) -> GenResult:
    """Generate every sample of ``prompts`` on static tp groups (cfg.planner None) or adaptively."""
    return _Gen(cfg, prompts, tp).run()


def choose_start(cfg: GenConfig, prompts: list[Prompt], tps: list[int]) -> tuple[int, bool]:
    """(starting TP, whether to let the planner merge): the candidate whose dry run finishes first.

    The dry run is this same simulation on the predicted lengths (each sample's length set to its prediction), so
    it sees nothing the planner would not. Candidates: every TP static, and every TP with the planner's merges;
    ties go to static, then to the narrower TP. Adaptive dry runs check DRY_RUN_CHECK_FACTOR times as rarely (the
    cost is the planner's, once per check; docs/rollout.md's --check-every sweep moves nothing between 16 and 256
    steps). The choice is as good as the predictions rank the candidates.
    """
    guess = [replace(p, lengths=[max(1, round(x)) for x in p.predicted]) for p in prompts]
    static = replace(cfg, planner=None, timeline=False, script=())
    adaptive = replace(cfg, timeline=False, script=(), check_every_steps=cfg.check_every_steps * DRY_RUN_CHECK_FACTOR)
    runs = []
    for tp in tps:
        runs.append((simulate_generation(static, guess, tp).makespan_s, 0, tp))
        if tp < max(tps):  # the widest TP has nothing left to merge into: its adaptive run is the static one
            runs.append((simulate_generation(adaptive, guess, tp).makespan_s, 1, tp))
    _, merges, tp = min(runs)
    return tp, bool(merges)
