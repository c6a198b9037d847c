"""Values derived from a layout spec, each defined once: world size, dp, head dim, KV heads, etp, padding, taps.

Validation and the compiler call these (plan.dims.ParallelDims is built from them); everything after compile reads
the results from the plan.
"""

from __future__ import annotations

import math
import re
from typing import Literal

from specdraft.spec.accounting import PipelineSplit
from specdraft.spec.schema import LayoutSpec, ModelSpec, ParallelSpec

# sbatch(1) --time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS.
SLURM_TIME_RE = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d{2}))?(?::(\d{2}))?$")


def world_size(spec: LayoutSpec) -> int:
    return spec.cluster.num_nodes * spec.cluster.gpus_per_node


def resolved_dp(spec: LayoutSpec) -> int | None:
    """dp as given, or derived from the world size; None when it cannot be derived."""
    p = spec.parallel
    if p.dp != -1:
        return p.dp
    inner = p.tp * p.cp * p.pp
    return world_size(spec) // inner if inner > 0 and world_size(spec) % inner == 0 else None


def tp_comm_overlap(spec: LayoutSpec, tp: int, sequence_parallel: bool) -> bool:
    """Whether TP collectives overlap the GEMMs at this tp: Megatron-LM does it only under sequence parallelism
    with TransformerEngine's userbuffers (GPU). Unset, it follows NVIDIA's performance recipes, which turn it on
    wherever tp > 1 (Megatron-Bridge scripts/performance/utils/overrides.py: tp_comm_overlap = tp > 1)."""
    from specdraft.spec.gpus import CATALOGUE

    if tp <= 1 or not sequence_parallel or not CATALOGUE[spec.cluster.gpu].is_gpu:
        return False
    wanted = spec.training.tp_comm_overlap
    return True if wanted is None else wanted


def head_dim(model: ModelSpec) -> int:
    """Per-head dimension: kv_channels, else hidden_size / num_attention_heads (Megatron's default)."""
    return (
        model.kv_channels if model.kv_channels is not None else model.hidden_size // max(model.num_attention_heads, 1)
    )


def kv_heads(model: ModelSpec) -> int:
    """K/V heads: num_query_groups under GQA, else one per attention head (MHA)."""
    return model.num_query_groups if model.num_query_groups is not None else model.num_attention_heads


def etp(parallel: ParallelSpec) -> int:
    """Expert tensor-parallel size: etp, else tp (Megatron's default)."""
    return parallel.etp if parallel.etp is not None else parallel.tp


def vpp(parallel: PipelineSplit) -> int | None:
    """Virtual stages per pipeline rank when interleaving is on (vpp > 1 and pp > 1), else None."""
    return parallel.vpp if parallel.vpp and parallel.vpp > 1 and parallel.pp > 1 else None


def pad_multiple(cp: int, tp: int, sequence_parallel: bool) -> int:
    """Per-sequence padding multiple of packed CP: 2*cp zigzag chunks, times tp under sequence parallelism."""
    return 2 * cp * (tp if sequence_parallel else 1)


def default_aux_layers(num_layers: int) -> list[int]:
    """EAGLE-3's default taps: outputs of layers [1, N//2-1, N-4] (modelopt, SpecForge, NeMo-RL)."""
    return [1, num_layers // 2 - 1, num_layers - 4]


def aux_layers(spec: LayoutSpec) -> list[int]:
    d = spec.draft
    return list(d.aux_layers) if d.aux_layers is not None else default_aux_layers(spec.model.num_layers)


def draft_vocab_size(spec: LayoutSpec) -> int:
    """The draft LM head's vocabulary: draft.vocab_size (the most frequent target tokens), else the target's."""
    d = spec.draft.vocab_size
    return d if d is not None else spec.model.vocab_size


IMPORTED_DRAFT_WARMUP = 20  # draft.lr_warmup_steps for a draft.path import (measured: docs/models.md)


def draft_lr_warmup_steps(spec: LayoutSpec) -> int:
    """draft.lr_warmup_steps resolved: null is IMPORTED_DRAFT_WARMUP for a draft imported from draft.path, else 0."""
    d = spec.draft
    if d.lr_warmup_steps is not None:
        return d.lr_warmup_steps
    return IMPORTED_DRAFT_WARMUP if d.path is not None else 0


def stage_index(stage: str | int, pp: int) -> int:
    """The pipeline stage index of a draft.stage value ('last', 'first' or an index) over ``pp`` stages."""
    if stage == "last":
        return pp - 1
    if stage == "first":
        return 0
    return int(stage)


def stage_value(index: int, pp: int) -> Literal["last", "first"] | int:
    """The draft.stage value that names stage ``index`` of ``pp``: 'last', 'first' or the index (stage_index's
    inverse, preferring 'last' for a single stage)."""
    return "last" if index == pp - 1 else "first" if index == 0 else index


def draft_stage_index(spec: LayoutSpec) -> int:
    """The pipeline stage index of draft.stage ('last', 'first' or an index)."""
    return stage_index(spec.draft.stage, spec.parallel.pp)


def num_speculative_tokens(spec: LayoutSpec) -> int:
    """Draft tokens per verify step: rollout.num_speculative_tokens, else draft.ttt_steps."""
    r = spec.rollout
    return r.num_speculative_tokens if r.num_speculative_tokens is not None else spec.draft.ttt_steps


def rollout_gpus(spec: LayoutSpec) -> int:
    """GPUs the rollout instances use: the training nodes' when colocated, else rollout.num_nodes'."""
    r, c = spec.rollout, spec.cluster
    nodes = c.num_nodes if r.colocated else r.num_nodes
    return nodes * c.gpus_per_node


def max_model_len(spec: LayoutSpec) -> int:
    """vLLM's max_model_len: rollout.max_model_len, else prompt_length + max_response_length."""
    r = spec.rollout
    return r.max_model_len if r.max_model_len is not None else r.prompt_length + r.max_response_length


def slurm_time_seconds(text: str) -> int:
    """Seconds in a Slurm time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (sbatch(1), --time)."""
    match = SLURM_TIME_RE.match(text.strip())
    if not match:
        raise ValueError(f"not a Slurm time: {text!r}")
    days, a, b, c = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        return int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    if c is not None:  # HH:MM:SS
        return int(a) * 3600 + int(b) * 60 + int(c)
    if b is not None:  # MM:SS
        return int(a) * 60 + int(b)
    return int(a) * 60  # MM


def signal_delay_s(time_limit_s: int) -> int:
    """Seconds before the limit at which Slurm sends the preemption warning: a tenth of the limit, within [10, 90].

    submitit's default (90 s) fires at once for a limit of 2 minutes or less, killing short jobs at start;
    a tenth keeps the warning proportionate, 90 s is submitit's own ceiling.
    """
    return max(10, min(90, time_limit_s // 10))


# Packed sequences are padded to a multiple of this and of the layout's pad_multiple: one packing for every layout
# whose pad_multiple divides it, so the same data gives the same rows (and losses) under tp, cp, pp and sp.
LENGTH_QUANTUM = 16


def length_multiple(parallel: ParallelSpec) -> int:
    """The per-sequence length multiple of the runtime's packed rows: lcm(LENGTH_QUANTUM, pad_multiple)."""
    return math.lcm(LENGTH_QUANTUM, pad_multiple(parallel.cp, parallel.tp, parallel.sequence_parallel))
