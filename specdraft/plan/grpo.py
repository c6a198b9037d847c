"""The plan's `grpo` section (the spec's, with nothing left to resolve but names) and its NeMo-RL keys.

`nemo_rl_overrides` maps it onto NeMo-RL's GRPO config: grpo.* and loss_fn.* of
https://github.com/NVIDIA-NeMo/RL/blob/main/examples/configs/grpo_math_1B.yaml (checked against
nemo_rl/algorithms/grpo.py's GRPOConfig and nemo_rl/algorithms/loss_functions.py's ClippedPGLossConfig).
"""

from __future__ import annotations

from dataclasses import dataclass

from specdraft.spec import engines
from specdraft.spec.schema import LayoutSpec

ENGINE_KINDS = engines.ENGINE_KINDS  # the rollout engine kinds, for the runtime (which reads plan/, not spec/)


@dataclass(frozen=True, kw_only=True)
class GrpoPlan:
    """The GRPO workload's settings; draft.refit_interval is in the draft section."""

    num_prompts_per_step: int
    num_generations_per_prompt: int
    max_new_tokens: int
    temperature: float
    engine: str  # one of ENGINE_KINDS
    task: str
    reward: str  # task, math-verify or module:function
    reward_timeout_s: float
    sft_steps: int
    draft_mode: str  # cotrain, or frozen: the draft trains and refits in the SFT warm-up only
    normalize_rewards: bool
    use_leave_one_out_baseline: bool
    ratio_clip_min: float
    ratio_clip_max: float
    reference_policy_kl_penalty: float


def grpo_plan(spec: LayoutSpec) -> GrpoPlan:
    g, r = spec.grpo, spec.rollout  # the step's sizes have one owner: the rollout section
    return GrpoPlan(
        num_prompts_per_step=r.num_prompts_per_step,
        num_generations_per_prompt=r.num_generations_per_prompt,
        max_new_tokens=r.max_response_length,
        temperature=g.temperature,
        engine=g.engine,
        task=g.task,
        reward=g.reward,
        reward_timeout_s=g.reward_timeout_s,
        sft_steps=g.sft_steps,
        draft_mode=g.draft_mode,
        normalize_rewards=g.normalize_rewards,
        use_leave_one_out_baseline=g.use_leave_one_out_baseline,
        ratio_clip_min=g.ratio_clip_min,
        ratio_clip_max=g.ratio_clip_max,
        reference_policy_kl_penalty=g.reference_policy_kl_penalty,
    )


def prompt_limit(plan) -> tuple[int, str]:
    """The longest prompt a GRPO sample can have, and what sets it: prompt + max_new_tokens must fit one training
    sequence (model.seq_length) and the engines' max_model_len. ``plan``: a LaunchPlan."""
    new = plan.grpo.max_new_tokens
    seq, engine = plan.model.seq_length - new, plan.rollout_settings.max_model_len - new
    if seq <= engine:
        return seq, f"model.seq_length {plan.model.seq_length:,} holds prompt and response in one training sequence"
    return engine, f"rollout.max_model_len is {plan.rollout_settings.max_model_len:,}"


# NeMo-RL key -> GrpoPlan field. Keys checked in NeMo-RL's GRPOConfig / ClippedPGLossConfig / generation config.
NEMO_RL_KEYS = {
    "grpo.num_prompts_per_step": "num_prompts_per_step",
    "grpo.num_generations_per_prompt": "num_generations_per_prompt",
    "grpo.normalize_rewards": "normalize_rewards",
    "grpo.use_leave_one_out_baseline": "use_leave_one_out_baseline",
    "loss_fn.ratio_clip_min": "ratio_clip_min",
    "loss_fn.ratio_clip_max": "ratio_clip_max",
    "loss_fn.reference_policy_kl_penalty": "reference_policy_kl_penalty",
    "policy.generation.max_new_tokens": "max_new_tokens",
    "policy.generation.temperature": "temperature",
}


def nemo_rl_overrides(grpo: GrpoPlan, *, train_iters: int) -> dict[str, object]:
    """NeMo-RL overrides (dotted key -> value) of ``grpo``: the section's keys, token-level loss as ours, and
    grpo.max_num_steps from training.train_iters."""
    out: dict[str, object] = {key: getattr(grpo, name) for key, name in NEMO_RL_KEYS.items()}
    out["loss_fn.token_level_loss"] = True  # the loss is a token-level mean over the step's response tokens
    out["grpo.max_num_steps"] = train_iters
    return out
