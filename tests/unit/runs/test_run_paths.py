"""The run folder has one owner (runs/paths.py), and nothing under a run folder is followed out of it.

- Every name of the run-folder protocol, every run-file size limit and the world-size bound is defined once: no
  other module of specdraft/ spells a protocol name as a string or assigns one of the limits.
- Links, built for real: a symlinked step-N is neither pruned through (the link's target keeps its marker), nor
  chosen by --resume, nor exported, and `status` names it; a symlinked checkpoints/ is refused; the guard against
  --resume-from this run's own checkpoints sees through a link to the run folder.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from specdraft.assemble import compile
from specdraft.errors import UserError
from specdraft.execute import launch, monitor
from specdraft.runs import checkpoints as files
from specdraft.runs import paths
from specdraft.runs.rundir import claim_run_dir
from specdraft.runtime.serve import offline
from specdraft.spec.load import load_layout
from tests.support.checkpoints import fake_checkpoint
from tests.support.paths import REPO

NAMES = {
    paths.PLAN,
    paths.RECORD,
    paths.METRICS,
    paths.RESULTS,
    paths.LOGS,
    paths.SUBMITIT,
    paths.ATTEMPTS,
    paths.CHECKPOINTS,
    paths.RUN_MARKER,
    paths.LAUNCH_LOCK,
    paths.RECORD_LOCK,
    paths.RESERVE,
    paths.SBATCH,
    paths.CHECKPOINT_MARKER,
}
LIMITS = {"MAX_WORLD_SIZE", "MAX_PLAN_BYTES", "MAX_METRICS_BYTES", "MAX_RECORD_BYTES", "MAX_RESULT_BYTES"}
OWNERS = {"specdraft/runs/paths.py", "specdraft/spec/bounds.py"}  # bounds.py owns the product bound on GPUs


@pytest.fixture(scope="module")
def plan():
    return compile(load_layout(None, ["training.save_interval=2"]))


def _modules():
    for path in sorted((REPO / "specdraft").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        yield rel, ast.parse(path.read_text(encoding="utf-8"))


def test_every_protocol_name_and_limit_is_defined_once():
    spelled, assigned = [], []
    for rel, tree in _modules():
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if rel not in OWNERS and isinstance(node, ast.Constant) and node.value in NAMES:
                if id(node) not in docstrings:
                    spelled.append(f"{rel}:{node.lineno} {node.value!r}")
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and target.id in LIMITS:
                        assigned.append((target.id, rel))
    assert not spelled, "protocol names spelled outside runs/paths.py:\n" + "\n".join(spelled)
    owners = {name: sorted(rel for n, rel in assigned if n == name) for name in LIMITS}
    assert owners == {
        name: ["specdraft/spec/bounds.py" if name == "MAX_WORLD_SIZE" else "specdraft/runs/paths.py"] for name in LIMITS
    }


def test_run_paths_name_every_part_of_a_run_folder(tmp_path):
    run = paths.RunPaths(tmp_path / "run")
    assert run.plan == tmp_path / "run" / "plan.json" and run.record.name == "run.json"
    assert run.result(3) == tmp_path / "run" / "results" / "rank-00003.json"
    assert paths.result_name(3) == "results/rank-00003.json" and paths.local_logs(1) == (
        "logs/rank-1.out",
        "logs/rank-1.err",
    )
    assert run.step(4) == tmp_path / "run" / "checkpoints" / "step-4" and run.published(4).parent == run.drafts
    assert run.attempt(2) == tmp_path / "run" / "attempts" / "2"
    from specdraft.runs import record
    from specdraft.spec import bounds

    assert record.MAX_WORLD_SIZE is bounds.MAX_WORLD_SIZE == 131_072  # the one bound, not 1 << 20


def test_containment_resolves_and_refuses_links_and_dot_dot(tmp_path):
    root = tmp_path / "run"
    (root / "checkpoints" / "step-1").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    assert paths.contained(root, "checkpoints/step-1") == (root / "checkpoints" / "step-1").resolve()
    assert paths.contained(root, "results/rank-00000.json").parent.name == "results"  # not there yet: fine
    (root / "checkpoints" / "step-2").symlink_to(outside)
    (root / "logs").symlink_to(root / "checkpoints")  # a link that points back inside is refused all the same
    for rel in ("checkpoints/step-2", "checkpoints/step-2/x", "logs/step-1", "../outside", "checkpoints/../logs"):
        with pytest.raises(paths.LinkOut):
            paths.contained(root, rel)
    with pytest.raises(paths.LinkOut, match="outside"):
        paths.contained(root, outside)


def _run_with_checkpoints(tmp_path, plan):
    run = tmp_path / "run"
    claim_run_dir(run)
    for step in (2, 4):
        fake_checkpoint(run / "checkpoints" / f"step-{step}", plan, step)
    elsewhere = fake_checkpoint(tmp_path / "elsewhere" / "step-6", plan, 6)
    (run / "checkpoints" / "step-6").symlink_to(elsewhere)  # the newest step-N, a link out of the run
    return run, elsewhere


def test_prune_never_follows_a_linked_step_folder(tmp_path, plan):
    run, elsewhere = _run_with_checkpoints(tmp_path, plan)
    removed = files.prune(run, keep=1)
    assert [p.name for p in removed] == ["step-2"]
    assert (elsewhere / files.MARKER).is_file(), "the link's target keeps its marker"
    assert sorted(os.listdir(elsewhere)) == sorted([".metadata", "__0_0.distcp", "common.pt", files.MARKER])
    assert (run / "checkpoints" / "step-4" / files.MARKER).is_file(), "the link does not count as a checkpoint"


def test_resume_export_and_status_agree_a_linked_step_does_not_count(tmp_path, plan):
    run, elsewhere = _run_with_checkpoints(tmp_path, plan)
    warnings = []
    chosen = files.choose(run, plan, "newest", None, warnings.append)
    assert [f.name for f, _ in chosen] == ["step-4", "step-2"]
    assert any("step-6 is a symbolic link" in w for w in warnings), warnings
    newest, hashed, problems = monitor.checkpoint_report(run)
    assert newest[0] == "checkpoints/step-4" and hashed
    assert any("step-6 is a symbolic link" in p for p in problems), problems
    assert offline.checkpoint(run, None)[0].name == "step-4"
    with pytest.raises(offline.LoadError, match="--step 6: .*step-6 is a symbolic link"):
        offline.checkpoint(run, 6)


def test_a_linked_checkpoints_folder_is_refused_by_every_command(tmp_path, plan):
    run = tmp_path / "run"
    claim_run_dir(run)
    fake_checkpoint(tmp_path / "elsewhere" / "step-2", plan, 2)
    (run / "checkpoints").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(paths.LinkOut):
        files.prune(run, keep=1)
    with pytest.raises(paths.LinkOut):
        files.choose(run, plan, "newest", None, print)
    assert monitor.checkpoint_report(run)[0] is None and "symbolic link" in monitor.checkpoint_report(run)[2][0]
    with pytest.raises(offline.LoadError, match="symbolic link"):
        offline.checkpoint(run, None)
    assert (tmp_path / "elsewhere" / "step-2" / files.MARKER).is_file()


def test_a_file_of_a_checkpoint_that_is_a_link_is_refused(tmp_path, plan):
    folder = fake_checkpoint(tmp_path / "run" / "checkpoints" / "step-2", plan, 2)
    (tmp_path / "secret").write_bytes(b"s")
    (folder / "extra.distcp").symlink_to(tmp_path / "secret")
    with pytest.raises(files.CorruptCheckpoint, match="extra.distcp is a symbolic link"):
        files.check_checkpoint(folder)


def test_resuming_from_this_runs_own_checkpoints_is_refused_through_any_alias(tmp_path, plan):
    run, _ = _run_with_checkpoints(tmp_path, plan)
    alias = tmp_path / "alias"
    alias.symlink_to(run)
    for run_dir, source in (
        (str(alias), str(run / "checkpoints" / "step-4")),
        (str(run), str(alias / "checkpoints" / "step-4")),
        (str(run), str(run / "results" / ".." / "checkpoints" / "step-4")),
    ):
        with pytest.raises(UserError, match="is a checkpoint of this very run folder"):
            launch.check_resume(plan, run_dir, "cotrain", False, source, 10)
    # A copy outside the run folder is another checkpoint: allowed.
    copy = fake_checkpoint(tmp_path / "copy" / "step-4", plan, 4)
    assert launch.check_resume(plan, str(run), "cotrain", False, str(copy), 10)[0] == str(copy.resolve())


def test_resume_from_a_checkpoint_at_or_past_the_last_step_is_refused(tmp_path, plan):
    copy = fake_checkpoint(tmp_path / "copy" / "step-4", plan, 4)
    for steps in (4, 3):
        with pytest.raises(UserError, match=f"after step 4, and this launch trains {steps} steps.*nothing is left"):
            launch.check_resume(plan, str(tmp_path / "run"), "cotrain", False, str(copy), steps)
    assert launch.check_resume(plan, str(tmp_path / "run"), "cotrain", False, str(copy), 5)[0]


def test_a_checkpoint_of_another_draft_vocabulary_is_refused_naming_the_field(tmp_path, plan):
    other = compile(load_layout(None, ["training.save_interval=2", "draft.vocab_size=48"]))
    copy = fake_checkpoint(tmp_path / "copy" / "step-2", other, 2)
    with pytest.raises(files.ResumeError, match=f"draft.vocab_size: checkpoint 48, this plan {plan.draft.vocab_size}"):
        files.choose(tmp_path / "run", plan, "from", copy, print, 10)
    meta = files.check_checkpoint(copy)
    with pytest.raises(offline.LoadError, match="another model shape than its run's plan: draft.vocab_size"):
        offline.require_same_model(plan, copy, meta)  # export and measure of a checkpoint copied in


def test_a_manifest_may_name_only_files_of_the_checkpoint_itself(tmp_path, plan):
    import json

    folder = fake_checkpoint(tmp_path / "step-2", plan, 2)
    marker = json.loads((folder / files.MARKER).read_text())
    entry = next(iter(marker["manifest"].values()))
    for name in ("../step-1/x", "/etc/passwd", "sub/x.distcp", "..", ".", "", "a\\b", "x\n"):
        marker["manifest"] = {**{k: v for k, v in marker["manifest"].items()}, name: entry}
        (folder / files.MARKER).write_text(json.dumps(marker))
        with pytest.raises(files.CorruptCheckpoint, match="not a file of the checkpoint folder itself"):
            files.check_checkpoint(folder)
        del marker["manifest"][name]
    assert Path(folder).is_dir()


def test_a_launch_refuses_links_where_ranks_write(tmp_path):
    run = tmp_path / "run"
    claim_run_dir(run)
    (tmp_path / "bashrc").write_text("mine\n")
    for name in ("metrics.jsonl", "draft", "taps", "checkpoints", "results"):
        (run / name).symlink_to(tmp_path / ("bashrc" if name == "metrics.jsonl" else "."))
        with pytest.raises(UserError, match=f"{run / name} is a link"):
            launch._check_folders(str(run))
        (run / name).unlink()
    launch._check_folders(str(run))
    assert (tmp_path / "bashrc").read_text() == "mine\n"
