"""Checks of raw layout data before OmegaConf resolves it: the missing marker `???`, over-long strings and lists,
`${...}` limited to one plain reference, and each interpolation's target (one value, a bounded count)."""

from __future__ import annotations

from typing import Any

from specdraft.errors import Problem, shorten
from specdraft.spec.bounds import MAX_INTERPOLATIONS, MAX_LIST_ITEMS, MAX_STRING_CHARS

MISSING_MARKER = "???"


def markers(data: Any, path: str) -> tuple[list[Problem], bool, int]:
    """(`???` values, over-long strings and lists, interpolations that are not plain references; whether any
    value interpolates; how many values there are) in raw data."""
    problems: list[Problem] = []
    interpolated = False
    nodes = 0
    stack = [(path, data)]
    while stack:  # iterative: nesting depth is the YAML parser's to bound, not Python's recursion limit
        where, value = stack.pop()
        nodes += 1
        if isinstance(value, dict):
            stack += [(f"{where}.{k}" if where else str(k), v) for k, v in reversed(list(value.items()))]
        elif isinstance(value, list):
            if len(value) > MAX_LIST_ITEMS:  # refused before anything walks or copies it item by item
                problems.append(
                    Problem(
                        path=where,
                        value=value,
                        rule=f"has {len(value):,} items; the bound is {MAX_LIST_ITEMS:,}",
                        fix="list fewer (typical values suffice)",
                    )
                )
                continue
            stack += [(f"{where}[{i}]", v) for i, v in reversed(list(enumerate(value)))]
        elif isinstance(value, str):
            interpolated = interpolated or "${" in value
            problem = _string_marker(where or "<root>", value)
            if problem:
                problems.append(problem)
    return problems, interpolated, nodes


def _string_marker(path: str, value: str) -> Problem | None:
    if value == MISSING_MARKER:
        return Problem(
            path=path,
            value=value,
            rule="is OmegaConf's missing-value marker, which would leave the "
            "field unset (an override of ??? is otherwise silently ignored)",
            fix="give a value, or drop the key to use the default",
        )
    if len(value) > MAX_STRING_CHARS:
        return Problem(
            path=path,
            value=value,
            rule=f"is {len(value):,} characters; the bound is {MAX_STRING_CHARS:,}",
            fix="shorten it",
        )
    if "${" not in value:
        return None
    from omegaconf import grammar_parser
    from omegaconf.errors import GrammarParseError
    from omegaconf.grammar.gen.OmegaConfGrammarParser import OmegaConfGrammarParser as G

    try:
        tree = grammar_parser.parse(value)
    except GrammarParseError as err:
        return Problem(
            path=path,
            value=value,
            rule=f"is not a valid interpolation: {first_line(err)}",
            fix="close the ${...}, or escape a literal as \\${",
        )
    nodes, resolvers = 0, 0
    stack: list[Any] = [tree]
    while stack:
        node = stack.pop()
        nodes += isinstance(node, G.InterpolationNodeContext)
        resolvers += isinstance(node, G.InterpolationResolverContext)
        stack += list(node.getChildren()) if hasattr(node, "getChildren") else []
    if resolvers:
        return Problem(
            path=path,
            value=value,
            rule="resolvers (${name:...}, e.g. ${oc.env:VAR}) are not allowed: "
            "they would copy the environment or run code into plan.json and the job scripts",
            fix="write the value itself; plain references such as ${model.path} are allowed",
        )
    if nodes > 1:
        return Problem(
            path=path,
            value=value,
            rule="holds more than one ${...} reference (or a nested one)",
            fix="use at most one plain reference per value, e.g. ${name}-ckpt",
        )
    return None


def interpolation_targets(merged) -> list[Problem]:
    """Each interpolation must point at one value (not a section or list) and there are at most a bounded number.

    Resolving a reference to a section copies the whole section; chains of such copies grow exponentially.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    found: list[tuple[str, Any, Any]] = []
    stack = [("", merged)]
    while stack:
        where, cfg = stack.pop()
        keys = list(cfg.keys()) if OmegaConf.is_dict(cfg) else list(range(len(cfg)))
        for key in keys:
            sub = (f"{where}.{key}" if where else str(key)) if OmegaConf.is_dict(cfg) else f"{where}[{key}]"
            if OmegaConf.is_interpolation(cfg, key):
                found.append((sub, cfg, key))
            elif OmegaConf.is_config(child := cfg[key]):  # not an interpolation: nothing is resolved here
                stack.append((sub, child))
    if len(found) > MAX_INTERPOLATIONS:
        return [
            Problem(
                path=found[MAX_INTERPOLATIONS][0],
                value=f"{len(found)} interpolations",
                rule=f"more ${{...}} interpolations than the bound of {MAX_INTERPOLATIONS}",
                fix="write values out",
            )
        ]
    problems = []
    for sub, cfg, key in found:
        try:
            target = cfg[key]  # resolves this one reference: a section comes back as a node, not a copy
        except (OmegaConfBaseException, RecursionError) as err:
            problems.append(
                Problem(
                    path=sub,
                    value=_raw(cfg, key),
                    rule=f"cannot resolve: {first_line(err)}",
                    fix="fix the ${...} interpolation or replace it by a literal value",
                )
            )
            continue
        if OmegaConf.is_config(target):
            problems.append(
                Problem(
                    path=sub,
                    value=_raw(cfg, key),
                    rule="points at a whole section or list",
                    fix="reference a single value",
                )
            )
        elif isinstance(target, str) and len(target) > MAX_STRING_CHARS:
            problems.append(
                Problem(
                    path=sub,
                    value=target,
                    rule=f"resolves to {len(target):,} characters; the bound is {MAX_STRING_CHARS:,}",
                    fix="shorten it",
                )
            )
    return problems


def _raw(cfg, key) -> Any:
    """The unresolved text of one value (`${...}` as written)."""
    from omegaconf import OmegaConf

    raw: Any = OmegaConf.to_container(cfg, resolve=False)
    return raw[key]


def first_line(err: BaseException) -> str:
    return shorten((str(err).splitlines() or [type(err).__name__])[0], 300)
