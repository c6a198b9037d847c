"""What the typer apps share: their settings, and the positional `[LAYOUT | PLAN.json] [OVERRIDES...]`."""

from __future__ import annotations

import typer

from specdraft.errors import UserError


def typer_app(name: str, help: str) -> typer.Typer:
    """A typer app whose errors reach cli.boundary untouched (no pretty tracebacks, no rich markup)."""
    return typer.Typer(
        name=name,
        help=help,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )


def target_args(default_layout: str):
    """The `[LAYOUT] [OVERRIDES...]` argument; ``default_layout`` says what runs without a LAYOUT."""
    return typer.Argument(
        None,
        metavar="[LAYOUT] [OVERRIDES...]",
        help=f"Layout YAML (default: {default_layout}), then KEY=VALUE overrides.",
    )


def split_target(args: list[str] | None) -> tuple[str | None, list[str]]:
    """The first argument without '=' is the layout (or plan) path; the rest are dotlist overrides."""
    args = list(args or [])
    if args and "=" not in args[0]:
        path, overrides = args[0], args[1:]
    else:
        path, overrides = None, args
    strays = [a for a in overrides if "=" not in a]
    if strays:
        raise UserError(
            f"expected KEY=VALUE overrides after the layout, got {' '.join(strays)!r}",
            "give at most one layout path, then overrides such as parallel.cp=4",
        )
    return path, overrides


def note_model_folder(path: str | None) -> None:
    """On stderr: a model.path folder with a config.json and no weights is taken, with a note saying so."""
    from specdraft.cli.boundary import console
    from specdraft.spec.checkpoints.hf_config import weights_note

    note = weights_note(path)
    if note:
        console(stderr=True).print(f"note: {note}", markup=False)


def load_plan(args: list[str] | None, balance: bool = False, notes: bool = True):
    """Compile a layout (or read and verify a plan.json) named by ``args``; returns (plan, suggestion). With
    ``notes``, what deserves a word about the model folder goes to stderr."""
    from specdraft.assemble import compile, read_plan
    from specdraft.plan.balance import apply_balance, suggest_balance
    from specdraft.spec.load import load_layout

    path, overrides = split_target(args)
    if path is not None and path.endswith(".json"):
        if overrides:
            raise UserError(
                "overrides apply to a layout, not to a compiled plan.json",
                "pass the layout YAML with the overrides, or drop them",
            )
        plan = read_plan(path)
        if notes:
            note_model_folder(plan.model.path)
        return plan, None
    spec = load_layout(path, overrides)
    if notes:
        note_model_folder(spec.model.path)
    suggestion = suggest_balance(spec)
    if balance and suggestion:
        spec = apply_balance(spec, suggestion)
    return compile(spec), suggestion
