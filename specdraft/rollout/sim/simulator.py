"""Discrete-event simulation of asynchronous RL rollout: instances, a trainer consuming minibatches, policy lag.

Deterministic for a workload and a schedule. Each rollout instance is an `engine.Instance`; a sample of step s is
released to its instance only while the rollout weights' version v satisfies s <= v + max_policy_lag, so no
trained sample lags more than the bound. A dedicated trainer trains its step's minibatches as they complete; a
colocated one waits for the whole step, then takes every GPU (in-flight KV is dropped) and hands them back.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from specdraft.rollout.model.workload import Workload
from specdraft.rollout.schedule.dispatch import Schedule
from specdraft.rollout.sim.engine import EPS, Instance, Req
from specdraft.rollout.sim.events import WAKE, EventQueue


@dataclass(frozen=True)
class SimConfig:
    """What one simulation run needs besides the workload and the schedule."""

    cost: object  # costmodel.CostModel (or a profile-backed equivalent)
    trainer: object  # trainer.TrainerModel
    num_instances: int
    tp: int
    max_policy_lag: int
    colocated: bool
    trained_steps: int  # steps the trainer completes; the workload holds max_policy_lag more to keep rollout fed
    warmup_steps: int = 1  # steps before the measured window (pipeline fill); see `plan_steps`
    speculative_mode: str = "auto"
    timeline: bool = False  # record utilisation samples for --plot


@dataclass
class RunResult:
    """Raw per-run measurements; metrics.py turns them into the reported figures."""

    iteration_time_s: float
    makespan_s: float
    bubbles: dict
    tokens_per_gpu_s: float
    trainer_idle_s: float
    max_policy_lag: int
    mean_policy_lag: float
    window_s: float
    generated_tokens: float  # what the instances decoded (fluid count)
    accounted_tokens: float  # what the requests hold: finished lengths + progress of the unfinished
    preemptions: int
    step_end: list[float]
    samples: list[Req] = field(repr=False, default_factory=list)
    timeline: dict = field(repr=False, default_factory=dict)


class _Trainer:
    def __init__(self):
        self.step = 0  # the RL step being trained; weights version = steps completed
        self.ready: deque = deque()
        self.left: list[int] = []  # minibatches still to train per step
        self.busy = False
        self.step_end: list[float] = []


class Simulation:
    """One run: build instances, release requests under the lag bound, train minibatches, account bubbles."""

    def __init__(self, cfg: SimConfig, workload: Workload, schedule: Schedule):
        self.cfg = cfg
        self.workload = workload
        self.prompts = {p.pid: p for step in workload for p in step}
        self.instances = [
            Instance(i, cfg.tp, cfg.cost, speculative_mode=cfg.speculative_mode) for i in range(cfg.num_instances)
        ]
        self.reqs: dict[tuple[int, int], Req] = {}
        rid = 0
        for inst, queue in zip(self.instances, schedule.queues):
            for pid in queue:
                p = self.prompts[pid]
                for sample, length in enumerate(p.lengths):
                    req = Req(rid, pid, sample, p.step, p.prompt_len, length, p.predicted[sample])
                    rid += 1
                    self.reqs[(pid, sample)] = req
                    inst.queue.append(req)
        self.mb_left: dict[tuple[int, int], int] = {}
        self.mb_members: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for step, mbs in enumerate(schedule.minibatches):
            for j, members in enumerate(mbs):
                self.mb_members[(step, j)] = members
                self.mb_left[(step, j)] = len(members)
                for key in members:
                    self.reqs[key].minibatch = j
        self.trainer = _Trainer()
        self.trainer.left = [len(m) for m in schedule.minibatches]
        self.version = 0  # rollout weights version
        self.events = EventQueue()
        self.now = 0.0
        self.acc = {"skewness": 0.0, "sorting": 0.0, "padding": 0.0, "train_idle": 0.0}
        self.step_first: dict[int, float] = {}
        self.step_last: dict[int, float] = {}
        self.lags: list[int] = []
        self.trained: list[Req] = []
        self.training_until = -math.inf  # colocated: instances paused while the trainer holds the GPUs
        self.tl: dict = {"t": [], "util": [[] for _ in self.instances], "queue": [], "version": []}

    # ---- admission ---------------------------------------------------------------------------------
    def _allowed(self, req: Req) -> bool:
        return req.step <= self.version + self.cfg.max_policy_lag

    def _admit(self, inst: Instance) -> None:
        if self.now < self.training_until:
            return
        for req in inst.admit(max(self.now, inst.t), self._allowed, self.version):
            self.step_first.setdefault(req.step, self.now)
        self.events.wake(inst, self.now)

    # ---- accounting ----------------------------------------------------------------------------------
    def _account(self, t: float) -> None:
        """Book [now, t) into the bubbles (docs/rollout.md): an idle rollout GPU is skewness while any instance
        still generates, sorting when none does (all wait on the trainer); an idle dedicated trainer is sorting."""
        dt = t - self.now
        if dt <= 0:
            return
        tr = self.trainer
        in_window = self.cfg.warmup_steps <= tr.step < self.cfg.trained_steps
        if in_window:
            paused = self.now < self.training_until
            busy = [inst.busy(self.now) for inst in self.instances]
            if not paused:
                any_busy = any(busy)
                idle_gpus = sum(self.cfg.tp for b in busy if not b)
                self.acc["skewness" if any_busy else "sorting"] += idle_gpus * dt
                if not self.cfg.colocated and not tr.busy:
                    self.acc["sorting"] += self.cfg.trainer.gpus * dt
            if not tr.busy:
                self.acc["train_idle"] += dt
        if self.cfg.timeline:
            self._sample_timeline(t)
        self.now = t

    def _sample_timeline(self, t: float) -> None:
        tl = self.tl
        tl["t"].append(self.now)
        for inst, col in zip(self.instances, tl["util"]):
            paused = self.now < self.training_until
            # Raw running batch; -1 while colocated training holds the GPUs (plot.py normalises).
            col.append(-1.0 if paused else float(inst.batch))
        tl["queue"].append(len(self.trainer.ready))
        tl["version"].append(self.version)

    # ---- trainer -------------------------------------------------------------------------------------
    def _on_finish(self, req: Req) -> None:
        self.step_last[req.step] = max(self.step_last.get(req.step, 0.0), req.finish_time)
        key = (req.step, req.minibatch)
        self.mb_left[key] -= 1
        if self.mb_left[key] == 0 and req.step < self.cfg.trained_steps:
            self.trainer.ready.append(key)
            self._maybe_train()

    def _maybe_train(self) -> None:
        tr = self.trainer
        if tr.busy or tr.step >= self.cfg.trained_steps:
            return
        mine = [k for k in tr.ready if k[0] == tr.step]
        if not mine:
            return
        if self.cfg.colocated:
            if len(mine) < tr.left[tr.step]:
                return  # colocated: train a whole step at once, pausing every instance (one switch per step)
            total, pad = 0.0, 0.0
            for key in mine:
                t, p = self._mb_cost(key)
                total, pad = total + t, pad + p
            for key in mine:
                tr.ready.remove(key)
            duration = total + self.cfg.trainer.sync_s
            self.training_until = self.now + duration
            for inst in self.instances:
                # Training needs the HBM: in-flight requests lose their KV and recompute it on resume.
                inst.evict(self.now)
                inst.pause(self.now, duration)
                self.events.cancel(inst.index)
            tr.busy = True
            self.events.push(self.now + duration, "trained", (tr.step, len(mine), pad))
            return
        key = mine[0]
        tr.ready.remove(key)
        t, pad = self._mb_cost(key)
        tr.busy = True
        self.events.push(self.now + t, "trained", (tr.step, 1, pad))

    def _mb_cost(self, key) -> tuple[float, float]:
        seqs = []
        for member in self.mb_members[key]:
            req = self.reqs[member]
            seqs.append(req.prompt_len + req.length)
            self.lags.append(self.trainer.step - req.admit_version)
            self.trained.append(req)
        return self.cfg.trainer.minibatch(seqs)

    def _on_trained(self, step: int, count: int, pad: float) -> None:
        tr = self.trainer
        tr.busy = False
        if self.cfg.warmup_steps <= tr.step < self.cfg.trained_steps:
            self.acc["padding"] += pad
        tr.left[step] -= count
        if tr.left[step] == 0:
            tr.step_end.append(self.now)
            tr.step += 1
            if self.cfg.colocated:
                self._set_version(tr.step)
            else:
                sync = self.cfg.trainer.sync_s
                for inst in self.instances:
                    inst.pause(self.now, sync)
                self.events.push(self.now + sync, "synced", tr.step)
        if self.cfg.colocated:
            for inst in self.instances:
                self._admit(inst)
        self._maybe_train()

    def _set_version(self, version: int) -> None:
        self.version = version
        for inst in self.instances:
            self._admit(inst)

    # ---- main loop -----------------------------------------------------------------------------------
    def _handle(self, t: float, kind: str, arg) -> None:
        self._account(t)
        if kind == WAKE:
            inst = self.instances[arg]
            for req in inst.collect(self.now):
                self._on_finish(req)
            self._admit(inst)
        elif kind == "trained":
            self._on_trained(*arg)
        elif kind == "synced":
            self._set_version(arg)

    def run(self) -> RunResult:
        for inst in self.instances:
            self._admit(inst)
        tr = self.trainer
        self.events.run(self._handle, lambda: tr.step >= self.cfg.trained_steps)
        if tr.step < self.cfg.trained_steps:
            raise RuntimeError("rollout simulation stalled before the trainer finished; this is a bug")
        return self._result()

    def _accounted_tokens(self) -> float:
        total = 0.0
        for req in self.reqs.values():
            if not math.isnan(req.finish_time):
                total += req.length
            elif req.running:
                total += self.instances[req.instance].progress - req.base
            else:
                total += req.generated
        return total

    def _result(self) -> RunResult:
        cfg, tr = self.cfg, self.trainer
        end = tr.step_end
        warm = cfg.warmup_steps
        start = end[warm - 1] if warm >= 1 else 0.0
        window = end[-1] - start
        measured = len(end) - warm
        iteration = window / measured
        rollout_gpus = cfg.num_instances * cfg.tp
        total_gpus = rollout_gpus if cfg.colocated else rollout_gpus + cfg.trainer.gpus
        denom = max(total_gpus * window, EPS)
        trained_window = [r for r in self.trained if r.step >= warm]
        tokens = sum(r.length for r in trained_window)
        makespans = [
            self.step_last[s] - self.step_first[s]
            for s in range(cfg.trained_steps)
            if s in self.step_first and s in self.step_last
        ]
        lags = self.lags
        return RunResult(
            iteration_time_s=iteration,
            makespan_s=sum(makespans) / len(makespans) if makespans else math.nan,
            bubbles={k: self.acc[k] / denom for k in ("padding", "skewness", "sorting")},
            tokens_per_gpu_s=tokens / max(rollout_gpus * window, EPS),
            trainer_idle_s=self.acc["train_idle"] / measured,
            max_policy_lag=max(lags) if lags else 0,
            mean_policy_lag=sum(lags) / len(lags) if lags else 0.0,
            window_s=window,
            generated_tokens=sum(inst.tokens for inst in self.instances),
            accounted_tokens=self._accounted_tokens(),
            preemptions=sum(inst.preemptions for inst in self.instances),
            step_end=list(end),
            samples=list(self.reqs.values()),
            timeline=self.tl if cfg.timeline else {},
        )


def plan_steps(measured: int, max_policy_lag: int) -> tuple[int, int]:
    """(steps to train, warm-up steps): the window spans whole periods of lag+1 steps after lag+1 warm-up steps.

    With lag L the rollout runs up to L+1 steps at once, so the pipeline repeats every L+1 steps; measuring whole
    periods after the first one keeps the fill and the period phase out of the mean.
    """
    period = max_policy_lag + 1
    periods = max(1, -(-measured // period))
    return period * (periods + 1), period


def simulate(cfg: SimConfig, workload: Workload, schedule: Schedule) -> RunResult:
    """Run one simulation (see `Simulation`)."""
    return Simulation(cfg, workload, schedule).run()
