"""The NeMo-RL profile the render targets, as data: the commit read, the base config, the keys it sets and the
rules NeMo-RL enforces on them (each with the source file that enforces it and what would lift it)."""

from __future__ import annotations

from dataclasses import dataclass

NAME = "nemo-rl-main-2026-08-22"
SOURCE = "https://github.com/NVIDIA-NeMo/RL"
COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"  # main on 2026-08-22 (#3504)
BASE_CONFIG = "examples/configs/grpo_math_8B_megatron.yaml"  # -> grpo_math_1B_megatron.yaml -> grpo_math_1B.yaml
RUN_SCRIPT = "examples/run_grpo.py"  # --config FILE, then Hydra overrides (nemo_rl/utils/config.py)

# Where each group of keys the render sets is defined and read, at COMMIT.
KEY_SOURCES: dict[str, str] = {
    "policy.*": "nemo_rl/models/policy/__init__.py (PolicyConfig)",
    "policy.megatron_cfg.*": "nemo_rl/models/policy/__init__.py (MegatronConfig), nemo_rl/models/megatron/setup.py",
    "policy.megatron_cfg.model_overrides.*": "nemo_rl/models/megatron/setup.py (_merge_model_overrides: Megatron "
    "Bridge provider fields without a first-class megatron_cfg key)",
    "policy.megatron_cfg.optimizer.*": "nemo_rl/models/policy/__init__.py (MegatronOptimizerConfig)",
    "policy.megatron_cfg.scheduler.*": "nemo_rl/models/policy/__init__.py (MegatronSchedulerConfig)",
    "policy.megatron_cfg.distributed_data_parallel_config.*": "nemo_rl/models/policy/__init__.py (MegatronDDPConfig)",
    "policy.megatron_cfg.fp8_cfg.*": "nemo_rl/models/policy/__init__.py (Fp8Config), megatron/setup.py",
    "policy.draft.*": "nemo_rl/models/policy/__init__.py (DraftConfig), nemo_rl/models/megatron/draft/utils.py",
    "policy.sequence_packing.*": "nemo_rl/models/policy/__init__.py (SequencePackingConfig), lm_policy.py",
    "policy.generation.*": "examples/configs/grpo_math_1B.yaml, nemo_rl/algorithms/grpo.py (colocated.resources)",
    "policy.generation.vllm_kwargs.*": "vLLM EngineArgs (NeMo-RL's vLLM worker passes them to the engine)",
    "grpo.*": "nemo_rl/algorithms/grpo.py (GRPOConfig, AsyncGRPOConfig)",
    "loss_fn.*": "examples/configs/grpo_math_1B.yaml (loss_fn), nemo_rl/algorithms/grpo.py",
    "checkpointing.*": "examples/configs/grpo_math_1B.yaml (checkpointing)",
    "cluster.*": "nemo_rl/algorithms/grpo.py (setup: total nodes = training + dedicated generation nodes)",
}

# Each spec field the render carries, and the NeMo-RL key that carries it (the first, where it sets several).
CARRIED: dict[str, str] = {
    "grpo.normalize_rewards": "grpo.normalize_rewards",
    "grpo.use_leave_one_out_baseline": "grpo.use_leave_one_out_baseline",
    "grpo.ratio_clip_min": "loss_fn.ratio_clip_min",
    "grpo.ratio_clip_max": "loss_fn.ratio_clip_max",
    "grpo.reference_policy_kl_penalty": "loss_fn.reference_policy_kl_penalty",
    "grpo.temperature": "policy.generation.temperature",
    "name": "(the file name in the command)",
    "model.path": "policy.model_name",
    "model.seq_length": "policy.max_total_sequence_length",
    "cluster.num_nodes": "cluster.num_nodes",
    "cluster.gpus_per_node": "cluster.gpus_per_node",
    "parallel.tp": "policy.megatron_cfg.tensor_model_parallel_size",
    "parallel.cp": "policy.megatron_cfg.context_parallel_size",
    "parallel.pp": "policy.megatron_cfg.pipeline_model_parallel_size",
    "parallel.ep": "policy.megatron_cfg.expert_model_parallel_size",
    "parallel.etp": "policy.megatron_cfg.expert_tensor_parallel_size",
    "parallel.vpp": "policy.megatron_cfg.model_overrides.virtual_pipeline_model_parallel_size",
    "parallel.sequence_parallel": "policy.megatron_cfg.sequence_parallel",
    "parallel.first_stage_layers": "policy.megatron_cfg.num_layers_in_first_pipeline_stage",
    "parallel.last_stage_layers": "policy.megatron_cfg.num_layers_in_last_pipeline_stage",
    "parallel.account_for_embedding_in_pipeline_split": "policy.megatron_cfg.model_overrides."
    "account_for_embedding_in_pipeline_split",
    "parallel.account_for_loss_in_pipeline_split": "policy.megatron_cfg.model_overrides."
    "account_for_loss_in_pipeline_split",
    "parallel.cp_comm_type": "policy.megatron_cfg.model_overrides.cp_comm_type",
    "parallel.hierarchical_cp_sizes": "policy.megatron_cfg.model_overrides.hierarchical_context_parallel_sizes",
    "draft.enabled": "policy.draft.enabled",
    "draft.num_layers": "policy.draft.num_layers",
    "draft.aux_layers": "policy.draft.aux_layer_indices",
    "draft.loss_weight": "policy.draft.loss_weight",
    "training.micro_batch_size": "policy.train_micro_batch_size",
    "training.global_batch_size": "policy.train_global_batch_size",
    "training.packing": "policy.sequence_packing.enabled",
    "training.dtype": "policy.precision",
    "training.grad_reduce_in_bf16": "policy.megatron_cfg.distributed_data_parallel_config.grad_reduce_in_fp32",
    "training.distributed_optimizer": "policy.megatron_cfg.optimizer.use_distributed_optimizer",
    "training.recompute": "policy.megatron_cfg.recompute_granularity",
    "training.train_iters": "grpo.max_num_steps",
    "training.lr": "policy.megatron_cfg.optimizer.lr",
    "training.clip_grad": "policy.megatron_cfg.optimizer.clip_grad",
    "training.seed": "grpo.seed",
    "training.save_interval": "checkpointing.save_period",
    "rollout.colocated": "policy.generation.colocated.enabled",
    "rollout.num_nodes": "policy.generation.colocated.resources.num_nodes",
    "rollout.tp": "policy.generation.vllm_cfg.tensor_parallel_size",
    "rollout.num_prompts_per_step": "grpo.num_prompts_per_step",
    "rollout.num_generations_per_prompt": "grpo.num_generations_per_prompt",
    "rollout.max_response_length": "policy.generation.max_new_tokens",
    "rollout.max_policy_lag": "grpo.async_grpo.max_trajectory_age_steps",
    "rollout.speculative": "policy.generation.vllm_kwargs.speculative_config.method",
    "rollout.num_speculative_tokens": "policy.generation.vllm_kwargs.speculative_config.num_speculative_tokens",
    "rollout.gpu_memory_utilization": "policy.generation.vllm_cfg.gpu_memory_utilization",
    "rollout.max_model_len": "policy.generation.vllm_cfg.max_model_len",
    "rollout.max_num_seqs": "policy.generation.vllm_kwargs.max_num_seqs",
}

# Spec fields the render has no NeMo-RL key for, and why (the output lists them under `# not carried`).
NOT_CARRIED: dict[str, str] = {
    "workload": "NeMo-RL's entry point is its script: examples/run_grpo.py for GRPO",
    "grpo.engine": "NeMo-RL's generation backend is its policy.generation.backend (vllm)",
    "grpo.task": "NeMo-RL's tasks are its data: and env: sections",
    "grpo.reward": "NeMo-RL's rewards come from its environments (env:)",
    "grpo.reward_timeout_s": "specdraft's reward runner only",
    "grpo.sft_steps": "NeMo-RL runs SFT as its own job (examples/run_sft.py)",
    "grpo.draft_mode": "NeMo-RL always trains the draft with the policy; a frozen draft is specdraft's benchmark arm",
    "draft.refit_interval": "NeMo-RL refits the draft with the policy every step",
    "draft.refit_policy": "NeMo-RL refits the draft with the policy every step",
    "draft.refit_drift_margin": "NeMo-RL refits the draft with the policy every step",
    "parallel.order": "Megatron Bridge's rank order is fixed (tp-cp-ep-dp-pp)",
    "parallel.dp": "NeMo-RL derives dp from the cluster: world / (tp * cp * pp)",
    "draft.method": "NeMo-RL's draft is EAGLE-3 (nemo_rl/models/megatron/draft/eagle.py)",
    "draft.stage": "NeMo-RL attaches the draft to the last pipeline stage's chunk (find_draft_owner_chunk)",
    "draft.ttt_steps": "no NeMo-RL key; vLLM's num_speculative_tokens is carried",
    "draft.lr": "the draft trains under the policy's optimizer (megatron_cfg.optimizer.lr)",
    "draft.lr_warmup_steps": "the draft follows the policy's learning-rate schedule (megatron_cfg.scheduler)",
    "draft.clip_grad": "the draft's gradients are clipped with the policy's (megatron_cfg.optimizer.clip_grad)",
    "draft.vocab_size": "NeMo-RL reads draft_vocab_size from policy.draft.model_name's config.json only",
    "draft.model": "only vLLM's speculative_config.model (policy.draft.model_name would replace num_layers and "
    "aux_layer_indices with that checkpoint's config.json)",
    "draft.export_interval": "NeMo-RL refits the draft into vLLM each step",
    "draft.path": "policy.draft.model_name would take num_layers, aux_layer_indices and draft_vocab_size from that "
    "checkpoint's config.json in its own numbering; specdraft initialises its draft from it itself",
    "draft.norm_before_residual": "no NeMo-RL key for it",
    "draft.norm_output": "no NeMo-RL key for it (its draft trains one shifted step, which carries no hidden state)",
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
    "cluster.executor": "NeMo-RL is started by its own run script, not by specdraft launch",
    "rollout.enabled": "NeMo-RL always runs its generation backend",
    "rollout.prompt_length": "specdraft's KV-cache sizing only",
    "rollout.acceptance_rate": "specdraft's rollout model only",
    "rollout.schedule": "NeMo-RL dispatches prompts to its vLLM workers itself (no length-aware schedule)",
    "rollout.adaptive_k": "specdraft's per-step k control; the plan's schedule is renders.vllm's "
    "speculative_config.num_speculative_tokens_per_batch_size, which vllm_kwargs could carry as it is",
    "model.moe_aux_loss_coeff": "the base config sets moe_router_load_balancing_type: none for GRPO",
}

# The model section's other fields (shape, norms, RoPE, biases, experts): Megatron Bridge builds the model from
# policy.model_name's config.json, where specdraft's model fields come from too.
FROM_CHECKPOINT = "model.*"

# Keys of the base config the render leaves out on purpose: NeMo-RL does not read them.
NOT_READ: dict[str, str] = {
    "policy.sequence_packing.sequence_length_round": "in grpo_math_1B.yaml but not in SequencePackingConfig; "
    "lm_policy.py pads packed sequences to policy.make_sequence_length_divisible_by (only dynamic_batching "
    "reads a sequence_length_round)",
}


@dataclass(frozen=True)
class Rule:
    """One limit of the profile: what NeMo-RL refuses, where, and what would lift it."""

    name: str
    limit: str  # what NeMo-RL refuses, quoting its message
    source: str  # the file at COMMIT that refuses it
    lift: str  # what in NeMo-RL would lift the limit


RULES: dict[str, Rule] = {
    rule.name: rule
    for rule in (
        Rule(
            "draft_packing",
            "NeMo-RL trains an online draft only without sequence packing: "
            "'policy.draft.enabled=true does not support sequence packing yet'",
            "nemo_rl/models/policy/lm_policy.py",
            "PR 3463, merged after this profile's commit, allows packing with a draft at CP 1",
        ),
        Rule(
            "draft_cp",
            "NeMo-RL needs sequence packing for context parallelism ('Sequence Packing must be enabled to use "
            "Context Parallelism with MCore') and refuses packing with a draft, so an online draft cannot train "
            "with CP > 1",
            "nemo_rl/models/megatron/setup.py, nemo_rl/models/policy/lm_policy.py",
            "the open PR 4059, context parallelism and sequence packing for draft co-training",
        ),
        Rule(
            "cp_packing",
            "'Sequence Packing must be enabled to use Context Parallelism with MCore'",
            "nemo_rl/models/megatron/setup.py",
            "none planned: its CP path takes cu_seqlens from packed sequences",
        ),
        Rule(
            "async_colocated",
            "max_policy_lag >= 1 turns on grpo.async_grpo, and async GRPO with colocated vLLM generation is "
            "asserted against: 'Colocated async GRPO is only supported for the Megatron generation backend'",
            "nemo_rl/algorithms/grpo.py (async_grpo_train)",
            "none for vLLM generation; only the Megatron generation backend runs colocated async GRPO, without "
            "vLLM's speculative decoding",
        ),
    )
}
