"""The layout spec's RL sections: `rollout` (the vLLM instances and their schedule) and `grpo` (the GRPO workload).

Each field's docstring is what `specdraft explain` prints; schema.py's LayoutSpec holds both sections.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional


@dataclass(frozen=True, kw_only=True)
class RolloutSpec:
    """The rollout side: vLLM speculative-decoding instances and the offline scheduler."""

    enabled: bool = False
    """Plan rollout instances (and render their vLLM settings)."""
    colocated: bool = True
    """Rollout shares the training GPUs (time-sliced); false uses dedicated nodes."""
    num_nodes: int = 0
    """Dedicated rollout nodes when colocated is false (gpus_per_node and gpu from cluster)."""
    tp: int = 1
    """Tensor-parallel size per vLLM instance; instances = rollout GPUs / tp."""
    num_prompts_per_step: int = 64
    """Prompts per RL step (grpo.num_prompts_per_step)."""
    num_generations_per_prompt: int = 8
    """Samples per prompt (grpo.num_generations_per_prompt)."""
    prompt_length: int = 1024
    """Typical prompt length in tokens (KV-cache sizing)."""
    max_response_length: int = 16384
    """Cap on generated tokens per sample."""
    max_policy_lag: int = 1
    """Bound on how many policy versions a sample may lag the trainer (async GRPO max_trajectory_age_steps)."""
    speculative: bool = True
    """Speculative decoding with the co-trained EAGLE-3 draft."""
    num_speculative_tokens: Optional[int] = None
    """Draft tokens per verify step; null = draft.ttt_steps."""
    acceptance_rate: float = 0.7
    """Per-token draft acceptance, measured (e.g. a run's metrics.jsonl) or assumed."""
    adaptive_k: bool = False
    """Draft as many tokens as pay at the running batch: k in 0..num_speculative_tokens per batch size, 0 (no
    speculation) where a verify pass costs more than it gains (vLLM's speculative_config
    num_speculative_tokens_per_batch_size). The plan's schedule comes from the calibrated cost model at
    acceptance_rate; in a GRPO run each instance re-derives it after every step from the acceptance its engine
    measured (docs/grpo-rollouts.md)."""
    gpu_memory_utilization: float = 0.85
    """Fraction of HBM vLLM may use (weights + KV cache)."""
    max_model_len: Optional[int] = None
    """vLLM max_model_len; null = prompt_length + max_response_length."""
    max_num_seqs: int = 1024
    """vLLM max_num_seqs: sequences one instance runs at once (1024 is VeRL's rollout default; vLLM's own is 256)."""
    schedule: Literal["fifo", "asp"] = "fifo"
    """How a GRPO step's prompt groups are dispatched to the instances: `fifo` deals them round-robin; `asp` places
    them by predicted length (longest first on the least-loaded instance), the predictions being each prompt's
    measured response lengths in earlier epochs (docs/grpo.md)."""


@dataclass(frozen=True, kw_only=True)
class GrpoSpec:
    """The `grpo` workload (docs/grpo.md): its engine, task, reward and loss (NeMo-RL's loss_fn.* names); the step's
    sizes are rollout.num_prompts_per_step, num_generations_per_prompt and max_response_length."""

    temperature: float = 1.0
    """Sampling temperature of the rollouts (policy.generation.temperature); 0 = greedy."""
    engine: Literal["builtin", "vllm"] = "builtin"  # the engine kinds' one listing (spec/engines.py)
    """Engine of each rollout instance (on its first rank): vLLM at rollout.tp, or the built-in decode (tp 1)."""
    task: Literal["reverse", "arithmetic", "markov"] = "reverse"
    """Built-in verifiable task whose seeded prompts the run trains on when data.path is null: reverse a digit list,
    add two digits, or continue the run's Markov chain. Its token ids are its own: it needs a model without a
    tokenizer of its own (random weights)."""
    reward: str = "task"
    """Reward: `task` (a built-in task's own verifier), `math-verify` (the math_verify package: the response text
    against the row's answer) or a user's `module:function` called as fn(prompt_text, response_text, answer, info)
    -> float, info holding the token ids (prompt_ids, response_ids), the row and the prompt's index."""
    reward_timeout_s: float = 10.0
    """Seconds one reward call may take before the run stops with an error naming the prompt."""
    sft_steps: int = 0
    """Supervised warm-up steps on the task's reference answers before RL (the draft co-trains in them too)."""
    draft_mode: Literal["cotrain", "frozen"] = "cotrain"
    """The draft in RL: `cotrain` trains it on every step's forward and refits it (draft.refit_interval);
    `frozen` trains it only in the grpo.sft_steps warm-up, refits it once as the warm-up ends, then holds it fixed
    (no draft loss, optimizer step or refit; metrics.jsonl's draft_loss is null)."""
    normalize_rewards: bool = True
    """Divide each group's advantages by its reward std (grpo.normalize_rewards)."""
    use_leave_one_out_baseline: bool = False
    """Baseline of a response = the mean reward of the other responses to its prompt
    (grpo.use_leave_one_out_baseline)."""
    ratio_clip_min: float = 0.2
    """Ratio clip below 1 (loss_fn.ratio_clip_min): the ratio is clamped to [1 - min, 1 + max]."""
    ratio_clip_max: float = 0.2
    """Ratio clip above 1 (loss_fn.ratio_clip_max)."""
    reference_policy_kl_penalty: float = 0.0
    """Weight of the k3 KL to the frozen reference policy, the policy as RL starts
    (loss_fn.reference_policy_kl_penalty); 0 keeps no reference."""
