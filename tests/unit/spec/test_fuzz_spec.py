"""Fuzzing the loader, the validator and compile: any input ends in a LayoutSpec (and a plan, or the problems
`validate` lists) or a SpecError/UserError, within a per-example deadline; never another exception. The CLI's
`validate`, `plan` and rollout commands turn exactly those into exit 0 or exit 2.
"""

from __future__ import annotations

import math
import os
import sys
import types
import typing
from dataclasses import fields, is_dataclass
from datetime import timedelta

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from specdraft.assemble import check, compile
from specdraft.errors import SpecError, UserError
from specdraft.spec.load import builtin_layout_text, load_layout_text, spec_sha256
from specdraft.spec.schema import LayoutSpec

TINY = builtin_layout_text()
BASE = yaml.safe_load(TINY)
FUZZ = settings(
    max_examples=int(os.environ.get("SPECDRAFT_FUZZ_EXAMPLES", "150")),
    deadline=timedelta(seconds=10),
    suppress_health_check=[HealthCheck.too_slow],
)


def _fields(cls=LayoutSpec, prefix=""):
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if is_dataclass(hints[f.name]):
            yield from _fields(hints[f.name], f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", hints[f.name]


TYPES = dict(_fields())
PATHS = sorted(TYPES)


def outcome(text: str, overrides=()) -> str:
    """Load, validate and (when valid) compile; return what happened. Any other exception fails the test."""
    try:
        spec = load_layout_text(text, list(overrides))
    except (SpecError, UserError) as err:
        assert str(err)  # the message renders (bounded, no exception while rendering)
        return "refused at load"
    errors, _ = check(spec)
    if errors:
        assert str(SpecError(errors))
        return "refused by validate"
    try:
        plan = compile(spec)
    except SpecError:
        pytest.fail("validate called the layout valid and compile refused it")
    assert plan.to_json() and spec_sha256(spec)
    return "valid"


numbers = st.one_of(
    st.integers(-(2**80), 2**80),
    st.integers(-3, 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1, 2, 4, 8, 1e30, 1e300, -1e300, 2**31, 2**53 + 1, 0.5, math.nan, math.inf]),
)
texts = st.one_of(
    st.text(max_size=20),
    st.sampled_from(
        [
            "???",
            "${name}",
            "${oc.env:HOME}",
            "${model}",
            "${",
            "${a.b",
            "\\${x}",
            "${name}${name}",
            "a\x00b",
            "x\ny",
            "last",
            "first",
            "cpu",
            "p2p",
            "bf16",
            "--exclusive",
            "--chd=/",
            "01:00:00",
            "\udcff",
            "é",
            "\u202e",
            "%j",
            "a b",
        ]
    ),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.one_of(st.sampled_from(PATHS), st.text(max_size=8)), inner, max_size=4)
    ),
    max_leaves=12,
)


def typed(tp):
    """Values of the field's own type, mostly small or at the edges, so the validator and compile run too."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.one_of(st.integers(-2, 130), st.sampled_from([0, 1, 2, 4, 8, 16, 64, 4096, 131_072, 2**31]))
    if tp is float:
        return st.one_of(st.floats(-2, 2), st.sampled_from([0.0, 1e-4, 1.0, 0.999, math.nan, math.inf]))
    if tp is str:
        return texts
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*[st.none() if a is type(None) else typed(a) for a in args])
    if origin is list:
        return st.lists(typed(args[0]), max_size=6)
    if origin is dict:
        return st.dictionaries(st.text(max_size=6), typed(args[1]), max_size=3)
    return values


def field_value(path):
    return st.one_of(typed(TYPES[path]), typed(TYPES[path]), typed(TYPES[path]), values)


def _set(data: dict, path: str, value) -> None:
    *parents, leaf = path.split(".")
    node = data
    for key in parents:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[leaf] = value


@FUZZ
@given(
    st.lists(st.sampled_from(PATHS).flatmap(lambda p: st.tuples(st.just(p), field_value(p))), min_size=1, max_size=6)
)
def test_random_values_for_known_fields(assignment):
    data = yaml.safe_load(TINY)
    for path, value in assignment:
        _set(data, path, value)
    try:
        text = yaml.safe_dump(data, allow_unicode=True)
    except yaml.YAMLError:
        return  # PyYAML cannot write it (e.g. a lone surrogate); nothing for specdraft to read
    outcome(text)


yaml_chars = st.sampled_from(list("abcdenmpt:{}[],-?*&!|>'\"#%@`$\\ \t\n019.=_") + ["\x00", "\xff", "\u2028"])


@FUZZ
@given(
    st.one_of(
        st.text(yaml_chars, max_size=80),
        st.text(max_size=80),
        st.builds(lambda head, tail: head + tail, st.just(TINY), st.text(yaml_chars, max_size=40)),
    )
)
def test_random_yaml_text(text):
    outcome(text)


override_values = st.one_of(
    texts,
    numbers.map(str),
    st.sampled_from(
        [
            ".nan",
            ".inf",
            "-.inf",
            "1e400",
            "[]",
            "{}",
            "[1, 2",
            "{a: 1}",
            "null",
            "~",
            "[${name}]",
            "'quoted'",
            '"a\\0b"',
            "!!binary aGk=",
            "*alias",
            "&a x",
            "- a",
            "a: b",
        ]
    ),
)
override_keys = st.one_of(
    st.sampled_from(PATHS),
    st.sampled_from(
        [
            "model",
            "parallel",
            "slurm.env.X",
            "training.sequence_lengths[0]",
            "a..b",
            "[0]",
            "model.path.x",
            "cluster.gpu.y",
            "",
        ]
    ),
    st.text(max_size=12),
)


@FUZZ
@given(
    st.lists(st.tuples(override_keys, override_values).map(lambda kv: f"{kv[0]}={kv[1]}"), max_size=5)
    | st.lists(st.text(max_size=30), max_size=3)
)
@example(["[="])  # found by this test in CI: OmegaConf's key splitter raised IndexError
def test_random_dotlist_overrides(overrides):
    outcome(TINY, overrides)


# ---- the real CLI, in-process through its one error boundary ----------------------------------------------------


@pytest.fixture(scope="module")
def cli():
    from specdraft.cli import main as cli_main
    from specdraft.cli.boundary import run

    if not any(group.name == "rollout" for group in cli_main.app.registered_groups):
        cli_main._register_optional_commands()

    def invoke(*argv):
        return run(lambda: cli_main.app(args=list(argv), prog_name="specdraft", standalone_mode=False))

    return invoke


def test_hostile_inputs_through_the_cli_end_in_exit_2(cli, capsys, tmp_path):
    (tmp_path / "latin1.yaml").write_bytes(b"name: caf\xe9\n")
    (tmp_path / "num.yaml").write_text("42\n")
    (tmp_path / "open.yaml").write_text("name: ${\n")
    os.mkfifo(tmp_path / "fifo.yaml")
    cases = [
        ("validate", str(tmp_path / "latin1.yaml")),
        ("validate", str(tmp_path / "num.yaml")),
        ("validate", str(tmp_path / "open.yaml")),
        ("validate", str(tmp_path / "fifo.yaml")),
        ("validate", "/dev/zero"),
        ("validate", "model.hidden_size=1e300"),
        ("validate", "parallel.tp=???"),
        ("validate", "name=${oc.env:HOME}"),
        ("validate", "training.lr=.nan"),
        ("validate", "model.path=a\x1bb"),
        ("validate", "model.path=" + "x" * 2_000_000),
        ("validate", "training.seed=1e30"),
        ("plan", "cluster.num_nodes=1048576", "cluster.gpus_per_node=8"),
        ("plan", "--format", "json", "-o", str(tmp_path / "fifo.yaml")),
        ("rollout", "simulate", "rollout.num_prompts_per_step=100000"),
        ("rollout", "plan", "rollout.colocated=false", "rollout.num_nodes=1000000"),
        ("rollout", "simulate", "--prediction-error", "nan"),
        ("rollout", "simulate", "--median", "nan"),
        ("rollout", "simulate", "--median", "1e308"),
        ("rollout", "simulate", "--steps", "1000000"),
        ("rollout", "simulate", "--sigma", "inf"),
        ("rollout", "simulate", "--correlation", "nan"),
        ("rollout", "simulate", "--tp-overhead-scale", "-inf"),
        ("rollout", "simulate", "--seeds", "0"),
        ("rollout", "simulate", "--steps", "1000"),  # 1,000 steps x 512 samples is past the simulated-sample bound
        ("rollout", "simulate", "--adaptive-tp", "--tp-start", "9" * 5000),
        ("rollout", "simulate", "slurm.time=1:30:00", "rollout.num_generations_per_prompt=5000"),
    ]
    for argv in cases:
        code = cli(*argv)
        out = capsys.readouterr()
        text = out.out + out.err
        assert code == 2, (argv[:3], text[-500:])
        assert "Traceback" not in text and "internal error" not in text, (argv[:3], text[-500:])
        assert len(text) < 20_000, (argv[:3], "error text must stay bounded")


def test_the_console_script_entry_point_maps_a_hostile_layout_to_exit_2(tmp_path):
    import subprocess

    (tmp_path / "bad.yaml").write_bytes(b"\xff\xfe" + TINY.encode())
    proc = subprocess.run(
        [sys.executable, "-m", "specdraft.cli", "validate", str(tmp_path / "bad.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "not UTF-8" in proc.stderr and "Traceback" not in proc.stderr
