"""`launch`, `runs`, `status`, `logs` and `cancel`: thin typer commands over execute/ and render/ (imported lazily)."""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from specdraft.cli.boundary import console as _console

TargetArgs = typer.Argument(None, metavar="[LAYOUT | PLAN.json] [OVERRIDES...]",
                            help="Layout YAML or compiled plan.json (default: the built-in tiny CPU layout), "
                                 "then KEY=VALUE overrides.")
RunArg = typer.Argument(None, metavar="[RUN]", help="A run folder's path, or its name under runs/ "
                                                    "(default: the most recent run).")


def _prepare(args, run_dir, python, workload, steps):
    """Compile (or read) the plan, re-validate it, pick the run folder and render the script: no side effects."""
    from specdraft.cli.args import load_plan
    from specdraft.errors import UserError
    from specdraft.execute.launch import WORKLOADS, choose_python
    from specdraft.execute.rundir import run_dir_for
    from specdraft.render.sbatch import render_sbatch

    if workload not in WORKLOADS:
        raise UserError(f"--workload {workload!r} is unknown", f"use one of: {', '.join(WORKLOADS)}")
    if steps is not None and steps < 1:
        raise UserError(f"--steps {steps} must be >= 1", "give a positive number of steps")
    plan, _ = load_plan(args)  # a plan.json is re-validated and re-compiled from its spec
    folder = run_dir_for(plan, run_dir)
    chosen_python = choose_python(plan, python)
    try:
        render = render_sbatch(plan, folder, python=chosen_python, workload=workload, steps=steps)
    except ValueError as err:
        raise UserError(f"cannot render a safe sbatch script: {err}", "fix those values in the layout") from None
    return plan, folder, chosen_python, render


def launch(
    args: Optional[List[str]] = TargetArgs,
    executor: Optional[str] = typer.Option(None, "--executor", "-e", help="slurm or local (default: slurm when "
                                           "sbatch answers, else local)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the sbatch script (stdout) and the srun line and "
                                 "per-rank command (stderr); create nothing, submit nothing."),
    run_dir: Optional[str] = typer.Option(None, "--run-dir", help="The run folder (default: runs/<name>-<hash8>)."),
    force: bool = typer.Option(False, "--force", help="Launch again into a run folder whose job has ended."),
    workload: str = typer.Option("cotrain", "--workload", "-w", help="cotrain (the co-training job) or selftest "
                                 "(collectives over every group and tap route)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Steps to run (default: training.train_iters)."),
    wait: bool = typer.Option(False, "--wait", help="Slurm: wait for the job to end and report every rank."),
    python: Optional[str] = typer.Option(None, "--python", help="Interpreter on the nodes (default: this one; "
                                         "`python` inside a container image)."),
) -> None:
    """Launch a plan on Slurm (through submitit) or locally, one process per rank."""
    from specdraft.execute.launch import choose_executor

    plan, folder, chosen_python, render = _prepare(args, run_dir, python, workload, steps)
    chosen, why = choose_executor(executor)
    err = _console(stderr=True)
    if dry_run:
        import shlex

        sys.stdout.write(render.script)
        err.print(f"# dry run: nothing written, nothing submitted. executor: {chosen} ({why})", markup=False)
        err.print(f"# run folder: {folder}", markup=False)
        err.print(f"# srun line: {render.srun_line}", markup=False)
        err.print(f"# per-rank command: {shlex.join(render.payload_argv)}", markup=False)
        if chosen == "local":
            err.print("# local: the same command once per rank, with RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK, "
                      "MASTER_ADDR=127.0.0.1 and a free MASTER_PORT", markup=False)
        return
    err.print(f"executor: {chosen} ({why})", markup=False)
    if chosen == "slurm":
        _launch_slurm(plan, folder, render, chosen_python, force, workload, steps, wait)
    else:
        # Locally there is no container: the ranks run under --python, else this interpreter.
        _launch_local(plan, folder, render, force, workload, steps, python or sys.executable)


def _launch_slurm(plan, folder, render, python, force, workload, steps, wait) -> None:
    from specdraft.execute.launch import launch_slurm

    record = launch_slurm(plan, folder, render, python, force, workload, steps)
    out = _console()
    spec = plan.spec
    out.print(f"submitted Slurm job {record['job_id']}: {plan.world_size} task(s) on {spec.cluster.num_nodes} "
              f"node(s), partition {spec.slurm.partition or '(default)'}", markup=False)
    out.print(f"run folder: {folder}", markup=False)
    if not wait:
        out.print(f"follow it: specdraft status {folder} | specdraft logs {folder} --follow | "
                  f"specdraft cancel {folder}", markup=False)
        return
    from specdraft.execute import monitor

    seen = {}

    def on_poll(state: str, done: int) -> None:
        if seen.get("last") != (state, done):
            seen["last"] = (state, done)
            _console(stderr=True).print(f"[slurm] job {record['job_id']}: {state}, {done}/{plan.world_size} "
                                        "rank result(s)", markup=False)

    state, record = monitor.wait(folder, plan.slurm.time_limit_s + 600, on_poll)
    _finish(folder, record, state)


def _launch_local(plan, folder, render, force, workload, steps, python) -> None:
    from specdraft.execute.launch import launch_local

    err = _console(stderr=True)
    err.print(f"run folder: {folder}", markup=False)
    if workload == "cotrain":
        from specdraft.cli.cotrain_view import ProgressBar

        total = steps or plan.spec.training.train_iters
        with ProgressBar(err, folder, total) as bar:
            record, _ = launch_local(plan, folder, render, force, workload, steps, python,
                                     lambda codes, elapsed: bar.update())
    else:
        def on_progress(codes: dict, elapsed: float) -> None:
            running = sum(c is None for c in codes.values())
            ok = sum(c == 0 for c in codes.values())
            err.print(f"[local] {elapsed:5.1f} s  ranks: {running} running, {ok} done, "
                      f"{len(codes) - running - ok} failed", markup=False)

        record, _ = launch_local(plan, folder, render, force, workload, steps, python, on_progress)
    _finish(folder, record, record["state"])


def _finish(folder, record, state) -> None:
    """Print the per-rank table; raise a UserError (exit 2) naming the failing rank when the run did not pass."""
    from specdraft.cli.runs_view import rank_table
    from specdraft.errors import UserError
    from specdraft.execute import monitor
    from specdraft.execute.report import read_results

    plan = monitor.read_plan(folder)
    results = read_results(folder)
    out = _console()
    out.print(rank_table(plan, results, state))
    message = monitor.problem(folder, record, state)
    if message:
        raise UserError(message, f"the logs: specdraft logs {folder} --rank N")
    passed = sum(1 for r in results.values() if r.get("ok"))
    if record.get("workload") == "cotrain":
        from specdraft.cli.cotrain_view import acceptance_table

        table = acceptance_table(folder)
        if table is not None:
            out.print(table)
    out.print(f"[green]{state}[/]: all {passed} ranks passed {record.get('workload', 'the workload')}")


def runs(root: str = typer.Option("runs", "--root", help="Folder holding run folders.")) -> None:
    """List runs: name, executor, job id, state, submitted."""
    from specdraft.cli.runs_view import runs_table
    from specdraft.execute.rundir import list_runs

    _console().print(runs_table(list_runs(root)))


def status(run: Optional[str] = RunArg) -> None:
    """Show a run's state (sacct/squeue, bounded) and each rank's progress."""
    from specdraft.cli.runs_view import print_status
    from specdraft.execute.rundir import resolve_run

    folder, record = resolve_run(run)
    print_status(_console(), folder, record)


def logs(
    run: Optional[str] = RunArg,
    rank: Optional[int] = typer.Option(None, "--rank", "-r", help="Only this rank."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the run ends."),
) -> None:
    """Show the logs of a run's ranks (submitit's per-task logs on Slurm, logs/ locally)."""
    from specdraft.cli.runs_view import show_logs
    from specdraft.execute.rundir import resolve_run

    folder, record = resolve_run(run)
    show_logs(folder, record, rank, follow)


def cancel(run: Optional[str] = RunArg) -> None:
    """Cancel a run (scancel on Slurm; the ranks' process group locally)."""
    from specdraft.execute import monitor
    from specdraft.execute.rundir import resolve_run

    folder, record = resolve_run(run)
    _console().print(monitor.cancel(folder, record), markup=False)


def register(app) -> None:
    """Add the launch commands to ``app``."""
    app.command()(launch)
    app.command()(runs)
    app.command()(status)
    app.command()(logs)
    app.command()(cancel)
