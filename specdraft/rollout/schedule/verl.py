"""The `verl` baseline: VeRL's default rollout, a static TP with the batch split evenly over its vLLM instances.

VeRL's rollout defaults (verl/trainer/config/rollout/rollout.yaml): tensor_model_parallel_size 2,
gpu_memory_utilization 0.5, max_num_seqs 1024. Its trainer repeats each prompt n times side by side and chunks the
batch into equal contiguous shares, one per rollout instance, whatever the lengths: `scheduler.verl_policy` and
`GenConfig(dispatch="even")` do that; this module gives the layout VeRL's engine settings.
"""

from __future__ import annotations

from dataclasses import replace

from specdraft.spec.schema import LayoutSpec

VERL_TP = 2
VERL_GPU_MEMORY_UTILIZATION = 0.5
VERL_MAX_NUM_SEQS = 1024


def layout(spec: LayoutSpec, tp: int = VERL_TP) -> LayoutSpec:
    """``spec`` with VeRL's rollout engine settings (TP, memory fraction, max_num_seqs); the rest is unchanged.

    VeRL does not speculate by default, but the layout's speculation is kept: turning it off on one side only
    would credit its gain to whatever the baseline is compared with (docs/rollout.md, "What each figure is
    compared against").
    """
    return replace(
        spec,
        rollout=replace(
            spec.rollout, tp=tp, gpu_memory_utilization=VERL_GPU_MEMORY_UTILIZATION, max_num_seqs=VERL_MAX_NUM_SEQS
        ),
    )


def settings(spec: LayoutSpec) -> dict:
    """The baseline's settings as the report shows them (``spec`` from `layout`)."""
    r = spec.rollout
    return {
        "tp": r.tp,
        "gpu_memory_utilization": r.gpu_memory_utilization,
        "max_num_seqs": r.max_num_seqs,
        "dispatch": "even",
    }
