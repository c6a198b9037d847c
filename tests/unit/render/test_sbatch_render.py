"""The rendered sbatch script: goldens for the shipped layouts, srun running the payload itself on every task, the
submission through submitit (a stub sbatch), and hostile values run through bash with srun/scontrol replaced by
recording stubs (proving nothing executes and values arrive intact)."""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import textwrap
from importlib import resources
from pathlib import Path

import pytest

from specdraft.assemble import compile
from specdraft.errors import SpecError, UserError
from specdraft.render.sbatch import nccl_env, render_sbatch
from specdraft.runs.rundir import run_dir_for
from specdraft.spec.derived import signal_delay_s, slurm_time_seconds
from specdraft.spec.load import builtin_layout_text, load_layout_text
from tests.support.paths import GOLDEN

GOLDEN = GOLDEN
LAYOUTS = sorted(p.name[:-5] for p in resources.files("specdraft.layouts").iterdir() if p.name.endswith(".yaml"))
PYTHON = "/opt/venv/bin/python"


def _plan(name: str = "tiny-cpu", overrides=()):
    return compile(load_layout_text(builtin_layout_text(name), overrides, source=name))


@pytest.mark.parametrize("name", LAYOUTS)
def test_golden_sbatch_of_shipped_layouts(name):
    plan = _plan(name)
    render = render_sbatch(plan, f"/scratch/runs/{name}", python=PYTHON)
    # The hashes move whenever the schema or the compiler's output does; the golden pins the script's text.
    text = (
        render.script.replace(plan.plan_hash, "<plan-sha256>")
        .replace(plan.plan_hash[:8], "<plan8>")
        .replace(plan.spec_sha256, "<spec-sha256>")
    )
    golden = GOLDEN / "sbatch" / f"{name}.sh"
    if os.environ.get("SPECDRAFT_REGEN_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8"), f"{golden} differs; SPECDRAFT_REGEN_GOLDEN=1 regenerates it"


def test_render_is_a_pure_function_of_its_inputs():
    plan = _plan()
    one = render_sbatch(plan, "/r/x", python=PYTHON, workload="selftest", steps=3)
    assert one == render_sbatch(plan, "/r/x", python=PYTHON, workload="selftest", steps=3)
    assert one.payload_argv == [
        PYTHON,
        "-u",
        "-m",
        "specdraft.runtime.entry",
        "/r/x/plan.json",
        "--workload",
        "selftest",
        "--steps",
        "3",
    ]
    assert f"specdraft {plan.specdraft_version}" in one.script and plan.spec_sha256 in one.script
    resumed = render_sbatch(plan, "/r/x", python=PYTHON, resume=True)
    assert resumed.payload_argv[-1] == "--resume" and resumed.srun_line.endswith(" --resume")
    moved = render_sbatch(plan, "/r/x", python=PYTHON, resume_from="/ckpt dir/step-3")
    assert moved.payload_argv[-2:] == ["--resume-from", "/ckpt dir/step-3"]
    assert moved.srun_line.endswith(" --resume-from '/ckpt dir/step-3'")
    with pytest.raises(ValueError, match="--resume-from"):  # a line break would end the payload's comment line
        render_sbatch(plan, "/r/x", python=PYTHON, resume_from="/a\nrm -rf /")


def test_srun_runs_the_payload_itself_on_every_task():
    # No submitit wrapper between srun and the payload: USR2 and SIGTERM must reach the runtime's own handlers.
    plan = _plan(overrides=["cluster.num_nodes=2", "cluster.gpus_per_node=2", "slurm.time=00:02:00"])
    render = render_sbatch(plan, "/r/run", python=PYTHON)
    lines = render.script.splitlines()
    for line in (
        "#SBATCH --output=/r/run/submitit/%j_0_log.out",
        "#SBATCH --error=/r/run/submitit/%j_0_log.err",
        "#SBATCH --open-mode=append",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=2",
        "#SBATCH --time=00:02:00",
    ):
        assert line in lines
    # A 2-minute limit with submitit's default USR2@90 would fire at once and kill the job early.
    assert "#SBATCH --signal=USR2@12" in lines
    assert not any("--gpus-per-node" in line for line in lines)  # cpu layout
    assert "submitit.core" not in render.script and "SUBMITIT" not in render.script
    srun = [line for line in lines if line.startswith("srun ")]
    assert srun == [render.srun_line] and render.srun_line.endswith(" " + render.task_command)
    assert render.task_command == shlex.join(render.payload_argv)
    assert "--output=/r/run/submitit/%j_%t_log.out" in render.srun_line


def test_submission_goes_through_submitit_without_its_wrapper_or_pickles(tmp_path, monkeypatch):
    from specdraft.execute.slurm import submit

    plan = _plan()
    run_dir = tmp_path / "run"
    render = render_sbatch(plan, str(run_dir), python=PYTHON)
    stubs = tmp_path / "bin"
    stubs.mkdir()
    _stub(stubs / "srun", "exit 0\n")  # submitit looks for srun on PATH before it agrees to submit
    answers = {
        "ok": 'cp "$1" {copy}; echo "Submitted batch job 4242"',
        "refused": 'echo "sbatch: error: invalid partition specified: nope" >&2; exit 1',
        "timeout": 'echo "sbatch: error: Socket timed out on send/recv operation" >&2; exit 1',
        "garbled": "echo hello",
    }
    monkeypatch.setenv("PATH", f"{stubs}:{os.environ['PATH']}")
    outcomes = {}
    for name, body in answers.items():
        _stub(stubs / "sbatch", body.format(copy=shlex.quote(str(tmp_path / "submitted.sh"))) + "\n")
        try:
            outcomes[name] = submit.submit(submit.make_executor(render, plan.world_size))
        except (submit.SubmitRefused, submit.SubmitUnknown) as err:
            outcomes[name] = (type(err).__name__, str(err))
    assert outcomes["ok"] == "4242"
    assert (tmp_path / "submitted.sh").read_text() == render.script
    assert (run_dir / "submitit" / "4242_submission.sh").read_text() == render.script
    assert outcomes["refused"][0] == "SubmitRefused" and "invalid partition" in outcomes["refused"][1]
    assert outcomes["timeout"][0] == "SubmitUnknown" and outcomes["garbled"][0] == "SubmitUnknown"
    assert not list(run_dir.rglob("*.pkl")), "nothing pickled: no wrapper runs in the job"


def test_nccl_settings_follow_the_layout():
    def defaults(plan):
        return {name for name, _, _ in nccl_env(plan)}

    assert defaults(_plan()) == set()  # CPU: gloo, no NCCL
    assert defaults(_plan("qwen3-8b")) >= {"TORCH_NCCL_ASYNC_ERROR_HANDLING"}
    assert "NCCL_DEBUG" not in defaults(_plan("qwen3-8b"))  # one node: no cross-node transport to debug
    multi = _plan("llama3-70b")
    assert {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_DEBUG"} <= defaults(multi)
    assert ("CUDA_DEVICE_MAX_CONNECTIONS" in defaults(multi)) == (multi.parallel.tp > 1)
    script = render_sbatch(multi, "/r", python=PYTHON).script
    assert "#SBATCH --gpus-per-node=8" in script
    # Every default is explained on the line above it, and the layout's own env comes after (so it wins).
    lines = script.splitlines()
    for name, value, why in nccl_env(multi):
        at = lines.index(f"export {name}={value}")
        assert lines[at - 1] == f"# {why}"
    for key in multi.spec.slurm.env:
        assert max(i for i, line in enumerate(lines) if line.startswith(f"export {key}=")) > at


@pytest.mark.parametrize(
    "text,seconds",
    [("5", 300), ("5:30", 330), ("01:02:03", 3723), ("2-3", 183600), ("1-00:10", 87000), ("1-00:00:07", 86407)],
)
def test_slurm_time(text, seconds):
    assert slurm_time_seconds(text) == seconds
    assert 10 <= signal_delay_s(seconds) <= 90 and signal_delay_s(seconds) < seconds


HOSTILE_SLURM = r"""
  env:
    EVIL_SUBST: "$(touch {canary})"
    EVIL_TICKS: "`touch {canary}`"
    EVIL_QUOTES: "it's \"quoted\" \\ back\\slash $HOME"
    EVIL_SEMI: "; touch {canary}; echo"
    EVIL_NEWLINE: "line1\n$(touch {canary})\nline3"
"""


def _with_slurm(fields: str, name: str | None = None) -> str:
    """The default layout with its slurm section replaced by ``fields`` (YAML indented by two spaces)."""
    head = builtin_layout_text().split("\nslurm:\n")[0]
    if name is not None:
        head = "\n".join(line for line in head.splitlines() if not line.startswith("name:")) + f"\nname: {name}"
    return head + "\nslurm:\n  partition: debug\n" + fields.lstrip("\n")


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + textwrap.dedent(body))
    path.chmod(0o755)


def test_hostile_values_are_inert_and_arrive_intact(tmp_path):
    canary = tmp_path / "PWNED"
    layout = _with_slurm(HOSTILE_SLURM.format(canary=canary))
    plan = compile(load_layout_text(layout, source="hostile"))
    # validate refuses such an image and mount (spec/validate/container.py); a hand-edited plan.json still reaches
    # the render, which must carry them inert.
    hostile = dataclasses.replace(
        plan.slurm,
        container_image=f"nvcr.io#x:1$(touch {canary})`touch {canary}`;'\"",
        container_mounts=(f"/data $(touch {canary}):/d;`touch {canary}`'",),
        container_specdraft="image",
    )
    plan = dataclasses.replace(plan, slurm=hostile)
    run_dir = str(tmp_path / f"run $(touch {canary}) `touch {canary}` 'q' \"d\" ;x")
    python = f"/opt/my venv/bin/python $(touch {canary})"
    checkpoint = f"/ckpt/$(touch {canary}) `touch {canary}` 'q';x/step-3"
    render = render_sbatch(plan, run_dir, python=python, resume_from=checkpoint)
    script = tmp_path / "job.sh"
    script.write_text(render.script)

    stubs, record = tmp_path / "bin", tmp_path / "record"
    stubs.mkdir()
    record.mkdir()
    _stub(
        stubs / "srun",
        f"""\
        printf '%s\\0' "$@" > {shlex.quote(str(record / "argv"))}
        env -0 > {shlex.quote(str(record / "env"))}
        """,
    )
    _stub(stubs / "scontrol", 'test "$1 $2" = "show hostnames" && printf "n7\\nn8\\n"\n')
    env = {
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "4321",
        "SLURM_JOB_NODELIST": "n[7-8]",
        "HOME": str(tmp_path),
    }
    proc = subprocess.run(
        ["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert not canary.exists(), "a value in the script was executed"

    argv = (record / "argv").read_bytes().decode().split("\0")[:-1]
    folder = f"{run_dir}/submitit"
    slurm = plan.slurm
    assert argv[:6] == [
        "--unbuffered",
        "--kill-on-bad-exit=1",
        f"--output={folder}/%j_%t_log.out",
        f"--error={folder}/%j_%t_log.err",
        f"--container-image={slurm.container_image}",
        f"--container-mounts={slurm.container_mounts[0]},{run_dir}:{run_dir}",
    ]
    assert argv[6:] == render.payload_argv and argv[-2:] == ["--resume-from", checkpoint]
    got = dict(item.split("=", 1) for item in (record / "env").read_bytes().decode().split("\0") if "=" in item)
    for key, value in slurm.env.items():
        assert got[key] == value, key
    assert got["MASTER_ADDR"] == "n7" and got["MASTER_PORT"] == str(20000 + 4321 % 40000)
    assert got["OMP_NUM_THREADS"] == str(slurm.cpus_per_task)


@pytest.mark.parametrize(
    "name,fields,path",
    [
        ('"two\\nlines"', "", "name"),
        (None, '  container_image: "img\\n#SBATCH --wrap=id"\n', "slurm.container_image"),
        (None, '  container_mounts: ["/a:/b,/c:/d"]\n', "slurm.container_mounts[0]"),
        (None, '  extra_sbatch_args: ["--output=/elsewhere"]\n', "slurm.extra_sbatch_args[0]"),
        (None, '  extra_sbatch_args: ["--exclusive\\n--wrap=id"]\n', "slurm.extra_sbatch_args[0]"),
        (None, "  env: {MASTER_ADDR: evil}\n", "slurm.env.MASTER_ADDR"),
        (None, '  env: {"A;B": x}\n', "slurm.env.A;B"),
    ],
)
def test_values_that_cannot_be_made_safe_are_refused(name, fields, path):
    with pytest.raises(SpecError) as err:
        compile(load_layout_text(_with_slurm(fields, name), source="bad"))
    assert any(p.path == path for p in err.value.problems), str(err.value)


def test_a_hand_edited_plan_cannot_smuggle_values_into_the_script():
    plan = _plan()
    slurm = dataclasses.replace(plan.slurm, env={"X;touch /tmp/p": "1"}, container_image="a\nb")
    with pytest.raises(ValueError, match="slurm.env key.*container_image|container_image.*slurm.env key"):
        render_sbatch(dataclasses.replace(plan, slurm=slurm), "/r", python=PYTHON)
    with pytest.raises(ValueError, match="run folder"):
        render_sbatch(plan, "/r/50%/x", python=PYTHON)


@pytest.mark.parametrize("bad", ["/tmp/a\nb", "/tmp/100%"])
def test_run_folders_that_slurm_cannot_carry_are_refused(bad):
    with pytest.raises(UserError, match="control character or '%'"):
        run_dir_for(_plan(), bad)
