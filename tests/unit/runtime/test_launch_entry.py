"""The rank payload's checks that need no process group, the run-folder protocol, and failure attribution."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest

from specdraft.assemble import compile
from specdraft.errors import UserError
from specdraft.execute.launch import check_existing
from specdraft.execute.report import root_cause
from specdraft.runs.record import Attempt, new_record
from specdraft.runs.rundir import claim_run_dir, launch_lock, read_record, replace_record
from specdraft.runtime.entry import check_placement, load_workload, rank_env
from specdraft.spec.load import load_layout


@pytest.fixture(scope="module")
def plan():
    return compile(load_layout(None, ["cluster.num_nodes=2", "cluster.gpus_per_node=2"]))


def test_rank_env_prefers_torchrun_names_then_slurm():
    base = {"MASTER_ADDR": "h", "MASTER_PORT": "1"}
    assert rank_env({**base, "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "GROUP_RANK": "1"}) == (3, 1, 4, 1)
    slurm = {**base, "SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_NODEID": "1"}
    assert rank_env(slurm) == (2, 0, 4, 1)
    with pytest.raises(ValueError, match="SLURM_NODEID"):
        rank_env({**base, "SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0"})
    with pytest.raises(ValueError, match="MASTER_ADDR and MASTER_PORT"):
        rank_env({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})


def test_placement_must_match_the_plan(plan):
    check_placement(plan, 3, 1, 4, 1)  # rank 3 = node 1, local rank 1
    with pytest.raises(ValueError, match="WORLD_SIZE is 8 but the plan's world_size is 4"):
        check_placement(plan, 3, 1, 8, 1)
    with pytest.raises(ValueError, match="runs as local rank 0 on node 1, but the plan places it as local rank 1"):
        check_placement(plan, 3, 0, 4, 1)  # cyclic distribution instead of block
    ranks = list(plan.ranks)
    ranks[3] = dataclasses.replace(ranks[3], pp=0)
    tampered = dataclasses.replace(plan, ranks=tuple(ranks))
    with pytest.raises(ValueError, match="edited or is stale"):
        check_placement(tampered, 3, 1, 4, 1)


def test_a_workload_whose_module_is_missing_fails_clearly(monkeypatch):
    from specdraft.runtime import entry

    monkeypatch.setitem(entry.WORKLOADS, "ghost", "specdraft.runtime.ghost_workload:run")
    with pytest.raises(RuntimeError, match="workload 'ghost' is not available yet"):
        load_workload("ghost")


def test_a_failing_rank_writes_its_result_and_exits_non_zero(plan, tmp_path):
    (tmp_path / "plan.json").write_text(plan.to_json())
    env = {
        **os.environ,
        "RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "specdraft.runtime.entry", str(tmp_path / "plan.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "WORLD_SIZE is 8 but the plan's world_size is 4" in proc.stderr
    result = json.loads((tmp_path / "results" / "rank-00001.json").read_text())
    assert result["ok"] is False and result["terminated"] is False and result["global_rank"] == 1
    assert "WORLD_SIZE is 8" in result["error"] and result["hostname"]
    assert result["coords"] == {k: getattr(plan.ranks[1], k) for k in ("tp", "cp", "dp", "pp", "ep", "etp", "edp")}


def test_root_cause_is_the_first_rank_that_raised_not_one_that_was_killed():
    results = {
        0: {"ok": False, "failed_at": 5.0, "error": "Connection closed by peer"},
        1: {"ok": False, "failed_at": 3.0, "error": "injected fault"},
        2: {"ok": False, "failed_at": 1.0, "terminated": True},
        3: {"ok": True},
    }
    assert root_cause(results) == 1
    assert root_cause({2: {"ok": False, "terminated": True}}, exit_order=[3, 2]) == 3
    assert root_cause({0: {"ok": True}}) is None


def test_two_launches_of_one_run_folder_exclude_each_other(tmp_path):
    with launch_lock(tmp_path):
        with pytest.raises(UserError, match=f"another `specdraft launch` \\(pid {os.getpid()}\\)"):
            with launch_lock(tmp_path):
                pass
    with launch_lock(tmp_path):  # released when the first one left
        pass


def _record(run_dir, plan, **fields):
    claim_run_dir(run_dir)
    fields = {"intent_epoch": time.time(), "job_name": plan.run_name, **fields}
    replace_record(
        run_dir,
        new_record(
            name=plan.name,
            run_dir=str(run_dir),
            plan_hash=plan.plan_hash,
            spec_sha256=plan.spec_sha256,
            specdraft_version=plan.specdraft_version,
            world_size=plan.world_size,
            workload="selftest",
            attempts=(
                Attempt(
                    attempt=1,
                    executor=fields["executor"],
                    job_id=fields.get("job_id"),
                    state=fields["state"],
                    intent="2026-01-01T00:00:00+00:00",
                ),
            ),
            **fields,
        ),
    )


def test_an_interrupted_submission_is_never_resubmitted_blindly(tmp_path, plan):
    # sbatch may have queued the job before the launcher died: no record of a job id, state SUBMITTING.
    _record(
        tmp_path,
        plan,
        executor="slurm",
        state="SUBMITTING",
        job_id=None,
        intent_epoch=time.time(),
        job_name=f"specdraft-test-{os.getpid()}-{time.time_ns()}",
    )  # a name no real job has
    with pytest.raises(UserError, match="stopped between recording its intent and recording sbatch's answer"):
        check_existing(str(tmp_path), plan, force=False)
    assert check_existing(str(tmp_path), plan, force=True) == 2


def test_relaunch_rules(tmp_path, plan):
    _record(tmp_path, plan, executor="slurm", state="SUBMIT_FAILED", job_id=None)
    assert check_existing(str(tmp_path), plan, force=False) == 2  # sbatch said no: nothing can run twice
    # A job still queued is refused even with --force (a job id no Slurm knows keeps its recorded state).
    _record(tmp_path, plan, executor="slurm", state="PENDING", job_id="999999999")
    with pytest.raises(UserError, match="already running.*job 999999999.*PENDING") as err:
        check_existing(str(tmp_path), plan, force=True)
    assert "specdraft cancel" in err.value.fix
    _record(tmp_path, plan, executor="slurm", state="COMPLETED", job_id="999999998")  # a job no Slurm knows
    with pytest.raises(UserError, match=f"already launched: {tmp_path} \\(slurm, job 999999998, state COMPLETED\\)"):
        check_existing(str(tmp_path), plan, force=False)
    assert check_existing(str(tmp_path), plan, force=True) == 2
    assert check_existing(str(tmp_path), plan, force=False, resume=True) == 2  # --resume relaunches an ended run
    _record(tmp_path, plan, executor="slurm", state="PENDING", job_id="999999997")
    with pytest.raises(UserError, match="already running"):  # ... never one that is queued
        check_existing(str(tmp_path), plan, force=False, resume=True)
    _record(tmp_path, plan, executor="slurm", state="COMPLETED", job_id="999999998")
    other = compile(load_layout(None, ["cluster.gpus_per_node=2", "parallel.cp=1"]))
    with pytest.raises(UserError, match="holds a run of another plan"):
        check_existing(str(tmp_path), other, force=True)
    assert read_record(tmp_path).state == "COMPLETED"


def test_selftest_expects_megatrons_groups_from_the_plan_arithmetic():
    from specdraft.runtime.workloads.selftest import plan_group, route_pairs

    # tp2 cp2 pp2, order tp-cp-ep-dp-pp: rank = tp + 2*cp + 4*pp.
    plan = compile(load_layout(None, ["cluster.gpus_per_node=8", "parallel.tp=2"]))
    assert [plan_group(plan, 5, dim) for dim in ("tp", "cp", "pp", "dp")] == [[4, 5], [5, 7], [1, 5], [5]]
    assert route_pairs(plan) == [(0, 4), (1, 5), (2, 6), (3, 7)]  # stage 0 taps -> the draft on stage 1


def test_the_launcher_knows_exactly_the_runtime_workloads():
    from specdraft.execute.launch import WORKLOADS as LAUNCHABLE
    from specdraft.runtime.entry import WORKLOADS

    assert set(LAUNCHABLE) == set(WORKLOADS)


def test_the_launcher_knows_the_runtime_preempted_exit_code():
    from specdraft.execute.local import PREEMPTED_EXIT as LAUNCHER
    from specdraft.runtime.train.preempt import PREEMPTED_EXIT

    assert LAUNCHER == PREEMPTED_EXIT == 75


def test_launch_runs_the_layouts_workload_unless_told_otherwise(tmp_path):
    from specdraft.errors import SpecError
    from specdraft.execute.launch import prepare
    from tests.support.paths import SHIPPED

    grpo = compile(load_layout(SHIPPED / "grpo-tiny-cpu.yaml", []))
    run_dir = str(tmp_path / "run")
    assert grpo.workload == "grpo" and compile(load_layout(None, [])).workload == "cotrain"
    request = prepare(grpo, executor="local", run_dir=run_dir)
    assert request.workload == "grpo" and "--workload grpo" in request.render.script
    assert prepare(grpo, executor="local", run_dir=run_dir, workload="selftest").workload == "selftest"
    with pytest.raises(SpecError) as caught:
        load_layout(None, ["workload=rl"])
    assert [p.path for p in caught.value.problems] == ["workload"]


def test_cotrain_says_it_packs_whatever_training_packing_says(tmp_path):
    from specdraft.execute.launch import prepare
    from tests.support.paths import SHIPPED

    plan = compile(load_layout(SHIPPED / "grpo-tiny-cpu.yaml", []))  # training.packing: false
    run_dir = str(tmp_path / "run")
    assert not any("training.packing" in n for n in prepare(plan, executor="local", run_dir=run_dir).notes)
    notes = prepare(plan, executor="local", run_dir=run_dir, workload="cotrain").notes
    assert any(n.startswith("training.packing = false: the cotrain runtime packs") for n in notes), notes
