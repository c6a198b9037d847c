"""The plan's `rollout` section: the rollout instances, their KV budget and speculative-decoding settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True, kw_only=True)
class KvBudget:
    """Per-GPU HBM split of one rollout instance."""

    weights_bytes_per_gpu: int
    target_weights_bytes_per_gpu: int
    draft_weights_bytes_per_gpu: int
    kv_bytes_per_gpu: int
    kv_bytes_per_token_per_gpu: float
    max_full_length_sequences: int


@dataclass(frozen=True, kw_only=True)
class RolloutInstance:
    """One vLLM instance: its node, local GPUs and, when colocated, the training ranks it shares them with."""

    instance: int
    node: int
    local_gpus: tuple[int, ...]
    training_ranks: Optional[tuple[int, ...]]


@dataclass(frozen=True, kw_only=True)
class AdaptiveK:
    """rollout.adaptive_k: how many tokens an instance drafts at each running batch (rollout/model/kchoice.py)."""

    source: str  # "model": the calibrated cost model at rollout.acceptance_rate (no measurement yet)
    max_k: int  # the engine's num_speculative_tokens: no schedule drafts more
    mean_context: float  # tokens per sequence the costs are taken at
    costs: tuple[tuple[int, tuple[float, ...]], ...]  # (batch, step seconds for k = 0..max_k), batch increasing
    schedule: tuple[tuple[int, int, int], ...]  # vLLM's num_speculative_tokens_per_batch_size: (first, last, k)


@dataclass(frozen=True, kw_only=True)
class RolloutPlan:
    """The rollout side: vLLM instances and their speculative-decoding settings."""

    colocated: bool
    num_gpus: int
    tp: int
    num_instances: int
    instances: tuple[RolloutInstance, ...]
    samples_per_step: int
    max_policy_lag: int
    speculative: bool
    num_speculative_tokens: int
    acceptance_rate: float
    kv: KvBudget
    adaptive_k: Optional[AdaptiveK] = None  # rollout.adaptive_k: the k each running batch drafts
