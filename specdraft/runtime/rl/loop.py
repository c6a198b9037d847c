"""One GRPO step as phases over a StepBatch: the dispatch places the step's prompt groups on the plan's rollout
instances; each instance's lead generates its share and scores it (the text decoded with the model's tokenizer);
the exchange gives every rank the step's rewards and each rank its own samples' tokens; then the old (and reference)
log-probs, the advantages, the update, and the refit of every instance. The first grpo.sft_steps steps are a
supervised warm-up on the reference answers instead (the draft co-trains in them too).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from specdraft.runtime.rl import drift, exchange, rewards
from specdraft.runtime.rl.advantages import group_advantages
from specdraft.runtime.rl.batch import Sample, pack, rank_samples, sequence_length
from specdraft.runtime.rl.dispatch import LengthPredictor, dispatch
from specdraft.runtime.rl.exchange import Generated
from specdraft.runtime.rl.log import RolloutLog
from specdraft.runtime.rl.speculation import KControl
from specdraft.runtime.rl.step import Phases, StepBatch


class GrpoLoop:
    """Every rank's side of the steps. ``instances`` (instances.Instances) holds the engine on a lead."""

    def __init__(self, ctx, trainer, source, score_fn, instances, predictor: LengthPredictor):
        self.ctx, self.trainer, self.source, self.score_fn = ctx, trainer, source, score_fn
        self.instances, self.predictor = instances, predictor
        self.plan, self.g = ctx.plan, ctx.plan.grpo
        self.rank = ctx.global_rank
        self.leads = [inst.lead for inst in instances.layout]
        self.log = RolloutLog(ctx)
        self.length = sequence_length(self.plan, source.max_prompt_length)
        self.row_tokens = self.plan.parallel.micro_batch_size * self.plan.model.seq_length
        # the ranks of each data-parallel rank: all of them build its rows
        self.dp_of = [r.dp for r in self.plan.ranks]
        self.engine_draft_step = -1  # the trainer step whose draft the engines hold (-1: an older one, resumed)
        self.k_control = KControl(self.plan, len(self.leads))

    # ------------------------------------------------------------------------------------------------ rows
    def _samples(self, num_samples: int, dp: int) -> range:
        return rank_samples(self.plan, self.source.max_prompt_length, num_samples, dp)

    def _train_rows(self, step: int, samples: list[Sample]) -> None:
        rows, adv = pack(samples, row_tokens=self.row_tokens, length=self.length, num_rows=self.plan.num_microbatches)
        self.trainer.begin_rows(step, rows, adv)

    # ------------------------------------------------------------------------------------------------ a step
    def step(self, index: int) -> tuple[str, dict, StepBatch | None]:
        phases = Phases()
        if index < self.g.sft_steps:
            with phases("update"):
                self._sft(index)
            if index == self.g.sft_steps - 1:
                self.trainer.take_reference()  # RL starts from here
                with phases("refit"):
                    refits = self.refit(index, None)
                return "sft", {**phases.seconds, **refits}, None
            return "sft", phases.seconds, None
        batch = self._rl(index, phases)
        with phases("refit"):
            refits = self.refit(index, batch)
        return "grpo", {**phases.seconds, **refits}, batch

    def _sft(self, index: int) -> None:
        count = self.g.num_prompts_per_step * self.g.num_generations_per_prompt
        prompts = self.source.sft_prompts(index, count)
        mine = self._samples(count, self.trainer.dp_rank)
        samples = [Sample(prompts[s].tokens, prompts[s].reference[: self.g.max_new_tokens]) for s in mine]
        self._train_rows(index, samples)
        self.trainer.sft_update()

    def _rl(self, index: int, phases: Phases) -> StepBatch:
        G = self.g.num_generations_per_prompt
        prompts = self.source.step_prompts(index)
        plan_dispatch = dispatch(
            self.plan.rollout_settings.schedule,
            prompts,
            self.predictor,
            num_instances=len(self.leads),
            num_generations=G,
            global_batch_size=self.plan.parallel.global_batch_size,
            first_position=prompts[0].index,
        )
        batch = StepBatch(index, index, prompts, G, plan_dispatch)
        lead_of = self.instances.instance_of_this_rank
        mine = None if lead_of is None else lead_of.index
        figures = None
        with phases("generate"):
            if mine is not None:
                figures = self._generate(batch, mine)
        with phases("score"):
            failure = self._score(batch) if mine is not None else None
        self._stop_on_failure(index, failure)
        with phases("exchange"):
            self._exchange(batch, mine, figures)
        self.log.write(batch)
        self.predictor.observe(
            [p.key for p in prompts],
            batch.lengths.view(len(prompts), G).tolist(),  # type: ignore[union-attr]
        )
        with phases("logprobs"):
            wanted = self._samples(batch.num_samples, self.trainer.dp_rank)
            samples = [
                Sample(batch.prompt_of(s).tokens, batch.responses[s], float(batch.advantages[s]))  # type: ignore
                for s in wanted
            ]
            self._train_rows(index, samples)
            batch.old_logp = self.trainer.logprobs()
            batch.ref_logp = self.trainer.logprobs(reference=True) if self.trainer.reference is not None else {}
        with phases("update"):
            self.trainer.pg_update(batch.old_logp, batch.ref_logp)
        return batch

    def _generate(self, batch: StepBatch, instance: int) -> dict:
        queue = batch.dispatch.queues[instance]
        engine = self.instances.engine
        G = batch.num_generations
        # a prompt's samples draw from its stream position's seed: the same on any instance and under any schedule
        base = self.plan.training.seed * 1_000_003
        self.k_control.apply(engine, instance)
        rollouts, stats = engine.generate(
            [batch.prompts[p].tokens for p in queue],
            num_generations=G,
            max_new_tokens=self.g.max_new_tokens,
            temperature=self.g.temperature,
            seed=[(base + batch.prompts[p].index) * G for p in queue],
        )
        if self.plan.rollout_settings.colocated:
            engine.sleep()  # the trainer's turn on the shared GPUs; the refit wakes the engine
        seen: dict[int, int] = {}
        for r in rollouts:  # each prompt's G responses in the engine's order: the group's generations
            position = queue[r.prompt_index]
            j = seen.get(position, 0)
            seen[position] = j + 1
            batch.generated.append(Generated(position * batch.num_generations + j, r.response, r.finished, 0.0))
        return {
            "samples": len(rollouts),
            "generated_tokens": stats.num_generated_tokens,
            "busy_s": stats.seconds,
            "drafts": stats.num_drafts,
            "draft_tokens": stats.num_draft_tokens,
            "accepted": stats.num_accepted_tokens,
            "target_forwards": stats.num_target_forwards,
            "requests": len(queue),
            "accepted_per_pos": list(stats.accepted_per_pos),
        }

    def _score(self, batch: StepBatch) -> tuple[str, str] | None:
        """A lead: reward its own samples, their text decoded with the model's tokenizer; (message, fix) of a
        failing reward."""
        responses = []
        for gen in batch.generated:
            text = self.source.decode(gen.ids)
            batch.texts[gen.sample] = text
            responses.append(rewards.Response(batch.prompt_of(gen.sample), gen.ids, text))
        try:
            values = rewards.score(self.score_fn, responses, self.g.reward_timeout_s)
        except rewards.RewardError as err:
            return err.message, err.fix
        batch.generated = [
            Generated(gen.sample, gen.ids, gen.finished, value) for gen, value in zip(batch.generated, values)
        ]
        return None

    def _stop_on_failure(self, index: int, failure: tuple[str, str] | None) -> None:
        """Every rank: a reward failure on any lead stops every rank alike, with the first failing lead's message."""
        world = dist.get_world_size()
        flag = torch.tensor([world - self.rank if failure else 0], dtype=torch.int64, device=self.trainer.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if int(flag) == 0:
            return
        source_rank = world - int(flag)
        box: list = [failure]
        dist.broadcast_object_list(box, src=source_rank)
        message, fix = box[0]
        self.log.error(index, message)
        raise rewards.RewardError(message, fix)

    def _exchange(self, batch: StepBatch, mine: int | None, figures: dict | None) -> None:
        k = self.plan.rollout_settings.num_speculative_tokens
        lengths, values, finished, instances = exchange.share(
            batch.num_samples, len(self.leads), k, mine, batch.generated, figures, self.trainer.device
        )
        batch.lengths, batch.rewards, batch.finished = lengths, values, finished
        slowest = max(i["busy_s"] for i in instances)
        for i, entry in enumerate(instances):
            entry["instance"] = i
            entry["idle_s"] = slowest - entry["busy_s"]  # waiting for the slowest instance: the measured bubble
        self.k_control.observe(instances)
        batch.instances = instances
        batch.advantages = group_advantages(
            values,
            batch.num_generations,
            normalize=self.g.normalize_rewards,
            leave_one_out=self.g.use_leave_one_out_baseline,
        )
        lead_of_prompt = [self.leads[i] for i in batch.dispatch.instance_of()]
        lead_of_sample = [lead_of_prompt[s // batch.num_generations] for s in range(batch.num_samples)]
        need = {r: self._samples(batch.num_samples, self.dp_of[r]) for r in range(len(self.dp_of))}
        batch.responses = exchange.deliver(
            batch.generated,
            lead_of_sample=lead_of_sample,
            wanted=need[self.rank],
            rank=self.rank,
            need=need,
            lengths=lengths,
            device=self.trainer.device,
        )

    # ------------------------------------------------------------------------------------------------ refit
    def refit(self, index: int, batch: StepBatch | None) -> dict:
        """Every rank: the new policy to every instance; the draft every draft.refit_interval steps, or under
        draft.refit_policy drift when this RL step's engines fell behind its training-time acceptance (rl/drift.py;
        the warm-up's last step always refits). A frozen draft's one refit is as the warm-up ends. Per-instance
        seconds, and a drift decision with its reason, in the step's record."""
        out: dict = {"policy_refit": self.instances.refit_policy()}  # every rank: a collective
        d = self.plan.draft
        if not (d.enabled and self.trainer.cotraining and self.plan.rollout_settings.speculative):
            return out
        last_warm = self.g.draft_mode == "frozen" and index == self.g.sft_steps - 1
        if d.refit_policy == "drift" and batch is not None and not last_warm:
            training = drift.training_accept_length(self.trainer)  # every rank: a collective
            decision = drift.decide(drift.engine_accept_length(batch.instances), training, d.refit_drift_margin)
            out["draft_refit_decision"] = decision
            due = decision["refit"]
        else:
            due = d.refit_policy == "drift" or (index + 1) % d.refit_interval == 0 or last_warm
        if due:
            out["draft_refit"] = self.instances.refit_draft()
            self.engine_draft_step = index + 1
        return out
