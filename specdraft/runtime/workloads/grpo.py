"""The `grpo` workload (docs/grpo.md): each step, rank 0's rollout engine samples G responses per prompt through the
current draft, rank 0 scores them and broadcasts the result; every rank then trains the policy on NeMo-RL's
clipped loss under the plan's layout (the draft co-trains on the same forward), and the new weights are refit into
every rollout instance's engine by the ranks that hold them (rl/instances; the draft every draft.refit_interval
steps).

The first grpo.sft_steps steps are a supervised warm-up on the task's reference answers (cotrain's loss), the
reference policy is the policy as RL starts; checkpoints, --resume and preemption work as in cotrain. With
grpo.draft_mode: frozen the draft trains in the warm-up only, is refit as it ends, and is then held fixed.
"""

from __future__ import annotations

import json
import os
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from specdraft.runtime.context import RankContext
from specdraft.runtime.workloads.cotrain import PAUSE_ENV

RL_DIR = "rl"  # RUN_DIR/rl/: the HF folders the engine starts from, and rollouts.jsonl
# In a checkpoint saved between two draft refits (draft.refit_interval > 1): the older draft the engine held then.
ENGINE_DRAFT = "engine_draft.safetensors"
SFT_SEED = 0x5F7  # the warm-up's prompt stream, apart from the RL prompts'


def run(ctx: RankContext) -> dict:
    from specdraft.runtime import cpu_compat
    from specdraft.runtime.rl import rewards
    from specdraft.runtime.rl.batch import check_fits
    from specdraft.runtime.rl.metrics import GrpoMetrics
    from specdraft.runtime.rl.prompts import PromptStream
    from specdraft.runtime.rl.tasks import make_task
    from specdraft.runtime.rl.trainer import GrpoTrainer
    from specdraft.runtime.train import checkpoint, preempt

    cpu_compat.apply(ctx.device)
    plan, g = ctx.plan, ctx.plan.grpo
    trainer = GrpoTrainer(ctx)
    task = make_task(g.task, chain=trainer.data, max_new_tokens=g.max_new_tokens)
    stream = PromptStream(task, seed=plan.training.seed, num_per_step=g.num_prompts_per_step)
    samples = g.num_prompts_per_step * g.num_generations_per_prompt
    sft = PromptStream(task, seed=plan.training.seed ^ SFT_SEED, num_per_step=samples)
    check_fits(plan, task, samples)
    score_fn = rewards.resolve(g.reward, task)  # every rank: a refusal (math-verify missing) stops all alike
    trainer.data = stream  # the checkpoint's data position is the prompt stream's
    start, resumed = checkpoint.restore(ctx, trainer)
    metrics = GrpoMetrics(ctx, trainer)
    loop = Loop(ctx, trainer, task, stream, sft, score_fn)
    vote = preempt.StopVote(trainer.device)
    interval = plan.training.save_interval
    saved = None
    try:
        loop.open_engine(start, resumed.get("resumed_from"))
        with preempt.graceful():
            for index in range(start, ctx.steps):
                phase, seconds, rollout = loop.step(index)
                metrics.grpo_record(index, phase, seconds, rollout)
                time.sleep(float(os.environ.get(PAUSE_ENV, "0")))  # tests: a kill's place, before the save
                done = index + 1
                stop = vote.agreed()
                if stop is not None or done == ctx.steps or (interval and done % interval == 0):
                    loop.fetch_engine_draft(done)
                    saved = checkpoint.save(ctx, trainer, done, partial(loop.save_engine_draft, done))
                if stop is not None:
                    return {
                        "steps": done,
                        "final": metrics.last,
                        **resumed,
                        **preempt.stopped(ctx.global_rank, plan, stop, done, saved),
                    }
        dist.barrier()
    finally:
        loop.close()  # after the last collective: closing vLLM in-process tears its distributed state down
    return {
        "steps": ctx.steps,
        "final": metrics.last,
        **resumed,
        "checkpoint": str(saved) if saved else None,
        "memory": trainer.state_bytes(),
        "policy_init": trainer.policy_init,
        "draft_init": trainer.draft_init,
        "task": task.name,
    }


class Loop:
    """One rank's side of the GRPO steps; the engine exists on global rank 0 only."""

    def __init__(self, ctx, trainer, task, stream, sft, score_fn):
        from megatron.core.pipeline_parallel import get_forward_backward_func

        self.ctx, self.trainer, self.task, self.stream, self.sft, self.score_fn = (
            ctx,
            trainer,
            task,
            stream,
            sft,
            score_fn,
        )
        self.plan, self.g = ctx.plan, ctx.plan.grpo
        self.forward_backward = get_forward_backward_func()
        self.instances: Any = None  # rl/instances.Instances, opened by open_engine
        self.engine: Any = None  # instance 0's RolloutEngine, on global rank 0 (its lead)
        self.rank0 = ctx.global_rank == 0
        self.folder = ctx.run_dir / RL_DIR
        # the step of the trainer's draft the engines' draft equals (-1: older), and on rank 0 before a checkpoint
        # the engines' draft when it is older (Instances.held_draft)
        self.engine_draft: dict | None = None
        self.engine_draft_step = -1

    # ------------------------------------------------------------------------------------------------ engine
    def open_engine(self, step: int, resumed_from: str | None = None) -> None:
        """Every rank: the plan's rollout instances (rl/instances), loaded with the current (initial or restored)
        weights; a resume between two draft refits starts them with the older draft the interrupted engines held
        (ENGINE_DRAFT), as they would be. Rank 0 leads instance 0, whose engine generates."""
        from specdraft.runtime.rl.instances import open_instances

        held = None
        path = Path(resumed_from) / ENGINE_DRAFT if resumed_from else None
        if self.plan.draft.enabled and path is not None and path.is_file():
            from safetensors.torch import load_file

            held = load_file(str(path))
        self.instances = open_instances(self.ctx, self.trainer, eos_id=self.task.eos_id, resumed_engine_draft=held)
        self.engine = self.instances.engine if self.rank0 else None
        self.engine_draft_step = -1 if held is not None else step

    def fetch_engine_draft(self, done: int) -> None:
        """Every rank, before a checkpoint: the engines' draft to rank 0 when it is older than the trainer's."""
        self.engine_draft = None
        if self.instances is not None and self.engine_draft_step != done:
            self.engine_draft = self.instances.held_draft()

    def save_engine_draft(self, done: int, folder: Path) -> None:
        """Rank 0, inside checkpoint.save: the engines' draft, when it is older than the trainer's."""
        if self.engine_draft is None or self.engine_draft_step == done:
            return
        from safetensors.torch import save_file

        save_file(self.engine_draft, str(folder / ENGINE_DRAFT))

    def close(self) -> None:
        if self.instances is not None:
            self.instances.close()
            self.instances = self.engine = None

    def refit(self, index: int) -> dict:
        """Every rank: the new weights into every instance; returns the seconds (the slowest instance's)."""
        started = time.perf_counter()
        out = {"policy_refit": max(self.instances.refit_policy().values(), default=0.0), "draft_refit": 0.0}
        every = self.plan.draft.refit_interval
        # a frozen draft's one refit is as the warm-up ends, whatever the interval (it never trains after)
        last_warm = self.g.draft_mode == "frozen" and index == self.g.sft_steps - 1
        if self.plan.draft.enabled and self.trainer.cotraining and ((index + 1) % every == 0 or last_warm):
            if self.plan.rollout_settings.speculative:
                out["draft_refit"] = max(self.instances.refit_draft().values(), default=0.0)
                self.engine_draft_step = index + 1
        out["refit"] = time.perf_counter() - started
        return out

    # ------------------------------------------------------------------------------------------------ one step
    def step(self, index: int) -> tuple[str, dict, dict | None]:
        started = time.perf_counter()
        if index < self.g.sft_steps:
            seconds = self._sft_step(index)
            if index == self.g.sft_steps - 1:
                self.trainer.take_reference()  # RL starts from here
                seconds.update(self.refit(index))
            seconds["step"] = time.perf_counter() - started
            return "sft", seconds, None
        rollout, samples, seconds = self._rollouts(index)
        self._train(index, samples, seconds)
        seconds.update(self.refit(index))
        seconds["step"] = time.perf_counter() - started
        return "grpo", seconds, rollout

    def _sft_step(self, index: int) -> dict:
        from specdraft.runtime.rl.batch import Sample

        started = time.perf_counter()
        samples = [
            Sample(p.tokens, self.task.reference(p)[: self.g.max_new_tokens]) for p in self.sft.step_prompts(index)
        ]
        self.trainer.mode = "sft"
        self._begin(index, samples)
        self._schedule(train=True)
        return {"train": time.perf_counter() - started}

    def _rollouts(self, index: int):
        """Rank 0 generates and scores; every rank gets the samples with their advantages (or the reward error)."""
        from specdraft.runtime.rl import rewards
        from specdraft.runtime.rl.advantages import group_advantages
        from specdraft.runtime.rl.batch import Sample

        prompts = self.stream.step_prompts(index)
        G = self.g.num_generations_per_prompt
        payload: list = [None]
        if self.rank0:
            payload[0] = self._generate_and_score(index, prompts)
        dist.broadcast_object_list(payload, src=0)
        result = payload[0]
        if "error" in result:
            raise rewards.RewardError(*result["error"])
        responses, values = result["responses"], torch.tensor(result["rewards"], dtype=torch.float64)
        adv = group_advantages(
            values, G, normalize=self.g.normalize_rewards, leave_one_out=self.g.use_leave_one_out_baseline
        )
        samples = [Sample(prompts[i // G].tokens, tuple(r), float(a)) for i, (r, a) in enumerate(zip(responses, adv))]
        lengths = [len(r) for r in responses]
        rollout = {
            "reward_mean": float(values.mean()),
            "reward_std": float(values.std(unbiased=False)),
            "response_length": sum(lengths) / len(lengths),
            "finished_fraction": result["finished"],
            "next_prompt": self.stream.next_prompt(index + 1),  # the stream's position after this step
            "engine": result["engine"],
        }
        return rollout, samples, {"generate": result["generate_s"], "score": result["score_s"]}

    def _generate_and_score(self, index: int, prompts) -> dict:
        from specdraft.runtime.rl import rewards

        G = self.g.num_generations_per_prompt
        started = time.perf_counter()
        seed = self.plan.training.seed * 1_000_003 + index
        rollouts, stats = self.engine.generate(
            [p.tokens for p in prompts],
            num_generations=G,
            max_new_tokens=self.g.max_new_tokens,
            temperature=self.g.temperature,
            seed=seed,
        )
        if self.plan.rollout_settings.colocated:
            self.engine.sleep()  # the trainer's turn on the shared GPUs; the refit wakes the engine
        generated = time.perf_counter()
        # prompt-major, each prompt's G responses in the engine's order: the groups the advantages normalise in
        ordered = sorted(range(len(rollouts)), key=lambda i: rollouts[i].prompt_index)
        rollouts = [rollouts[i] for i in ordered]
        try:
            values = rewards.score(self.score_fn, prompts, rollouts, self.g.reward_timeout_s)
        except rewards.RewardError as err:
            self._log(index, {"error": err.message})
            return {"error": (err.message, err.fix)}
        self._log(index, {"rollouts": [[r.prompt_index, list(r.response), v] for r, v in zip(rollouts, values)]})
        return {
            "responses": [r.response for r in rollouts],
            "rewards": values,
            "finished": sum(r.finished for r in rollouts) / len(rollouts),
            "engine": {
                "accept_length": stats.accept_length,
                "acceptance_per_pos": list(stats.acceptance_per_pos),
                "num_generated_tokens": stats.num_generated_tokens,
                "num_target_forwards": stats.num_target_forwards,
                "tokens_per_target_forward": stats.tokens_per_target_forward,
            },
            "generate_s": generated - started,
            "score_s": time.perf_counter() - generated,
        }

    def _log(self, index: int, row: dict) -> None:
        """RUN_DIR/rl/rollouts.jsonl: every step's responses and rewards, or the reward failure."""
        from specdraft.runs import files as runfiles

        fd = runfiles.open_append(self.folder, "rollouts.jsonl")
        with os.fdopen(fd, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"step": index, **row}) + "\n")

    def _train(self, index: int, samples, seconds: dict) -> None:
        started = time.perf_counter()
        t = self.trainer
        self._begin(index, samples)
        t.old_logp = self._logp()
        t.ref_logp = {}
        if t.reference is not None:
            t.swap_reference()
            t.ref_logp = self._logp()
            t.swap_reference()
        t.mode = "grpo"
        self._schedule(train=True)
        seconds["train"] = time.perf_counter() - started

    def _begin(self, index: int, samples) -> None:
        from specdraft.runtime.rl.batch import pack, rows_per_step, sequence_length

        row_tokens = self.plan.parallel.micro_batch_size * self.plan.model.seq_length
        length = sequence_length(self.plan, self.task)
        rows, adv = pack(samples, row_tokens=row_tokens, length=length, num_rows=rows_per_step(self.plan))
        self.trainer.begin_rows(index, rows, adv)

    def _logp(self) -> dict[int, torch.Tensor]:
        """The current parameters' log-probs of every label of this rank's microbatches (last stage; {} elsewhere)."""
        from specdraft.runtime.workloads.cotrain import schedule_pass

        t = self.trainer
        t.mode, t.logp = "logp", {}
        t.set_training(False)
        with torch.no_grad():
            schedule_pass(t, self.forward_backward, forward_only=True)
        t.channel.end_step()
        return t.logp

    def _schedule(self, train: bool) -> None:
        from specdraft.runtime.workloads.cotrain import run_schedule

        self.trainer.set_training(train)
        run_schedule(self.trainer, self.forward_backward)
