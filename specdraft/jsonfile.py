"""JSON that specdraft reads from files (run files, model and draft folders, data rows): one bounded parser and a
check of the shape its reader expects, so a hostile file is one message naming the file and the field, never a
ValueError, RecursionError or TypeError from deep inside a reader."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from specdraft.errors import UserError, echo

MAX_INT_DIGITS = 40  # every integer specdraft reads is a count, an id, a size, an offset or a time: far below 10**40
MAX_DEPTH = 64  # the deepest file specdraft reads (plan.json) nests about 8 levels


class BadJson(UserError):
    """A JSON file (or line) that is not what its reader expects: not JSON, a number no such file holds, nested
    too deeply, or a field of the wrong type. ``why`` is the reason alone, for a reader that words its own message."""

    def __init__(self, message: str, fix: str = "", why: str = ""):
        super().__init__(message, fix)
        self.why = why or message


class _Refused:
    """A number no file specdraft reads holds, kept in place while parsing so the walk after it can name its field."""

    def __init__(self, why: str):
        self.why = why


def _int(text: str) -> Any:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        return _Refused(f"an integer of {digits:,} digits (at most {MAX_INT_DIGITS} are read)")
    return int(text)


def _float(text: str) -> Any:
    value = float(text)
    return value if math.isfinite(value) else _Refused(f"the number {text[:40]}, which overflows to infinity")


def _constant(name: str) -> Any:
    return _Refused(f"{name}, which is not a JSON number")


def _field(path: tuple) -> str:
    shown = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path[:12]).lstrip(".")
    return (shown + ("..." if len(path) > 12 else "")) or "(the whole file)"


def _walk(value: Any) -> tuple[int, str | None]:
    """(how deeply ``value`` nests: a scalar is 0, [] is 1; what is refused in it and where, or None), walked
    without recursion; it stops at the first refused number or the first level past MAX_DEPTH."""
    deepest = 0
    todo: list[tuple[Any, tuple]] = [(value, ())]
    while todo:
        item, path = todo.pop()
        if isinstance(item, _Refused):
            return deepest, f"`{_field(path)}` is {item.why}"
        pairs = item.items() if isinstance(item, dict) else enumerate(item) if isinstance(item, list) else None
        if pairs is None:
            continue
        deepest = max(deepest, len(path) + 1)
        if deepest > MAX_DEPTH:
            return deepest, f"`{_field(path)}` nests more than {MAX_DEPTH} levels deep"
        todo.extend((v, (*path, k)) for k, v in reversed(list(pairs)))
    return deepest, None


def _clean(value: Any) -> bool:
    """Nothing refused in ``value`` and no deeper than MAX_DEPTH: the fast walk (no paths) that every file takes;
    only a file that fails it is walked again by _walk, for the message."""
    if isinstance(value, _Refused):
        return False
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        item, level = stack.pop()
        if level > MAX_DEPTH:
            return False
        for v in item.values() if type(item) is dict else item:
            kind = type(v)
            if kind is dict or kind is list:
                stack.append((v, level + 1))
            elif kind is _Refused:
                return False
    return True


def depth(value: Any) -> int:
    """How deeply ``value`` nests (a scalar is 0, [] is 1)."""
    return _walk(value)[0]


def parse(text: str | bytes, source: str, fix: str = "", *, error: type[UserError] = BadJson) -> Any:
    """``text`` as JSON, the one parser of every file specdraft reads. Anything json.loads refuses, an integer
    past MAX_INT_DIGITS digits, a float that overflows to inf, NaN/Infinity, bytes that are not UTF-8 and nesting
    past MAX_DEPTH levels are one ``error`` naming ``source`` (and the field, where there is one), never a
    ValueError or RecursionError."""
    try:
        value = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except (ValueError, RecursionError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        why = "nested too deeply" if isinstance(err, RecursionError) else str(err)[:160]
        raise _error(error, f"{source} is not valid JSON: {why}", fix, why) from None
    refused = None if _clean(value) else _walk(value)[1]
    if refused is not None:
        raise _error(error, f"{source} is not valid JSON: {refused}", fix, refused)
    return value


def _error(error: type[UserError], message: str, fix: str, why: str) -> UserError:
    made = error(message, fix or "restore the file")
    made.why = why  # type: ignore[attr-defined]  # every BadJson has it; another UserError gets it here
    return made


# --------------------------------------------------------------------------------------------------- shapes
# A shape says what a reader expects where: a Python type (or tuple of types; bool never counts as a number),
# Opt(shape) for a value that may also be null, ListOf(shape), Obj({key: shape}, values=shape, required=keys) for an
# object whose named keys (when present) and other values have those shapes, or ANY. Absent keys are the reader's
# to default, unless required.
ANY = object


@dataclass(frozen=True)
class Opt:
    shape: Any


@dataclass(frozen=True)
class ListOf:
    item: Any = ANY
    min_len: int = 0


@dataclass(frozen=True)
class Obj:
    keys: dict[str, Any] = field(default_factory=dict)
    values: Any = ANY
    required: tuple[str, ...] = ()  # keys that must be there (the others may be absent)


@dataclass(frozen=True)
class OneOf:
    shapes: tuple


_NAMES = {
    dict: "an object",
    list: "a list",
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
}


def kind(value: Any) -> str:
    """A JSON value's type in JSON's words, with a short echo of a scalar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    for tp in (int, float, str):
        if isinstance(value, tp):
            return f"{_NAMES[tp]} {echo(value, 40)}"
    return _NAMES.get(type(value), type(value).__name__)


def _wants(shape: Any) -> str:
    if isinstance(shape, Opt):
        return f"{_wants(shape.shape)} or null"
    if isinstance(shape, ListOf):
        return "a list" if shape.item is ANY else f"a list ({_wants(shape.item)} each)"
    if isinstance(shape, Obj):
        return "an object"
    if isinstance(shape, OneOf):
        return " or ".join(_wants(s) for s in shape.shapes)
    if isinstance(shape, tuple):
        return " or ".join(_wants(s) for s in shape)
    if shape is float:
        return "a number"
    return _NAMES.get(shape, getattr(shape, "__name__", str(shape)))


def _fits(value: Any, tp: Any) -> bool:
    if tp is ANY:
        return True
    if isinstance(tp, tuple):
        return any(_fits(value, t) for t in tp)
    if isinstance(value, bool):
        return tp is bool
    if tp is float:
        return isinstance(value, (int, float))
    return isinstance(value, tp)


def fits(value: Any, shape: Any) -> bool:
    """Whether ``value`` has ``shape``: the fast check without messages (recursive: parse bounds the depth)."""
    if shape is ANY:
        return True
    if isinstance(shape, Opt):
        return value is None or fits(value, shape.shape)
    if isinstance(shape, OneOf):
        return any(fits(value, s) for s in shape.shapes)
    if isinstance(shape, ListOf):
        if type(value) is not list or len(value) < shape.min_len:
            return False
        return shape.item is ANY or all(fits(v, shape.item) for v in value)
    if isinstance(shape, Obj):
        if type(value) is not dict:
            return False
        keys, rest = shape.keys, shape.values
        return all(k in value for k in shape.required) and all(fits(v, keys.get(k, rest)) for k, v in value.items())
    return _fits(value, shape)


def problems(value: Any, shape: Any, path: str = "") -> list[str]:
    """Every place ``value`` does not have ``shape``, as "`field.path` is <what it is>: must be <what fits>"."""
    if fits(value, shape):
        return []
    out: list[str] = []
    todo = [(value, shape, path)]
    while todo:
        item, want, where = todo.pop()
        if want is ANY:
            continue
        if isinstance(want, Opt):
            if item is not None:
                todo.append((item, want.shape, where))
            continue
        if isinstance(want, OneOf):
            if not any(not problems(item, s, where) for s in want.shapes):
                out.append(f"`{where or '(the whole file)'}` is {kind(item)}: must be {_wants(want)}")
            continue
        name = where or "(the whole file)"
        if isinstance(want, ListOf):
            if not isinstance(item, list) or len(item) < want.min_len:
                short = isinstance(item, list)
                what = f"a list of {len(item)} item(s)" if short else kind(item)
                least = f" with at least {want.min_len} item(s)" if short else ""
                out.append(f"`{name}` is {what}: must be {_wants(want)}{least}")
                continue
            todo.extend((x, want.item, f"{where}[{i}]") for i, x in reversed(list(enumerate(item))))
            continue
        if isinstance(want, Obj):
            if not isinstance(item, dict):
                out.append(f"`{name}` is {kind(item)}: must be an object")
                continue
            for key in want.required:
                if key not in item:
                    out.append(f"`{where}.{key}` is missing" if where else f"`{key}` is missing")
            for key, sub in reversed(list(item.items())):
                inner = want.keys.get(key, want.values)
                todo.append((sub, inner, f"{where}.{key}" if where else key))
            continue
        if not _fits(item, want):
            out.append(f"`{name}` is {kind(item)}: must be {_wants(want)}")
    return out


def expect(value: Any, shape: Any, source: str, fix: str = "", *, error: type[UserError] = BadJson) -> Any:
    """``value`` when it has ``shape``; else one ``error`` naming ``source`` and every field that does not fit."""
    found = problems(value, shape)
    if found:
        listed = "; ".join(found[:10]) + (f" (and {len(found) - 10} more)" if len(found) > 10 else "")
        raise _error(error, f"{source}: {listed}", fix, listed)
    return value


def load(text: str | bytes, source: str, shape: Any, fix: str = "", *, error: type[UserError] = BadJson) -> Any:
    """parse() then expect(): the bounded parse and the type check of the shape the reader expects."""
    return expect(parse(text, source, fix, error=error), shape, source, fix, error=error)
