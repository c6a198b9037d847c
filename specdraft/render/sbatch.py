"""The sbatch script of a launch: pure text in, text out (templates/sbatch.j2), no clock, no randomness.

`specdraft launch --dry-run` prints exactly what execute.slurm hands to sbatch: both call `render_sbatch`.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from functools import cache

from specdraft.plan.environment import nccl_env
from specdraft.plan.model import LaunchPlan
from specdraft.runs.paths import PLAN, REQUEUE_REQUEST, SBATCH, SUBMITIT

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Job-id-derived rendezvous port range: above the well-known and registered ranges most sites use, below
# the Linux ephemeral range (32768+ on some kernels is fine too: only collisions within one job matter).
PORT_BASE, PORT_SPAN = 20000, 40000


@dataclass(frozen=True, kw_only=True)
class SbatchRender:
    """One rendered launch: the script and the pieces `--dry-run` shows separately."""

    script: str
    job_name: str
    submitit_folder: str  # where submitit keeps the submitted script and srun writes each task's log
    task_command: str  # the shell words srun runs on every task: the payload, shell-quoted
    srun_line: str
    payload_argv: list[str]  # what every task runs: python -u -m specdraft.runtime.entry PLAN ...


# The payload in slurm.container_specdraft=mount: the mounted package's folder goes first on sys.path inside the
# interpreter, not through PYTHONPATH, whose value in the image (pyxis lets it win) may hold the image's own
# packages. runpy runs the entry as `-m` would, in the same process, so srun's signals still reach it.
MOUNTED_ENTRY = (
    "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); "
    'runpy.run_module("specdraft.runtime.entry", run_name="__main__", alter_sys=True)'
)


def specdraft_package() -> str:
    """The folder of the specdraft package this process imports: what slurm.container_specdraft=mount mounts."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def payload_argv(
    python: str,
    plan_path: str,
    workload: str,
    steps: int | None,
    *,
    resume: bool = False,
    resume_from: str | None = None,
    mounted_from: str | None = None,
    allow_data_change: bool = False,
) -> list[str]:
    """The rank payload's argv; the resume flags (if any) are the same on every rank. ``mounted_from``: the folder
    holding the mounted specdraft package, put first on sys.path (slurm.container_specdraft=mount)."""
    entry = ["-m", "specdraft.runtime.entry"] if mounted_from is None else ["-c", MOUNTED_ENTRY, mounted_from]
    argv = [python, "-u", *entry, plan_path, "--workload", workload]
    argv += ["--steps", str(steps)] if steps is not None else []
    argv += ["--resume"] if resume else []
    argv += ["--resume-from", resume_from] if resume_from is not None else []
    return argv + (["--allow-data-change"] if allow_data_change else [])


@cache
def _template():
    from importlib import resources

    import jinja2

    env = jinja2.Environment(
        autoescape=False,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    # Every value that reaches a shell line goes through |q (shlex.quote); #SBATCH lines use it too, since
    # sbatch's own #SBATCH parser honours single quotes the same way.
    env.filters["q"] = shlex.quote
    text = resources.files("specdraft.templates").joinpath("sbatch.j2").read_text(encoding="utf-8")
    return env.from_string(text)


def unsafe_values(
    plan: LaunchPlan, run_dir: str, python: str, resume_from: str | None = None, package: str | None = None
) -> list[str]:
    """What the script cannot carry safely, quoted or not (line breaks end comments and #SBATCH lines; '%' is a
    Slurm filename pattern; '\\' is an escape to sbatch). Validation refuses these in layouts; this re-checks a
    hand-edited plan.json, the run folder and a --resume-from path."""
    slurm = plan.slurm
    problems = []
    one_line = {
        "run folder": run_dir,
        "python": python,
        "name": plan.name,
        "slurm.time": slurm.time,
        "--resume-from": resume_from or "",
        "slurm.partition": slurm.partition or "",
        "slurm.account": slurm.account or "",
        "slurm.qos": slurm.qos or "",
        "slurm.mem": slurm.mem or "",
        "slurm.container_image": slurm.container_image or "",
        "the specdraft package": package or "",
    }
    one_line.update({f"slurm.container_mounts[{i}]": m for i, m in enumerate(slurm.container_mounts)})
    if slurm.container_image:
        # Both become pyxis mounts SRC:DST, in a list that ',' separates.
        for what, value in (("run folder", run_dir), ("the specdraft package", package or "")):
            if "," in value or ":" in value:
                problems.append(f"{what} {value!r} contains ',' or ':', which a container mount cannot carry")
    one_line.update({f"slurm.extra_sbatch_args[{i}]": a for i, a in enumerate(slurm.extra_sbatch_args)})
    for what, value in one_line.items():
        if CONTROL.search(value):
            problems.append(f"{what} {value!r} contains a line break or control character")
    for what, value in (("run folder", run_dir), ("name", plan.name)):
        if "%" in value:
            problems.append(f"{what} {value!r} contains '%', which Slurm expands in log file names")
    # sbatch's #SBATCH reader unescapes '\' even inside single quotes, so no quoting carries one into those lines.
    sbatch_lines = {
        "run folder": run_dir,
        "name": plan.name,
        "slurm.time": slurm.time,
        "slurm.partition": slurm.partition or "",
        "slurm.account": slurm.account or "",
        "slurm.qos": slurm.qos or "",
        "slurm.mem": slurm.mem or "",
    }
    sbatch_lines.update({f"slurm.extra_sbatch_args[{i}]": a for i, a in enumerate(slurm.extra_sbatch_args)})
    for what, value in sbatch_lines.items():
        if "\\" in value:
            problems.append(
                f"{what} {value!r} contains a backslash, which sbatch reads as an escape in #SBATCH "
                "lines even inside quotes (the job would run elsewhere than the script says)"
            )
    for key, value in slurm.env.items():
        if not ENV_KEY.match(key) or "\x00" in value:
            problems.append(f"slurm.env key {key!r} is not a shell variable name, or its value holds NUL")
    return problems


def render_sbatch(
    plan: LaunchPlan,
    run_dir: str,
    *,
    python: str,
    workload: str | None = None,
    steps: int | None = None,
    resume: bool = False,
    resume_from: str | None = None,
    package: str | None = None,
    allow_data_change: bool = False,
) -> SbatchRender:
    """Render the sbatch script for ``plan`` in the run folder ``run_dir`` (an absolute, normalised path);
    ``resume``/``resume_from`` (an absolute path) add the payload's --resume/--resume-from on every rank, and
    ``allow_data_change`` its --allow-data-change;
    ``package`` is the specdraft package folder slurm.container_specdraft=mount mounts (default: this one's);
    ``workload`` None is the layout's own (plan.workload).

    Raises ValueError listing every value that cannot be made safe (see ``unsafe_values``)."""
    slurm, cluster = plan.slurm, plan.cluster
    container = slurm.container_image is not None
    mount = container and slurm.container_specdraft == "mount"
    package = (package or specdraft_package()) if mount else None
    problems = unsafe_values(plan, run_dir, python, resume_from, package)
    if problems:
        raise ValueError("; ".join(problems))
    folder = f"{run_dir}/{SUBMITIT}"
    plan_path = f"{run_dir}/{PLAN}"
    argv = payload_argv(
        python,
        plan_path,
        workload or plan.workload,
        steps,
        resume=resume,
        resume_from=resume_from,
        mounted_from=os.path.dirname(package) if package else None,
        allow_data_change=allow_data_change,
    )
    command = shlex.join(argv)
    srun = [
        "srun",
        "--unbuffered",
        "--kill-on-bad-exit=1",
        f"--output={folder}/%j_%t_log.out",
        f"--error={folder}/%j_%t_log.err",
    ]
    if container:
        # The run folder at its own path (plan.json, checkpoints, results, the requeue request), after the
        # layout's mounts so none of them hides it; then the specdraft package, read-only, when it is mounted.
        mounts = [*slurm.container_mounts, f"{run_dir}:{run_dir}"]
        mounts += [f"{package}:{package}:ro"] if package else []
        srun.append(f"--container-image={slurm.container_image}")
        srun.append(f"--container-mounts={','.join(mounts)}")
    srun_words = shlex.join(srun)
    script = _template().render(
        version=plan.specdraft_version,
        name=plan.name,
        spec_sha256=plan.spec_sha256,
        plan_hash=plan.plan_hash,
        run_dir=run_dir,
        plan_path=plan_path,
        script_path=f"{run_dir}/{SBATCH}",
        job_name=plan.run_name,
        nodes=cluster.num_nodes,
        tasks_per_node=cluster.gpus_per_node,
        gpus_per_node=0 if cluster.gpu == "cpu" else cluster.gpus_per_node,
        cpus_per_task=slurm.cpus_per_task,
        mem=slurm.mem,
        time=slurm.time,
        partition=slurm.partition,
        account=slurm.account,
        qos=slurm.qos,
        requeue=slurm.max_requeues > 0,
        max_requeues=slurm.max_requeues,
        folder=folder,
        signal_delay=plan.slurm.signal_delay_s,
        extra_sbatch_args=slurm.extra_sbatch_args,
        nccl=nccl_env(plan),
        env=slurm.env,
        world_size=plan.world_size,
        srun=srun_words,
        payload=command,
        port_base=PORT_BASE,
        port_span=PORT_SPAN,
        container=container,
        image=slurm.container_image,
        package=package,
        request=f"{run_dir}/{REQUEUE_REQUEST}",
    )
    return SbatchRender(
        script=script,
        job_name=plan.run_name,
        submitit_folder=folder,
        task_command=command,
        srun_line=f"{srun_words} {command}",
        payload_argv=argv,
    )
