"""The plan's settings sections: cluster, Slurm, training and the rollout engine, each a spec section with its
defaults resolved, so that renders, launchers and the runtime read the plan's sections and never its spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True, kw_only=True)
class ClusterPlan:
    """Where the training job runs."""

    num_nodes: int
    gpus_per_node: int
    gpu: str  # the catalogue's accelerator kind; cpu for local runs
    executor: Optional[str]  # local or slurm, as the layout chose; None: `launch` needs --executor


@dataclass(frozen=True, kw_only=True)
class SlurmPlan:
    """The spec's slurm section, and the time limit and preemption warning derived from it."""

    time_limit_s: int  # slurm.time in seconds
    signal_delay_s: int  # the preemption warning's lead before the limit
    time: str  # slurm.time as written ([D-]HH:MM:SS or minutes), what sbatch --time gets
    partition: Optional[str]
    account: Optional[str]
    qos: Optional[str]
    cpus_per_task: int
    mem: Optional[str]  # sbatch --mem, as written; None: the partition's default
    container_image: Optional[str]
    container_mounts: tuple[str, ...]
    container_specdraft: Optional[str]  # image or mount: how specdraft gets into the container; None on the host
    env: dict
    extra_sbatch_args: tuple[str, ...]
    max_requeues: int


@dataclass(frozen=True, kw_only=True)
class TrainingPlan:
    """Precision, recomputation, optimizer, schedule and checkpoint settings; the batch sizes are in `parallel`, the
    data's in `data`."""

    packing: bool
    sequence_lengths: tuple[int, ...]  # training.sequence_lengths, else (model.seq_length,)
    dtype: str
    grad_reduce_in_bf16: bool
    tp_comm_overlap: bool
    distributed_optimizer: bool
    recompute: str  # none, selective or full (Megatron's --recompute-granularity)
    train_iters: int
    warmup_steps: int
    lr: float
    clip_grad: float
    seed: int
    save_interval: int
    keep_checkpoints: int
    stop_grace_s: float  # how long a stop waits for the ranks' save before killing them


@dataclass(frozen=True, kw_only=True)
class RolloutSettings:
    """The rollout engine's settings with their defaults resolved, set whether or not rollout planning is on (the
    vLLM and NeMo-RL renders read them; `rollout` holds the planned instances)."""

    tp: int
    colocated: bool  # rollout shares the training GPUs; false = dedicated nodes
    num_nodes: int  # dedicated rollout nodes (rollout.num_nodes) when not colocated, else 0
    num_gpus: int  # the training nodes' GPUs when colocated, else rollout.num_nodes'
    speculative: bool  # rollout.speculative as written (the renders also need draft.enabled)
    num_speculative_tokens: int  # rollout.num_speculative_tokens, else draft.ttt_steps
    gpu_memory_utilization: float
    max_model_len: int  # rollout.max_model_len, else prompt_length + max_response_length
    max_response_length: int
    max_num_seqs: int
    max_policy_lag: int
    num_prompts_per_step: int
    num_generations_per_prompt: int
    schedule: str  # fifo | asp: how a GRPO step's prompt groups are dispatched to the instances
