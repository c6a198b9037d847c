"""The runtime's CUDA-only paths, run on CPU/gloo wherever they can run there (docs/gpu.md, "CUDA path review"):

- bf16 parameters with fp32 main weights through the real rank payload: close to the fp32 run; the distributed
  optimizer (dp = 2, whole-parameter owners) gives bit-identical metrics to the replicated one; the plan's memory
  estimate (2-byte weights, 4-byte grads, 12-byte optimizer state) matches what the ranks hold; a checkpoint the
  owners wrote resumes bit-identically into a replicated optimizer.
- fp16 with dynamic loss scaling on an MoE target (expert state sharded over expert dp): injected inf gradients
  skip steps and halve the scale after the hysteresis, and a resume from a checkpoint taken between the two bad
  steps continues bit-identically (loss-scale state, fp32 main weights and owner-held AdamW state restored).
- Tied embeddings at pp = 2 over megatron's batched P2P (what NCCL runs; gloo keeps its order without vpp) and
  at tp = 2 with sequence parallelism give the single-process losses.
- megatron's GPU weight-init path (use_cpu_initialization off, forks of the CUDA RNG tracker) ends with the same
  weights as the CPU path: init_parameters overwrites every parameter, so the tracker's per-rank seeds never reach
  the weights and every layout starts equal.
- The rank payload sets the sbatch script's NCCL/CUDA environment itself where the launcher did not.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from specdraft.runs.checkpoints import MARKER
from specdraft.runtime.models.target import BATCH_P2P_ENV
from specdraft.runtime.train.precision import NONFINITE_ENV
from tests.support.distributed import run_distributed
from tests.support.memory_accuracy import assert_memory_matches_plan
from tests.support.paths import SHIPPED
from tests.support.rank_procs import RankRun, metrics, result, without_timing, write_plan

pytestmark = pytest.mark.dist
MIXTRAL = SHIPPED / "mixtral-tiny-cpu.yaml"
STEPS = 4
BASE = ["training.warmup_steps=1", f"training.train_iters={STEPS}"]  # the draft joins at step 1
DP2 = ["cluster.gpus_per_node=2", "parallel.cp=1", "parallel.pp=1"]
SINGLE = ["cluster.gpus_per_node=1", "parallel.cp=1", "parallel.pp=1"]
MOE_DP2 = [
    "layout=mixtral",
    "cluster.gpus_per_node=2",
    "parallel.tp=1",
    "parallel.cp=1",
    "parallel.pp=1",
    "parallel.vpp=null",
    "parallel.ep=1",
    "parallel.etp=null",
    "parallel.sequence_parallel=false",
]
TRAINED = (
    "target_loss",
    "draft_loss",
    "acceptance",
    "accept_len",
    "grad_norm",
    "draft_grad_norm",
    "loss_scale",
    "skipped_step",
)


def _launch(run_dir, world: int, overrides: list[str], *args: str, env: dict | None = None) -> list[dict]:
    layout = None
    if overrides and overrides[0] == "layout=mixtral":
        layout, overrides = MIXTRAL, overrides[1:]
    write_plan(run_dir, BASE + overrides, layout=layout)
    run = RankRun.start(run_dir, world, "--workload", "cotrain", *args, env=env)
    assert run.wait() == [0] * world, run.stderr_tail()
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(STEPS))
    return rows


def _trained(rows: list[dict]) -> list[dict]:
    return [{k: r[k] for k in TRAINED} for r in rows]


@pytest.mark.timeout(600)
def test_bf16_main_weights_and_the_distributed_optimizer(tmp_path):
    fp32 = _launch(tmp_path / "fp32", 2, DP2)
    replicated = _launch(tmp_path / "bf16", 2, DP2 + ["training.dtype=bf16"])
    sharded = _launch(
        tmp_path / "bf16-sharded",
        2,
        DP2 + ["training.dtype=bf16", "training.distributed_optimizer=true", "training.save_interval=2"],
    )
    assert _trained(sharded) == _trained(replicated), "the distributed optimizer steps exactly like the replicated one"
    assert replicated[0]["precision"] == (
        "specdraft bf16 params, fp32 main weights, grads fp32, no loss scale, AdamW replicated"
    )
    assert sharded[0]["precision"].endswith("AdamW sharded over 2 dp x cp ranks")
    for got, want in zip(replicated, fp32):  # bf16 activations and weights, fp32 updates: close to fp32
        assert got["target_loss"] == pytest.approx(want["target_loss"], rel=1e-3), got["step"]
    assert replicated[-1]["target_loss"] < replicated[0]["target_loss"], "the bf16 target trains"
    assert all(r["loss_scale"] is None and r["skipped_step"] is False for r in replicated)

    assert_memory_matches_plan(tmp_path / "bf16")  # 2-byte weights, fp32 grads, fp32 main + AdamW: 12 bytes
    held = [result(tmp_path / name, r)["memory"]["optimizer"] for name in ("bf16", "bf16-sharded") for r in (0, 1)]
    assert held[2] < 0.75 * held[0] and held[3] < 0.75 * held[1]
    assert abs(held[2] + held[3] - held[0]) <= 8 * result(tmp_path / "bf16", 0)["memory"]["num_params"]

    # The owners' checkpoint, resumed into the replicated optimizer: every rank loads every state.
    resumed = _launch(
        tmp_path / "resumed",
        2,
        DP2 + ["training.dtype=bf16"],
        "--resume-from",
        str(tmp_path / "bf16-sharded" / "checkpoints" / "step-2"),
    )
    assert _trained(resumed) == _trained(sharded)


@pytest.mark.timeout(600)
def test_fp16_loss_scaling_skips_backs_off_and_resumes_exactly(tmp_path):
    env = {NONFINITE_ENV: "1,2"}  # rank 0 puts an inf into a target grad at steps 1 and 2
    fp16 = MOE_DP2 + ["training.dtype=fp16", "training.distributed_optimizer=true", "training.save_interval=2"]
    rows = _launch(tmp_path / "run", 2, fp16, env=env)
    assert [r["skipped_step"] for r in rows] == [False, True, True, False]
    # hysteresis 2: the first bad step keeps the scale, the second halves it for the next step's backward
    assert [r["loss_scale"] for r in rows] == [2.0**16, 2.0**16, 2.0**16, 2.0**15]
    assert rows[1]["grad_norm"] is None and rows[0]["grad_norm"] > 0 and rows[3]["grad_norm"] > 0
    assert rows[0]["grad_norm"] < 100, "unscaled before the norm (scaled by 2**16 it would be about 2e5)"
    assert rows[-1]["target_loss"] < rows[0]["target_loss"]
    assert "dynamic loss scale" in rows[0]["precision"]
    marker = json.loads((tmp_path / "run" / "checkpoints" / "step-2" / MARKER).read_text())
    assert marker["loss_scale"] == {"scale": 2.0**16, "growth_tracker": 0, "hysteresis_tracker": 1}

    resumed = _launch(
        tmp_path / "resumed", 2, fp16, "--resume-from", str(tmp_path / "run" / "checkpoints" / "step-2"), env=env
    )
    assert without_timing(resumed) == without_timing(rows), "scale, main weights and AdamW state restored"


@pytest.mark.timeout(600)
def test_tied_embeddings_over_batched_p2p_and_sequence_parallel_match_one_process(tmp_path):
    tied = ["model.tie_embeddings=true"]
    reference = _launch(tmp_path / "single", 1, SINGLE + tied)
    layouts = {
        "pp2-batched-p2p": (["cluster.gpus_per_node=2", "parallel.cp=1"], {BATCH_P2P_ENV: "1"}),
        "tp2-sp": (
            [
                "cluster.gpus_per_node=2",
                "parallel.tp=2",
                "parallel.cp=1",
                "parallel.pp=1",
                "parallel.sequence_parallel=true",
            ],
            None,
        ),
    }
    for name, (overrides, env) in layouts.items():
        rows = _launch(tmp_path / name, 2, overrides + tied, env=env)
        for got, want in zip(rows, reference):  # the tolerances of tests/dist/test_cotrain_parity.py
            assert got["target_loss"] == pytest.approx(want["target_loss"], rel=2e-5), (name, got["step"])
            if want["draft_loss"] is None:  # a warm-up step
                assert got["draft_loss"] is None, (name, got["step"])
            else:
                assert got["draft_loss"] == pytest.approx(want["draft_loss"], rel=2e-4, abs=1e-6), (name, got["step"])
        assert_memory_matches_plan(tmp_path / name)  # the last stage's copy of the tied embedding counted
    assert reference[-1]["target_loss"] < reference[0]["target_loss"]


def _init_paths_worker(rank: int, world: int, cases: list) -> dict:
    from megatron.core import parallel_state as ps

    from specdraft.runtime import cpu_compat
    from specdraft.runtime.models.draft import Eagle3Draft, draft_shape
    from specdraft.runtime.models.target import build_chunks, init_parameters, transformer_config

    cpu_compat.apply("cpu")
    cpu, out = torch.device("cpu"), {}
    for name, layout, overrides in cases:
        plan = _compile(layout, overrides)
        par = plan.parallel
        ps.initialize_model_parallel(
            tensor_model_parallel_size=par.tp,
            pipeline_model_parallel_size=par.pp,
            expert_model_parallel_size=par.ep,
            expert_tensor_parallel_size=par.etp,
            order=par.order,
            create_gloo_process_groups=False,
        )
        try:
            seed, pp_rank = plan.spec.training.seed, plan.ranks[rank].pp
            gpu = transformer_config(plan, torch.float32, "cuda")
            assert not gpu.use_cpu_initialization and gpu.batch_p2p_comm
            models = {}
            for path, config in (("cpu", None), ("gpu", gpu)):
                torch.manual_seed(1 if path == "cpu" else 2)  # megatron's own draws differ between the builds
                chunks = build_chunks(plan, pp_rank, cpu, torch.float32, seed, config=config)
                draft_config = dataclasses.replace(
                    config or transformer_config(plan, torch.float32, cpu), sequence_parallel=False
                )
                draft = Eagle3Draft(draft_shape(plan), draft_config)
                init_parameters(draft, 0, par.tp, seed ^ 0x5EED)
                models[path] = [*chunks, draft]
            pairs = [
                (n, a, b)
                for ma, mb in zip(models["cpu"], models["gpu"])
                for (n, a), (_, b) in zip(ma.named_parameters(), mb.named_parameters())
            ]
            out[name] = {"params": len(pairs), "differ": [n for n, a, b in pairs if not torch.equal(a, b)]}
        finally:
            ps.destroy_model_parallel()
    return out


def _compile(layout, overrides):
    from specdraft.assemble import compile
    from specdraft.spec.load import load_layout

    return compile(load_layout(layout, list(overrides)))


@pytest.mark.timeout(300)
def test_gpu_init_path_and_its_rng_tracker_never_reach_the_weights():
    moe = MIXTRAL
    cases = [
        ("dense-tp2", None, ["cluster.gpus_per_node=2", "parallel.tp=2", "parallel.cp=1", "parallel.pp=1"]),
        ("dense-pp2-tied", None, ["cluster.gpus_per_node=2", "parallel.cp=1", "model.tie_embeddings=true"]),
        (
            "moe-ep2",
            moe,
            [
                "cluster.gpus_per_node=2",
                "parallel.tp=1",
                "parallel.cp=1",
                "parallel.pp=1",
                "parallel.vpp=null",
                "parallel.ep=2",
                "parallel.etp=null",
                "parallel.sequence_parallel=false",
            ],
        ),
    ]
    for rank_result in run_distributed(_init_paths_worker, 2, cases, timeout=240):
        for name, got in rank_result.items():
            assert got["params"] > 10 and got["differ"] == [], name


def test_the_payload_sets_the_scripts_nccl_environment_where_the_launcher_did_not(monkeypatch):
    """The local launcher exports nothing: the rank payload sets what the sbatch script would (plan/environment.py),
    before CUDA starts; a value already set wins. Without CUDA the payload then refuses the GPU plan by name."""
    import os

    from specdraft.plan.environment import nccl_env
    from specdraft.runtime.entry import _device

    plan = _compile(
        None,
        [
            "cluster.gpu=h100-80gb",
            "cluster.num_nodes=2",
            "cluster.gpus_per_node=2",
            "parallel.tp=2",
            "parallel.cp=1",
            "parallel.pp=1",
        ],
    )
    wanted = {name: value for name, value, _ in nccl_env(plan)}
    assert set(wanted) == {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "CUDA_DEVICE_MAX_CONNECTIONS", "NCCL_DEBUG"}
    for name in wanted:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch.cuda.is_available"):
            _device(plan, 0)
    assert {name: os.environ[name] for name in wanted} == {**wanted, "NCCL_DEBUG": "INFO"}
