"""What a GRPO refit moves (runtime/rl/instances): every rollout instance receives the whole policy, in bf16, from
the ranks of the data-parallel replica that feeds it (instance i from replica i % dp), and the draft at its own
cadence; each engine GPU receives every byte (a broadcast to the instance's tensor-parallel workers), and each
sending rank sends its own shards once per instance its replica feeds. The time is the bytes over one link."""

from __future__ import annotations

from dataclasses import dataclass

from specdraft.plan.memory import draft_params
from specdraft.rollout.model.instances import model_params, speculating
from specdraft.spec.derived import resolved_dp, rollout_gpus
from specdraft.spec.schema import LayoutSpec

WEIGHT_BYTES = 2  # bf16, as the engines serve the policy on GPUs
NVLINK_BYTES_S = 450e9  # NVLink 4 (H100): 900 GB/s bidirectional, 450 GB/s each way
IB_BYTES_S = 50e9  # one InfiniBand NDR link: 400 Gb/s


@dataclass(frozen=True)
class RefitTraffic:
    num_instances: int
    rollout_tp: int
    num_replicas: int  # training data-parallel replicas (dp); instance i is fed by replica i % dp
    instances_per_replica: int  # the most instances one replica feeds
    senders_per_instance: int  # the replica's ranks that hold policy shards (tp x pp, context rank 0)
    policy_bytes: int  # what each instance (and each of its GPUs) receives per policy refit
    draft_bytes: int  # per draft refit, when the instances speculate (else 0)

    @property
    def sender_bytes(self) -> float:
        """What one sending rank sends per policy refit, its shards taken as an even share of the policy: its share
        once for every instance its replica feeds."""
        return self.instances_per_replica * self.policy_bytes / self.senders_per_instance

    def seconds(self, bytes_per_s: float, draft: bool = False) -> float:
        """One instance's refit over one link of ``bytes_per_s``."""
        return (self.policy_bytes + (self.draft_bytes if draft else 0)) / bytes_per_s


def refit_traffic(spec: LayoutSpec) -> RefitTraffic:
    r, p = spec.rollout, spec.parallel
    tp = max(r.tp, 1)
    instances = rollout_gpus(spec) // tp
    dp = resolved_dp(spec) or 1
    return RefitTraffic(
        num_instances=instances,
        rollout_tp=tp,
        num_replicas=dp,
        instances_per_replica=-(-instances // dp),
        senders_per_instance=p.tp * p.pp,
        policy_bytes=model_params(spec) * WEIGHT_BYTES,
        draft_bytes=draft_params(spec) * WEIGHT_BYTES if speculating(spec) else 0,
    )
