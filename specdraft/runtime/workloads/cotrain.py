"""The `cotrain` workload: the target trains under the plan's TP/CP/PP layout on megatron-core's schedule while
the EAGLE-3 draft trains online on the draft stage from taps that TapChannel delivers.

The draft runs inside the last stage's loss function when it sits on the last stage (its backward then rides the
schedule's own backward), else after the schedule. Either way the schedule itself is untouched. Around the steps:
a resume loads a checkpoint first (checkpoint.py), one is saved every training.save_interval steps and after the
last step, and a stop signal is agreed on at each step boundary (preempt.py); every draft.export_interval steps the
draft is published for rollout engines (export.py).
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from specdraft.runtime.context import RankContext

PAUSE_ENV = "SPECDRAFT_STEP_PAUSE_S"  # tests: seconds to idle after each step, so a run outlasts a Slurm time limit


def run(ctx: RankContext) -> dict:
    from specdraft.runtime import cpu_compat
    from specdraft.runtime.serve import export
    from specdraft.runtime.train import checkpoint, preempt
    from specdraft.runtime.train.metrics import StepMetrics
    from specdraft.runtime.train.trainer import CoTrainer

    cpu_compat.apply(ctx.device)
    trainer = CoTrainer(ctx)
    start, resumed = checkpoint.restore(ctx, trainer)
    metrics = StepMetrics(ctx, trainer)
    step = make_step(trainer)
    vote = preempt.StopVote(trainer.device)
    interval = ctx.plan.training.save_interval
    publish_every = ctx.plan.draft.export_interval
    saved = None
    with preempt.graceful():
        for index in range(start, ctx.steps):
            started = time.perf_counter()
            step(index)
            metrics.record(index, time.perf_counter() - started)
            time.sleep(float(os.environ.get(PAUSE_ENV, "0")))
            done = index + 1
            stop = vote.agreed()
            # the last step's weights are always kept (export needs them); save_interval sets the ones before
            if stop is not None or done == ctx.steps or (interval and done % interval == 0):
                saved = checkpoint.save(ctx, trainer, done)
            if publish_every and trainer.cotraining and (done % publish_every == 0 or done == ctx.steps):
                export.publish(ctx, trainer, done)
            if stop is not None:
                return {
                    "steps": done,
                    "final": metrics.last,
                    **resumed,
                    **preempt.stopped(ctx.global_rank, ctx.plan, stop, done, saved, ctx.run_dir),
                }
    dist.barrier()
    return {
        "steps": ctx.steps,
        "final": metrics.last,
        **resumed,
        "checkpoint": str(saved) if saved else None,
        "memory": trainer.state_bytes(),
        "policy_init": trainer.policy_init,
        "draft_init": trainer.draft_init,
        **trainer.data.summary(),
    }


def make_step(trainer):
    """One optimizer step of ``trainer``: the schedule (target + draft when it shares the last stage), the draft
    elsewhere, the taps' completion, both optimizers. Under activations.MEASURE_ENV the first step also counts
    the bytes saved for backward per microbatch (trainer.meter)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from specdraft.runtime.train import activations
    from specdraft.runtime.train.schedule import run_schedule

    forward_backward = get_forward_backward_func()
    measure = activations.requested()

    def step(index: int) -> None:
        trainer.begin_step(index)
        trainer.meter = trainer.new_meter() if measure else None
        run_schedule(trainer, forward_backward)
        trainer.keep_measurement()
        if trainer.device.type == "cuda":
            torch.cuda.synchronize(trainer.device)  # step_time_s is the device's time, not the time to queue it

    return step
