"""The local executor: one process per rank on this machine (gloo), torchrun-style env, one process group.

When a rank fails (exits neither 0 nor 75) the launcher stops the rest (SIGTERM, SIGKILL after GRACE_S): no hang.
A stop that can save (Ctrl-C, SIGTERM or SIGHUP to the launcher, the time limit, `cancel`) SIGTERMs the ranks, which
finish their step and save, and waits up to the layout's training.stop_grace_s before SIGKILL; asked again while
it waits, it kills at once. Exit 75 is a rank that stopped at a checkpoint with its peers: a run whose ranks all
end so is PREEMPTED. The launcher is the job: it holds the launch lock for the whole run and records how the ranks
ended.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from specdraft.errors import UserError
from specdraft.execute import diskspace, forked
from specdraft.execute.executor import Executor, Observation, Progress, ProgressFn
from specdraft.execute.report import read_results, settle
from specdraft.runs import files as runfiles
from specdraft.runs.paths import LOGS, PLAN, PREEMPTED_EXIT, RECORD, local_logs
from specdraft.runs.record import LocalProcesses, RunRecord, now_iso
from specdraft.runs.rundir import ACTIVE, lock_is_held, read_record

GRACE_S = 5.0  # the peers of a failed rank: with a peer gone they cannot save, only leave
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
POLL_S = 0.2
HEARTBEAT_S = 5.0  # a progress line at least this often, so a slow start does not look like a hang


@dataclass
class LocalOutcome:
    exit_codes: dict[int, int] = field(default_factory=dict)
    exit_order: list[int] = field(default_factory=list)  # ranks in the order they failed (exit neither 0 nor 75)
    timed_out: bool = False
    interrupted: bool = False
    elapsed_s: float = 0.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_env(plan, rank: int, port: int) -> dict[str, str]:
    """The torchrun-style variables of one rank; node and local rank mirror the plan's placement."""
    me = plan.ranks[rank]
    per_node = plan.cluster.gpus_per_node
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(plan.world_size),
        "LOCAL_RANK": str(me.local_rank),
        "LOCAL_WORLD_SIZE": str(per_node),
        "GROUP_RANK": str(me.node),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        # Ranks share this machine's cores; one torch thread per core each would thrash.
        "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // plan.world_size)),
    }


def base_env(plan) -> dict[str, str]:
    """This process's environment minus any enclosing job's rank variables, plus the layout's slurm.env."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env.update(plan.slurm.env)
    return env


def signal_group(pgid: int, sig: int) -> bool:
    if pgid <= 0:  # 0 would be this process's own group
        return False
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def group_members(pgid: int, marker: str) -> list[int]:
    """Pids in process group ``pgid`` whose command line contains ``marker`` (guards against a reused pgid)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        # Field 5 of /proc/PID/stat is the pgrp; the command name (field 2) may hold spaces, so split after ')'.
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and int(fields[2]) == pgid and marker in cmdline:
            out.append(int(entry.name))
    return out


def run(
    plan,
    run_dir: str,
    argv: list[str],
    timeout_s: float,
    on_start: Callable[[int, list[int]], None],
    on_progress: Callable[[dict[int, int | None], float], None],
    on_stop: Callable[[str], None] = lambda line: None,
) -> LocalOutcome:
    """Start every rank, wait, stop the rest when one fails; ``on_start(pgid, pids)`` runs once all started, and
    ``on_stop(line)`` says what a stop waits for."""
    grace_s = plan.training.stop_grace_s
    runfiles.make_dir(run_dir, LOGS)
    port = free_port()
    env = base_env(plan)
    procs: list = []  # subprocess.Popen, or forked.ForkedRank with the same poll/wait/returncode/pid
    reports = None  # the forked ranks' (forked.Reports), when the runtime's starter forks them
    outcome = LocalOutcome()
    started = time.monotonic()
    pgid = 0
    # A launcher told to stop (kill, a closed terminal) takes its ranks with it, like Ctrl-C does.
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        args = forked.entry_args(argv, plan.cluster.gpu, plan.world_size)
        if args is None:
            for rank in range(plan.world_size):
                proc = _popen(argv, {**env, **rank_env(plan, rank, port)}, run_dir, rank, pgid)
                pgid = pgid or proc.pid
                procs.append(proc)
        else:
            reports = _fork(argv, args, plan, env, port, run_dir)
            procs = reports.ranks
            pgid = reports.pids()[0]
        if pgid:  # else the starter failed before forking a rank: rank 0's log has why, and _wait ends them
            on_start(pgid, [p.pid for p in procs])
        outcome = _wait(procs, pgid, started, timeout_s, grace_s, on_progress)
    except KeyboardInterrupt:
        outcome.interrupted = True
        pgid = pgid or (reports.abandon() if reports else 0)
        _stop(procs, pgid, grace_s, on_stop)
        outcome.exit_codes = {r: p.returncode for r, p in enumerate(procs)}
    except BaseException:
        pgid = pgid or (reports.abandon() if reports else 0)
        _stop(procs, pgid, grace_s, on_stop)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    outcome.elapsed_s = time.monotonic() - started
    return outcome


def _popen(argv: list[str], env: dict, run_dir: str, rank: int, pgid: int) -> subprocess.Popen:
    """Rank ``rank`` as its own interpreter, its output appended to its logs; rank 0 leads a new process group and
    the others join it: `cancel` signals the group."""
    out, err = _open_logs(run_dir, rank)
    try:
        return subprocess.Popen(
            argv, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=run_dir, process_group=pgid
        )
    finally:
        os.close(err)
        os.close(out)


def _open_logs(run_dir: str, rank: int) -> tuple[int, int]:
    """Descriptors appending to rank ``rank``'s stdout and stderr logs (neither left open if one is refused)."""
    out_log, err_log = local_logs(rank)
    out = runfiles.open_append(run_dir, out_log)
    try:
        return out, runfiles.open_append(run_dir, err_log)
    except BaseException:
        os.close(out)
        raise


def _fork(argv: list[str], args: list[str], plan, env: dict, port: int, run_dir: str):
    """Every rank forked by the runtime's starter (forked.py): the imports once, not once per rank."""
    logs: list[tuple[int, int]] = []
    try:
        for rank in range(plan.world_size):
            logs.append(_open_logs(run_dir, rank))
        envs = [{**env, **rank_env(plan, rank, port)} for rank in range(plan.world_size)]
        return forked.start(argv, args, envs, logs, run_dir)
    finally:
        for pair in logs:
            for fd in pair:
                os.close(fd)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _wait(procs, pgid: int, started: float, timeout_s: float, grace_s: float, on_progress) -> LocalOutcome:
    outcome = LocalOutcome()
    codes: dict[int, int | None] = {r: None for r in range(len(procs))}
    stop_at = None
    last = None
    next_beat = 0.0
    while True:
        for rank, proc in enumerate(procs):
            if codes[rank] is None and proc.poll() is not None:
                codes[rank] = proc.returncode
                if proc.returncode not in (0, PREEMPTED_EXIT):
                    outcome.exit_order.append(rank)
        now = time.monotonic()
        if last != codes or now >= next_beat:
            on_progress(dict(codes), now - started)
            last, next_beat = dict(codes), now + HEARTBEAT_S
        if all(code is not None for code in codes.values()):
            break
        if stop_at is None and (outcome.exit_order or now - started > timeout_s):
            outcome.timed_out = not outcome.exit_order
            signal_group(pgid, signal.SIGTERM)
            stop_at = now + (GRACE_S if outcome.exit_order else grace_s)  # at the time limit they save first
        elif stop_at is not None and now > stop_at:
            signal_group(pgid, signal.SIGKILL)
            stop_at = float("inf")
        time.sleep(POLL_S)
    outcome.exit_codes = {r: c for r, c in codes.items() if c is not None}
    return outcome


def _stop(procs, pgid: int, grace_s: float, on_stop: Callable[[str], None]) -> None:
    """SIGTERM the ranks and give them ``grace_s`` to finish their step and save (each exits once saved), then
    SIGKILL what is left. Asked again while it waits (a second Ctrl-C, SIGTERM or SIGHUP), it kills at once."""
    if pgid:
        signal_group(pgid, signal.SIGTERM)
    try:
        if any(p.poll() is None for p in procs):
            on_stop(
                f"stopping: every rank finishes its step and saves a checkpoint; waiting up to {grace_s:g} s "
                "(training.stop_grace_s) before killing them; interrupt again to kill them now"
            )
        deadline = time.monotonic() + grace_s
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    except KeyboardInterrupt:
        on_stop("interrupted again: killing the ranks without waiting for their save")
    finally:
        # No third signal may leave the ranks running or the run unrecorded: the kill and the reaping take no time.
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}
        try:
            if pgid:
                signal_group(pgid, signal.SIGKILL)
            for proc in procs:
                proc.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def stop_group(pgid: int, marker: str, grace_s: float = GRACE_S) -> int:
    """SIGTERM the run's process group, give it ``grace_s`` to save and exit, then SIGKILL; returns how many ranks
    were alive."""
    alive = group_members(pgid, marker)
    if not alive:
        return 0
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and group_members(pgid, marker):
        time.sleep(POLL_S)
    if group_members(pgid, marker):
        signal_group(pgid, signal.SIGKILL)
    return len(alive)


class LocalExecutor(Executor):
    name = "local"
    runs_in_launcher = True
    intent_state = "STARTING"

    def default_python(self, plan, explicit: str | None) -> str:
        """--python, else this interpreter (there is no container locally)."""
        return explicit or sys.executable

    def dry_run_notes(self) -> list[str]:
        return [
            "local: the same command once per rank, with RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK, "
            "MASTER_ADDR=127.0.0.1 and a free MASTER_PORT"
        ]

    def start(self, request, on_progress: ProgressFn) -> RunRecord:
        """Run every rank here and wait; the caller holds the launch lock for the whole run."""
        run_dir, plan = request.run_dir, request.plan

        def started(pgid: int, pids: list[int]) -> None:
            diskspace.update(
                run_dir,
                job_id=f"local-{pgid}",
                state="RUNNING",
                submitted=now_iso(),
                local=LocalProcesses(pgid=pgid, pids=tuple(pids), launcher_pid=os.getpid()),
                attempt={"job_id": f"local-{pgid}", "state": "RUNNING", "submitted": now_iso()},
            )

        seen: dict = {}

        def progress(codes: dict[int, int | None], elapsed: float) -> None:
            running = sum(c is None for c in codes.values())
            ok = sum(c == 0 for c in codes.values())
            saved = sum(c == PREEMPTED_EXIT for c in codes.values())
            heartbeat = seen.get("codes") == codes  # run() reports every HEARTBEAT_S even when nothing changed
            seen["codes"] = dict(codes)
            stopped = f"{saved} stopped at a checkpoint, " if saved else ""
            on_progress(
                Progress(
                    self.name,
                    elapsed,
                    "RUNNING" if running else "ENDING",
                    f"ranks: {running} running, {ok} done, {stopped}{len(codes) - running - ok - saved} failed",
                    heartbeat,
                )
            )

        def stopping(line: str) -> None:
            on_progress(Progress(self.name, 0.0, "STOPPING", line))

        outcome = run(
            plan, run_dir, list(request.render.payload_argv), plan.slurm.time_limit_s, started, progress, stopping
        )
        record = read_record(run_dir)
        if outcome.interrupted or (record is not None and record.cancel_requested):
            state = "CANCELLED"
        elif outcome.timed_out:
            state = "TIMEOUT"
        elif outcome.exit_order:  # _wait lists every rank that exited neither 0 nor PREEMPTED_EXIT
            state = "FAILED"
        elif PREEMPTED_EXIT in outcome.exit_codes.values():
            state = "PREEMPTED"  # every rank stopped at the same step boundary after saving
        else:
            state = "COMPLETED"
        # Every rank exited 0: the results decide (a rank that exited 0 without one failed).
        state, why = settle(state, read_results(run_dir, plan.world_size), plan.world_size)
        # Ranks that died on a full disk leave no result or log line saying so: the launcher says it.
        full = state in ("FAILED", "CANCELLED", "TIMEOUT") and diskspace.low_on_space(run_dir)
        note = {"message": diskspace.full_disk_note(run_dir)} if full else {"message": why} if why else {}
        return diskspace.update(
            run_dir,
            **note,
            state=state,
            attempt={"state": state, "ended": now_iso()},
            exit_codes=tuple(c for _, c in sorted(outcome.exit_codes.items())),
            exit_order=tuple(outcome.exit_order),
            elapsed_s=round(outcome.elapsed_s, 3),
        )

    def started_summary(self, record: RunRecord, plan) -> str:
        return f"ran {plan.world_size} rank process(es) here ({record.describe_job()})"

    def observe(self, run_dir: Path, record: RunRecord, *, launching: bool = False) -> Observation:
        if record.state not in ACTIVE:
            return Observation(record.state, RECORD)
        # A launcher that is still running holds the launch lock; under our own lock no launcher of this run runs.
        if not launching and lock_is_held(run_dir):
            return Observation(record.state, RECORD)
        if record.local and group_members(record.local.pgid, str(Path(run_dir) / PLAN)):
            return Observation(
                record.state, f"{RECORD} (its launcher is gone, its ranks still run; `specdraft cancel` stops them)"
            )
        return Observation(
            "LOST", f"{RECORD} (its launcher is gone)", note="the launcher stopped before recording how its ranks ended"
        )

    def cancel(self, run_dir: Path, record: RunRecord) -> tuple[str, str | None]:
        """SIGTERM the ranks, wait up to the plan's training.stop_grace_s for their save, then SIGKILL."""
        pgid = record.local.pgid if record.local else None
        killed = stop_group(pgid, str(Path(run_dir) / PLAN), _stop_grace(run_dir)) if pgid else 0
        # A running launcher records the outcome itself; with none left, the canceller records it.
        return (
            f"cancelled the local run: stopped {killed} rank process(es) of group {pgid}",
            None if lock_is_held(run_dir) else "CANCELLED",
        )

    def log_paths(self, record: RunRecord, rank: int) -> tuple[str, str]:
        return local_logs(rank)


def _stop_grace(run_dir: Path) -> float:
    """The run's training.stop_grace_s, from its plan.json as `status` reads it; the default when that is refused."""
    from specdraft.execute.monitor import read_plan
    from specdraft.spec.schema import TrainingSpec

    try:
        return read_plan(run_dir).training.stop_grace_s
    except UserError:
        return TrainingSpec.stop_grace_s
