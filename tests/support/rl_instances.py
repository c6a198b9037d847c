"""A GRPO trainer (real megatron-core, gloo) on a tiny HF Llama with its rollout instances opened through
runtime/rl/instances, for the refit tests: the plan of a case, one rank's whole scenario (open, generate on every
lead, load new policy weights and a changed draft into the trainer, refit, generate again) and what it reports."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support import rl_models
from tests.support.paths import SHIPPED

GRPO = SHIPPED / "grpo-tiny-cpu.yaml"
PROMPTS = [[5, 17, 99, 3], [250, 42, 7, 8, 9, 10], [1, 2]]
K = 3


def overrides(policy: Path) -> list[str]:
    """grpo-tiny-cpu with rl_models' policy (hidden 128, 4 heads: head_dim 32) as model.path."""
    return [
        f"model.num_layers={rl_models.LAYERS}", f"model.hidden_size={rl_models.HIDDEN}",
        f"model.ffn_hidden_size={rl_models.FFN}", f"model.num_attention_heads={rl_models.HEADS}",
        f"model.num_query_groups={rl_models.KV_HEADS}", f"model.vocab_size={rl_models.hf_models.VOCAB}",
        f"model.path={policy}", "draft.aux_layers=[0,1,2]", f"rollout.num_speculative_tokens={K}",
    ]  # fmt: skip


def plan_of(policy: Path, more: list[str]):
    from specdraft.assemble import compile
    from specdraft.spec.load import load_layout

    return compile(load_layout(GRPO, [*overrides(policy), *more]))


def _context(plan, rank: int, world: int, run_dir: Path):
    from specdraft.runtime.context import RankContext

    return RankContext(
        plan=plan, run_dir=run_dir, global_rank=rank, local_rank=plan.ranks[rank].local_rank, world_size=world,
        node=plan.ranks[rank].node, device="cpu", backend="gloo", steps=1, workload="grpo",
    )  # fmt: skip


def _init_parallel(plan) -> None:
    from megatron.core import parallel_state as ps

    par = plan.parallel
    ps.initialize_model_parallel(
        tensor_model_parallel_size=par.tp, pipeline_model_parallel_size=par.pp, context_parallel_size=par.cp,
        expert_model_parallel_size=par.ep, expert_tensor_parallel_size=par.etp, order=par.order,
        create_gloo_process_groups=False,
    )  # fmt: skip


def _generate(engine) -> dict:
    out = {}
    for temperature in (0.0, 1.0):
        rollouts, stats = engine.generate(
            PROMPTS, num_generations=2, max_new_tokens=12, temperature=temperature, seed=4
        )
        out[temperature] = ([r.response for r in rollouts], tuple(stats.accepted_per_pos))
    return out


def scenario(rank: int, world: int, cases, root: str, bucket_bytes: int) -> list[dict]:
    """Every rank, per case (name, plan, policy2): open the instances, generate on every lead, load policy2 into the
    trainer and scale its draft, refit both, generate again. Reports each lead's outputs, the published draft
    folders (serve/export.publish, the reference a fresh engine loads), every buffer each sender allocated, the
    bucket counts and the refit seconds."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from specdraft.runtime import cpu_compat
    from specdraft.runtime.models.hf.checkpoint import open_checkpoint
    from specdraft.runtime.models.hf.load import load_chunks
    from specdraft.runtime.rl.instances import open_instances
    from specdraft.runtime.rl.trainer import GrpoTrainer
    from specdraft.runtime.serve.export import publish

    cpu_compat.apply("cpu")
    os.environ["SPECDRAFT_REFIT_BUCKET_BYTES"] = str(bucket_bytes)
    torch.set_num_threads(1)
    reports = []
    for name, plan, policy2 in cases:
        run_dir = Path(root) / name
        run_dir.mkdir(parents=True, exist_ok=True)
        _init_parallel(plan)
        ctx = _context(plan, rank, world, run_dir)
        trainer = GrpoTrainer(ctx)
        instances = open_instances(ctx, trainer, eos_id=None)
        report: dict = {"name": name, "rank": rank, "lead_of": instances.lead_of(rank)}
        mine = instances.instance_of_this_rank
        report["instance"] = None if mine is None else mine.index
        publish(ctx, trainer, 0)
        before = _generate(instances.engine) if mine is not None else None
        load_chunks(trainer.chunks, plan, trainer.pp_rank, open_checkpoint(plan.model, Path(policy2)))
        if trainer.draft is not None:
            with torch.no_grad():
                for p in trainer.draft.parameters():
                    p.mul_(1.5)
        publish(ctx, trainer, 1)
        report["policy_s"] = instances.refit_policy()
        report["draft_s"] = instances.refit_draft()
        after = _generate(instances.engine) if mine is not None else None
        report.update(before=before, after=after, allocations=instances.out.allocations())
        report["feeds"] = {which: instances.out.instances(which) for which in ("policy", "draft")}
        report["buckets"] = {
            which: sum(len(instances.out.buckets(which, i)[0]) for i in instances.out.instances(which))
            for which in ("policy", "draft")
        }
        instances.close()
        dist.barrier()
        ps.destroy_model_parallel()
        reports.append(report)
    return reports


def _greedy(engine, max_new_tokens: int = 12):
    rollouts, stats = engine.generate(PROMPTS, num_generations=1, max_new_tokens=max_new_tokens, temperature=0, seed=1)
    return [r.response for r in rollouts], stats.accept_length, stats.num_target_forwards


def vllm_scenario(rank: int, world: int, cases, root: str, bucket_bytes: int) -> list[dict]:
    """Every rank, per case (name, plan, policy2), with vLLM engines: open the instances; each lead's greedy
    rollouts; policy2 into the trainer and refit; greedy again; then the policy's and the draft's final norms
    zeroed (the policy then emits token 0 only, and the draft proposes it: every draft accepted) and both refit;
    greedy again. Reports those, the bytes each lead's proxy pickled to its engine per refit, and the seconds."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from specdraft.runtime import cpu_compat
    from specdraft.runtime.models.hf.checkpoint import open_checkpoint
    from specdraft.runtime.models.hf.load import load_chunks
    from specdraft.runtime.rl.instances import open_instances
    from specdraft.runtime.rl.trainer import GrpoTrainer

    cpu_compat.apply("cpu")
    os.environ["SPECDRAFT_REFIT_BUCKET_BYTES"] = str(bucket_bytes)
    torch.set_num_threads(1)
    reports = []
    for name, plan, policy2 in cases:
        run_dir = Path(root) / name
        run_dir.mkdir(parents=True, exist_ok=True)
        _init_parallel(plan)
        ctx = _context(plan, rank, world, run_dir)
        trainer = GrpoTrainer(ctx)
        instances = open_instances(ctx, trainer, eos_id=None)
        engine, mine = instances.engine, instances.instance_of_this_rank
        report: dict = {"name": name, "rank": rank, "instance": None if mine is None else mine.index}
        report["first"] = _greedy(engine) if engine else None
        load_chunks(trainer.chunks, plan, trainer.pp_rank, open_checkpoint(plan.model, Path(policy2)))
        sent = engine.sent_bytes if engine else 0
        report["policy_s"] = instances.refit_policy()
        report["pipe_bytes"] = engine.sent_bytes - sent if engine else None
        report["second"] = _greedy(engine) if engine else None
        with torch.no_grad():
            for chunk in trainer.chunks:
                for pname, p in chunk.named_parameters():
                    if pname.endswith("final_layernorm.weight"):
                        p.zero_()
            if trainer.draft is not None:
                dict(trainer.draft.named_parameters())["norm.weight"].zero_()
        sent = engine.sent_bytes if engine else 0
        report["policy_s_2"] = instances.refit_policy()
        report["draft_s"] = instances.refit_draft()
        report["pipe_bytes_2"] = engine.sent_bytes - sent if engine else None
        report["third"] = _greedy(engine, max_new_tokens=13) if engine else None
        report["allocations"] = instances.out.allocations()
        report["buckets"] = sum(len(instances.out.buckets("policy", i)[0]) for i in instances.out.instances("policy"))
        instances.close()
        dist.barrier()
        ps.destroy_model_parallel()
        reports.append(report)
    return reports
