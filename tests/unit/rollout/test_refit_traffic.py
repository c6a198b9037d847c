"""What a refit moves (rollout/model/refit.py), on the shipped 8B layout: each of its 4 TP2 instances receives the
whole bf16 policy from one of the 4 replicas; the 70B layout's one replica feeds every instance."""

from __future__ import annotations

import pytest

from specdraft.rollout.model.instances import model_params
from specdraft.rollout.model.refit import IB_BYTES_S, NVLINK_BYTES_S, refit_traffic
from specdraft.spec.load import load_layout
from tests.support.paths import SHIPPED


def test_each_instance_receives_the_whole_bf16_policy_from_its_replica():
    spec = load_layout(SHIPPED / "llama3.1-8b-pat.yaml", [])
    t = refit_traffic(spec)
    assert (t.num_instances, t.rollout_tp, t.num_replicas, t.instances_per_replica) == (4, 2, 4, 1)
    assert t.senders_per_instance == 2  # tp2 pp1: both tensor ranks of the replica
    assert t.policy_bytes == 2 * model_params(spec) and 16.0e9 < t.policy_bytes < 16.1e9  # Llama-3.1-8B: 8.03 B
    assert t.draft_bytes == 0  # the layout does not speculate
    assert t.seconds(NVLINK_BYTES_S) == pytest.approx(t.policy_bytes / 450e9)
    assert t.seconds(IB_BYTES_S) == pytest.approx(t.policy_bytes / 50e9)
    big = refit_traffic(load_layout(SHIPPED / "llama3-70b.yaml", ["rollout.tp=8"]))
    assert (big.num_instances, big.num_replicas, big.instances_per_replica, big.senders_per_instance) == (8, 1, 8, 32)
    assert big.draft_bytes > 0 and big.seconds(IB_BYTES_S, draft=True) > big.seconds(IB_BYTES_S)
