"""What a resume continues with: the data file it trained on, and GRPO's rollouts.jsonl rewound with metrics.jsonl.

- A checkpoint records its data file's sha256; `launch --resume` with a file whose content changed since is refused
  before anything is written (exit 2, naming the file, both hashes and the fix), unless --allow-data-change, which
  the ranks get too (they check the same against the digest of an older checkpoint that lacks the sha256).
- rollouts.jsonl keeps only the rows of the steps before the one a resume continues at, in both its formats (one
  row per sample, or per step in older runs); a start over (--force) moves it to attempts/ with metrics.jsonl.
"""

from __future__ import annotations

import hashlib
import json

from specdraft.assemble import compile
from specdraft.execute.launch import _archive
from specdraft.runs import checkpoints
from specdraft.runs.rundir import claim_run_dir
from specdraft.spec.load import load_layout
from tests.support.checkpoints import fake_checkpoint
from tests.support.cli import run_cli

CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def _setup(tmp_path, recorded: dict | None = None):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "tokenizer.json").write_text("{}")
    data = tmp_path / "chats.jsonl"
    data.write_text(json.dumps({"messages": CHAT}) + "\n")
    over = [f"data.path={data}", f"model.path={tmp_path / 'model'}"]
    plan = compile(load_layout(None, over))
    run = tmp_path / "run"
    claim_run_dir(run)
    sha = hashlib.sha256(data.read_bytes()).hexdigest()
    position = recorded if recorded is not None else {"epoch": 0, "index": 1, "digest": "d" * 64, "sha256": sha}
    fake_checkpoint(run / "checkpoints" / "step-2", plan, 2, data=position)
    return data, run, over, sha


def _resume(run, over, *extra):
    return run_cli("launch", *over, "--executor", "local", "--run-dir", run, "--resume", "--dry-run", *extra)


def test_a_changed_data_file_is_refused_unless_the_launch_allows_it(tmp_path):
    data, run, over, then = _setup(tmp_path)
    same = _resume(run, over)
    assert same.returncode == 0, same.stderr
    data.write_text(json.dumps({"messages": CHAT}) + "\n" + json.dumps({"messages": CHAT}) + "\n")
    now = hashlib.sha256(data.read_bytes()).hexdigest()
    refused = _resume(run, over)
    text = " ".join(refused.stderr.split())
    assert refused.returncode == 2 and "Traceback" not in text, text
    assert f"data file {data} is not the file checkpoint {run / 'checkpoints' / 'step-2'} was trained on" in text
    assert f"sha256 {then[:12]} then, {now[:12]} now" in text and "--allow-data-change" in text, text
    allowed = _resume(run, over, "--allow-data-change")
    assert allowed.returncode == 0, allowed.stderr
    assert f"data file {data} changed since" in allowed.stderr, allowed.stderr
    assert "--resume --allow-data-change" in allowed.stderr, "every rank gets the flag: they check it too"


def test_an_older_checkpoint_without_the_files_hash_is_left_to_the_ranks(tmp_path):
    _, run, over, _ = _setup(tmp_path, {"epoch": 0, "index": 1, "digest": "d" * 64})
    got = _resume(run, over)
    assert got.returncode == 0, got.stderr  # the ranks compare the digest of the tokenised samples
    assert checkpoints.data_change({"digest": "a" * 64}, {"digest": "b" * 64, "sha256": "c" * 64}) == (
        "a" * 64,
        "b" * 64,
    )
    assert checkpoints.data_change(None, {"digest": "b" * 64}) is None, "the built-in data: no file to compare"


def _rows(path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rollouts_are_rewound_to_the_resumed_step_and_moved_on_a_start_over(tmp_path):
    run = tmp_path / "run"
    claim_run_dir(run)
    (run / "rl").mkdir()
    rollouts = run / "rl" / "rollouts.jsonl"
    old = [{"step": s, "rollouts": [[0, [5, 6], 1.0]]} for s in (1, 2, 3)]  # one line per step (older runs)
    new = [{"step": s, "instance": 0, "prompt_index": i, "reward": 0.5} for s in (3, 4) for i in (0, 1)]
    lines = [json.dumps(r) for r in old + new] + ['{"step": 9, "instance": 0, "resp']  # cut short by a kill
    rollouts.write_text("\n".join(lines))
    checkpoints.rewind_rollouts(run, 3)
    assert [r["step"] for r in _rows(rollouts)] == [1, 2], "steps 3 and later run again: their rows go"
    checkpoints.rewind_rollouts(run, 0)
    assert rollouts.read_text() == ""
    rollouts.write_text(json.dumps(new[0]) + "\n")
    _archive(str(run), 2, resume=False)
    assert not rollouts.exists() and _rows(run / "attempts" / "1" / "rl" / "rollouts.jsonl") == [new[0]]
