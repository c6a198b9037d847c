"""The plan as NeMo-RL overrides (nested as its YAML configs) on the profile's base config,
examples/configs/grpo_math_8B_megatron.yaml: the Megatron policy, packing, draft, generation, GRPO and cluster."""

from __future__ import annotations

import math

from specdraft.plan.grpo import nemo_rl_overrides as grpo_overrides
from specdraft.plan.model import LaunchPlan
from specdraft.render.nemo_rl.grpo import grpo_keys, merge
from specdraft.render.paths import draft_model, model_path

_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "bfloat16"}  # fp8: bf16 weights


def nemo_rl_overrides(plan: LaunchPlan) -> dict:
    """Nested overrides keyed as NeMo-RL's examples/configs (every key is in the profile's key table)."""
    m, p, t, d, c, r = plan.model, plan.parallel, plan.training, plan.draft, plan.cluster, plan.rollout_settings
    policy = {
        "model_name": model_path(plan),
        "train_global_batch_size": p.global_batch_size,
        "train_micro_batch_size": p.micro_batch_size,
        # lm_policy.py asserts logprob_batch_size == train_micro_batch_size at tp >= 4 (the 8B base sets 4 vs 1).
        "logprob_batch_size": p.micro_batch_size,
        "max_total_sequence_length": m.seq_length,
        "precision": _DTYPE[t.dtype],
        "max_grad_norm": t.clip_grad,
        # "Configure either Megatron ... or DTensor ..., not both" (lm_policy.py): grpo_math_1B.yaml enables DTensor.
        "dtensor_cfg": {"enabled": False},
        "megatron_cfg": _megatron_cfg(plan),
        "dynamic_batching": {"enabled": False},  # exclusive of sequence packing (lm_policy.py)
        # Packed sequences are padded to make_sequence_length_divisible_by (sequence_packing's sequence_length_round
        # is not read); NeMo-RL needs a multiple of 2*cp, times tp under sequence parallelism (megatron/data.py).
        "sequence_packing": (
            {
                "enabled": True,
                "train_mb_tokens": p.micro_batch_size * m.seq_length,
                "algorithm": "modified_first_fit_decreasing",
            }
            if t.packing
            else {"enabled": False}
        ),
        "make_sequence_length_divisible_by": math.lcm(p.pad_multiple, p.tp),
        "draft": (
            {
                "enabled": True,
                # A model_name would replace num_layers and aux_layer_indices with that checkpoint's config.json
                # (draft/utils.py build_draft_model): the co-trained draft starts from the plan's shape.
                "model_name": None,
                "loss_weight": d.loss_weight,
                "num_layers": d.num_layers,
                "aux_layer_indices": list(d.aux_layers),
            }
            if d.enabled
            else {"enabled": False}
        ),
        "generation": _generation(plan),
    }
    out = {
        "policy": policy,
        "cluster": {"gpus_per_node": c.gpus_per_node, "num_nodes": c.num_nodes + r.num_nodes},
        "grpo": {
            "max_num_steps": t.train_iters,
            "seed": t.seed,
            "async_grpo": {
                "enabled": r.max_policy_lag > 0,
                "max_trajectory_age_steps": max(r.max_policy_lag, 1),
                # Beyond a lag of 1 only in-flight weight updates let generation run ahead (grpo.py warns).
                "in_flight_weight_updates": r.max_policy_lag > 1,
            },
        },
        "checkpointing": {"enabled": True, "save_period": t.save_interval} if t.save_interval else {"enabled": False},
    }
    out = merge(
        out,
        grpo_keys(num_prompts_per_step=r.num_prompts_per_step, num_generations_per_prompt=r.num_generations_per_prompt),
    )
    # The grpo section is what the GRPO job runs: its values win over the rollout model's (docs/grpo.md).
    out = merge(out, _nested(grpo_overrides(plan.grpo, train_iters=t.train_iters)))
    if r.max_policy_lag > 0:
        # async_grpo_train asserts it: off-policy samples need the importance-sampling correction (grpo.py).
        out = merge(out, {"loss_fn": {"use_importance_sampling_correction": True}})
    return out


def _megatron_cfg(plan: LaunchPlan) -> dict:
    p, t = plan.parallel, plan.training
    cfg: dict = {
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
        # activation_checkpointing alone is full recompute; setup.py reads the granularity (and, for selective,
        # the modules: Megatron-LM's selective default is core attention) only when it is on.
        "activation_checkpointing": t.recompute != "none",
    }
    if t.recompute != "none":
        cfg["recompute_granularity"] = t.recompute
        cfg["recompute_modules"] = ["core_attn"] if t.recompute == "selective" else None
    overrides: dict = {}  # Megatron Bridge provider fields without a first-class megatron_cfg key (setup.py)
    if p.vpp is not None:
        overrides["virtual_pipeline_model_parallel_size"] = p.vpp
    if p.account_for_embedding_in_pipeline_split:
        overrides["account_for_embedding_in_pipeline_split"] = True
    if p.account_for_loss_in_pipeline_split:
        overrides["account_for_loss_in_pipeline_split"] = True
    if p.cp > 1:
        overrides["cp_comm_type"] = p.cp_comm_type
        if p.hierarchical_cp_sizes is not None:
            overrides["hierarchical_context_parallel_sizes"] = list(p.hierarchical_cp_sizes)
    cfg["model_overrides"] = overrides
    cfg["optimizer"] = {
        "lr": t.lr,
        "min_lr": t.lr,  # a constant schedule, as specdraft's runtime trains
        "clip_grad": t.clip_grad,
        # setup.py's _validate_dtype_config: the optimizer's bf16/fp16 must match policy.precision.
        "bf16": t.dtype in ("bf16", "fp8"),
        "fp16": t.dtype == "fp16",
        "use_distributed_optimizer": t.distributed_optimizer,
    }
    cfg["scheduler"] = {"lr_decay_style": "constant", "lr_warmup_iters": 0}
    cfg["distributed_data_parallel_config"] = {
        # Megatron-LM reduces gradients in fp32 unless --grad-reduce-in-bf16; NeMo-RL's base config says false.
        "grad_reduce_in_fp32": not t.grad_reduce_in_bf16,
        "overlap_grad_reduce": t.distributed_optimizer,
        "overlap_param_gather": t.distributed_optimizer,
    }
    # fp8: the Megatron render's recipe (TE hybrid format, per-tensor current scaling, fp8 parameters).
    cfg["fp8_cfg"] = (
        {"enabled": True, "fp8": "hybrid", "fp8_recipe": "tensorwise", "fp8_param": True}
        if t.dtype == "fp8"
        else {"enabled": False}
    )
    return cfg


def _generation(plan: LaunchPlan) -> dict:
    d, c, r = plan.draft, plan.cluster, plan.rollout_settings
    # vllm_cfg is NeMo-RL's closed set of engine fields; anything else reaches vLLM's engine args through
    # vllm_kwargs (its vLLM worker copies them into the engine), max_num_seqs included.
    vllm_kwargs: dict = {"max_num_seqs": r.max_num_seqs}
    if d.enabled and r.speculative:
        vllm_kwargs["speculative_config"] = {
            "method": "eagle3",
            "model": draft_model(plan),
            "num_speculative_tokens": r.num_speculative_tokens,
            "draft_tensor_parallel_size": r.tp,
        }
    # Dedicated rollout nodes: grpo.py takes them out of cluster.num_nodes and needs gpus_per_node set to the
    # cluster's when the cluster has more than one node.
    colocated: dict = (
        {"enabled": True}
        if r.colocated
        else {"enabled": False, "resources": {"gpus_per_node": c.gpus_per_node, "num_nodes": r.num_nodes}}
    )
    return {
        "max_new_tokens": r.max_response_length,
        "vllm_cfg": {
            "tensor_parallel_size": r.tp,
            "pipeline_parallel_size": 1,
            "expert_parallel_size": 1,
            "gpu_memory_utilization": r.gpu_memory_utilization,
            "max_model_len": r.max_model_len,
            "async_engine": r.max_policy_lag > 0,
        },
        "vllm_kwargs": vllm_kwargs,
        "colocated": colocated,
    }


def _nested(dotted: dict[str, object]) -> dict:
    """{"a.b": 1} -> {"a": {"b": 1}}."""
    out: dict = {}
    for key, value in dotted.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out
