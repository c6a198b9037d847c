"""The shared main of the runtime's one-process tools (payloads the CLI runs: export, measure, the launch-time
checks): the result as one JSON line on stdout, a user's error as the payload's one-line error (exit 2); and the
fast exit of a rank or tool whose results are on disk."""

from __future__ import annotations

import os
import sys

from specdraft.errors import SpecdraftError


def exit_now(code: int) -> None:
    """Flush and leave without interpreter finalisation: after megatron's import that alone takes seconds, and
    after a failure it would wait on gloo's threads while peers wait on us. Results are already on disk."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_tool(work) -> int:
    """The offline tools' shared main: megatron's warnings quieted, the result as one JSON line on stdout, a LoadError
    (or any other error of the user's: a refused run file) as the one-line payload error the CLI shows (exit 2).
    SIGTERM or SIGHUP (the CLI passing on its stop) raise, so what a tool half-wrote is removed (an export's temp
    folder) before it exits 130."""
    import json
    import signal
    import sys
    import warnings

    def stop(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)

    from specdraft.errors import file_error, payload_error_line

    warnings.filterwarnings("ignore", category=UserWarning, module="megatron")  # config deprecations, TE absent
    try:
        result = work()
    except KeyboardInterrupt as err:
        print(f"[specdraft] stopped ({err or 'SIGINT'})", file=sys.stderr, flush=True)
        return 130
    except SpecdraftError as err:  # LoadError, ExportError, a refused run file
        message, fix = getattr(err, "message", str(err)), getattr(err, "fix", "")
        print(payload_error_line(message, fix), file=sys.stderr, flush=True)
        return 2
    except OSError as err:  # a read-only or full disk, a name too long: the user's, naming the path
        user = file_error(err)
        if user is None:
            raise
        print(payload_error_line(user.message, user.fix), file=sys.stderr, flush=True)
        return 2
    print(json.dumps(result), flush=True)
    return 0
