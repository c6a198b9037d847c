"""Layout text + dotlist overrides -> one plain dict, through OmegaConf, with every hostile input a SpecError.

Guards (docs/spec.md, "Bounds" and "Interpolation"): a size bound on the text and the overrides; a YAML node
bound after alias expansion; OmegaConf's missing marker `???` refused rather than silently ignored; `${...}`
interpolation limited to plain references to one value (no resolvers such as `${oc.env:VAR}`, which would copy
the environment into plan.json and the scripts), so resolving is bounded too.
"""

from __future__ import annotations

from typing import Any, Sequence

from specdraft.errors import Problem, SpecError, shorten
from specdraft.spec.bounds import (MAX_INTERPOLATIONS, MAX_LAYOUT_BYTES, MAX_OVERRIDE_YAML_NODES, MAX_OVERRIDES,
                                   MAX_STRING_CHARS, MAX_YAML_NODES)

MISSING_MARKER = "???"


def to_plain_dict(text: str, overrides: Sequence[str], source: str) -> dict:
    """Parse ``text`` (YAML) and merge ``overrides``; return plain data with interpolations resolved."""
    # Imported here: omegaconf (and its yaml) cost start-up time that --help should not pay.
    from omegaconf import OmegaConf

    _check_overrides(overrides, source)
    base = _parse(text, source)
    problems = _markers(OmegaConf.to_container(base, resolve=False), "")
    merged, errs = _merge(base, overrides)
    problems += errs
    if problems:
        raise SpecError(problems, source)
    problems = _interpolation_targets(merged)
    if problems:
        raise SpecError(problems, source)
    return _resolve(merged, source)


def _check_overrides(overrides: Sequence[str], source: str) -> None:
    problems = []
    if len(overrides) > MAX_OVERRIDES:
        problems.append(Problem(path="<overrides>", value=f"{len(overrides):,} overrides",
                                rule=f"more than the bound of {MAX_OVERRIDES:,}", fix="put them in a layout file"))
    elif sum(len(item) for item in overrides) > MAX_LAYOUT_BYTES:
        problems.append(Problem(path="<overrides>", value=f"{sum(len(i) for i in overrides):,} characters",
                                rule=f"the overrides together exceed the bound of {MAX_LAYOUT_BYTES:,}",
                                fix="put long values in a layout file"))
    else:
        for item in overrides:
            if "=" not in item or item.startswith("="):
                problems.append(Problem(path="<override>", value=item, rule="an override is KEY=VALUE",
                                        fix="write it as a dotlist, e.g. parallel.cp=4"))
    if problems:
        raise SpecError(problems, source)


def _parse(text: str, source: str):
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if len(text) > MAX_LAYOUT_BYTES:
        _fail(source, "<yaml>", f"{len(text):,} characters", f"the layout exceeds the bound of {MAX_LAYOUT_BYTES:,}",
              "a layout is a few hundred lines")
    if not text.strip():
        return OmegaConf.create({})
    try:
        base = OmegaConf.create(text, max_yaml_expanded_nodes=MAX_YAML_NODES)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        _fail(source, "<yaml>", where, f"YAML syntax error: {_yaml_reason(err, MAX_YAML_NODES)}",
              "fix the YAML at that position (indentation, a missing ':' or an unclosed quote)")
    except AssertionError:
        # OmegaConf.create asserts that YAML text is a mapping or a list; a scalar document (`42`) trips it.
        _not_a_mapping(source, "a single value")
    except OmegaConfBaseException as err:  # e.g. `name: ${` (an unclosed interpolation) is refused on creation
        _fail(source, getattr(err, "full_key", None) or "<yaml>", "(unreadable)",
              f"cannot read the layout: {_first_line(err)}", "fix the value (an unclosed ${...}?)")
    except ValueError as err:  # e.g. an integer of more than 4,300 digits (Python's int/str conversion bound)
        _fail(source, "<yaml>", None, f"cannot read a value: {_first_line(err)}", "use a realistic value")
    if not OmegaConf.is_dict(base):
        _not_a_mapping(source, "a list")
    return base


def _merge(base, overrides: Sequence[str]):
    """(merged config, problems): one merge for all overrides; when that fails, one at a time to name each."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    expected = (OmegaConfBaseException, yaml.YAMLError, ValueError, TypeError, KeyError)
    if not overrides:
        return base, []
    problems: list[Problem] = []
    try:
        dotlist = OmegaConf.from_dotlist(list(overrides))
        problems = _markers(OmegaConf.to_container(dotlist, resolve=False), "")
        return OmegaConf.merge(base, dotlist), problems
    except expected:
        pass  # reported item by item below
    merged = base
    for item in overrides:
        key, value = item.split("=", 1)
        try:
            one = OmegaConf.from_dotlist([item])
            problems += _markers(OmegaConf.to_container(one, resolve=False), "")
            merged = OmegaConf.merge(merged, one)
        except expected as err:
            reason = _yaml_reason(err, MAX_OVERRIDE_YAML_NODES) if isinstance(err, yaml.YAMLError) else _first_line(err)
            problems.append(Problem(path=key, value=value, rule=f"cannot apply override: {reason}",
                                    fix="check the key path and the value's YAML syntax"))
    return merged, problems


def _markers(data: Any, path: str) -> list[Problem]:
    """`???` values, over-long raw strings and interpolations that are not plain references, in raw data."""
    problems: list[Problem] = []
    stack = [(path, data)]
    while stack:  # iterative: nesting depth is the YAML parser's to bound, not Python's recursion limit
        where, value = stack.pop()
        if isinstance(value, dict):
            stack += [(f"{where}.{k}" if where else str(k), v) for k, v in reversed(list(value.items()))]
        elif isinstance(value, list):
            stack += [(f"{where}[{i}]", v) for i, v in reversed(list(enumerate(value)))]
        elif isinstance(value, str):
            problem = _string_marker(where or "<root>", value)
            if problem:
                problems.append(problem)
    return problems


def _string_marker(path: str, value: str) -> Problem | None:
    if value == MISSING_MARKER:
        return Problem(path=path, value=value, rule="is OmegaConf's missing-value marker, which would leave the "
                       "field unset (an override of ??? is otherwise silently ignored)",
                       fix="give a value, or drop the key to use the default")
    if len(value) > MAX_STRING_CHARS:
        return Problem(path=path, value=value, rule=f"is {len(value):,} characters; the bound is "
                       f"{MAX_STRING_CHARS:,}", fix="shorten it")
    if "${" not in value:
        return None
    from omegaconf import grammar_parser
    from omegaconf.errors import GrammarParseError
    from omegaconf.grammar.gen.OmegaConfGrammarParser import OmegaConfGrammarParser as G

    try:
        tree = grammar_parser.parse(value)
    except GrammarParseError as err:
        return Problem(path=path, value=value, rule=f"is not a valid interpolation: {_first_line(err)}",
                       fix="close the ${...}, or escape a literal as \\${")
    nodes, resolvers = 0, 0
    stack = [tree]
    while stack:
        node = stack.pop()
        nodes += isinstance(node, G.InterpolationNodeContext)
        resolvers += isinstance(node, G.InterpolationResolverContext)
        stack += list(node.getChildren()) if hasattr(node, "getChildren") else []
    if resolvers:
        return Problem(path=path, value=value, rule="resolvers (${name:...}, e.g. ${oc.env:VAR}) are not allowed: "
                       "they would copy the environment or run code into plan.json and the job scripts",
                       fix="write the value itself; plain references such as ${model.path} are allowed")
    if nodes > 1:
        return Problem(path=path, value=value, rule="holds more than one ${...} reference (or a nested one)",
                       fix="use at most one plain reference per value, e.g. ${name}-ckpt")
    return None


def _interpolation_targets(merged) -> list[Problem]:
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
        return [Problem(path=found[MAX_INTERPOLATIONS][0], value=f"{len(found)} interpolations",
                        rule=f"more ${{...}} interpolations than the bound of {MAX_INTERPOLATIONS}",
                        fix="write values out")]
    problems = []
    for sub, cfg, key in found:
        try:
            target = cfg[key]  # resolves this one reference: a section comes back as a node, not a copy
        except (OmegaConfBaseException, RecursionError) as err:
            problems.append(Problem(path=sub, value=_raw(cfg, key), rule=f"cannot resolve: {_first_line(err)}",
                                    fix="fix the ${...} interpolation or replace it by a literal value"))
            continue
        if OmegaConf.is_config(target):
            problems.append(Problem(path=sub, value=_raw(cfg, key),
                                    rule="points at a whole section or list", fix="reference a single value"))
        elif isinstance(target, str) and len(target) > MAX_STRING_CHARS:
            problems.append(Problem(path=sub, value=target, rule=f"resolves to {len(target):,} characters; the "
                                    f"bound is {MAX_STRING_CHARS:,}", fix="shorten it"))
    return problems


def _raw(cfg, key) -> Any:
    """The unresolved text of one value (`${...}` as written)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=False)[key]


def _resolve(merged, source: str) -> dict:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(merged, resolve=True, throw_on_missing=True)
    except (OmegaConfBaseException, RecursionError) as err:
        _fail(source, getattr(err, "full_key", None) or "<interpolation>", None,
              f"cannot resolve: {_first_line(err)}", "fix the ${...} interpolation or replace it by a literal value")


def _yaml_reason(err, limit: int) -> str:
    reason = getattr(err, "problem", None) or _first_line(err)
    if "node expansion exceeds" in reason or "aliases expand" in reason:
        # OmegaConf's own text blames alias expansion and suggests an environment variable; say what happened.
        return (f"more than {limit:,} YAML nodes (counting what aliases expand to); specdraft's bound is "
                f"{limit:,} (a list of 12,000 sequence lengths is fine in a layout file)")
    return shorten(reason, 300)


def _first_line(err: BaseException) -> str:
    return shorten((str(err).splitlines() or [type(err).__name__])[0], 300)


def _not_a_mapping(source: str, what: str) -> None:
    _fail(source, "<yaml>", what, "the layout must be a YAML mapping",
          "start the file with `name:` and `model:` keys")


def _fail(source: str, path: str, value: Any, rule: str, fix: str) -> None:
    raise SpecError([Problem(path=path, value=value, rule=rule, fix=fix)], source) from None
