"""The NeMo-RL config keys the render may set, each with the type NeMo-RL reads (data, not code).

Source: https://github.com/NVIDIA-NeMo/RL at commit 7ea279abfbeb698b092856d0dab61e7cf39bc909 (main, 2026-08-22):
nemo_rl/models/policy/__init__.py (PolicyConfig, MegatronConfig, MegatronOptimizerConfig, MegatronSchedulerConfig,
MegatronDDPConfig, Fp8Config, DraftConfig, SequencePackingConfig, DynamicBatchingConfig), nemo_rl/algorithms/grpo.py
(GRPOConfig, AsyncGRPOConfig; the colocated.resources checks), examples/configs/grpo_math_1B.yaml (generation,
loss_fn, checkpointing, cluster). model_overrides keys are Megatron Bridge provider fields (megatron-core's
ModelParallelConfig / TransformerConfig) that MegatronConfig has no first-class key for (setup.py rejects
duplicates). vllm_kwargs keys are vLLM EngineArgs / SpeculativeConfig fields, which NeMo-RL's vLLM worker passes on.
Types: int, float (an int is accepted), bool, str, list[int], list[str], dict, each optionally "|None".
"""

SOURCE = "https://github.com/NVIDIA-NeMo/RL"
COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"
KEYS: dict[str, str] = {
    "policy.model_name": "str",
    "policy.train_global_batch_size": "int",
    "policy.train_micro_batch_size": "int",
    "policy.logprob_batch_size": "int",
    "policy.max_total_sequence_length": "int",
    "policy.precision": "str",
    "policy.max_grad_norm": "float|None",
    "policy.make_sequence_length_divisible_by": "int",
    "policy.dtensor_cfg.enabled": "bool",
    "policy.dynamic_batching.enabled": "bool",
    "policy.sequence_packing.enabled": "bool",
    "policy.sequence_packing.train_mb_tokens": "int",
    "policy.sequence_packing.algorithm": "str",
    "policy.draft.enabled": "bool",
    "policy.draft.model_name": "str|None",
    "policy.draft.loss_weight": "float",
    "policy.draft.num_layers": "int|None",
    "policy.draft.aux_layer_indices": "list[int]|None",
    "policy.megatron_cfg.enabled": "bool",
    "policy.megatron_cfg.tensor_model_parallel_size": "int",
    "policy.megatron_cfg.expert_tensor_parallel_size": "int",
    "policy.megatron_cfg.expert_model_parallel_size": "int",
    "policy.megatron_cfg.pipeline_model_parallel_size": "int",
    "policy.megatron_cfg.num_layers_in_first_pipeline_stage": "int|None",
    "policy.megatron_cfg.num_layers_in_last_pipeline_stage": "int|None",
    "policy.megatron_cfg.context_parallel_size": "int",
    "policy.megatron_cfg.sequence_parallel": "bool",
    "policy.megatron_cfg.pipeline_dtype": "str",
    "policy.megatron_cfg.activation_checkpointing": "bool",
    "policy.megatron_cfg.recompute_granularity": "str",
    "policy.megatron_cfg.recompute_modules": "list[str]|None",
    "policy.megatron_cfg.model_overrides": "dict",
    "policy.megatron_cfg.model_overrides.virtual_pipeline_model_parallel_size": "int|None",
    "policy.megatron_cfg.model_overrides.account_for_embedding_in_pipeline_split": "bool",
    "policy.megatron_cfg.model_overrides.account_for_loss_in_pipeline_split": "bool",
    "policy.megatron_cfg.model_overrides.cp_comm_type": "str",
    "policy.megatron_cfg.model_overrides.hierarchical_context_parallel_sizes": "list[int]|None",
    "policy.megatron_cfg.optimizer.lr": "float",
    "policy.megatron_cfg.optimizer.min_lr": "float",
    "policy.megatron_cfg.optimizer.clip_grad": "float",
    "policy.megatron_cfg.optimizer.bf16": "bool",
    "policy.megatron_cfg.optimizer.fp16": "bool",
    "policy.megatron_cfg.optimizer.use_distributed_optimizer": "bool",
    "policy.megatron_cfg.scheduler.lr_decay_style": "str",
    "policy.megatron_cfg.scheduler.lr_warmup_iters": "int",
    "policy.megatron_cfg.distributed_data_parallel_config.grad_reduce_in_fp32": "bool",
    "policy.megatron_cfg.distributed_data_parallel_config.overlap_grad_reduce": "bool",
    "policy.megatron_cfg.distributed_data_parallel_config.overlap_param_gather": "bool",
    "policy.megatron_cfg.fp8_cfg.enabled": "bool",
    "policy.megatron_cfg.fp8_cfg.fp8": "str",
    "policy.megatron_cfg.fp8_cfg.fp8_recipe": "str",
    "policy.megatron_cfg.fp8_cfg.fp8_param": "bool",
    "policy.generation.max_new_tokens": "int",
    "policy.generation.temperature": "float",
    "policy.generation.vllm_cfg.tensor_parallel_size": "int",
    "policy.generation.vllm_cfg.pipeline_parallel_size": "int",
    "policy.generation.vllm_cfg.expert_parallel_size": "int",
    "policy.generation.vllm_cfg.gpu_memory_utilization": "float",
    "policy.generation.vllm_cfg.max_model_len": "int",
    "policy.generation.vllm_cfg.async_engine": "bool",
    "policy.generation.vllm_kwargs.max_num_seqs": "int",
    "policy.generation.vllm_kwargs.speculative_config.method": "str",
    "policy.generation.vllm_kwargs.speculative_config.model": "str",
    "policy.generation.vllm_kwargs.speculative_config.num_speculative_tokens": "int",
    "policy.generation.vllm_kwargs.speculative_config.draft_tensor_parallel_size": "int",
    "policy.generation.colocated.enabled": "bool",
    "policy.generation.colocated.resources.gpus_per_node": "int|None",
    "policy.generation.colocated.resources.num_nodes": "int|None",
    "cluster.gpus_per_node": "int",
    "cluster.num_nodes": "int",
    "grpo.num_prompts_per_step": "int",
    "grpo.num_generations_per_prompt": "int",
    "grpo.max_num_steps": "int",
    "grpo.normalize_rewards": "bool",
    "grpo.use_leave_one_out_baseline": "bool",
    "grpo.seed": "int",
    "grpo.async_grpo.enabled": "bool",
    "grpo.async_grpo.max_trajectory_age_steps": "int",
    "grpo.async_grpo.in_flight_weight_updates": "bool",
    "loss_fn.use_importance_sampling_correction": "bool",
    "loss_fn.ratio_clip_min": "float",
    "loss_fn.ratio_clip_max": "float",
    "loss_fn.reference_policy_kl_penalty": "float",
    "loss_fn.token_level_loss": "bool",
    "checkpointing.enabled": "bool",
    "checkpointing.save_period": "int",
}


def type_ok(kind: str, value: object) -> bool:
    """Whether ``value`` (a rendered YAML value) has the table's type ``kind``."""
    if value is None:
        return kind.endswith("|None")
    base = kind.removesuffix("|None")
    if base == "bool":
        return isinstance(value, bool)
    if base == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if base == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if base == "str":
        return isinstance(value, str)
    if base == "dict":
        return isinstance(value, dict)
    if base in ("list[int]", "list[str]"):
        item = int if base == "list[int]" else str
        return isinstance(value, list) and all(isinstance(v, item) and not isinstance(v, bool) for v in value)
    raise ValueError(f"unknown kind {kind!r}")
