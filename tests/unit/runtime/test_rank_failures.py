"""How a rank fails, read from its real process (`python -m specdraft.runtime.entry`, one rank of a larger world):

- a user error (any UserError: a DataError, a RewardError, a refused file) shows its message on the line the
  launcher's summary and the per-rank tables show, never its fix;
- the grpo workload runs the same checks before its first collective as cotrain (the HF checkpoint, the draft's,
  the data file): a bad checkpoint stops the rank with its own message, not after a process-group timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specdraft.assemble import compile
from specdraft.datafile import DataError
from specdraft.errors import UserError, headline_of
from specdraft.execute.report import failure_message, read_results
from specdraft.runtime.rl.rewards import RewardError
from specdraft.spec.load import load_layout
from tests.support import hf_models
from tests.support.model_files import rewrite_header


def _rank(plan_path: Path, world: int, *args: str, **env: str) -> subprocess.CompletedProcess:
    """Rank 0 of a ``world``-rank job, alone: any collective would wait for peers that never come."""
    environ = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": "0",
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29571",
        **env,
    }
    environ.pop("SPECDRAFT_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "specdraft.runtime.entry", str(plan_path), *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "err",
    [
        RewardError("the reward function returned nan on prompt 3", "return a finite number"),
        DataError("data file /d.jsonl: 2 problems:\n  - line 2: ...", "fix those rows"),
        UserError("plan file /r/plan.json is a FIFO", "pass the path of a regular file"),
    ],
)
def test_every_user_error_has_a_headline_that_is_its_message(err):
    assert headline_of(err) == err.message.splitlines()[0] and "fix" not in headline_of(err)


def test_a_rank_that_stops_on_a_user_error_is_summarised_by_its_message(tmp_path):
    plan = compile(load_layout(None, []))
    os.mkfifo(tmp_path / "plan.json")  # read_plan refuses it: a UserError with a fix
    proc = _rank(tmp_path / "plan.json", plan.world_size)
    assert proc.returncode == 2, proc.stderr
    results = read_results(tmp_path, plan.world_size)
    last = results[0]["error"].strip().splitlines()[-1]
    assert "is a FIFO" in last and "fix:" not in last, results[0]["error"]
    summary = failure_message(plan, results, 0, tmp_path, None, "the run FAILED").splitlines()[0]
    assert summary.endswith(last) and "failed first: plan file" in summary, summary


def test_grpo_checks_the_checkpoint_before_its_first_collective(tmp_path):
    folder = Path(shutil.copytree(hf_models.make("llama", tmp_path / "made"), tmp_path / "llama"))

    def overlap(header: dict) -> None:
        a, b = (next(n for n in header if n.endswith(f"layers.{i}.input_layernorm.weight")) for i in (0, 1))
        header[b]["data_offsets"] = list(header[a]["data_offsets"])

    rewrite_header(folder / "model.safetensors", overlap)
    plan = compile(load_layout(None, hf_models.overrides(folder)))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "plan.json").write_text(plan.to_json())
    # Past the checks, rank 0 would wait for its peers: the timeout says so, and no check ran before it.
    proc = _rank(tmp_path / "run" / "plan.json", plan.world_size, "--workload", "grpo", SPECDRAFT_DIST_TIMEOUT_S="30")
    result = json.loads((tmp_path / "run" / "results" / "rank-00000.json").read_text())
    assert result["ok"] is False and result["error_type"] == "CheckpointError", result["error"][-2000:]
    assert str(folder / "model.safetensors") in result["error"] and "overlap" in result["error"], result["error"]
    assert proc.returncode != 0
