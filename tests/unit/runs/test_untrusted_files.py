"""Run files read as untrusted: one JSON reader (runs/files.parse_json) for all of them, a marker checked field by
field, and a run folder of another specdraft version named as such. Every refusal is a clean UserError (exit 2
through the CLI), never a ValueError, RecursionError, TypeError or AttributeError.
"""

from __future__ import annotations

import json

import pytest

from specdraft.assemble import compile
from specdraft.errors import UserError
from specdraft.execute import monitor
from specdraft.execute.report import read_results
from specdraft.runs import checkpoints as files
from specdraft.runs.files import BadRunFile, parse_json
from specdraft.runs.record import read_record
from specdraft.spec.load import load_layout
from tests.support.checkpoints import fake_checkpoint
from tests.support.cli import run_cli
from tests.support.run_folder import make_run_folder

HOSTILE_JSON = {
    "5,000 digits": "1" * 5000,
    "10**400 as a float": "1e400",
    "minus 10**400": "-1e400",
    "an integer of 400 digits": "1" + "0" * 400,
    "NaN": "NaN",
    "Infinity": "[Infinity]",
    "deep nesting": "[" * 200_000 + "]" * 200_000,
    "deep objects": '{"a":' * 100_000 + "1" + "}" * 100_000,
    "not UTF-8": b"\xff\xfe{}",
}


@pytest.fixture(scope="module")
def plan():
    return compile(load_layout(None, ["training.save_interval=2"]))


@pytest.mark.parametrize("case", sorted(HOSTILE_JSON))
def test_the_one_json_reader_refuses_what_json_loads_would_raise_or_turn_into_inf(case):
    with pytest.raises(BadRunFile, match="x.json is not valid JSON") as err:
        parse_json(HOSTILE_JSON[case], "x.json")
    assert len(str(err.value)) < 1000
    assert parse_json('{"a": [1, 2.5, null, true, "s"]}', "x.json") == {"a": [1, 2.5, None, True, "s"]}


@pytest.mark.parametrize("case", sorted(HOSTILE_JSON))
def test_every_run_file_reader_refuses_hostile_json_cleanly(tmp_path, plan, case):
    data = HOSTILE_JSON[case]
    data = data if isinstance(data, bytes) else data.encode()
    folder = make_run_folder(tmp_path / "run", plan)
    good = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    # results and metrics lines: skipped as not written (yet) by the runtime, never an error
    (folder / "results" / "rank-00001.json").write_bytes(data)
    assert sorted(read_results(folder, plan.world_size)) == [r for r in range(plan.world_size) if r != 1]
    (folder / "metrics.jsonl").write_bytes(good[folder / "metrics.jsonl"] + data + b"\n")
    assert len(monitor.read_metrics(folder)) == 4
    assert len(files.metrics_rows(folder, 10)) == 4
    status = run_cli("status", folder)
    assert status.returncode == 0, status.stderr
    # the marker: the checkpoint does not count, and status names it
    marker = folder / "checkpoints" / "step-4" / files.MARKER
    marker.write_bytes(data)
    with pytest.raises(files.CorruptCheckpoint, match="not valid JSON"):
        files.check_checkpoint(marker.parent)
    assert monitor.checkpoint_report(folder)[0] is None
    status = run_cli("status", folder)
    assert status.returncode == 0 and "step-4 is damaged and does not count: its marker" in status.stdout
    # run.json and plan.json: the command stops with one message naming the file
    for name in ("run.json", "plan.json"):
        (folder / name).write_bytes(data)
        out = run_cli("status", folder)
        assert out.returncode == 2, out.stdout + out.stderr
        assert f"{folder / name} is not valid JSON" in out.stderr and "Traceback" not in out.stderr + out.stdout
        (folder / name).write_bytes(good[folder / name])
    with pytest.raises(UserError, match="run.json is not valid JSON"):
        (folder / "run.json").write_bytes(data)
        read_record(folder)


WRONG = [None, True, "7", 7.5, [], {}, -1, 10**30, "x" * 400]
VALID = {"name": ["7"], "specdraft_version": ["7"], "loss_scale": [None], "main_weights": [True], "data": [None]}
VALID.update({key: [{}] for key in ("model", "parallel", "draft")})  # objects: compared with the plan's later
FIELDS = [
    "format",
    "step",
    "world_size",
    "spec_sha256",
    "name",
    "specdraft_version",
    "model",
    "parallel",
    "draft",
    "target_optimizer_step",
    "draft_optimizer_step",
    "main_weights",
    "loss_scale",
    "data",
    "manifest",
]


@pytest.mark.parametrize("field", FIELDS)
def test_every_marker_field_of_the_wrong_type_or_range_is_a_clear_refusal(tmp_path, plan, field):
    folder = fake_checkpoint(tmp_path / "run" / "checkpoints" / "step-2", plan, 2)
    good = json.loads((folder / files.MARKER).read_text())
    for value in WRONG:
        if value == good.get(field) or value in VALID.get(field, ()):
            continue
        (folder / files.MARKER).write_text(json.dumps({**good, field: value}))
        with pytest.raises(files.CorruptCheckpoint, match="its marker") as err:
            files.check_checkpoint(folder)
        assert len(str(err.value)) < 600
        with pytest.raises(files.ResumeError, match="is not a complete checkpoint: its marker"):
            files.choose(tmp_path / "other", plan, "from", folder, print, 10)
        assert files.choose(tmp_path / "run", plan, "auto", None, lambda _: None) == []
    for manifest_entry in ({"size": -1, "sha256": "0" * 64}, {"size": 1}, {"size": 1, "sha256": "xyz"}, 5, []):
        (folder / files.MARKER).write_text(json.dumps({**good, "manifest": {"common.pt": manifest_entry}}))
        with pytest.raises(files.CorruptCheckpoint, match="manifest"):
            files.check_checkpoint(folder)


def test_a_marker_of_another_step_or_another_format_says_so(tmp_path, plan):
    folder = fake_checkpoint(tmp_path / "step-2", plan, 2)
    good = json.loads((folder / files.MARKER).read_text())
    (folder / files.MARKER).write_text(json.dumps({**good, "step": 3}))
    with pytest.raises(files.CorruptCheckpoint, match="says step 3, but the folder is step-2"):
        files.check_checkpoint(folder)
    old = {**good, "format": 1, "manifest": {k: v["size"] for k, v in good["manifest"].items()}}
    (folder / files.MARKER).write_text(json.dumps(old))
    with pytest.raises(files.CorruptCheckpoint, match="format 1, this specdraft reads format 2: .*another specdraft"):
        files.check_checkpoint(folder)


def test_a_run_folder_of_another_specdraft_version_is_named_as_such(tmp_path, plan):
    folder = make_run_folder(tmp_path / "run", plan)
    data = json.loads((folder / "plan.json").read_text())
    for edit in ({"schema_version": 99}, {"specdraft_version": "9.9.9"}):
        (folder / "plan.json").write_text(json.dumps({**data, **edit, "specdraft_version": "9.9.9"}))
        with pytest.raises(UserError, match="was written by specdraft 9.9.9, and this is specdraft 0.1.0") as err:
            monitor.verified_plan(folder)
        assert "use specdraft 9.9.9 for this run folder" in err.value.fix
        for argv in (("export", folder, "-o", tmp_path / "out"), ("rollout", "measure", folder), ("status", folder)):
            out = run_cli(*argv)
            assert out.returncode == 2, (argv, out.stdout, out.stderr)
            assert "was written by specdraft 9.9.9" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "out").exists()


def test_export_and_measure_refuse_a_plan_whose_model_disagrees_with_its_own_spec(tmp_path, plan):
    folder = make_run_folder(tmp_path / "run", plan)
    data = json.loads((folder / "plan.json").read_text())
    data["model"]["hidden_size"] = 2 * data["model"]["hidden_size"]
    (folder / "plan.json").write_text(json.dumps(data))
    for argv in (("export", folder, "-o", tmp_path / "out"), ("rollout", "measure", folder)):
        out = run_cli(*argv)
        assert out.returncode == 2, (argv, out.stdout, out.stderr)
        assert "does not match what specdraft 0.1.0 compiles from the spec inside it (sections that differ: model" in (
            out.stderr
        ), out.stderr
