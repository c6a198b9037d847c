"""The `grpo` workload (docs/grpo.md): GRPO on the run's prompts (a prompt file rendered with the checkpoint's chat
template, or a built-in task) with one rollout engine per planned instance, a schedule that dispatches each step's
prompt groups to them, rewards on the decoded text, NeMo-RL's clipped loss under the plan's layout (the draft
co-trains on the same forward), and every instance refit after each update (runtime/rl/loop.py has the phases).

Checkpoints, --resume and preemption work as in cotrain; a checkpoint also holds the length predictions the asp
schedule dispatches by, and the older draft the engines held when it was saved between two draft refits.
"""

from __future__ import annotations

import json
import os
import time
from functools import partial
from pathlib import Path

import torch.distributed as dist

from specdraft.errors import UserError
from specdraft.runtime.context import RankContext
from specdraft.runtime.workloads.cotrain import PAUSE_ENV

# In a checkpoint: the older draft the engines held when it was saved between two draft refits; and the length
# predictor's state (rollout.schedule: asp dispatches by it).
ENGINE_DRAFT = "engine_draft.safetensors"
PREDICTOR = "prompt_lengths.json"
MAX_PREDICTOR_BYTES = 256 << 20


def prompt_source(ctx: RankContext):
    """The run's prompts: the prompt file entry.py tokenised before any collective, or the built-in task."""
    from specdraft.runtime.rl.prompts import FilePrompts, TaskPrompts
    from specdraft.runtime.rl.tasks import make_task
    from specdraft.runtime.train.corpus import load_tokenizer
    from specdraft.runtime.train.data import MarkovData

    plan, g = ctx.plan, ctx.plan.grpo
    if plan.data.path is not None and plan.data.tokenizer is not None:
        if ctx.data is None:
            raise ValueError("the prompt file was not loaded before the workload (runtime.entry loads it)")
        tokenizer = load_tokenizer(plan.data.tokenizer)
        return FilePrompts(
            ctx.data,
            tokenizer,
            seed=plan.data.seed,
            shuffle=plan.data.shuffle,
            num_per_step=g.num_prompts_per_step,
            vocab=plan.model.vocab_size,
        )
    task = make_task(g.task, chain=MarkovData.for_plan(plan), max_new_tokens=g.max_new_tokens)
    return TaskPrompts(task, seed=plan.training.seed, num_per_step=g.num_prompts_per_step, vocab=plan.model.vocab_size)


def run(ctx: RankContext) -> dict:
    from specdraft.runtime import cpu_compat
    from specdraft.runtime.rl import rewards
    from specdraft.runtime.rl.batch import check_fits
    from specdraft.runtime.rl.dispatch import LengthPredictor
    from specdraft.runtime.rl.instances import open_instances
    from specdraft.runtime.rl.loop import GrpoLoop
    from specdraft.runtime.rl.metrics import GrpoMetrics
    from specdraft.runtime.rl.prompts import check_row_fits
    from specdraft.runtime.rl.trainer import GrpoTrainer
    from specdraft.runtime.train import checkpoint, preempt

    cpu_compat.apply(ctx.device)
    plan, g = ctx.plan, ctx.plan.grpo
    if plan.rollout is None:
        raise UserError(
            "the grpo workload runs the plan's rollout instances, but this plan has none (rollout.enabled is false "
            "and the layout's workload is not grpo)",
            "set workload: grpo (or rollout.enabled: true) in the layout",
        )
    source = prompt_source(ctx)
    check_row_fits(plan, source)
    samples = g.num_prompts_per_step * g.num_generations_per_prompt
    check_fits(plan, source.max_prompt_length, samples, f"prompts of up to {source.max_prompt_length} tokens")
    score_fn = rewards.resolve(g.reward, source)  # every rank: a refusal (math-verify missing) stops all alike
    trainer = GrpoTrainer(ctx, source)
    start, resumed = checkpoint.restore(ctx, trainer)
    predictor = LengthPredictor(g.max_new_tokens)
    held = None
    if resumed.get("resumed_from"):
        held = _restore_extras(Path(resumed["resumed_from"]), predictor)
    metrics = GrpoMetrics(ctx, trainer)
    instances = open_instances(ctx, trainer, eos_id=source.eos_id, resumed_engine_draft=held)
    loop = GrpoLoop(ctx, trainer, source, score_fn, instances, predictor)
    loop.engine_draft_step = -1 if held is not None else start
    vote = preempt.StopVote(trainer.device)
    interval = plan.training.save_interval
    saved = None
    try:
        with preempt.graceful():
            for index in range(start, ctx.steps):
                phase, seconds, batch = loop.step(index)
                metrics.grpo_record(index, phase, seconds, batch)
                time.sleep(float(os.environ.get(PAUSE_ENV, "0")))  # tests: a kill's place, before the save
                done = index + 1
                stop = vote.agreed()
                if stop is not None or done == ctx.steps or (interval and done % interval == 0):
                    # every rank: the engines' draft when it is older than the trainer's (a save between refits)
                    held_draft = instances.held_draft() if loop.engine_draft_step != done else None
                    extra = partial(_save_extras, predictor, held_draft)
                    saved = checkpoint.save(ctx, trainer, done, extra)
                if stop is not None:
                    return {
                        "steps": done,
                        "final": metrics.last,
                        **resumed,
                        **preempt.stopped(ctx.global_rank, plan, stop, done, saved),
                    }
        dist.barrier()
    finally:
        instances.close()  # after the last collective: closing vLLM in-process tears its distributed state down
    return {
        "steps": ctx.steps,
        "final": metrics.last,
        **resumed,
        "checkpoint": str(saved) if saved else None,
        "memory": trainer.state_bytes(),
        "policy_init": trainer.policy_init,
        "draft_init": trainer.draft_init,
        **source.summary(),
    }


def _save_extras(predictor, held_draft: dict | None, folder: Path) -> None:
    """Rank 0, inside checkpoint.save: the length predictions, and the engines' draft when older than the
    trainer's (a save between two draft refits; Instances.held_draft gives it on rank 0)."""
    from specdraft.fsutil import atomic_write_text

    atomic_write_text(folder / PREDICTOR, json.dumps(predictor.state()) + "\n", what="length predictions")
    if held_draft is not None:
        from safetensors.torch import save_file

        save_file(held_draft, str(folder / ENGINE_DRAFT))


def _restore_extras(folder: Path, predictor) -> dict | None:
    """Every rank: the checkpoint's length predictions (a checkpoint of an older specdraft has none: the prior
    stands), and the older draft the engines held, if it holds one."""
    from specdraft.runs import files as runfiles

    data = runfiles.read_bytes(folder, PREDICTOR, MAX_PREDICTOR_BYTES)
    if data is not None:
        predictor.load(runfiles.parse_json(data, str(folder / PREDICTOR)))
    held = folder / ENGINE_DRAFT
    if not held.is_file():
        return None
    from safetensors.torch import load_file

    return load_file(str(held))
