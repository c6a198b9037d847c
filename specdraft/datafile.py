"""A training-data file the user names (data.path): its rows read (JSON lines, or parquet through pyarrow) and checked
against one row format, every problem named by file, row and field. No torch: `validate` and `launch` run it before
any rank starts, and every rank runs it again before tokenising (runtime/train/corpus.py).
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from typing import Any, Iterator

from specdraft import jsonfile
from specdraft.errors import UserError, echo
from specdraft.fsutil import file_kind

FORMATS = ("messages", "prompt_response", "problem_answer", "text")
MAX_ROW_BYTES = 64 << 20  # one JSON line; a longer one is refused, not read whole
MAX_LISTED = 20  # problems listed in one message; the rest are counted
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
PARQUET_MAGIC = b"PAR1"
FIX = "fix those rows (docs/data.md lists the row formats), or set data.format to what the file holds"


class DataError(UserError):
    """A data file (or its tokenizer) that cannot be trained on; the message names the file, the rows and fields.
    ``headline`` is one line of it (the first problem), for the tables that show one line per rank."""

    def __init__(self, message: str, fix: str = "", headline: str | None = None):
        super().__init__(message, fix)
        self.headline = headline or message.splitlines()[0]


@dataclass(frozen=True)
class Record:
    """One row's content in its format: messages ((role, content), ...), (prompt, response), or the text."""

    row: int  # 1-based: the line of a jsonl file, the row of a parquet file
    value: Any


def row_name(path: str, row: int) -> str:
    return f"line {row}" if path.lower().endswith(".jsonl") else f"row {row}"


def problems_error(path: str, problems: list[str], fix: str = FIX) -> DataError:
    """One DataError listing ``problems`` (at most MAX_LISTED, then how many more)."""
    n = len(problems)
    lines = [f"data file {path}: {n} problem{'s' if n != 1 else ''}:"]
    lines += [f"  - {p}" for p in problems[:MAX_LISTED]]
    if n > MAX_LISTED:
        lines.append(f"  ... and {n - MAX_LISTED} more")
    more = f" (and {n - 1} more)" if n > 1 else ""
    return DataError("\n".join(lines), fix, headline=f"data file {path}: {problems[0]}{more}")


def read_records(path: str, fmt: str = "auto") -> tuple[str, list[Record]]:
    """(the resolved format, every row's Record); DataError with every problem found (an unreadable file, a row that
    is not an object, a missing field, a wrong type, no rows at all)."""
    problems: list[str] = []
    records: list[Record] = []
    for row, value in _rows(path, problems):
        where = row_name(path, row)
        if not isinstance(value, dict):
            problems.append(f"{where}: must be a JSON object with the row's fields, got {_kind(value)}")
            continue
        if fmt == "auto":
            fmt = _detect(value)
            if fmt == "auto":
                problems.append(
                    f"{where}: has none of the fields `messages`, `prompt`/`response`, `problem`/`expected_answer` "
                    "or `text` "
                    f"(it has {', '.join(map(repr, sorted(value)[:8])) or 'no fields'})"
                )
                break
        record = _record(fmt, value, where, problems)
        if record is not None:
            records.append(Record(row, record))
    if problems:
        raise problems_error(path, problems)
    if not records:
        raise DataError(f"data file {path} has no rows", "give a file with at least one row (docs/data.md)")
    return fmt, records


def check_file(path: str, fmt: str, tokenizer: str | None) -> tuple[str, int | None]:
    """The CLI's check before any rank starts: the rows (format, count) and the tokenizer folder's files. Without
    pyarrow a parquet file is checked for its magic bytes only (count None): the ranks read its rows."""
    if tokenizer is not None:
        check_tokenizer_folder(tokenizer)
    if path.lower().endswith(".parquet"):
        try:
            import pyarrow.parquet  # noqa: F401 - only whether it is there
        except ImportError:
            _check_parquet_magic(path)
            return fmt, None
    fmt, records = read_records(path, fmt)
    return fmt, len(records)


def file_sha256(path: str) -> str:
    """The sha256 of the data file's bytes: what a checkpoint records, so a resume knows the file it trained on."""
    digest = hashlib.sha256()
    with _open_regular(path) as handle:
        try:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        except OSError as err:
            raise DataError(f"cannot read data file {path}: {err.strerror or err}", "check the file") from None
    return digest.hexdigest()


def check_tokenizer_folder(folder: str) -> None:
    if not os.path.isdir(folder):
        raise DataError(
            f"model.path {folder} is not a folder: with data.path set, the ranks load the tokenizer from it",
            "point model.path at the Hugging Face model folder (config.json, tokenizer files)",
        )
    if not any(os.path.isfile(os.path.join(folder, name)) for name in TOKENIZER_FILES):
        raise DataError(
            f"model.path {folder} has no tokenizer files ({', '.join(TOKENIZER_FILES)})",
            "save the tokenizer there (tokenizer.save_pretrained(folder)), or point model.path at the model's folder",
        )


def _detect(row: dict) -> str:
    if "messages" in row:
        return "messages"
    if "prompt" in row or "response" in row:
        return "prompt_response"
    if "problem" in row or "expected_answer" in row:
        return "problem_answer"
    return "text" if "text" in row else "auto"


def _record(fmt: str, row: dict, where: str, problems: list[str]) -> Any:
    """The row's value in ``fmt``, or None after appending what is wrong with it."""
    before = len(problems)

    def string(field: str, value: Any) -> str | None:
        if value is None and field not in row:
            problems.append(f"{where}, field `{field}`: is missing")
        elif not isinstance(value, str):
            problems.append(f"{where}, field `{field}`: must be a string, got {_kind(value)}")
        else:
            return value
        return None

    if fmt == "text":
        text = string("text", row.get("text"))
        if text is not None and not text.strip():
            problems.append(f"{where}, field `text`: is empty")
        return text if len(problems) == before else None
    if fmt == "prompt_response":
        pair = (string("prompt", row.get("prompt")), string("response", row.get("response")))
        return pair if len(problems) == before else None
    if fmt == "problem_answer":  # NeMo-RL's math rows; a numeric answer reads as its JSON text
        answer = row.get("expected_answer")
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)
        pair = (string("problem", row.get("problem")), string("expected_answer", answer))
        return pair if len(problems) == before else None
    messages = row.get("messages")
    if "messages" not in row:
        problems.append(f"{where}, field `messages`: is missing")
        return None
    if not isinstance(messages, list) or not messages:
        what = (
            "is empty" if isinstance(messages, list) else f"must be a list of {{role, content}}, got {_kind(messages)}"
        )
        problems.append(f"{where}, field `messages`: {what}")
        return None
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            problems.append(
                f"{where}, field `messages[{i}]`: must be an object {{role, content}}, got {_kind(message)}"
            )
            continue
        role, content = message.get("role"), message.get("content")
        for name, value in (("role", role), ("content", content)):
            if name not in message:
                problems.append(f"{where}, field `messages[{i}].{name}`: is missing")
            elif not isinstance(value, str):
                problems.append(f"{where}, field `messages[{i}].{name}`: must be a string, got {_kind(value)}")
        out.append((role, content))
    if len(problems) == before and not any(role == "assistant" for role, _ in out):
        problems.append(f"{where}, field `messages`: has no message with role 'assistant' (no token to train on)")
    return tuple(out) if len(problems) == before else None


def _rows(path: str, problems: list[str]) -> Iterator[tuple[int, Any]]:
    """(1-based row, decoded value) of every row; a line that is not JSON is a problem, and reading goes on."""
    if path.lower().endswith(".parquet"):
        yield from _parquet_rows(path)
        return
    with _open_regular(path) as handle:
        try:
            yield from _jsonl_lines(handle, problems)
        except OSError as err:
            raise DataError(f"cannot read data file {path}: {err.strerror or err}", "check the file") from None


def _jsonl_lines(handle, problems: list[str]) -> Iterator[tuple[int, Any]]:
    for number, line in enumerate(iter(lambda: handle.readline(MAX_ROW_BYTES + 1), b""), 1):
        if len(line) > MAX_ROW_BYTES:
            while line and not line.endswith(b"\n"):  # skip the rest of the line, unread
                line = handle.readline(1 << 20)
            problems.append(f"line {number}: is longer than {MAX_ROW_BYTES:,} bytes")
            continue
        try:
            text = line.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as err:
            problems.append(f"line {number}: is not UTF-8 text (byte {err.start})")
            continue
        if not text.strip():
            continue  # a blank line (a trailing newline, a separator) holds no row
        try:  # the bounded parser: a 5,000-digit integer or deep nesting is this line's problem, in any field
            value = jsonfile.parse(text, f"line {number}")
        except jsonfile.BadJson as err:
            problems.append(f"line {number}: is not JSON ({err.why}): {echo(text.strip()[:80])}")
            continue
        yield number, value


def _parquet_rows(path: str) -> Iterator[tuple[int, Any]]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(
            f"reading the parquet file {path} needs pyarrow, which is not installed here",
            "pip install pyarrow, or convert the file to JSON lines (.jsonl)",
        ) from None
    _open_regular(path).close()
    number = 0
    try:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                number += 1
                yield number, row
    except (pa.ArrowException, OSError) as err:
        raise DataError(
            f"data file {path} is not a readable parquet file (after {number} rows: {err})",
            "check that it is a complete parquet file, or convert it to JSON lines (.jsonl)",
        ) from None


def _check_parquet_magic(path: str) -> None:
    with _open_regular(path) as handle:
        head = handle.read(4)
        size = os.fstat(handle.fileno()).st_size
        handle.seek(max(size - 4, 0))
        tail = handle.read(4)
    if head != PARQUET_MAGIC or tail != PARQUET_MAGIC or size < 12:
        raise DataError(
            f"data file {path} is not a parquet file (it does not start and end with {PARQUET_MAGIC!r})",
            "check the file, or convert it to JSON lines (.jsonl)",
        )


def _open_regular(path: str):
    """``path`` opened for binary reading; DataError for a missing, unreadable or not regular file (a FIFO is
    refused, never waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise DataError(f"data file {path} does not exist", "check data.path (an absolute path)") from None
    except (OSError, ValueError) as err:  # ValueError: a NUL in the path
        raise DataError(
            f"cannot read data file {path}: {getattr(err, 'strerror', None) or err}", "check the path's permissions"
        ) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise DataError(f"data file {path} is {file_kind(mode)}, not a regular file", "point data.path at a file")
    return os.fdopen(fd, "rb")


def _kind(value: Any) -> str:
    """A JSON value's type in JSON's words, with the value itself for scalars."""
    if value is None:
        return "null"
    for tp, name in (
        (bool, "a boolean"),
        (int, "a number"),
        (float, "a number"),
        (list, "a list"),
        (dict, "an object"),
    ):
        if isinstance(value, tp):
            return f"{name} {echo(value, 40)}" if tp in (bool, int, float) else name
    return f"a {type(value).__name__}"
