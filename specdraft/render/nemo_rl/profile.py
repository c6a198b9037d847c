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
