"""The rollout instances with the built-in engine (runtime/rl/instances), inside real gloo worlds with a real
megatron-core GRPO trainer that loaded a tiny HF Llama:

- one engine per instance, on its lead rank (rollout.tp 1: every rank leads one), started from config-only folders;
- after the first refit and after a refit of new weights (a second HF checkpoint loaded into the trainer, the draft
  scaled), each instance's greedy and seeded sampled rollouts through the draft, and its per-position acceptance,
  equal a fresh engine's on those weights (the HF folder itself, the draft as serve/export.publish wrote it);
- under pp2, tp2, dp2 (each instance fed by its own replica) and ep2 of a tiny Mixtral (the experts from both
  ranks, expert-data-parallel rank 0, into each instance), with a bucket bound of 4 KiB that forces many buckets
  and splits slices by rows, every sending rank allocated one buffer, once, within the bound.
"""

from __future__ import annotations

import pytest

from tests.support import rl_instances, rl_models
from tests.support.distributed import run_distributed

pytestmark = pytest.mark.dist
BUCKET_BYTES = 4096  # the 128-wide rows are 512 B: several per bucket; a 192-wide fc1 slice needs many buckets
# name: (the model, the layout's overrides)
CASES = {
    "pp2": ("llama", ["parallel.pp=2"]),
    "tp2": ("llama", ["parallel.tp=2", "parallel.pp=1"]),
    "dp2": ("llama", ["parallel.pp=1"]),
    "ep2": ("mixtral", ["parallel.pp=1", "parallel.ep=2"]),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("instances")
    mixtral = dict(hidden_size=128, num_attention_heads=4)
    return {
        "root": root,
        "llama": (rl_models.make_policy(root / "policy"), rl_models.make_policy(root / "policy2", seed=5)),
        "mixtral": (
            rl_models.hf_models.make("mixtral", root / "mixtral", seed=0, **mixtral),
            rl_models.hf_models.make("mixtral", root / "mixtral2", seed=3, **mixtral),
        ),
    }


def _plan(folders, kind: str, more: list[str]):
    policy = folders[kind][0]
    extra = _moe_shape() if kind == "mixtral" else []
    return rl_instances.plan_of(policy, ["cluster.gpus_per_node=2", "parallel.cp=1", *extra, *more])


def _moe_shape() -> list[str]:
    """The Mixtral's shape (hidden 128, ffn 96, 4 experts, top 2) over rl_instances' Llama overrides."""
    c = rl_models.hf_models.COMMON
    return [f"model.ffn_hidden_size={c['intermediate_size']}", "model.num_experts=4",
            f"model.moe_ffn_hidden_size={c['intermediate_size']}", "model.moe_router_topk=2"]  # fmt: skip


@pytest.fixture(scope="module")
def reports(folders):
    cases = [(name, _plan(folders, kind, more), str(folders[kind][1])) for name, (kind, more) in CASES.items()]
    per_rank = run_distributed(
        rl_instances.scenario, 2, cases, str(folders["root"] / "runs"), BUCKET_BYTES, timeout=900
    )
    reports = {(r["name"], r["rank"]): r for rank_reports in per_rank for r in rank_reports}
    for (name, rank), r in sorted(reports.items()):  # the figures docs/grpo-rollouts.md quotes (pytest -s)
        print(f"refit {name} rank {rank}: policy {r['policy_s']} draft {r['draft_s']}")
    return reports


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
    for name, (kind, _) in CASES.items():
        want_before = _fresh(folders[kind][0], runs / name / "draft" / "step-0")
        want_after = _fresh(folders[kind][1], runs / name / "draft" / "step-1")
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
    # ep2 (dp2, edp1): each rank's dense shards to its own instance, its experts to both
    assert [reports["ep2", r]["feeds"]["policy"] for r in (0, 1)] == [[0, 1], [0, 1]]
