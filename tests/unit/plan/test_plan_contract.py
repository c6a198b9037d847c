"""The plan as a versioned, typed contract: round trips, strict decoding, and refusal of another schema_version by
every reader (launch, status, render, the runtime entry), cleanly and before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from specdraft.assemble import compile, parse_plan, verify
from specdraft.errors import UserError
from specdraft.plan.codec import PlanFormatError
from specdraft.plan.model import SCHEMA_VERSION, LaunchPlan, PlanVersionError
from specdraft.spec.load import load_layout
from tests.support.cli import run_cli
from tests.support.layouts import valid_layouts


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_layouts())
def test_from_json_round_trips_every_valid_layout(spec):
    plan = compile(spec)
    text = plan.to_json()
    back = LaunchPlan.from_json(text)
    assert back == plan and back.to_json() == text
    assert verify(back, "plan.json") is back


def test_derived_values_are_resolved_once_in_the_plan():
    plan = compile(load_layout(None, ["cluster.gpus_per_node=8", "parallel.tp=2", "parallel.cp=2"]))
    m, spec = plan.model, plan.spec.model
    assert m.head_dim == spec.hidden_size // spec.num_attention_heads and m.num_query_groups == spec.num_query_groups
    assert plan.parallel.etp == 2 and plan.parallel.pad_multiple == 4 and plan.parallel.dp == 1
    assert plan.slurm.time_limit_s == 3600 * int(plan.spec.slurm.time.split(":")[0]) + 60 * int(
        plan.spec.slurm.time.split(":")[1]
    )
    assert plan.run_name == f"{plan.name}-{plan.plan_hash[:8]}"


@pytest.mark.parametrize(
    "edit, where",
    [
        (lambda d: d["ranks"][3].pop("pp"), "ranks[3]: missing pp"),
        (lambda d: d["ranks"][0].update(tp="0"), "ranks[0].tp: expected int"),
        (lambda d: d["parallel"].update(extra=1), "parallel: unknown extra"),
        (lambda d: d["parallel"].update(world_size=True), "parallel.world_size: expected int"),
        (lambda d: d["parallel"].update(world_size=1000), "parallel: tp*cp*pp*dp = 4 differs from world_size = 1000"),
        (lambda d: d["parallel"].update(edp=3), "parallel: edp = 3 where these sizes give 2"),
        (lambda d: d["spec"]["parallel"].update(tp="x"), "spec.parallel.tp"),
        (lambda d: d["memory"][0].update(fraction=float("nan")), "memory[0].fraction"),
    ],
)
def test_malformed_plans_name_the_field(edit, where):
    data = json.loads(compile(load_layout(None)).to_json())
    edit(data)
    with pytest.raises(PlanFormatError) as info:
        LaunchPlan.from_dict(data)
    assert where in str(info.value)


def test_another_schema_version_is_refused_naming_both():
    data = json.loads(compile(load_layout(None)).to_json())
    data["schema_version"] = SCHEMA_VERSION + 7
    with pytest.raises(
        PlanVersionError, match=f"schema_version is {SCHEMA_VERSION + 7}.*reads schema_version {SCHEMA_VERSION}"
    ):
        LaunchPlan.from_dict(data)
    for bad in ([], "plan", 3):
        with pytest.raises(PlanFormatError):
            LaunchPlan.from_dict(bad)


def test_a_hand_edited_plan_is_refused_by_recompiling_its_spec():
    plan = compile(load_layout(None))
    data = json.loads(plan.to_json())
    data["parallel"]["cp_comm_type"] = "a2a"
    with pytest.raises(UserError, match="sections that differ: parallel"):
        verify(parse_plan(json.dumps(data), "plan.json"), "plan.json")
    data = json.loads(plan.to_json())
    data["name"] = data["spec"]["name"] = "../../etc/x"
    with pytest.raises(Exception, match="name"):
        verify(parse_plan(json.dumps(data), "plan.json"), "plan.json")
    data = json.loads(plan.to_json())
    data["renders"]["megatron"][1] = "7"
    with pytest.raises(UserError, match="renders"):
        verify(parse_plan(json.dumps(data), "plan.json"), "plan.json")


def _old_plan(tmp_path: Path) -> Path:
    data = json.loads(compile(load_layout(None)).to_json())
    data["schema_version"] = 1
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    return path


def _cli(*args, cwd=None):
    return run_cli(*args, cwd=cwd, env={"COLUMNS": "200"})


def test_launch_render_and_status_refuse_another_schema_version(tmp_path):
    plan = _old_plan(tmp_path)
    for argv in (("render", plan, "--to", "megatron"), ("launch", plan, "--executor", "local", "--dry-run")):
        proc = _cli(*argv)
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        assert f"schema_version is 1, but this specdraft reads schema_version {SCHEMA_VERSION}" in proc.stderr
        assert "Traceback" not in proc.stderr
    # A run folder holding such a plan: status says so and exits 2.
    from specdraft.runs.record import new_record
    from specdraft.runs.rundir import claim_run_dir, replace_record

    run = tmp_path / "runs" / "old-run"
    claim_run_dir(run)
    (run / "plan.json").write_text(plan.read_text())
    replace_record(
        run,
        new_record(
            name="tiny-cpu",
            run_dir=str(run),
            executor="local",
            job_name="tiny-cpu-0",
            state="COMPLETED",
            intent_epoch=0.0,
            plan_hash="0" * 64,
            spec_sha256="0" * 64,
            specdraft_version="0.1.0",
            world_size=4,
            workload="selftest",
        ),
    )
    proc = _cli("status", run, cwd=tmp_path)
    assert proc.returncode == 2 and "schema_version is 1" in proc.stderr and "Traceback" not in proc.stderr


def test_runtime_entry_refuses_another_schema_version_and_writes_its_result(tmp_path):
    plan = _old_plan(tmp_path)
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "0",
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "specdraft.runtime.entry", str(plan)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "schema_version is 1" in proc.stderr and "Traceback" not in proc.stderr
    result = json.loads((tmp_path / "results" / "rank-00000.json").read_text())
    assert result["ok"] is False and "schema_version is 1" in result["error"]
    assert "Traceback" not in result["error"]
