"""Hypothesis strategies for hostile JSON files: random JSON values, and a good file mutated (a field replaced or
deleted, cut short, a byte changed, or one of the raw inputs a red team tries: a 5,000-digit integer, 100,000-deep
nesting, NaN, bytes that are not UTF-8)."""

from __future__ import annotations

import json

from hypothesis import strategies as st

TOKENS = [
    "",
    "0" * 64,
    "../x",
    "/etc/passwd",
    ".metadata",
    "step-4",
    "COMPLETED",
    "RUNNING",
    "local",
    "local-1",
    "\x1b[2J",
]
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 2, 4, 10**30]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(TOKENS),
)
values = st.recursive(
    leaves,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8) | st.sampled_from(TOKENS), kids, max_size=4)
    ),
    max_leaves=10,
)
RAW = [b"1" * 5000, b"1e400", b"NaN", b"[" * 100_000, b"\xff\xfe", b"{", b"", b"null", b'"x"', b"[]"]


def _paths(data, prefix=()):
    """Every (path, value) of a JSON value, depth first."""
    yield prefix, data
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _paths(value, (*prefix, i))


def _set(data, path, value, delete):
    if not path:
        return value
    *head, last = path
    target = data
    for key in head:
        target = target[key]
    if delete and isinstance(target, dict):
        del target[last]
    else:
        target[last] = value
    return data


@st.composite
def mutated(draw, good: bytes):
    """``good`` (JSON bytes) with one field replaced or deleted, cut short, a byte changed, or something else."""
    kind = draw(st.sampled_from(["field", "field", "field", "cut", "byte", "raw", "value"]))
    if kind == "cut":
        return good[: draw(st.integers(0, max(0, len(good) - 1)))]
    if kind == "byte":
        at = draw(st.integers(0, len(good) - 1))
        return good[:at] + bytes([draw(st.integers(0, 255))]) + good[at + 1 :]
    if kind == "raw":
        return draw(st.sampled_from(RAW))
    if kind == "value":
        return json.dumps(draw(values)).encode()
    data = json.loads(good)
    paths = list(_paths(data))
    path, _ = draw(st.sampled_from(paths))
    return json.dumps(_set(data, path, draw(values), draw(st.booleans()))).encode()
