"""A child process the test interrupts gets SIGINT's default disposition back, whatever the test run inherited."""

from __future__ import annotations

import signal


def default_sigint() -> None:
    """``preexec_fn``: a test run started in the background (`make test &`) inherits SIGINT ignored, and a Python
    started so never installs its KeyboardInterrupt handler, so the launcher under test would not see Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
