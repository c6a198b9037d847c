"""Chat templates under a budget. A template is code from the model folder: every render of a row runs in a forked
child process holding the tokenizer, with a time limit, a memory limit and a size limit per row, so a template
that loops for hours, recurses without end or grows without bound is refused naming the file, the row and the
template, and no rank is held until the job's time limit. `render_chat` renders one row's messages."""

from __future__ import annotations

import multiprocessing
import os
import resource
from pathlib import Path
from typing import Any, Callable

from specdraft.datafile import DataError

TIME_BUDGET_S = 10.0  # per row: a real template renders a row in milliseconds
MEMORY_BUDGET_BYTES = 4 << 30  # per row, above what the worker holds when it starts
MAX_RESULT_ITEMS = 64 << 20  # characters of text, or token ids, one row may render to
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")


class TemplateFailed(Exception):
    """The template raised (its own refusal, a bug, a RecursionError); ``over_budget`` when it ran past a limit."""

    def __init__(self, detail: str, over_budget: bool = False):
        super().__init__(detail)
        self.detail, self.over_budget = detail, over_budget


def template_name(tokenizer) -> str:
    """Where the tokenizer's chat template comes from, for messages: its file in the model folder."""
    folder = Path(getattr(tokenizer, "name_or_path", "") or ".")
    for name in TEMPLATE_FILES:
        if (folder / name).is_file():
            return f"the chat template in {folder / name}"
    return f"the chat template of {folder}"


def _size(value: Any) -> int:
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(_size(v) if isinstance(v, (str, bytes, list, tuple)) else 1 for v in value)
    return 1


def _limit_memory(budget: int) -> None:
    """RLIMIT_DATA (heap and private writable mappings) at what this process holds now plus ``budget``: past it an
    allocation fails with MemoryError in this process alone. Best effort; the time limit holds regardless."""
    try:
        with open("/proc/self/status") as status:
            held = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmData:"))
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        soft = held + budget
        resource.setrlimit(resource.RLIMIT_DATA, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
    except (OSError, ValueError, StopIteration):
        pass


def _serve(conn, tokenizer, memory_bytes: int) -> None:
    """The child: run each (fn, args) it is sent as fn(tokenizer, *args) and send back ("ok", result) or
    ("error", why) / ("budget", why); leave without cleanup (os._exit) when the parent closes the pipe."""
    _limit_memory(memory_bytes)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        if message is None:
            os._exit(0)
        fn, args = message
        try:
            out = fn(tokenizer, *args)
            size = _size(out)
            reply = ("ok", out) if size <= MAX_RESULT_ITEMS else ("budget", f"it rendered {size:,} items")
        except RecursionError:
            reply = ("error", "RecursionError: it recursed without end (a macro or include that calls itself)")
        except MemoryError:
            reply = ("budget", f"it needed more than {memory_bytes:,} bytes of memory")
        except BaseException as err:  # the template's own refusal or its bug: reported to the parent, named there
            reply = ("error", f"{type(err).__name__}: {str(err)[:1000]}")
        try:
            conn.send(reply)
        except (OSError, MemoryError):
            os._exit(1)


class Renderer:
    """One forked worker holding ``tokenizer``: ``call(fn, *args)`` runs fn(tokenizer, *args) in it under the time
    and memory budget and returns the result; TemplateFailed when it raised or ran past a limit (then the worker is
    killed and the next call starts a fresh one). Use as a context manager."""

    def __init__(self, tokenizer, timeout_s: float | None = None, memory_bytes: int | None = None):
        self.tokenizer = tokenizer
        self.timeout_s = TIME_BUDGET_S if timeout_s is None else timeout_s
        self.memory_bytes = MEMORY_BUDGET_BYTES if memory_bytes is None else memory_bytes
        self._proc: Any = None
        self._conn: Any = None

    def __enter__(self) -> "Renderer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        context = multiprocessing.get_context("fork")  # the child inherits the loaded tokenizer: nothing to pickle
        mine, theirs = context.Pipe()
        self._proc = context.Process(
            target=_serve, args=(theirs, self.tokenizer, self.memory_bytes), daemon=True, name="chat-template"
        )
        self._proc.start()
        theirs.close()
        self._conn = mine

    def call(self, fn: Callable, *args) -> Any:
        if self._proc is None:
            self._start()
        try:
            self._conn.send((fn, args))
            ready = self._conn.poll(self.timeout_s)
            reply = self._conn.recv() if ready else None
        except (EOFError, OSError):
            code = self._stop()
            raise TemplateFailed(f"its process died (exit code {code}) while rendering", over_budget=True) from None
        if reply is None:
            self._stop()
            raise TemplateFailed(f"it did not finish within {self.timeout_s:g} s", over_budget=True)
        kind, value = reply
        if kind == "ok":
            return value
        if kind == "budget":
            self._stop()
        raise TemplateFailed(value, over_budget=kind == "budget")

    def _stop(self) -> int | None:
        proc, self._proc = self._proc, None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if proc is None:
            return None
        proc.kill()
        proc.join()
        return proc.exitcode

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.send(None)
            except OSError:
                pass
        self._stop()


def _render(tokenizer, messages: list[dict], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def render_chat(
    tokenizer,
    messages: list[dict],
    *,
    add_generation_prompt: bool,
    where: str,
    renderer: Renderer | None = None,
) -> str:
    """The text the tokenizer's chat template makes of ``messages`` ({"role", "content"} each), with the generation
    prompt when ``add_generation_prompt``, rendered under the row's budget (TIME_BUDGET_S, MEMORY_BUDGET_BYTES,
    MAX_RESULT_ITEMS). ``where`` names the row for messages (e.g. "data file /d/x.jsonl, line 3"). Tokenise the
    text with ``tokenizer(text, add_special_tokens=False)`` to get what apply_chat_template(tokenize=True) gives.

    Raises DataError naming ``where`` and the template's file when the template raises, recurses or runs past a
    limit. Pass a ``renderer`` to reuse one worker process across rows; without one, each call starts its own."""
    own = renderer is None
    worker = Renderer(tokenizer) if renderer is None else renderer
    try:
        return worker.call(_render, messages, add_generation_prompt)
    except TemplateFailed as err:
        raise refusal(tokenizer, where, err) from None
    finally:
        if own:
            worker.close()


def refusal(tokenizer, where: str, err: TemplateFailed) -> DataError:
    """One DataError naming the row, the template and what went wrong."""
    template = template_name(tokenizer)
    if err.over_budget:
        return DataError(
            f"{where}: {template} ran past its budget for one row: {err.detail}",
            "fix the template (a loop or macro that never ends, or output that grows without bound), or drop that row",
        )
    return DataError(
        f"{where}: {template} refused it ({err.detail})",
        "fix the row or the template (docs/data.md says how rows are rendered)",
    )
