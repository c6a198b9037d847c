"""What one trainer rank sends at each refit: the HF slices of its policy shards for every instance it feeds, laid
out in buckets once at open (their sources are the live parameters, read at each refit), and the draft, gathered
and converted to EAGLE-3 names at each draft refit on the feeding replicas' draft stage. Buckets are packed one at a
time into one reused buffer per device (buckets.Packer): a rank never holds more than its own shards and one
bucket, plus, on a draft-sending rank, the draft (one layer) it gathers whole, as the draft export does."""

from __future__ import annotations

from typing import Sequence

import torch

from specdraft.runtime.rl.instances import sources
from specdraft.runtime.rl.instances.buckets import Bucket, Packer, Source, layout
from specdraft.runtime.rl.instances.layout import Instance


class Outgoing:
    def __init__(self, trainer, instances: Sequence[Instance], bound: int, speculating: bool, resumed_draft=None):
        self.trainer, self.bound = trainer, bound
        # instance -> (buckets, their sources); instances fed by the same shards share one layout
        self.policy: dict[int, tuple[list[Bucket], list[list[Source]]]] = {}
        made: dict[tuple[bool, bool], tuple[list[Bucket], list[list[Source]]]] = {}
        for inst in instances:
            role = (sources.feeds_dense(trainer, inst.index), sources.feeds_experts(trainer, inst.index))
            if not any(role):
                continue
            if role not in made:
                made[role] = layout(sources.policy_slices(trainer, dense=role[0], experts=role[1]), bound)
            if made[role][0]:
                self.policy[inst.index] = made[role]
        # the draft: gathered by every tensor rank of the draft's stage on a feeding replica, sent by tensor rank 0
        self.gathers_draft = [i.index for i in instances if speculating and sources.feeds_draft(trainer, i.index)]
        first_tp = trainer.ps.get_tensor_model_parallel_rank() == 0
        self.draft_instances = self.gathers_draft if first_tp else []
        self.draft: tuple[list[Bucket], list[list[Source]]] | None = None
        self.resumed = dict(resumed_draft) if resumed_draft else None
        self.keep = 0 in self.draft_instances  # the one copy a checkpoint saves (Instances.held_draft)
        self.held: dict[str, torch.Tensor] | None = None
        self.packers: dict[torch.device, Packer] = {}

    def gather_draft(self) -> None:
        """The draft as it is now (collective over the draft's tensor-parallel group, on the ranks that gather it);
        a resume's older draft (Instances' resumed_engine_draft) replaces it the first time."""
        if not self.gathers_draft:
            return
        state = sources.draft_state(self.trainer)
        if not self.draft_instances:  # a tensor rank > 0: its shards went into rank 0's gather
            return
        if self.resumed is not None:
            state = {**state, **self.resumed}
            self.resumed = None
        laid = layout(sources.whole_slices(sources.draft_tensors(self.trainer, state)), self.bound)
        if self.draft is not None and laid[0] != self.draft[0]:
            raise ValueError("refit: the draft's tensors changed shape since the instances opened")
        self.draft = laid
        if self.keep:  # a copy: the trainer's draft moves on while the engines hold this one
            self.held = {k: v.detach().cpu().clone() for k, v in state.items()}

    def buckets(self, which: str, instance: int) -> tuple[list[Bucket], list[list[Source]]]:
        if which == "policy":
            return self.policy.get(instance, ([], []))
        if self.draft is None or instance not in self.draft_instances:
            return [], []
        return self.draft

    def instances(self, which: str) -> list[int]:
        return sorted(self.policy) if which == "policy" else list(self.draft_instances)

    def _packer(self, device) -> Packer:
        where = torch.device(device)
        if where not in self.packers:
            self.packers[where] = Packer(where)
        return self.packers[where]

    def reserve(self, device, nbytes: int) -> None:
        """Allocate the buffer on ``device`` once, at the largest bucket it will hold."""
        self._packer(device).reserve(nbytes)

    def pack(self, device, bucket: Bucket, source: Sequence[Source]) -> torch.Tensor:
        return self._packer(device).pack(bucket, source)

    def allocations(self) -> list[int]:
        """The bytes of every bucket buffer this rank allocated (one per device, reused for every bucket)."""
        return [n for packer in self.packers.values() for n in packer.allocated]
