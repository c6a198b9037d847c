"""Multi-process test harness: run a function on every rank of a fresh torch.distributed world (spawned processes,
gloo on 127.0.0.1), collect the per-rank results, and fail loudly (rank + traceback) instead of hanging.

Usage (tests/ is a package; pytest puts the repo root on sys.path)::

    from tests.support.distributed import run_distributed

    def _worker(rank, world_size, cases):      # module level, so spawned children can import it by name
        ...                                    # the default process group is already initialised
        return some_picklable_result

    results = run_distributed(_worker, 2, cases, timeout=120)   # list indexed by rank

Spawning costs about 2 s per rank on 2 cores: spawn one world and loop over many cases inside it.
"""

from __future__ import annotations

import datetime
import os
import pickle
import queue as queue_mod
import socket
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class DistributedTestError(RuntimeError):
    """A rank raised, died, or did not finish in time; the message names the rank and carries its traceback."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(rank, world_size, port, backend, timeout, fn, args, results):
    try:
        # Ranks share the cores; without this each rank starts one thread per core and they thrash.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout),
        )
        # Plain pickle copies tensor bytes into the message. The queue's own pickler would pass shared-memory file
        # descriptors instead, which the parent can only fetch while this rank is alive: a rank that finishes
        # first and exits makes the parent's unpickling fail (FileNotFoundError on the resource sharer's socket).
        value = pickle.dumps(fn(rank, world_size, *args))
        results.put((rank, True, value))
    except BaseException:  # reported to the parent, which raises it with this rank's traceback
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(
    fn, world_size: int, *args, timeout: float = 120, backend: str = "gloo", daemon: bool = True
) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned ranks and return the results in rank order.

    ``fn`` must be a module-level function and ``args``/results picklable. Each child initialises the default
    process group (``backend``, TCP rendezvous on a free localhost port) and sets torch to cpu_count/world_size
    threads. Raises DistributedTestError naming the first failing rank with its traceback, a rank that exited
    without reporting, or (after ``timeout`` seconds of wall time) the ranks still running; the remaining
    processes are killed in every failure case, so a broken collective never hangs the test session. ``daemon``
    False: ranks that start processes of their own (a vLLM engine's, the final checkpoint's writers), which a daemonic
    process may not."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1; got {world_size}")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(
            target=_child,
            args=(r, world_size, port, backend, timeout, fn, args, results),
            daemon=daemon,
            name=f"rank{r}",
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    values: dict[int, object] = {}
    try:
        while len(values) < world_size:
            try:
                rank, ok, value = results.get(timeout=0.2)
            except queue_mod.Empty:
                if time.monotonic() > deadline:
                    missing = sorted(set(range(world_size)) - set(values))
                    raise DistributedTestError(
                        f"{fn.__name__}: ranks {missing} did not finish within {timeout} s "
                        f"(world_size={world_size}); killed them"
                    ) from None
                dead = [
                    r for r, p in enumerate(procs) if r not in values and p.exitcode is not None and p.exitcode != 0
                ]
                if dead:
                    raise DistributedTestError(
                        f"{fn.__name__}: rank {dead[0]} exited with code "
                        f"{procs[dead[0]].exitcode} without reporting a result"
                    ) from None
                continue
            if not ok:
                raise DistributedTestError(f"{fn.__name__} failed on rank {rank} of {world_size}:\n{value}")
            values[rank] = pickle.loads(value)
    finally:
        for p in procs:
            p.join(timeout=5 if len(values) == world_size else 0.1)
            if p.is_alive():
                p.kill()
                p.join()
        results.close()
    return [values[r] for r in range(world_size)]
