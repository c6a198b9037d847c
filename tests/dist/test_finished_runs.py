"""What a finished run leaves for its user, on real runs of the shipped layouts (one process each, built-in engine):

- with training.save_interval at its default 0, a finished grpo run and a finished cotrain run each keep their last
  step's checkpoint, so `specdraft export RUN --policy` works on both, and each result says `draft_init`;
- `status` on the finished GRPO run (through the in-process CLI) shows its reward, response length, the engine's
  accept length and per-position acceptance and refit seconds, equal to its metrics.jsonl; `status --plot` draws
  them into a PNG; `rollouts` prints the recorded samples with the rewards rl/rollouts.jsonl holds.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import SPECDRAFT_BIN
from tests.support.cli import run_cli
from tests.support.paths import SHIPPED

pytestmark = pytest.mark.dist
GRPO_STEPS = 4  # one SFT step, three RL steps
PNG = b"\x89PNG\r\n\x1a\n"


def _launch(folder: Path, layout: str, *overrides: str, steps: int) -> None:
    argv = [str(SPECDRAFT_BIN), "launch", layout, *overrides, "--steps", str(steps), "--executor", "local"]
    argv += ["--run-dir", str(folder)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=400, cwd=folder.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("grpo") / "run"
    single = ["cluster.gpus_per_node=1", "parallel.pp=1", "grpo.sft_steps=1"]
    _launch(folder, str(SHIPPED / "grpo-tiny-cpu.yaml"), *single, steps=GRPO_STEPS)
    return folder


def _rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def _result(folder: Path) -> dict:
    return json.loads((folder / "results" / "rank-00000.json").read_text())


def _export_policy(folder: Path, out: Path) -> None:
    proc = subprocess.run(
        [str(SPECDRAFT_BIN), "export", str(folder), "--policy", "-o", str(out)], capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (out / "config.json").is_file() and list(out.glob("*.safetensors"))


@pytest.mark.timeout(600)
def test_a_finished_grpo_run_keeps_its_last_weights_and_says_draft_init(grpo_run, tmp_path):
    plan = json.loads((grpo_run / "plan.json").read_text())
    assert plan["training"]["save_interval"] == 0, "the default: no periodic checkpoint"
    assert (grpo_run / "checkpoints" / f"step-{GRPO_STEPS}" / "specdraft-checkpoint.json").is_file()
    assert _result(grpo_run)["draft_init"] == "random"
    _export_policy(grpo_run, tmp_path / "policy")


@pytest.mark.timeout(600)
def test_a_finished_cotrain_run_keeps_its_last_weights_and_says_draft_init(tmp_path):
    folder = tmp_path / "cotrain"
    _launch(folder, "tiny-cpu", "cluster.gpus_per_node=1", "parallel.cp=1", "parallel.pp=1", steps=2)
    assert (folder / "checkpoints" / "step-2" / "specdraft-checkpoint.json").is_file()
    assert _result(folder)["draft_init"] == "random"
    _export_policy(folder, tmp_path / "policy")


@pytest.mark.timeout(600)
def test_status_shows_the_finished_grpo_runs_figures(grpo_run):
    rows = _rows(grpo_run)
    assert [r["phase"] for r in rows] == ["sft", "grpo", "grpo", "grpo"]
    proc = run_cli("status", grpo_run)
    assert proc.returncode == 0, proc.stderr
    assert "SFT warm-up: 1 step(s)" in proc.stdout and "GRPO: 3 RL step(s)" in proc.stdout
    last = rows[-1]
    line = next(x for x in proc.stdout.splitlines() if x.lstrip("│ ").startswith(f"{GRPO_STEPS} "))
    cells = [c.strip() for c in line.strip("│ ").split("│")]
    engine = last["engine"]
    k = len(engine["acceptance_per_pos"])
    want = [
        str(GRPO_STEPS),
        f"{last['reward_mean']:.3f}",
        f"{last['reward_std']:.3f}",
        f"{last['response_length']:.1f}",
        f"{engine['accept_length']:.2f}",
        *(f"{a:.3f}" for a in engine["acceptance_per_pos"]),
        f"{engine['tokens_per_target_forward']:.2f}",
        f"{last['draft_loss']:.4f}",
        f"{last['refit_s']:.3f}",
        f"{last['step_time_s']:.2f}",
    ]
    assert cells == want and k == 3, (cells, want)


@pytest.mark.timeout(600)
def test_status_plot_and_rollouts_of_the_finished_grpo_run(grpo_run, tmp_path):
    pytest.importorskip("matplotlib")
    picture = tmp_path / "grpo.png"
    proc = run_cli("status", grpo_run, "--plot", picture)
    assert proc.returncode == 0, proc.stderr
    data = picture.read_bytes()
    assert data.startswith(PNG) and len(data) > 20_000
    recorded = [json.loads(line) for line in (grpo_run / "rl" / "rollouts.jsonl").read_text().splitlines()]
    newest = max(r["step"] for r in recorded)
    # per-sample records, or (written before samples carried their text) one record per step
    want = [r["reward"] for r in recorded if r["step"] == newest and "reward" in r]
    want += [e[2] for r in recorded if r["step"] == newest for e in r.get("rollouts", [])]
    got = run_cli("rollouts", grpo_run, "--format", "json")
    assert got.returncode == 0, got.stderr
    assert [r["reward"] for r in json.loads(got.stdout)] == want and len(want) == 32
    text = run_cli("rollouts", grpo_run)
    assert text.stdout.startswith(f"step {newest + 1} (the newest of 3 recorded") and "reward" in text.stdout
