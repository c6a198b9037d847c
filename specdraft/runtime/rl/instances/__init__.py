"""The rollout instances of a GRPO job: one engine per planned instance, owned by its lead rank, and the refit of
every instance from the trainer ranks that hold the weights, in flat buckets over a group per (sender, instance)."""

from specdraft.runtime.rl.instances.instances import Instances, open_instances

__all__ = ["Instances", "open_instances"]
