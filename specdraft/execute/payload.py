"""Run a one-process runtime payload (`python -m specdraft.runtime.<module> ...`) for a CLI command that needs torch.

The CLI never imports torch; like `launch`, it runs the runtime in a subprocess of this interpreter. The payload's
stderr streams through as it comes (progress, warnings), except its error line (errors.PAYLOAD_ERROR_PREFIX), which
becomes a UserError here, so the CLI prints it like any other and exits 2. Its stdout is returned.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
from typing import Callable

from specdraft.errors import UserError, parse_payload_error

# Library chatter every payload prints on import without TE/Apex (megatron-core): noise next to the result.
QUIET_PREFIXES = ("  warnings.warn(",)
QUIET_FRAGMENTS = ("Transformer Engine and Apex are not installed",)


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
    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", f"specdraft.runtime.{module}", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
    )
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
        raise RuntimeError(f"specdraft.runtime.{module} exited with code {code}:\n" + "\n".join(tail[-15:]))
    return out
