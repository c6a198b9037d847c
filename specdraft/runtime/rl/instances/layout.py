"""Where the rollout instances run: the plan's instances (plan.rollout, which a grpo layout always plans), each led by
its first training rank, which owns its engine. Dedicated rollout nodes (rollout.colocated false) are not built."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Instance:
    """One rollout instance: the training ranks it shares devices with (the first leads it), their node and their
    devices on it (plan.rollout's local_gpus)."""

    index: int
    ranks: tuple[int, ...]
    node: int
    local_gpus: tuple[int, ...]

    @property
    def lead(self) -> int:
        return self.ranks[0]


def instance_layout(plan) -> tuple[Instance, ...]:
    """The plan's rollout instances, in order; ValueError for a layout the runtime cannot run."""
    settings = plan.rollout_settings
    if not settings.colocated:
        raise ValueError(
            "rollout.colocated is false: dedicated rollout nodes are not built; the grpo workload runs each rollout "
            "instance on its own training ranks (set rollout.colocated: true)"
        )
    if plan.rollout is None:
        raise ValueError(
            "the plan has no rollout instances (its layout's workload is not grpo and rollout.enabled is false); "
            "set workload: grpo, or rollout.enabled: true"
        )
    out = []
    for inst in plan.rollout.instances:
        if not inst.training_ranks:
            raise ValueError(f"plan.rollout instance {inst.instance} has no training ranks (colocated needs them)")
        out.append(Instance(inst.instance, tuple(inst.training_ranks), inst.node, tuple(inst.local_gpus)))
    return tuple(out)
