"""Training on a real data file through the real rank payload: a chat jsonl tokenised by a real tokenizer (a BPE
trained with `tokenizers`, saved with a Llama-3-like chat template, loaded by AutoTokenizer from model.path).

- tiny-cpu's layout (tp1 cp2 pp2, 4 ranks): every rank builds the same packed rows (the digest of all the rows
  each rank built is equal on every rank), the data position (epoch, index of the next sample) advances past an
  epoch boundary, and each checkpoint's marker records it.
- Resume: a run started with --resume-from the step-2 checkpoint continues at the recorded data position: its
  metrics (losses, acceptance, positions) are bit-identical to the uninterrupted run's steps 2 and 3.
- A sample longer than model.seq_length stops every rank (pp2, 2 ranks) before any collective with exit 2 and the
  same message, naming the file, the line and the field.
- A resume with the data file edited since its checkpoint stops every rank with exit 2 naming the file; with
  --allow-data-change it trains on the new file from its first sample and its result says so.
"""

from __future__ import annotations

import json

import pytest

from specdraft.runs.checkpoints import MARKER
from tests.support.hf_tokenizer import VOCAB_SIZE, conversations, make_model_folder, write_jsonl
from tests.support.rank_procs import RankRun, metrics, result, without_timing, write_plan

pytestmark = pytest.mark.dist
STEPS = 4
COTRAIN = ("--workload", "cotrain")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model_folder(tmp_path_factory.mktemp("hf") / "model")


def _overrides(data, model) -> list[str]:
    return [
        f"data.path={data}",
        f"model.path={model}",
        f"model.vocab_size={VOCAB_SIZE}",
        "model.seq_length=128",
        "training.warmup_steps=1",
        "training.save_interval=2",
        "training.keep_checkpoints=3",
        f"training.train_iters={STEPS}",
    ]


@pytest.mark.timeout(900)
def test_a_data_file_run_packs_alike_on_every_rank_and_resumes_at_its_position(tmp_path, model):
    data = write_jsonl(tmp_path / "chats.jsonl", [{"messages": c} for c in conversations(10, seed=5)])
    first = tmp_path / "first"
    write_plan(first, _overrides(data, model))
    run = RankRun.start(first, 4, *COTRAIN)
    assert run.wait() == [0] * 4, run.stderr_tail()
    rows = metrics(first)
    assert [r["step"] for r in rows] == list(range(STEPS)) and rows[-1]["draft_loss"] is not None
    positions = [(r["data"]["epoch"], r["data"]["index"]) for r in rows]
    assert positions == sorted(positions) and positions[-1][0] >= 1, f"past an epoch boundary: {positions}"
    built = [result(first, rank)["data"] for rank in range(4)]
    assert all(b == built[0] for b in built) and built[0]["samples"] == 10, built
    marker = json.loads((first / "checkpoints" / "step-2" / MARKER).read_text())
    assert marker["data"] == rows[1]["data"], "step-2 records the position after step index 1"

    second = tmp_path / "second"
    write_plan(second, _overrides(data, model))
    run = RankRun.start(second, 4, *COTRAIN, "--resume-from", str(first / "checkpoints" / "step-2"))
    assert run.wait() == [0] * 4, run.stderr_tail()
    assert result(second, 0)["resumed_step"] == 2
    assert without_timing(metrics(second)) == without_timing(rows), "bit-identical, at the same data positions"


@pytest.mark.timeout(600)
def test_every_rank_refuses_a_sample_longer_than_seq_length(tmp_path, model):
    chats = conversations(3, seed=6)
    chats[1] = [{"role": "user", "content": " ".join(["hello"] * 200)}, {"role": "assistant", "content": "sure"}]
    data = write_jsonl(tmp_path / "long.jsonl", [{"messages": c} for c in chats])
    run_dir = tmp_path / "run"
    write_plan(run_dir, [*_overrides(data, model), "cluster.gpus_per_node=2", "parallel.cp=1"])
    run = RankRun.start(run_dir, 2, *COTRAIN)
    assert run.wait() == [2, 2], run.stderr_tail()
    errors = [result(run_dir, rank)["error"] for rank in range(2)]
    assert errors[0] == errors[1], "the same message on every rank"
    assert f"data file {data}: 1 problem" in errors[0]
    assert "line 2, field `messages`" in errors[0] and "longer than model.seq_length (128)" in errors[0]
    assert errors[0].splitlines()[-1].startswith(f"data file {data}: line 2, field `messages`: "), "the headline"
    assert all(result(run_dir, rank)["error_type"] == "DataError" for rank in range(2))
    assert "Traceback" not in (run_dir / "rank-0.err").read_text()


@pytest.mark.timeout(900)
def test_a_resume_with_an_edited_data_file_is_refused_unless_allowed(tmp_path, model):
    data = write_jsonl(tmp_path / "chats.jsonl", [{"messages": c} for c in conversations(6, seed=7)])
    run_dir = tmp_path / "run"
    write_plan(run_dir, [*_overrides(data, model), "cluster.gpus_per_node=2", "parallel.cp=1"])
    run = RankRun.start(run_dir, 2, *COTRAIN, "--steps", "2")
    assert run.wait() == [0, 0], run.stderr_tail()
    write_jsonl(data, [{"messages": c} for c in conversations(7, seed=7)])  # one row more: other content
    run = RankRun.start(run_dir, 2, *COTRAIN, "--resume")
    assert run.wait() == [2, 2], run.stderr_tail()
    errors = [result(run_dir, rank)["error"] for rank in range(2)]
    assert errors[0] == errors[1] and f"data file {data} is not the file checkpoint" in errors[0], errors[0]
    assert "--allow-data-change" in errors[0] and result(run_dir, 0)["error_type"] == "ResumeError"
    run = RankRun.start(run_dir, 2, *COTRAIN, "--resume", "--allow-data-change")
    assert run.wait() == [0, 0], run.stderr_tail()
    assert result(run_dir, 0)["resumed_step"] == 2
    assert any("the data starts at its first sample" in w for w in result(run_dir, 0)["warnings"]), result(run_dir, 0)
