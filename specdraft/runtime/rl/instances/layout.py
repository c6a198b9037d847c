"""Where the rollout instances run: the plan's instances (plan.rollout), or, without rollout planning
(rollout.enabled false), the same colocated tiling of the training ranks by rollout.tp; each instance is led by its
first training rank, which owns its engine. Dedicated rollout nodes (rollout.colocated false) are not built."""

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
    planned = plan.rollout
    if planned is not None:
        out = []
        for inst in planned.instances:
            if not inst.training_ranks:
                raise ValueError(f"plan.rollout instance {inst.instance} has no training ranks (colocated needs them)")
            out.append(Instance(inst.instance, tuple(inst.training_ranks), inst.node, tuple(inst.local_gpus)))
        return tuple(out)
    tp, world = settings.tp, plan.world_size
    if tp < 1 or world % tp:
        raise ValueError(f"rollout.tp {tp} must divide the {world} training ranks into rollout instances")
    out = []
    for index in range(world // tp):
        ranks = tuple(range(index * tp, (index + 1) * tp))
        places = [plan.ranks[r] for r in ranks]
        if len({p.node for p in places}) != 1:
            raise ValueError(f"rollout.tp {tp}: instance {index}'s ranks {ranks} span nodes; an instance fits a node")
        out.append(Instance(index, ranks, places[0].node, tuple(p.local_rank for p in places)))
    return tuple(out)
