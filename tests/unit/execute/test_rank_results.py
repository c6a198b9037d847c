"""A rank's result decides the run's state, through a real local launch whose ranks are real processes: `--python`
names a stand-in interpreter that writes (or does not write) each rank's result file the way the runtime does, then
exits as told. A rank that exits 0 without its result makes the run FAILED (run.json, status and the launcher's
exit code), naming the rank; the warnings the ranks record (what they did other than asked) reach the launcher's
output and `status`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specdraft.runs.rundir import read_record
from tests.support.cli import run_cli

RANK = """#!{python}
import json, os, sys
rank = int(os.environ["RANK"])
plan = sys.argv[sys.argv.index("specdraft.runtime.entry") + 1]
told = json.loads(os.environ["FAKE_RANKS"]).get(str(rank), {{}})
if told.get("result", True):
    record = {{"global_rank": rank, "ok": True, "terminated": False, "error": None, "checks": [],
              "hostname": "here", "warnings": told.get("warnings", [])}}
    os.makedirs(os.path.join(os.path.dirname(plan), "results"), exist_ok=True)
    with open(os.path.join(os.path.dirname(plan), "results", "rank-%05d.json" % rank), "w") as out:
        out.write(json.dumps(record))
sys.exit(told.get("exit", 0))
"""


def _launch(tmp_path: Path, ranks: dict):
    fake = tmp_path / "python"
    fake.write_text(RANK.format(python=sys.executable))
    fake.chmod(0o755)
    run = tmp_path / "run"
    args = ("launch", "--executor", "local", "--workload", "selftest", "--run-dir", run, "--python", fake)
    return run, run_cli(*args, env={"FAKE_RANKS": json.dumps(ranks)})


def test_a_rank_that_exits_0_without_its_result_fails_the_run(tmp_path):
    run, got = _launch(tmp_path, {"1": {"result": False}})  # a reward that called os._exit(0), say
    text = " ".join((got.stdout + got.stderr).split())
    assert got.returncode == 2, text
    assert "FAILED" in text and "rank 1 (node 0" in text and "failed first: exited without a result line" in text, text
    record = read_record(run)
    assert record.state == "FAILED" and "rank(s) 1 exited without writing a result" in (record.message or "")
    status = run_cli("status", run)
    assert status.returncode == 0 and "state FAILED" in " ".join(status.stdout.split()), status.stdout


def test_what_the_ranks_warn_of_reaches_the_launcher_and_status(tmp_path):
    why = "the checkpoint's data position does not apply: it was written with other data"
    run, got = _launch(tmp_path, {str(r): {"warnings": [why]} for r in range(4)})
    assert got.returncode == 0, got.stderr
    assert f"warning: rank 0, 1, 2, 3: {why}" in got.stderr, got.stderr
    assert read_record(run).state == "COMPLETED"
    status = run_cli("status", run)
    assert f"rank 0, 1, 2, 3: {why}" in " ".join(status.stdout.split()), status.stdout
