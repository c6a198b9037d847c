"""Load a layout: YAML (OmegaConf) + dotlist overrides -> plain dict -> frozen LayoutSpec.

OmegaConf stops here: nothing past this module sees a DictConfig. Every problem is collected, not just the first.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
import types
import typing
from dataclasses import MISSING as DC_MISSING
from dataclasses import asdict, fields, is_dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Sequence, Union

from specdraft.errors import MAX_LISTED_PROBLEMS, MISSING, Problem, SpecError
from specdraft.spec import bounds
from specdraft.spec.bounds import MAX_LAYOUT_BYTES
from specdraft.spec.schema import LayoutSpec

DEFAULT_LAYOUT = "tiny-cpu"


def builtin_layout_text(name: str = DEFAULT_LAYOUT) -> str:
    """The YAML text of a layout shipped inside the package (layouts/)."""
    return resources.files("specdraft.layouts").joinpath(f"{name}.yaml").read_text(encoding="utf-8")


def load_layout(path: str | Path | None, overrides: Sequence[str] = ()) -> LayoutSpec:
    """Load ``path`` (None = the built-in default layout), apply dotlist ``overrides``, build the spec."""
    source = str(path) if path is not None else f"<built-in {DEFAULT_LAYOUT}>"
    shipped = shipped_layout_name(path)
    if shipped is not None:
        text = builtin_layout_text(shipped)
    else:
        text = _read_layout(Path(path))  # type: ignore[arg-type]  # None is always shipped
    return load_layout_text(text, overrides, source=source)


def shipped_layouts() -> list[str]:
    """The names of the layouts shipped inside the package, sorted."""
    return sorted(
        p.name[: -len(".yaml")] for p in resources.files("specdraft.layouts").iterdir() if p.name.endswith(".yaml")
    )


def shipped_layout_name(path: str | Path | None) -> str | None:
    """The shipped layout ``path`` names, or None for a file of the user's. A path that exists is always the
    user's file; otherwise `NAME`, `NAME.yaml` and `layouts/NAME.yaml` name a shipped layout, from any folder."""
    if path is None:
        return DEFAULT_LAYOUT
    text = str(path)
    if Path(text).exists():
        return None
    name = text[len("layouts/") :] if text.startswith("layouts/") else text
    name = name[: -len(".yaml")] if name.endswith(".yaml") else name
    return name if name in shipped_layouts() else None


def _read_layout(file: Path) -> str:
    """A layout file's text: a regular file (a FIFO or device is refused, not read) of bounded size, UTF-8."""
    from specdraft.fsutil import read_regular_file

    data = read_regular_file(file, MAX_LAYOUT_BYTES, "layout file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpecError(
            [
                Problem(
                    path="<file>",
                    value=f"byte {err.start}: {data[err.start : err.start + 4]!r}",
                    rule="the layout is not UTF-8 text",
                    fix="save the file as UTF-8",
                )
            ],
            str(file),
        ) from None


def load_layout_text(text: str, overrides: Sequence[str] = (), source: str = "<text>") -> LayoutSpec:
    """Parse YAML text plus dotlist overrides into a LayoutSpec, reporting every problem at once."""
    from specdraft.spec.checkpoints import draft as draft_checkpoint
    from specdraft.spec.checkpoints import hf_config
    from specdraft.spec.source.text import to_plain_dict

    data = to_plain_dict(text, overrides, source)
    hf = hf_config.read(data, source)  # model.path's config.json, when it is a local folder
    given = hf_config.fill(data, hf, source) if hf is not None else set()
    draft_checkpoint.fill(data)  # draft.norm_output from draft.path's config.json, unless the layout says it
    stood_in: list[str] = []
    spec, problems = build(LayoutSpec, data, "", stood_in)
    if hf is not None and spec is not None:
        problems += hf_config.disagreements(spec.model, hf, given)
    if spec is not None and (spec.draft.path is not None or spec.draft.model is not None):
        problems += draft_checkpoint.problems(spec)  # the EAGLE-3 checkpoint the draft starts from
        problems += draft_checkpoint.model_problems(spec)  # and the one the renders hand to vLLM
    if problems:
        if spec is not None:
            # Run the field rules on what did load, so one pass reports everything, except the rules that read a
            # field whose default stood in for a bad value: their verdict would be about a value nobody wrote.
            from specdraft.spec.validate import validate_fields

            problems += [q for q in validate_fields(spec)[0] if not any(_reads(q, f) for f in stood_in)]
        raise SpecError(problems, source)
    return spec


def _reads(problem: Problem, field_path: str) -> bool:
    """Whether ``problem`` is about the field at ``field_path`` (or inside it) or names it in its rule or fix: by
    its full path anywhere, by its bare name in a rule of the same section (`train_iters` in a training rule)."""
    if problem.path == field_path or problem.path.startswith((f"{field_path}.", f"{field_path}[")):
        return True
    text = f"{problem.rule} {problem.fix}"
    if field_path in text:
        return True
    section, _, name = field_path.rpartition(".")
    in_section = bool(section) and (problem.path == section or problem.path.startswith(f"{section}."))
    return in_section and re.search(rf"\b{re.escape(name)}\b", text) is not None


def spec_from_dict(data: dict) -> LayoutSpec:
    """Rebuild a LayoutSpec from its dict form (e.g. the `spec` section of a plan.json)."""
    spec, problems = build(LayoutSpec, data, "")
    if problems:
        raise SpecError(problems, "plan.json spec")
    return spec


def spec_to_dict(spec: LayoutSpec) -> dict:
    """The spec as plain JSON-able data, field order preserved."""
    return asdict(spec)


def spec_sha256(spec: LayoutSpec) -> str:
    """sha256 of the canonical JSON of the resolved spec: equal layouts hash equal, whatever the YAML looked like."""
    canonical = json.dumps(spec_to_dict(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def build(cls: type, data: Any, path: str, stood_in: list[str] | None = None) -> tuple[Any, list[Problem]]:
    """Build dataclass ``cls`` from plain ``data``; return (instance or None, every problem found).

    A bad or unknown field is reported and, where the field has a default, the default stands in, so the
    remaining rules can still run and every problem is reported in one pass; ``stood_in`` collects the paths of
    those fields.
    """
    if not isinstance(data, dict):
        return None, [
            Problem(
                path=path or "<root>",
                value=data,
                rule=f"must be a mapping of {cls.__name__} fields",
                fix="write it as `key: value` lines",
            )
        ]
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    problems: list[Problem] = []
    values: dict[str, Any] = {}
    complete = True
    for key, raw in data.items():
        sub = f"{path}.{key}" if path else str(key)
        if key not in known:
            # difflib is quadratic in the key's length (a long key is no typo of a field name anyway), and only
            # the first problems are listed, so thousands of unknown keys get no suggestion past those.
            suggest = len(str(key)) <= 64 and len(problems) < MAX_LISTED_PROBLEMS
            close = difflib.get_close_matches(str(key), list(known), n=3) if suggest else []
            hint = (
                f"did you mean {' or '.join(f'`{_join(path, c)}`' for c in close)}?"
                if close
                else f"known fields: {', '.join(known)}"
            )
            problems.append(Problem(path=sub, value=raw, rule="unknown field", fix=hint))
            continue
        value, errs = _convert(hints[key], raw, sub, stood_in)
        problems += errs
        if value is not None or not errs:
            values[key] = value
        elif not _has_default(known[key]):
            complete = False
        elif stood_in is not None:
            stood_in.append(sub)
    for name, f in known.items():
        if name not in data and not _has_default(f):
            complete = False
            problems.append(
                Problem(
                    path=_join(path, name),
                    value=MISSING,
                    rule="is required",
                    fix=f"set `{_join(path, name)}` in the layout (`specdraft explain {_join(path, name)}`)",
                )
            )
    return (cls(**values) if complete else None), problems


def _has_default(f) -> bool:
    return f.default is not DC_MISSING or f.default_factory is not DC_MISSING


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _convert(tp: Any, raw: Any, path: str, stood_in: list[str] | None = None) -> tuple[Any, list[Problem]]:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if is_dataclass(tp):
        return build(tp, raw, path, stood_in)
    if origin in (Union, types.UnionType):
        if raw is None and type(None) in args:
            return None, []
        options = [a for a in args if a is not type(None)]
        for option in options:
            value, errs = _convert(option, raw, path)
            if not errs:
                return value, []
        if len(options) == 1:
            return _convert(options[0], raw, path)
        numeric = [o for o in options if o in (int, float)]
        if numeric and isinstance(raw, (int, float)) and not isinstance(raw, bool):
            return _convert(numeric[0], raw, path)  # a number out of bounds: say which bound, not "must be X or Y"
        return None, [Problem(path=path, value=raw, rule=f"must be {_describe(tp)}", fix=f"use {_describe(tp)}")]
    if origin is Literal:
        if raw in args:
            return raw, []
        close = difflib.get_close_matches(str(raw), [str(a) for a in args], n=1)
        fix = f"did you mean {close[0]!r}?" if close else f"use one of {', '.join(map(repr, args))}"
        return None, [Problem(path=path, value=raw, rule=f"must be one of {', '.join(map(repr, args))}", fix=fix)]
    if origin is list:
        if not isinstance(raw, list):
            return None, [
                Problem(path=path, value=raw, rule=f"must be a list ({_describe(tp)})", fix="write it as [a, b, ...]")
            ]
        too_long = bounds.list_problem(path, raw)
        if too_long:
            return None, [too_long]
        out, problems = [], []
        for i, item in enumerate(raw):
            value, errs = _convert(args[0], item, f"{path}[{i}]")
            out.append(value)
            problems += errs
        # A list with a bad item is no list of that type: the field's default stands in for the other rules.
        return (None if problems else out), problems
    if origin is dict:
        if not isinstance(raw, dict):
            return None, [Problem(path=path, value=raw, rule="must be a mapping", fix="write it as `KEY: value` lines")]
        out, problems = {}, []
        for key, item in raw.items():
            value, errs = _convert(args[1], item, f"{path}.{key}")
            out[str(key)] = value
            problems += errs
        return (None if problems else out), problems
    return _scalar(tp, raw, path)


def _scalar(tp: type, raw: Any, path: str) -> tuple[Any, list[Problem]]:
    """Convert one value and apply its bounds (spec.bounds): a bad value is reported and None returned."""
    value = _scalar_value(tp, raw)
    if value is _BAD:
        return None, [
            Problem(
                path=path,
                value=raw,
                rule=f"must be {_describe(tp)}, got {type(raw).__name__}",
                fix=f"write {_describe(tp)} (YAML quotes make a string)" if tp is not str else "quote it",
            )
        ]
    if isinstance(value, bool):
        return value, []
    if isinstance(value, int):
        problem = bounds.int_problem(path, value, raw)
    elif isinstance(value, float):
        problem = bounds.float_problem(path, value)
    else:
        problem = bounds.string_problem(path, value)
    return (None, [problem]) if problem else (value, [])


_BAD = object()


def _scalar_value(tp: type, raw: Any) -> Any:
    number = isinstance(raw, (int, float)) and not isinstance(raw, bool)
    if tp is bool and isinstance(raw, bool):
        return raw
    if tp is int and number and (isinstance(raw, int) or raw.is_integer()):
        return int(raw)  # an integral float (1e3) counts; its bound is checked on the int
    if tp is float and number:
        try:
            return float(raw)
        except OverflowError:  # an int beyond the float range is as unusable as inf
            return math.inf
    if tp is str:
        # Numbers are accepted where text is expected (`time: 60`, `env: {OMP_NUM_THREADS: 4}`).
        if isinstance(raw, str):
            return raw
        if number:
            return str(raw)
    return _BAD


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _describe(a) for a in args)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin is list:
        return f"list of {_describe(args[0])}"
    if origin is dict:
        return f"mapping of {_describe(args[0])} to {_describe(args[1])}"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )
