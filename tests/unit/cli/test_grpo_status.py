"""Watching a GRPO run without ranks: `status` on a run folder whose metrics.jsonl holds GRPO rows (the keys the
GRPO loop writes, with and without the per-instance list of the metrics contract), `rollouts` on the per-sample,
the per-step (older) and the failed-step records of rl/rollouts.jsonl, and `status --plot`. A run folder the real
grpo workload wrote is watched in tests/dist/test_finished_runs.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdraft.assemble import compile
from specdraft.spec.load import load_layout
from tests.support.cli import run_cli
from tests.support.paths import SHIPPED
from tests.support.run_folder import make_run_folder

SINGLE = ["cluster.gpus_per_node=1", "parallel.pp=1"]
PNG = b"\x89PNG\r\n\x1a\n"


def grpo_row(step: int, **more) -> dict:
    """A GRPO step's row as the loop writes it (runtime/rl/metrics.py)."""
    return {
        "step": step, "phase": "grpo", "target_loss": None, "draft_loss": 0.6 - step / 100,
        "acceptance": [0.7, 0.5, 0.3], "accept_len": 2.5, "tap_bytes": 0, "step_time_s": 0.37 + step / 100,
        "policy_loss": -0.01, "kl": 0.0, "clip_fraction": 0.0, "loss": -0.01,
        "reward_mean": 0.25 + step / 10, "reward_std": 0.125, "response_length": 7.5, "finished_fraction": 0.25,
        "engine": {
            "accept_length": 2.0 + step / 10, "acceptance_per_pos": [0.75, 0.5, 0.25 + step / 100],
            "num_generated_tokens": 256, "num_target_forwards": 112, "tokens_per_target_forward": 2.25,
        },
        "generate_s": 0.05, "score_s": 0.007, "train_s": 0.3, "refit_s": 0.0024 + step / 1000, "tokens_per_s": 5000.0,
        **more,
    }  # fmt: skip


def sft_row(step: int) -> dict:
    return {"step": step, "phase": "sft", "target_loss": 3.5 - step / 10, "draft_loss": 1.0, "acceptance": [0.1] * 3,
            "accept_len": 1.2, "tap_bytes": 0, "step_time_s": 0.4}  # fmt: skip


INSTANCES = [
    {"instance": 0, "samples": 16, "generated_tokens": 128, "busy_s": 0.04, "idle_s": 0.01, "accept_length": 2.5,
     "refit_s": 0.002},
    {"instance": 1, "samples": 16, "generated_tokens": 120, "busy_s": 0.03, "idle_s": 0.02, "accept_length": 2.25,
     "refit_s": 0.003},
]  # fmt: skip


@pytest.fixture(scope="module")
def plan():
    return compile(load_layout(SHIPPED / "grpo-tiny-cpu.yaml", SINGLE))


def grpo_folder(root: Path, plan, rows: list[dict]) -> Path:
    folder = make_run_folder(root / "run", plan)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_status_shows_reward_length_accept_length_per_position_and_refit(tmp_path, plan):
    folder = grpo_folder(tmp_path, plan, [sft_row(0), grpo_row(1), grpo_row(2), grpo_row(3)])
    proc = run_cli("status", folder)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "SFT warm-up: 1 step(s), last target loss 3.5000" in out
    assert "GRPO: 3 RL step(s)" in out
    for header in ("reward", "±std", "resp len", "accept len", "accept@1", "accept@2", "accept@3", "refit s"):
        assert header in out, header
    last = next(line for line in out.splitlines() if line.lstrip("│ ").startswith("4 "))  # step index 3
    cells = [c.strip() for c in last.strip("│ ").split("│")]
    assert cells[:9] == ["4", "0.550", "0.125", "7.5", "2.30", "0.750", "0.500", "0.280", "2.25"], cells
    assert cells[10] == "0.005"  # refit_s
    assert "draft acceptance (top-1 match" not in out, "a GRPO run's view, not co-training's"
    assert "rollout instances" not in out, "no instances in these rows"


def test_status_shows_each_instance_once_the_rows_carry_them(tmp_path, plan):
    odd = [*INSTANCES, {"instance": 2, "samples": "many", "busy_s": None}, "not an object"]
    rows = [grpo_row(0), grpo_row(1, instances=odd, policy_version=1)]
    proc = run_cli("status", grpo_folder(tmp_path, plan, rows))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "rollout instances at step 2 (policy version 1)" in out
    lines = {c[0]: c for c in ([x.strip() for x in line.strip("│ ").split("│")] for line in out.splitlines()) if c}
    assert lines["0"] == ["0", "16", "128", "0.04", "0.01", "2.50", "0.002"]
    assert lines["1"] == ["1", "16", "120", "0.03", "0.02", "2.25", "0.003"]
    assert lines["2"] == ["2", "-", "-", "-", "-", "-", "-"], "odd values show as -"


def test_a_cotrain_run_keeps_its_acceptance_table(tmp_path, plan):
    folder = make_run_folder(tmp_path / "run", compile(load_layout(None)))
    proc = run_cli("status", folder)
    assert proc.returncode == 0 and "draft acceptance (top-1 match" in proc.stdout and "GRPO" not in proc.stdout


def sample(step: int, i: int, **more) -> dict:
    """One per-sample record of the rollouts contract."""
    return {
        "step": step, "instance": i % 2, "policy_version": step, "prompt_index": i // 2,
        "prompt_text": f"what is {i} + 1?", "response_text": f"{i + 1}", "answer": f"{i + 1}",
        "reward": 1.0 if i % 3 else 0.0, "prompt_ids": [1, 2, i], "response_ids": [i + 1, 0], "finished": i != 3,
        **more,
    }  # fmt: skip


def write_rollouts(folder: Path, records: list) -> None:
    (folder / "rl").mkdir(exist_ok=True)
    (folder / "rl" / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_rollouts_prints_each_sample_with_its_text_and_reward(tmp_path, plan):
    folder = grpo_folder(tmp_path, plan, [grpo_row(0), grpo_row(1)])
    evil = sample(1, 3, response_text="4\x1b]0;owned\x07\x1b[2J", future_key={"kept": True})
    write_rollouts(folder, [sample(0, i) for i in range(4)] + [sample(1, i) for i in range(3)] + [evil])
    newest = run_cli("rollouts", folder)
    assert newest.returncode == 0, newest.stderr
    out = newest.stdout
    assert out.startswith("step 2 (the newest of 2 recorded; --step N shows another): 4 sample(s), reward mean 0.5000")
    assert "policy version 1" in out
    assert "#1  prompt 0  instance 1  reward 1.0000  finished" in out
    assert "#3  prompt 1  instance 1  reward 0.0000  cut at the length limit" in out
    assert "    prompt:   what is 2 + 1?\n    response: 3\n    answer:   3\n" in out
    assert "\x1b" not in out and "\x07" not in out, "no escape sequence reaches the terminal"
    first = run_cli("rollouts", folder, "--step", "1", "--format", "json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == [{**sample(0, i)} for i in range(4)]
    evil_json = json.loads(run_cli("rollouts", folder, "--format", "json").stdout)[-1]
    assert evil_json["future_key"] == {"kept": True} and evil_json["response_text"] == evil["response_text"]
    missing = run_cli("rollouts", folder, "--step", "9")
    assert missing.returncode == 2 and "--step 9 is not recorded" in missing.stderr and "1, 2" in missing.stderr


def test_rollouts_shows_older_per_step_records_as_ids_and_a_failed_step(tmp_path, plan):
    folder = grpo_folder(tmp_path, plan, [grpo_row(0), grpo_row(1)])
    old = {"step": 0, "rollouts": [[0, [5, 11, 25], 0.125], [1, [19, 28], 0.0]]}
    failed = {"step": 1, "error": "the reward function raised RuntimeError: boom on prompt 3"}
    write_rollouts(folder, [old, "not a record", {"step": "x"}, failed])
    (folder / "rl" / "rollouts.jsonl").write_text((folder / "rl" / "rollouts.jsonl").read_text() + '{"step": 1, "re')
    proc = run_cli("rollouts", folder, "--step", "1")
    assert proc.returncode == 0, proc.stderr
    assert "step 1: 2 sample(s), reward mean 0.0625" in proc.stdout
    assert "(token ids only" in proc.stdout
    assert "#0  prompt 0  reward 0.1250\n    response ids: [5, 11, 25]" in proc.stdout
    assert "note: 3 line(s)" in proc.stdout  # the string, the step of another type, the line being written
    assert json.loads(run_cli("rollouts", folder, "--step", "1", "-f", "json").stdout) == [
        {"step": 0, "prompt_index": 0, "reward": 0.125, "response_ids": [5, 11, 25]},
        {"step": 0, "prompt_index": 1, "reward": 0.0, "response_ids": [19, 28]},
    ]
    failed_out = run_cli("rollouts", folder).stdout
    assert failed_out.startswith("step 2 (the newest") and "the reward failed: the reward function raised" in failed_out


def test_rollouts_of_a_run_without_them_is_one_message(tmp_path, plan):
    folder = make_run_folder(tmp_path / "run", compile(load_layout(None)))
    proc = run_cli("rollouts", folder)
    assert proc.returncode == 2 and "rl/rollouts.jsonl does not exist" in proc.stderr and "grpo" in proc.stderr
    (folder / "rl").mkdir()
    (folder / "rl" / "rollouts.jsonl").symlink_to("/etc/passwd")
    proc = run_cli("rollouts", folder)
    assert proc.returncode == 2 and "symbolic link" in proc.stderr and "Traceback" not in proc.stderr


def test_status_plot_draws_the_run_into_a_png(tmp_path, plan):
    pytest.importorskip("matplotlib")
    rows = [sft_row(0), *(grpo_row(s) for s in range(1, 12))]
    folder = grpo_folder(tmp_path, plan, rows)
    out = tmp_path / "run.png"
    proc = run_cli("status", folder, "--plot", out)
    assert proc.returncode == 0, proc.stderr
    data = out.read_bytes()
    assert data.startswith(PNG) and len(data) > 20_000, len(data)
    assert f"wrote {out}" in proc.stdout
    cotrain = make_run_folder(tmp_path / "cotrain", compile(load_layout(None)))
    assert run_cli("status", cotrain, "--plot", tmp_path / "c.png").returncode == 0
    assert (tmp_path / "c.png").read_bytes().startswith(PNG)
    wrong = run_cli("status", folder, "--plot", tmp_path / "run.svg")
    assert wrong.returncode == 2 and "must name a .png file" in wrong.stderr and not (tmp_path / "run.svg").exists()
    (folder / "metrics.jsonl").write_text("")
    empty = run_cli("status", folder, "--plot", tmp_path / "empty.png")
    assert empty.returncode == 2 and "no step in metrics.jsonl" in empty.stderr
