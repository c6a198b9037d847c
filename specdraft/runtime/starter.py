"""The local executor's rank starter: `python -u -m specdraft.runtime.starter PLAN [entry flags]` imports torch,
megatron-core and the workload once, then forks every rank of a CPU run from itself, so that N ranks on a few cores
do not each spend about 6 s of a core on the same imports. Each fork runs runtime.entry's main as its own process.

Protocol with execute/local.py: one JSON line on stdin, {"workload": W, "ranks": [{"env", "stdout_fd",
"stderr_fd"}, ...]} (the log descriptors passed to this process); JSON lines on stdout, {"rank", "pid"} as each rank
is forked and {"rank", "code"} as each is reaped (the code as Popen's returncode: negative for a signal). Rank 0
leads a new process group and the others join it, as the executor's Popen path does; this process stays outside it,
so a stop signalled to the group reaches the ranks alone and the starter lives on to report how they ended.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import traceback

from specdraft.runtime.tool import exit_now

# What every rank imports before its first step, heaviest first (about 6 s of a core together on this machine's CPU).
PRELOAD = (
    "torch.distributed",
    "megatron.core",
    "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.optimizer",
    "megatron.core.dist_checkpointing",
    "transformers",
    "transformers.modeling_layers",
    "transformers.configuration_utils",
    "specdraft.runtime.rl.trainer",
    "specdraft.runtime.models.eagle3_import",
    "specdraft.runtime.rl.loop",
    "specdraft.runtime.rl.instances",
    "specdraft.runtime.train.trainer",
    "specdraft.runtime.train.checkpoint",
)


def _report(fd: int, **fields) -> None:
    os.write(fd, (json.dumps(fields) + "\n").encode())


def _rank(spec: dict, pgid: int, passed: list[int], report_fd: int, entry_args: list[str]) -> None:
    """In the forked child: become the rank (its group, logs, environment and signals) and run the entry."""
    code = 1
    try:
        os.setpgid(0, pgid)  # 0: a new group that this rank leads
        # as a fresh interpreter has them (the starter ignores them); the entry installs its own
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(spec["stdout_fd"], 1)
        os.dup2(spec["stderr_fd"], 2)
        for fd in {devnull, report_fd, *passed}:
            os.close(fd)
        os.environ.clear()
        os.environ.update(spec["env"])
        import torch

        # read once when torch loaded (the starter's environment); set again as this rank's environment says
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
        from specdraft.runtime import entry

        sys.argv = [entry.__file__, *entry_args]
        code = entry.main(entry_args)
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        exit_now(code)


def main() -> int:
    # The launcher handles Ctrl-C and its stop signals; the starter must outlive them to reap and report the ranks.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    report_fd = os.dup(1)  # reports go here alone; fd 1 and Python's stdout are the ranks' to inherit and replace
    os.dup2(2, 1)
    entry_args = sys.argv[1:]
    import warnings

    from specdraft.runtime import entry

    request = json.loads(sys.stdin.readline())
    with warnings.catch_warnings():  # megatron's notes on a missing TE and Apex: each rank's log has them anyway
        warnings.simplefilter("ignore")
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except ImportError:
                pass  # the rank that needs it imports it again and fails with its own message, in its own log
        try:
            entry.load_workload(request["workload"])
        except (ImportError, ValueError, entry.WorkloadUnavailable):
            pass  # likewise: the rank's entry refuses it
    ranks = request["ranks"]
    passed = [fd for spec in ranks for fd in (spec["stdout_fd"], spec["stderr_fd"])]
    pgid = 0
    rank_of: dict[int, int] = {}
    for rank, spec in enumerate(ranks):
        pid = os.fork()
        if pid == 0:
            _rank(spec, pgid, passed, report_fd, entry_args)  # never returns
        try:
            os.setpgid(pid, pgid or pid)  # also here, so the group exists before the next fork joins it
        except (PermissionError, ProcessLookupError):
            pass  # the child set it first (or already exited): either way the group is the one it asked for
        pgid = pgid or pid
        rank_of[pid] = rank
        _report(report_fd, rank=rank, pid=pid)
    for fd in passed:
        os.close(fd)
    while rank_of:
        pid, status = os.wait()
        if pid in rank_of:
            _report(report_fd, rank=rank_of.pop(pid), code=os.waitstatus_to_exitcode(status))
    return 0


if __name__ == "__main__":
    exit_now(main())
