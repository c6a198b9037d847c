"""Field documentation for `specdraft explain`: each field's attribute docstring, type and default.

The docstrings live under the fields in schema.py and rl.py (the RL sections); they are read from the source with
`ast`, so the schema stays the single place that documents itself.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import typing
from dataclasses import MISSING, dataclass, fields, is_dataclass
from functools import lru_cache

from specdraft.errors import UserError
from specdraft.spec import rl, schema
from specdraft.spec.bounds import bounds_table
from specdraft.spec.load import _describe


@dataclass(frozen=True, kw_only=True)
class FieldDoc:
    path: str
    type: str
    default: str
    doc: str
    section: bool


@lru_cache(maxsize=1)
def _docstrings() -> dict[tuple[str, str], str]:
    """(class name, field name) -> the string literal that follows the field in schema.py or rl.py."""
    nodes = [node for module in (schema, rl) for node in ast.parse(inspect.getsource(module)).body]
    out = {}
    for node in nodes:
        if not isinstance(node, ast.ClassDef):
            continue
        body = node.body
        for i, stmt in enumerate(body[:-1]):
            nxt = body[i + 1]
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                out[(node.name, stmt.target.id)] = inspect.cleandoc(nxt.value.value)
    return out


def all_fields(cls: type = schema.LayoutSpec, prefix: str = "") -> list[FieldDoc]:
    """Every field of the layout, sections first then their fields, in schema order."""
    docs = _docstrings()
    hints = typing.get_type_hints(cls)
    out = []
    for f in fields(cls):
        path = f"{prefix}{f.name}"
        tp = hints[f.name]
        if f.default is not MISSING:
            default = "null" if f.default is None else repr(f.default)
        elif f.default_factory is not MISSING:
            value = f.default_factory()
            default = "(section)" if is_dataclass(value) else repr(value)
        else:
            default = "(required)"
        doc = docs.get((cls.__name__, f.name), "")
        section = is_dataclass(tp)
        out.append(
            FieldDoc(
                path=path, type=tp.__name__ if section else _describe(tp), default=default, doc=doc, section=section
            )
        )
        if section:
            out += all_fields(tp, f"{path}.")
        elif (inner := _optional_dataclass(tp)) is not None:
            out += all_fields(inner, f"{path}.")  # e.g. model.rope_scaling.factor, documented under its field
    return out


def _optional_dataclass(tp) -> type | None:
    """The dataclass of an `Optional[SomeDataclass]` field (a value that may be null), else None."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if len(args) == 1 and isinstance(args[0], type) and is_dataclass(args[0]) and type(None) in typing.get_args(tp):
        return args[0]
    return None


def explain(path: str) -> list[FieldDoc]:
    """The docs of ``path``; a section path returns the section and all its fields."""
    everything = all_fields()
    exact = [f for f in everything if f.path == path or f.path.startswith(path + ".")]
    if exact:
        return exact
    close = difflib.get_close_matches(path, [f.path for f in everything], n=3)
    raise UserError(
        f"no layout field named {path!r}",
        f"did you mean {', '.join(close)}?" if close else "run `specdraft explain` to list every field",
    )


def markdown_reference() -> str:
    """The whole schema as Markdown tables (docs/spec.md is this text; a test keeps it current)."""
    lines = [
        "# Layout spec reference",
        "",
        "Generated from the field docstrings in `specdraft/spec/schema.py` (`specdraft explain FIELD` prints the "
        "same). Fields marked `(required)` have no default.",
        "",
        "**Interpolation.** A value may hold one plain reference to another single value, e.g. "
        "`draft.model: ${name}-eagle3` or `draft.lr: ${training.lr}`; it sees what the file and the overrides "
        "set, not the schema's defaults. Resolvers (`${oc.env:VAR}`, "
        "`${oc.decode:...}`, any `${name:...}`) are refused: they would copy the environment into plan.json "
        "and the job scripts. So are references to a whole section or list, two references in one value, "
        "and OmegaConf's missing marker `???` (which an override would otherwise silently ignore).",
        "",
        "**Bounds.** Every value has a documented bound (the [table at the end](#bounds)); `validate`, `plan` "
        "and the rollout commands refuse the same values with exit 2, so every command does bounded work.",
        "",
    ]
    for doc in all_fields():
        if doc.section:
            lines += [
                "",
                f"## `{doc.path}`",
                "",
                doc.doc,
                "",
                "| field | type | default | meaning |",
                "|---|---|---|---|",
            ]
        elif "." not in doc.path:
            lines += [f"- `{doc.path}` ({doc.type}, {doc.default}): {doc.doc}"]
        else:
            cells = [f"`{doc.path.split('.', 1)[1]}`", doc.type, f"`{doc.default}`", doc.doc]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += [
        "",
        "## Bounds",
        "",
        "From `specdraft/spec/bounds.py`; integer fields not listed have the last row's "
        "range. A bound below which a field's own rule already applies (e.g. `parallel.tp` >= 1) is that rule's.",
        "",
        "| what | bound |",
        "|---|---|",
    ]
    lines += [f"| {what} | {bound} |" for what, bound in bounds_table()]
    return "\n".join(lines) + "\n"
