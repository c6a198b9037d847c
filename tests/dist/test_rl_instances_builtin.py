"""The rollout instances with the built-in engine (runtime/rl/instances), inside real gloo worlds with a real
megatron-core GRPO trainer that loaded a tiny HF Llama:

- one engine per instance, on its lead rank (rollout.tp 1: every rank leads one), started from config-only folders;
- after the first refit and after a refit of new weights (a second HF checkpoint loaded into the trainer, the draft
  scaled), each instance's greedy and seeded sampled rollouts through the draft, and its per-position acceptance,
  equal a fresh engine's on those weights (the HF folder itself, the draft as serve/export.publish wrote it);
- under pp2, tp2 and dp2 (each instance fed by its own replica), with a bucket bound of 4 KiB that forces many
  buckets and splits slices by rows, every sending rank allocated one buffer, once, within the bound.
"""

from __future__ import annotations

import pytest

from tests.support import rl_instances, rl_models
from tests.support.distributed import run_distributed

pytestmark = pytest.mark.dist
BUCKET_BYTES = 4096  # the 128-wide rows are 512 B: several per bucket; a 192-wide fc1 slice needs many buckets
CASES = {"pp2": ["parallel.pp=2"], "tp2": ["parallel.tp=2", "parallel.pp=1"], "dp2": ["parallel.pp=1"]}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("instances")
    return {"root": root, "policy": rl_models.make_policy(root / "policy"), "policy2": rl_models.make_policy(
        root / "policy2", seed=5)}  # fmt: skip


@pytest.fixture(scope="module")
def reports(folders):
    cases = [
        (name, rl_instances.plan_of(folders["policy"], ["cluster.gpus_per_node=2", "parallel.cp=1", *more]),
         str(folders["policy2"]))
        for name, more in CASES.items()
    ]  # fmt: skip
    per_rank = run_distributed(
        rl_instances.scenario, 2, cases, str(folders["root"] / "runs"), BUCKET_BYTES, timeout=600
    )
    return {(r["name"], r["rank"]): r for rank_reports in per_rank for r in rank_reports}


def _fresh(policy, draft) -> dict:
    import torch

    from specdraft.runtime.rl.engine import open_engine

    torch.set_num_threads(1)
    engine = open_engine("builtin", policy_dir=policy, draft_dir=draft, k=rl_instances.K, eos_id=None, device="cpu",
                         seed=0)  # fmt: skip
    return rl_instances._generate(engine)


@pytest.mark.timeout(900)
def test_each_instance_after_a_refit_equals_a_fresh_engine_on_those_weights(reports, folders):
    runs = folders["root"] / "runs"
    for name in CASES:
        want_before = _fresh(folders["policy"], runs / name / "draft" / "step-0")
        want_after = _fresh(folders["policy2"], runs / name / "draft" / "step-1")
        assert want_before[0.0][0] != want_after[0.0][0], "the new weights change the greedy rollouts"
        for rank in (0, 1):
            got = reports[name, rank]
            assert got["instance"] == rank and got["lead_of"] == rank, "rollout.tp 1: each rank leads its instance"
            assert got["before"] == want_before, (name, rank, "after the first refit")
            assert got["after"] == want_after, (name, rank, "after the refit of new weights")
            assert sorted(got["policy_s"]) == sorted(got["draft_s"]) == [0, 1]
            assert all(s > 0 for s in got["policy_s"].values())


@pytest.mark.timeout(900)
def test_a_sender_holds_one_bucket_buffer_within_the_bound(reports):
    for name in CASES:
        for rank in (0, 1):
            got = reports[name, rank]
            assert len(got["allocations"]) == 1, (name, rank, got["allocations"])
            assert got["allocations"][0] <= BUCKET_BYTES
            assert got["buckets"]["policy"] > 20, (name, rank, got["buckets"])
    # dp2: each instance is fed by its own replica; pp2 and tp2: replica 0 feeds both instances, each rank its shards
    for rank in (0, 1):
        assert reports["dp2", rank]["feeds"]["policy"] == [rank]
        assert reports["pp2", rank]["feeds"]["policy"] == reports["tp2", rank]["feeds"]["policy"] == [0, 1]
    # the draft: from the draft's stage (pp2: the last, rank 1), tensor rank 0 (tp2: rank 0), each replica's own (dp2)
    assert [reports["pp2", r]["feeds"]["draft"] for r in (0, 1)] == [[], [0, 1]]
    assert [reports["tp2", r]["feeds"]["draft"] for r in (0, 1)] == [[0, 1], []]
    assert [reports["dp2", r]["feeds"]["draft"] for r in (0, 1)] == [[0], [1]]
