"""JSON <-> frozen dataclasses for the plan contract: strict decoding (every field, right type) and fast encoding.

Decoding names the exact path of the first field that is missing, unknown or of the wrong type, so a hand-edited or
truncated plan.json is refused with a message, not a KeyError on some rank after the allocation is granted.
"""

from __future__ import annotations

import json
import math
import types
import typing
from dataclasses import fields, is_dataclass
from functools import cache
from typing import Any, Callable, Union

_COMPACT = json.JSONEncoder(separators=(", ", ": "), ensure_ascii=True).encode


class PlanFormatError(ValueError):
    """plan.json is not a plan this specdraft can read."""


def encode_value(value: Any) -> Any:
    """Plain JSON data of a dataclass tree, in field order; tuples become lists."""
    if is_dataclass(value):
        return {f.name: encode_value(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, (list, tuple)):
        return [encode_value(v) for v in value]
    if isinstance(value, dict):
        return {k: encode_value(v) for k, v in value.items()}
    return value


def encode_rows(rows: tuple) -> str:
    """A list of flat row dataclasses, one compact JSON object per line, in one C-encoder call.

    Rows hold only numbers, booleans and plain names, so "}, {" occurs exactly between rows.
    """
    body = _COMPACT([vars(r) for r in rows])
    return "[\n  " + body[1:-1].replace("}, {", "},\n  {") + "\n ]"


@cache
def _hints(cls: type) -> tuple[tuple[str, Any], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in fields(cls))


def decode(tp: Any, data: Any, path: str, *, spec_decoder: Callable[[Any, str], Any]) -> Any:
    """Build ``tp`` from JSON ``data``; raise PlanFormatError naming ``path`` on the first mismatch."""
    from specdraft.spec.schema import LayoutSpec

    if tp is LayoutSpec:
        return spec_decoder(data, path)
    if is_dataclass(tp):
        if not isinstance(data, dict):
            raise PlanFormatError(f"{path or 'plan'}: expected an object, got {_kind(data)}")
        hints = _hints(tp)
        names = {name for name, _ in hints}
        unknown = sorted(set(data) - names)
        missing = [name for name, _ in hints if name not in data]
        if missing or unknown:
            what = (
                (f"missing {', '.join(missing)}" if missing else "")
                + ("; " if missing and unknown else "")
                + (f"unknown {', '.join(map(str, unknown))[:200]}" if unknown else "")
            )
            raise PlanFormatError(f"{path or 'plan'}: {what}")
        return tp(
            **{name: decode(hint, data[name], _join(path, name), spec_decoder=spec_decoder) for name, hint in hints}
        )
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return decode(option, data, path, spec_decoder=spec_decoder)
            except PlanFormatError:
                continue
        raise PlanFormatError(f"{path}: expected {_name(tp)}, got {_kind(data)}")
    if origin is tuple:
        if not isinstance(data, list):
            raise PlanFormatError(f"{path}: expected a list, got {_kind(data)}")
        if len(args) == 2 and args[1] is Ellipsis:  # tuple[X, ...]
            items = [args[0]] * len(data)
        elif len(args) != len(data):  # a fixed tuple, e.g. tuple[int, tuple[float, ...]]
            raise PlanFormatError(f"{path}: expected {len(args)} items, got {len(data)}")
        else:
            items = list(args)
        return tuple(
            decode(item, v, f"{path}[{i}]", spec_decoder=spec_decoder) for i, (item, v) in enumerate(zip(items, data))
        )
    if tp is dict or origin is dict:
        if not isinstance(data, dict):
            raise PlanFormatError(f"{path}: expected an object, got {_kind(data)}")
        return data
    if tp is Any:
        return data
    if tp is bool:
        if isinstance(data, bool):
            return data
    elif tp is int:
        if isinstance(data, int) and not isinstance(data, bool):
            return data
    elif tp is float:
        if isinstance(data, (int, float)) and not isinstance(data, bool) and math.isfinite(data):
            return float(data)
    elif tp is str:
        if isinstance(data, str):
            return data
    raise PlanFormatError(f"{path}: expected {_name(tp)}, got {_kind(data)}")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _kind(data: Any) -> str:
    text = json.dumps(data)[:40] if isinstance(data, (int, float, str, bool)) or data is None else ""
    return f"{type(data).__name__} {text}".strip()


def _name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
