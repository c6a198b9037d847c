"""Run a one-process runtime payload (`python -m specdraft.runtime.<module> ...`) for a CLI command that needs torch.

The CLI never imports torch; like `launch`, it runs the runtime in a subprocess of this interpreter. The payload's
stderr streams through as it comes (progress, warnings), except its error line (errors.PAYLOAD_ERROR_PREFIX), which
becomes a UserError here, so the CLI prints it like any other and exits 2. Its stdout is returned. The payload never
outlives the CLI: a stop signal to the CLI is forwarded to it and waited for (bounded), then its group is killed.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
from typing import Callable

from specdraft.errors import UserError, parse_payload_error

# Library chatter every payload prints on import without TE/Apex (megatron-core): noise next to the result.
QUIET_PREFIXES = ("  warnings.warn(",)
QUIET_FRAGMENTS = ("Transformer Engine and Apex are not installed",)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_GRACE_S = 30.0  # a payload asked to stop removes what it half-wrote (an export's temp folder) and leaves
PR_SET_PDEATHSIG = 1  # prctl(2)


def require_runtime(command: str) -> None:
    """The runtime extra must be installed (find_spec looks without importing)."""
    missing = [
        m for m in ("torch", "megatron.core", "safetensors") if importlib.util.find_spec(m.split(".")[0]) is None
    ]
    if missing:
        raise UserError(
            f"`specdraft {command}` runs the draft and the policy with torch, but {', '.join(missing)} "
            "is not installed here",
            "pip install 'specdraft[runtime]'",
        )


def run(module: str, argv: list[str], on_stderr: Callable[[str], None]) -> str:
    """Run ``python -m specdraft.runtime.<module> ARGV``; return its stdout. A user error it reports raises that
    UserError; any other failure raises RuntimeError with its last stderr lines."""
    return run_command([sys.executable, "-u", "-m", f"specdraft.runtime.{module}", *argv], on_stderr)


class _Stopped(BaseException):
    """A stop signal to this CLI while its payload runs."""


def _stopped(signum, frame):
    raise _Stopped(signum)


def _die_with_parent() -> None:
    """In the payload, before it starts: the kernel sends it SIGTERM should this CLI die without taking it down
    (a SIGKILL), so not even that leaves it orphaned (Linux; elsewhere a no-op)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def run_command(command: list[str], on_stderr: Callable[[str], None]) -> str:
    """``command`` as the payload (its own session and process group, so the terminal's Ctrl-C reaches this CLI
    only); see ``run``. A stop signal to this CLI (SIGINT, SIGTERM, SIGHUP) is forwarded to the payload's group,
    which gets STOP_GRACE_S to clean up before SIGKILL; then KeyboardInterrupt (exit 130) is raised here."""
    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, _stopped) for sig in STOP_SIGNALS} if main else {}
    try:
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        try:
            return _collect(proc, command, on_stderr)
        except _Stopped as stop:
            _take_down(proc)
            raise KeyboardInterrupt(signal.Signals(stop.args[0]).name) from None
        except BaseException:
            _take_down(proc)
            raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _take_down(proc: subprocess.Popen) -> None:
    """SIGTERM the payload's process group, wait up to STOP_GRACE_S, SIGKILL the group (the payload's own children
    too); a second stop signal meanwhile kills at once."""
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except (subprocess.TimeoutExpired, _Stopped):
            pass
    _signal_group(proc.pid, signal.SIGKILL)  # the group outlives its leader while a child of it still runs
    proc.wait()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _collect(proc: subprocess.Popen, command: list[str], on_stderr: Callable[[str], None]) -> str:
    stdout, stderr = proc.stdout, proc.stderr
    assert stdout is not None and stderr is not None  # both are PIPE above; Popen types them Optional
    errors: list[UserError] = []
    tail: list[str] = []

    def pump() -> None:
        for line in stderr:
            line = line.rstrip("\n")
            found = parse_payload_error(line)
            if found is not None:
                errors.append(found)
            elif not line.startswith(QUIET_PREFIXES) and not any(f in line for f in QUIET_FRAGMENTS):
                tail.append(line)
                del tail[:-30]
                on_stderr(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    out = stdout.read()
    code = proc.wait()
    reader.join()
    if errors:
        raise errors[-1]
    if code != 0:
        name = command[3] if command[1:3] == ["-u", "-m"] else command[0]
        raise RuntimeError(f"{name} exited with code {code}:\n" + "\n".join(tail[-15:]))
    return out
