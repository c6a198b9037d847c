"""`launch`, `runs`, `status`, `logs` and `cancel`: thin typer commands that parse, call execute/, and print."""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from specdraft.cli.boundary import console as _console
from specdraft.cli.terminal import plain, safe

TargetArgs = typer.Argument(
    None,
    metavar="[LAYOUT | PLAN.json] [OVERRIDES...]",
    help="Layout YAML or compiled plan.json (default: the built-in tiny CPU layout), then KEY=VALUE overrides.",
)
RunArg = typer.Argument(
    None, metavar="[RUN]", help="A run folder's path, or its name under runs/ (default: the most recent run)."
)


def launch(
    args: Optional[List[str]] = TargetArgs,
    executor: Optional[str] = typer.Option(
        None,
        "--executor",
        "-e",
        help="slurm or local (default: the layout's cluster.executor; with neither, launch refuses).",
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Print the sbatch script (stdout) and the srun line and "
        "per-rank command (stderr); write nothing, submit nothing.",
    ),
    run_dir: Optional[str] = typer.Option(None, "--run-dir", help="The run folder (default: runs/<name>-<hash8>)."),
    force: bool = typer.Option(
        False,
        "--force",
        help="Launch again into a run folder whose job has ended, from "
        "step 0 (its old checkpoints and metrics move to attempts/).",
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue the run folder from its newest complete "
        "checkpoint (relaunches a run that ended; never one that is queued or running).",
    ),
    resume_from: Optional[str] = typer.Option(
        None,
        "--resume-from",
        metavar="CHECKPOINT",
        help="Start from this checkpoint folder (another run, or another layout of the same model).",
    ),
    allow_data_change: bool = typer.Option(
        False,
        "--allow-data-change",
        help="With --resume/--resume-from: continue although data.path's content changed since the checkpoint "
        "(the new file is trained from its first sample); without it such a resume is refused.",
    ),
    workload: Optional[str] = typer.Option(
        None,
        "--workload",
        "-w",
        help="cotrain (the co-training job), grpo (RL post-training, docs/grpo.md) or selftest (collectives over "
        "every group and tap route); default: the layout's `workload` (cotrain unless it says otherwise).",
    ),
    steps: Optional[int] = typer.Option(None, "--steps", help="Steps to run (default: training.train_iters)."),
    wait: bool = typer.Option(False, "--wait", help="Slurm: wait for the job to end and report every rank."),
    python: Optional[str] = typer.Option(
        None, "--python", help="Interpreter on the nodes (default: this one; `python` inside a container image)."
    ),
) -> None:
    """Launch a plan on Slurm (through submitit) or locally, one process per rank.

    Exit codes: 0 the run passed (or was queued), 2 it failed or could not start, 75 every rank stopped at a
    checkpoint (preempted: --resume continues it)."""
    from specdraft.cli.args import load_plan
    from specdraft.execute import launch as use_case

    plan, _ = load_plan(args, notes=False)  # a plan.json is re-validated and re-compiled from its spec
    request = use_case.prepare(
        plan,
        executor=executor,
        run_dir=run_dir,
        python=python,
        workload=workload,
        steps=steps,
        force=force,
        wait=wait,
        resume=resume,
        resume_from=resume_from,
        allow_data_change=allow_data_change,
        dry_run=dry_run,
    )
    err = _console(stderr=True)
    for note in request.notes:
        err.print(f"warning: {plain(note)}", markup=False)
    if dry_run:
        _print_dry_run(request, err)
        return
    err.print(f"executor: {request.executor} ({request.executor_why})", markup=False)
    err.print(f"run folder: {plain(request.run_dir)}", markup=False)
    if request.checkpoint:
        err.print(f"resuming from: {plain(request.checkpoint)}", markup=False)
    out = _console()
    bar = None
    if request.workload in ("cotrain", "grpo") and request.waits:
        from specdraft.cli.cotrain_view import ProgressBar

        bar = ProgressBar(err, request.run_dir, steps or plan.training.train_iters, label=request.workload)

    def on_progress(progress) -> None:
        if bar is not None:
            bar.update()
            if not progress.heartbeat:
                bar.progress.console.print(f"[{progress.executor}] {plain(progress.summary)}", markup=False)
        else:
            err.print(f"[{progress.executor}] {progress.elapsed_s:5.1f} s  {plain(progress.summary)}", markup=False)

    def warn(message: str) -> None:
        err.print(f"warning: {plain(message)}", markup=False)

    if bar is not None:
        with bar:
            result = use_case.launch(request, lambda line: out.print(plain(line), markup=False), on_progress, warn)
    else:
        result = use_case.launch(request, lambda line: out.print(plain(line), markup=False), on_progress, warn)
    if not result.ended:
        folder = request.run_dir
        out.print(
            f"follow it: specdraft status {folder} | specdraft logs {folder} --follow | specdraft cancel {folder}",
            markup=False,
        )
        return
    _finish(request.run_dir, result)


def _print_dry_run(request, err) -> None:
    import shlex

    from specdraft.execute.launch import dry_run_notes

    sys.stdout.write(request.render.script)
    err.print(
        f"# dry run: nothing written, nothing submitted. executor: {request.executor} ({request.executor_why})",
        markup=False,
    )
    err.print(
        "# the script reads the run folder's plan.json, which only a launch writes: run the same command without "
        "--dry-run to write both and start it",
        markup=False,
    )
    err.print(f"# run folder: {plain(request.run_dir)}", markup=False)
    if request.checkpoint:
        err.print(f"# resumes from: {plain(request.checkpoint)} (every rank gets the same flag)", markup=False)
    err.print(f"# srun line: {request.render.srun_line}", markup=False)
    err.print(f"# per-rank command: {shlex.join(request.render.payload_argv)}", markup=False)
    for note in dry_run_notes(request):
        err.print(f"# {note}", markup=False)


def _finish(folder, result) -> None:
    """Print the per-rank table; raise a UserError (exit 2) naming the failing rank when the run did not pass."""
    from specdraft.cli.runs_view import rank_table
    from specdraft.errors import UserError
    from specdraft.execute import monitor
    from specdraft.execute.report import read_results, warnings_of
    from specdraft.runs.paths import PREEMPTED_EXIT

    plan = monitor.read_plan(folder)
    results = read_results(folder, plan.world_size)
    out = _console()
    out.print(rank_table(plan, results, result.state))
    for warning in warnings_of(results):  # what the ranks did other than asked (a data position that did not apply)
        _console(stderr=True).print(f"warning: {plain(warning)}", markup=False)
    if result.problem and result.state != "CANCELLED" and monitor.stopped_at(results, plan.world_size) is not None:
        # Not a failure: every rank saved and stopped (EX_TEMPFAIL, the ranks' own exit code): run it again.
        _console(stderr=True).print(f"{plain(result.state)}: {plain(result.problem)}", markup=False)
        raise typer.Exit(PREEMPTED_EXIT)
    if result.problem:
        raise UserError(result.problem, f"the logs: specdraft logs {folder} --rank N")
    passed = sum(1 for r in results.values() if r.get("ok"))
    if result.record.workload in ("cotrain", "grpo"):
        from specdraft.cli.runs_view import print_figures

        print_figures(out, folder, result.record.workload)
    out.print(f"[green]{safe(result.state)}[/]: all {passed} ranks passed {safe(result.record.workload)}")


def runs(root: str = typer.Option("runs", "--root", help="Folder holding run folders.")) -> None:
    """List runs: name, executor, job id, state, submitted (a folder that cannot be read is a row saying why)."""
    from specdraft.cli.runs_view import runs_table
    from specdraft.execute import monitor
    from specdraft.runs.rundir import list_runs

    entries = list_runs(root)
    fresh = monitor.refresh_all([(e.folder, e.record) for e in entries if e.record is not None])
    _console().print(runs_table(entries, fresh))


def status(
    run: Optional[str] = RunArg,
    plot: Optional[str] = typer.Option(
        None,
        "--plot",
        metavar="FILE.png",
        help="Also draw reward (GRPO) or losses (cotrain), accept length and step time over the steps "
        "(needs matplotlib: the plot extra).",
    ),
) -> None:
    """Show a run's state (sacct/squeue, bounded; a pending job's reason), each rank's progress and its figures."""
    from specdraft.cli.runs_view import print_status
    from specdraft.runs.rundir import resolve_run

    if plot is not None:
        from specdraft.fsutil import check_output_path
        from specdraft.render.metrics_plot import check_plot_path

        check_plot_path(plot)
        check_output_path(plot, "plot")  # refuse a FIFO, link or device before reading the run
    folder, record, broken = resolve_run(run)
    if broken:
        _console(stderr=True).print(
            f"note: {len(broken)} other folder(s) under runs/ could not be read; `specdraft runs` shows why",
            markup=False,
        )
    print_status(_console(), folder, record)
    if plot is not None:
        from specdraft.execute.monitor import read_metrics
        from specdraft.fsutil import atomic_write_bytes
        from specdraft.render.metrics_plot import plot_bytes

        atomic_write_bytes(plot, plot_bytes(read_metrics(folder), folder.name), what="plot")
        _console().print(f"wrote {plain(plot)}", markup=False)


def logs(
    run: Optional[str] = RunArg,
    rank: Optional[int] = typer.Option(None, "--rank", "-r", help="Only this rank."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the run ends."),
) -> None:
    """Show the logs of a run's ranks (submitit's per-task logs on Slurm, logs/ locally)."""
    from specdraft.cli.runs_view import show_logs
    from specdraft.runs.rundir import resolve_run

    folder, record, _ = resolve_run(run)
    show_logs(folder, record, rank, follow)


def cancel(run: Optional[str] = RunArg) -> None:
    """Cancel a run (scancel on Slurm, bounded; the ranks' process group locally)."""
    from specdraft.execute import monitor
    from specdraft.runs.rundir import resolve_run

    folder, record, _ = resolve_run(run)
    _console().print(plain(monitor.cancel(folder, record)), markup=False)


def register(app) -> None:
    """Add the launch commands to ``app``."""
    app.command()(launch)
    app.command()(runs)
    app.command()(status)
    app.command()(logs)
    app.command()(cancel)
