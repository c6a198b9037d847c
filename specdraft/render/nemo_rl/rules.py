"""What the NeMo-RL profile refuses in a plan (as Problems naming the limit and what would lift it), and which
plan fields have no NeMo-RL key (listed in the render as not carried)."""

from __future__ import annotations

from typing import Any

from specdraft.errors import Problem
from specdraft.plan.model import LaunchPlan
from specdraft.render.nemo_rl.profile import NAME, RULES


def _problem(rule: str, path: str, value: Any, fix: str, severity: str) -> Problem:
    r = RULES[rule]
    return Problem(
        path=path,
        value=value,
        rule=f"NeMo-RL {NAME} refuses it: {r.limit} ({r.source})",
        fix=f"{fix} (what would lift the limit in NeMo-RL: {r.lift})",
        severity=severity,
    )


def refusals(plan: LaunchPlan, severity: str = "error") -> list[Problem]:
    """Every limit of the profile the plan runs into, each as one Problem (empty: NeMo-RL accepts it)."""
    d, p, t, r = plan.draft, plan.parallel, plan.training, plan.rollout_settings
    out: list[Problem] = []
    if d.enabled and p.cp > 1:
        out.append(
            _problem(
                "draft_cp",
                "parallel.cp",
                p.cp,
                "use parallel.cp=1 with training.packing=false, or draft.enabled=false",
                severity,
            )
        )
    elif d.enabled and t.packing:
        out.append(
            _problem(
                "draft_packing",
                "training.packing",
                True,
                "set training.packing=false, or draft.enabled=false",
                severity,
            )
        )
    if not d.enabled and p.cp > 1 and not t.packing:
        out.append(
            _problem("cp_packing", "training.packing", False, "set training.packing=true, or parallel.cp=1", severity)
        )
    if r.max_policy_lag >= 1 and r.colocated:
        out.append(
            _problem(
                "async_colocated",
                "rollout.max_policy_lag",
                r.max_policy_lag,
                "set rollout.colocated=false with rollout.num_nodes >= 1 (dedicated vLLM nodes), or "
                "rollout.max_policy_lag=0 (synchronous GRPO)",
                severity,
            )
        )
    return out


# Spec fields the render has no NeMo-RL key for, and why. The model's shape and layer semantics are not listed:
# NeMo-RL (Megatron Bridge) builds the model from policy.model_name's config.json, which the plan's fields came from.
_NOT_CARRIED: dict[str, str] = {
    "parallel.order": "Megatron Bridge's rank order is fixed (tp-cp-ep-dp-pp)",
    "parallel.dp": "NeMo-RL derives dp from the cluster: world / (tp * cp * pp)",
    "draft.method": "NeMo-RL's draft is EAGLE-3 (nemo_rl/models/megatron/draft/eagle.py)",
    "draft.stage": "NeMo-RL attaches the draft to the last pipeline stage's chunk (find_draft_owner_chunk)",
    "draft.ttt_steps": "no NeMo-RL key; vLLM's num_speculative_tokens is carried",
    "draft.lr": "the draft trains under the policy's optimizer (megatron_cfg.optimizer.lr)",
    "draft.clip_grad": "the draft's gradients are clipped with the policy's (megatron_cfg.optimizer.clip_grad)",
    "draft.vocab_size": "NeMo-RL reads draft_vocab_size from policy.draft.model_name's config.json only",
    "draft.model": "only vLLM's speculative_config.model (policy.draft.model_name would replace num_layers and "
    "aux_layer_indices with that checkpoint's config.json)",
    "draft.export_interval": "NeMo-RL refits the draft into vLLM each step",
    "training.warmup_steps": "no policy-only warm-up in NeMo-RL",
    "training.tp_comm_overlap": "NeMo-RL does not set up TransformerEngine userbuffers",
    "training.keep_checkpoints": "NeMo-RL keeps checkpointing.keep_top_k by checkpointing.metric_name, not the newest",
    "training.sequence_lengths": "specdraft's padding report only",
    "training.stop_grace_s": "specdraft's runner only",
    "training.data_drift_interval": "specdraft's synthetic data only",
    "training.data_drift_fraction": "specdraft's synthetic data only",
    "data.*": "NeMo-RL reads its data: section (a dataset and a math environment), not specdraft's data file",
    "slurm.*": "NeMo-RL is launched through Ray (its ray.sub), not specdraft's sbatch script",
    "cluster.gpu": "NeMo-RL uses the GPUs Ray finds",
    "rollout.enabled": "NeMo-RL always runs its generation backend",
    "rollout.prompt_length": "specdraft's KV-cache sizing only",
    "rollout.acceptance_rate": "specdraft's rollout model only",
    "model.moe_aux_loss_coeff": "the base config sets moe_router_load_balancing_type: none for GRPO",
}


def not_carried(plan: LaunchPlan) -> list[tuple[str, str]]:
    """(field, why) for every spec field without a NeMo-RL key, in a fixed order; model.moe_aux_loss_coeff only
    for a MoE model."""
    return [(f, why) for f, why in _NOT_CARRIED.items() if f != "model.moe_aux_loss_coeff" or plan.model.num_experts]
