"""What the rollout commands (cli/rollout.py, cli/rollout_simulate.py) share: the LAYOUT argument and its spec,
the --format and output-path checks, and the rich table they all draw."""

from __future__ import annotations

from typing import Optional

from specdraft.cli.args import target_args

TargetArgs = target_args("the built-in qwen3-8b rollout layout")


def spec_from_args(args):
    """The rollout layout the command's LAYOUT [OVERRIDES...] arguments name (the built-in one by default)."""
    from specdraft.cli.args import split_target
    from specdraft.rollout.report.overview import load

    path, overrides = split_target(args)
    return load(path, overrides)


def check_output(path: Optional[str], option: str, stdout_ok: bool = False) -> None:
    """Refuse a non-regular-file target before any work is done (the write itself checks again)."""
    if path is None:
        return
    from specdraft.errors import UserError
    from specdraft.fsutil import STDOUT, check_output_path

    if path == STDOUT and not stdout_ok:
        raise UserError(f"{option} writes a PNG image, not text for standard output", f"give {option} a file name")
    if path != STDOUT:
        check_output_path(path, option)


def check_format(value: str) -> None:
    """--format must be text or json."""
    from specdraft.errors import UserError

    if value not in ("text", "json"):
        raise UserError(f"--format {value!r} is not supported", "use --format text or --format json")


def new_table(title: str, columns: list[str], right: bool = True):
    from rich.table import Table

    table = Table(title=title)
    for i, col in enumerate(columns):
        table.add_column(col, justify="right" if right and i else "left")
    return table
