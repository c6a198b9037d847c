"""Layout text + dotlist overrides -> one plain dict, as OmegaConf reads them, with every hostile input a SpecError.

YAML is read with OmegaConf's own loader and overrides with its dotlist parser; OmegaConf's containers (about
0.1 ms per node) are built only when an interpolation needs resolving. Guards (docs/spec.md, "Bounds"): a size
bound on the text and the overrides; a YAML node bound after alias expansion; OmegaConf's missing marker `???`
refused rather than silently ignored; `${...}` limited to plain references to one value (no resolvers such as
`${oc.env:VAR}`, which would copy the environment into plan.json and the scripts), so resolving is bounded too.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from specdraft.errors import Problem, SpecError, shorten
from specdraft.spec.bounds import (
    MAX_INTERPOLATED_NODES,
    MAX_LAYOUT_BYTES,
    MAX_OVERRIDE_YAML_NODES,
    MAX_OVERRIDES,
    MAX_YAML_NODES,
)
from specdraft.spec.source.checks import first_line, interpolation_targets, markers

# YAML 1.1 reads `1:30:00` as the base-60 integer 5400, so `slurm.time: 1:30:00` became 5400 minutes. YAML 1.2
# (and every reader's intuition) keeps it text; so does specdraft, in files and in overrides.
SEXAGESIMAL = re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$")
STR_TAG = "tag:yaml.org,2002:str"


def to_plain_dict(text: str, overrides: Sequence[str], source: str) -> dict:
    """Parse ``text`` (YAML) and merge ``overrides``; return plain data with interpolations resolved."""
    _check_overrides(overrides, source)
    base = _parse(text, source)
    problems, interpolated, nodes = markers(base, "")
    layers, errs, interpolated_too = _parse_overrides(overrides)
    problems += errs
    if problems:
        raise SpecError(problems, source)
    if not (interpolated or interpolated_too):
        # Plain data all the way: OmegaConf's containers cost ~0.1 ms per node (seconds for a 12,000-entry list)
        # and add nothing without interpolations. The merge follows OmegaConf.merge for untyped configs.
        problems = []
        for item, layer in layers:
            problems += _merge_plain(base, layer, item)
        if problems:
            raise SpecError(problems, source)
        return base
    if nodes > MAX_INTERPOLATED_NODES:
        _fail(
            source,
            "<yaml>",
            f"{nodes:,} values",
            f"a layout with ${{...}} interpolations may hold at most "
            f"{MAX_INTERPOLATED_NODES:,} values (resolving builds OmegaConf's containers, ~0.1 ms per value)",
            "write the referenced values out, or shorten the long lists",
        )
    return _resolve_with_omegaconf(base, layers, source)


def _check_overrides(overrides: Sequence[str], source: str) -> None:
    problems = []
    if len(overrides) > MAX_OVERRIDES:
        problems.append(
            Problem(
                path="<overrides>",
                value=f"{len(overrides):,} overrides",
                rule=f"more than the bound of {MAX_OVERRIDES:,}",
                fix="put them in a layout file",
            )
        )
    elif sum(len(item) for item in overrides) > MAX_LAYOUT_BYTES:
        problems.append(
            Problem(
                path="<overrides>",
                value=f"{sum(len(i) for i in overrides):,} characters",
                rule=f"the overrides together exceed the bound of {MAX_LAYOUT_BYTES:,}",
                fix="put long values in a layout file",
            )
        )
    else:
        for item in overrides:
            if "=" not in item or item.startswith("="):
                problems.append(
                    Problem(
                        path="<override>",
                        value=item,
                        rule="an override is KEY=VALUE",
                        fix="write it as a dotlist, e.g. parallel.cp=4",
                    )
                )
    if problems:
        raise SpecError(problems, source)


def _yaml_loader():
    """The YAML loader OmegaConf.create itself uses (YAML 1.2 floats, no timestamps, duplicate keys refused, alias
    expansion bounded), so a layout reads exactly as OmegaConf would read it; None where this OmegaConf lacks it."""
    try:
        from omegaconf._yaml import get_yaml_loader
    except ImportError:
        return None
    base = get_yaml_loader(max_yaml_expanded_nodes=MAX_YAML_NODES)
    # The str resolver goes first for the characters a base-60 number can start with, so it wins over int/float.
    resolvers = {
        key: ([(STR_TAG, SEXAGESIMAL)] if key in "+-0123456789" else []) + list(value)
        for key, value in base.yaml_implicit_resolvers.items()
    }
    return type("LayoutLoader", (base,), {"yaml_implicit_resolvers": resolvers})


def _parse(text: str, source: str) -> dict:
    import yaml
    from omegaconf.errors import OmegaConfBaseException

    if len(text) > MAX_LAYOUT_BYTES:
        _fail(
            source,
            "<yaml>",
            f"{len(text):,} characters",
            f"the layout exceeds the bound of {MAX_LAYOUT_BYTES:,}",
            "a layout is a few hundred lines",
        )
    loader = _yaml_loader()
    try:
        if loader is not None:
            data = yaml.load(text, Loader=loader)
        else:
            from omegaconf import OmegaConf

            data = OmegaConf.to_container(OmegaConf.create(text, max_yaml_expanded_nodes=MAX_YAML_NODES))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        _fail(
            source,
            "<yaml>",
            where,
            f"YAML syntax error: {_yaml_reason(err, MAX_YAML_NODES)}",
            "fix the YAML at that position (indentation, a missing ':' or an unclosed quote)",
        )
    except RecursionError:
        _fail(source, "<yaml>", None, "the YAML nests too deeply", "a layout nests a few levels")
    except AssertionError:
        # OmegaConf.create asserts that YAML text is a mapping or a list; a scalar document (`42`) trips it.
        _not_a_mapping(source, "a single value")
    except OmegaConfBaseException as err:
        _fail(
            source,
            getattr(err, "full_key", None) or "<yaml>",
            "(unreadable)",
            f"cannot read the layout: {first_line(err)}",
            "fix the value",
        )
    except ValueError as err:  # e.g. an integer of more than 4,300 digits (Python's int/str conversion bound)
        _fail(source, "<yaml>", None, f"cannot read a value: {first_line(err)}", "use a realistic value")
    if data is None:
        return {}
    if not isinstance(data, dict):
        _not_a_mapping(source, "a list" if isinstance(data, list) else "a single value")
    return data


def _parse_overrides(overrides: Sequence[str]) -> tuple[list[tuple[str, dict]], list[Problem], bool]:
    """Each override as plain nested data (OmegaConf's dotlist syntax), the problems, whether any interpolates."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    layers, problems, interpolated = [], [], False
    for item in overrides:
        key, value = item.split("=", 1)
        if SEXAGESIMAL.match(value.strip()):
            item = f"{key}='{value.strip()}'"  # text, as in a file (see SEXAGESIMAL)
        try:
            layer = OmegaConf.to_container(OmegaConf.from_dotlist([item]), resolve=False)
        except (
            OmegaConfBaseException,
            yaml.YAMLError,
            ValueError,
            TypeError,
            KeyError,
            IndexError,
            RecursionError,
        ) as err:
            # IndexError: OmegaConf 2.4's key splitter fails on a key such as `[` instead of refusing it.
            reason = (
                _yaml_reason(err, MAX_OVERRIDE_YAML_NODES)
                if isinstance(err, yaml.YAMLError)
                else f"malformed key path {key!r} (write a.b.c, or a.b[0] for a list item)"
                if isinstance(err, IndexError)
                else first_line(err)
            )
            problems.append(
                Problem(
                    path=key,
                    value=value,
                    rule=f"cannot apply override: {reason}",
                    fix="check the key path and the value's YAML syntax",
                )
            )
            continue
        found, uses, _ = markers(layer, "")
        problems += found
        interpolated = interpolated or uses
        layers.append((item, layer))
    return layers, problems, interpolated


def _merge_plain(base: dict, layer: dict, item: str, path: str = "") -> list[Problem]:
    """Merge ``layer`` into ``base`` in place as OmegaConf.merge does for untyped configs: mappings merge key by
    key, anything else replaces, and a mapping never merges into a list (nor a list into a mapping)."""
    problems = []
    for key, value in layer.items():
        sub = f"{path}.{key}" if path else str(key)
        old = base.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            problems += _merge_plain(old, value, item, sub)
        elif isinstance(value, dict) and isinstance(old, list) or isinstance(value, list) and isinstance(old, dict):
            problems.append(
                Problem(
                    path=sub,
                    value=item.split("=", 1)[1],
                    rule="cannot apply override: it merges a "
                    f"{'mapping into a list' if isinstance(value, dict) else 'list into a mapping'}",
                    fix="replace the whole value, e.g. key=[a, b]",
                )
            )
        else:
            base[key] = value
    return problems


def _resolve_with_omegaconf(base: dict, layers: list[tuple[str, dict]], source: str) -> dict:
    """The layout has interpolations: build OmegaConf's containers, merge, check the references, then resolve."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    expected = (OmegaConfBaseException, yaml.YAMLError, ValueError, TypeError, KeyError, RecursionError)
    try:
        merged = OmegaConf.create(base)
    except expected as err:
        _fail(
            source,
            getattr(err, "full_key", None) or "<yaml>",
            "(unreadable)",
            f"cannot read the layout: {first_line(err)}",
            "fix the value",
        )
    problems = []
    for item, _ in layers:  # one at a time, so a failing one is named
        try:
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist([item]))
        except expected as err:
            key, value = item.split("=", 1)
            problems.append(
                Problem(
                    path=key,
                    value=value,
                    rule=f"cannot apply override: {first_line(err)}",
                    fix="check the key path and the value's YAML syntax",
                )
            )
    problems = problems or interpolation_targets(merged)
    if problems:
        raise SpecError(problems, source)
    return _resolve(merged, source)


def _resolve(merged, source: str) -> dict:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(merged, resolve=True, throw_on_missing=True)
    except (OmegaConfBaseException, RecursionError) as err:
        _fail(
            source,
            getattr(err, "full_key", None) or "<interpolation>",
            None,
            f"cannot resolve: {first_line(err)}",
            "fix the ${...} interpolation or replace it by a literal value",
        )


def _yaml_reason(err, limit: int) -> str:
    reason = getattr(err, "problem", None) or first_line(err)
    if "node expansion exceeds" in reason or "aliases expand" in reason:
        # OmegaConf's own text blames alias expansion and suggests an environment variable; say what happened.
        return (
            f"more than {limit:,} YAML nodes (counting what aliases expand to); specdraft's bound is "
            f"{limit:,} (a list of 12,000 sequence lengths is fine in a layout file)"
        )
    return shorten(reason, 300)


def _not_a_mapping(source: str, what: str) -> None:
    _fail(source, "<yaml>", what, "the layout must be a YAML mapping", "start the file with `name:` and `model:` keys")


def _fail(source: str, path: str, value: Any, rule: str, fix: str) -> None:
    raise SpecError([Problem(path=path, value=value, rule=rule, fix=fix)], source) from None
