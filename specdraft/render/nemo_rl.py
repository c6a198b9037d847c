"""NeMo-RL overrides (policy.megatron_cfg, sequence packing, draft, cluster, grpo) as data and as YAML text."""

from __future__ import annotations

from specdraft.plan.model import LaunchPlan

_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "bfloat16"}  # fp8: bf16 weights


def nemo_rl_overrides(plan: LaunchPlan) -> dict:
    """Nested overrides keyed as NeMo-RL's examples/configs/grpo_math_1B.yaml."""
    m, p, t, d, c, r = plan.model, plan.parallel, plan.training, plan.draft, plan.cluster, plan.rollout_settings
    megatron_cfg = {
        "enabled": True,
        "tensor_model_parallel_size": p.tp,
        "expert_tensor_parallel_size": p.etp,
        "expert_model_parallel_size": p.ep,
        "pipeline_model_parallel_size": p.pp,
        "num_layers_in_first_pipeline_stage": p.first_stage_layers,
        "num_layers_in_last_pipeline_stage": p.last_stage_layers,
        "context_parallel_size": p.cp,
        "sequence_parallel": p.sequence_parallel,
        "pipeline_dtype": _DTYPE[t.dtype],
        "activation_checkpointing": t.recompute != "none",
    }
    out = {
        "policy": {
            "model_name": m.path,
            "train_global_batch_size": p.global_batch_size,
            "train_micro_batch_size": p.micro_batch_size,
            "max_total_sequence_length": m.seq_length,
            "precision": _DTYPE[t.dtype],
            "megatron_cfg": megatron_cfg,
            "sequence_packing": {
                "enabled": t.packing,
                "train_mb_tokens": p.micro_batch_size * m.seq_length,
                "algorithm": "modified_first_fit_decreasing",
                # The CP packing multiple; without CP, NeMo-RL's usual rounding.
                "sequence_length_round": p.pad_multiple if p.cp > 1 else 64,
            },
            "draft": {
                "enabled": d.enabled,
                "model_name": d.model,
                "loss_weight": d.loss_weight,
                "num_layers": d.num_layers,
                "aux_layer_indices": list(plan.draft.aux_layers),
            },
            "generation": {
                "vllm_cfg": {
                    "tensor_parallel_size": r.tp,
                    "pipeline_parallel_size": 1,
                    "expert_parallel_size": 1,
                    "gpu_memory_utilization": r.gpu_memory_utilization,
                    "max_model_len": r.max_model_len,
                    "async_engine": r.max_policy_lag > 0,
                },
            },
        },
        "cluster": {"gpus_per_node": c.gpus_per_node, "num_nodes": c.num_nodes},
        "grpo": {
            "num_prompts_per_step": r.num_prompts_per_step,
            "num_generations_per_prompt": r.num_generations_per_prompt,
            "async_grpo": {"enabled": r.max_policy_lag > 0, "max_trajectory_age_steps": max(r.max_policy_lag, 1)},
        },
    }
    # vllm_cfg is NeMo-RL's closed set of engine fields; anything else reaches vLLM's engine args through
    # vllm_kwargs (its vLLM worker copies them into the engine), max_num_seqs included.
    vllm_kwargs: dict = {"max_num_seqs": r.max_num_seqs}
    if d.enabled and r.speculative:
        vllm_kwargs["speculative_config"] = {
            "method": "eagle3",
            "model": d.model,
            "num_speculative_tokens": r.num_speculative_tokens,
            "draft_tensor_parallel_size": r.tp,
        }
    out["policy"]["generation"]["vllm_kwargs"] = vllm_kwargs
    return out


def to_yaml(overrides: dict) -> str:
    """YAML text of the overrides (block style, keys in render order)."""
    import yaml

    return yaml.safe_dump(overrides, sort_keys=False, default_flow_style=False)


def to_dotlist(overrides: dict, prefix: str = "") -> list[str]:
    """The same overrides as OmegaConf/Hydra dotlist items (`policy.megatron_cfg.context_parallel_size=4`)."""
    items: list[str] = []
    for key, value in overrides.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            items += to_dotlist(value, f"{path}.")
        else:
            items.append(f"{path}={_scalar(value)}")
    return items


def _scalar(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(_scalar(v) for v in value) + "]"
    return str(value)
