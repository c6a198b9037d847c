"""Writes tests/support/megatron_lm_flags.py: every flag Megatron-LM's argument parser defines, with its value kind.

Run once per Megatron-LM update, against a checkout of https://github.com/NVIDIA/Megatron-LM (its `megatron/`
folder on PYTHONPATH ahead of any installed megatron-core), from the repository root:

    PYTHONPATH=CHECKOUT:. python tests/support/gen_megatron_lm_flags.py COMMIT > tests/support/megatron_lm_flags.py

It builds the parser as pretrain_gpt.py does (megatron.training.arguments.add_megatron_arguments) and reads its
actions. Only the parser is built: the few modules whose import needs triton (GPU kernels, not arguments) are
replaced by empty stand-ins, and Python 3.11 gets typing.override.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import sys
import types
import typing

# Kernel modules that import triton at module level on the way to the argument parser (Megatron-LM d98e8a64).
KERNEL_MODULES = (
    "megatron.core.transformer.moe.ops.paged_stash",
    "megatron.core.ssm.ops.common.causal_conv1d_varlen",
    "megatron.core.ssm.ops.mamba2.batch_invariant_decode",
)

HEADER = '''"""The flags Megatron-LM's argument parser defines, each with its value kind (data, not code).

Source: https://github.com/NVIDIA/Megatron-LM at commit {commit},
megatron/training/arguments.py (add_megatron_arguments, as pretrain_gpt.py builds its parser; many flags are
generated there from megatron-core's TransformerConfig). Written by tests/support/gen_megatron_lm_flags.py.
Kinds: store_true / store_false / store_const / boolean_optional take no value; int, float, str and other (a parser
function) take one; a tuple lists the choices; a trailing "+", "*" or "?" means that many values.
"""

SOURCE = "https://github.com/NVIDIA/Megatron-LM"
COMMIT = "{commit}"'''


class _StandIn(types.ModuleType):
    """An empty module: any attribute is another stand-in, callable, usable as a decorator or a base class."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _StandIn(f"{self.__name__}.{name}")

    def __call__(self, *args, **kwargs):
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else _StandIn("call")

    def __mro_entries__(self, bases):
        return (object,)


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        return importlib.machinery.ModuleSpec(name, self) if name in KERNEL_MODULES else None

    def create_module(self, spec):
        return _StandIn(spec.name)

    def exec_module(self, module):
        pass


def kind(action: argparse.Action):
    """store_true | store_false | store_const | boolean_optional | int | float | str | other (a parser function), a
    tuple of choices; `+`/`*`/`?` after a kind whose flag takes that many values."""
    if isinstance(action, argparse._StoreTrueAction):
        return "store_true"
    if isinstance(action, argparse._StoreFalseAction):
        return "store_false"
    if isinstance(action, argparse._StoreConstAction):
        return "store_const"
    if action.nargs == 0:  # argparse.BooleanOptionalAction: --x and --no-x
        return "boolean_optional"
    if action.choices is not None:
        base = tuple(str(c.value if hasattr(c, "value") else c) for c in action.choices)
    else:
        base = {int: "int", float: "float", str: "str", None: "str"}.get(action.type, "other")
    if action.nargs in ("+", "*", "?"):
        return (*base, action.nargs) if isinstance(base, tuple) else base + action.nargs
    return base


def main(commit: str) -> None:
    sys.meta_path.insert(0, _StandInFinder())
    if not hasattr(typing, "override"):
        typing.override = lambda f: f
    from megatron.training.arguments import add_megatron_arguments

    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_megatron_arguments(parser)
    flags = {}
    for action in parser._actions:
        for option in action.option_strings:
            if option.startswith("--") and option != "--help":
                flags[option] = kind(action)
    print(HEADER.format(commit=commit))
    print("FLAGS: dict[str, str | tuple[str, ...]] = {")
    for option in sorted(flags):
        print(f"    {option!r}: {flags[option]!r},")
    print("}")


if __name__ == "__main__":
    main(sys.argv[1])
