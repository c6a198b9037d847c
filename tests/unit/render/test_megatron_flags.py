"""The Megatron-LM argv holds only flags Megatron-LM's parser defines, each with a value of its kind.

The table (tests/support/megatron_lm_flags.py) is Megatron-LM's own parser, read at the commit it names. Every
shipped layout, and variants that reach the optional flags, must pass: argparse rebuilt from the table parses the
argv strictly (an unknown flag ends pretrain_gpt.py), ints parse as ints, choices are among the choices, and a
store_true flag carries no value.
"""

from __future__ import annotations

import argparse

import pytest

from specdraft.assemble import compile
from specdraft.spec.load import load_layout
from tests.support.megatron_lm_flags import COMMIT, FLAGS
from tests.support.paths import SHIPPED

LAYOUTS = sorted(SHIPPED.glob("*.yaml"))
NO_VALUE = {"store_true", "store_false", "store_const", "boolean_optional"}
VARIANTS = {  # (layout, overrides) that reach the flags the shipped layouts leave out
    "fp8-full-recompute": ("llama3-70b", ["training.dtype=fp8", "training.recompute=full"]),
    "a2a+p2p": (
        "llama3-70b",
        [
            "parallel.cp=4",
            "parallel.cp_comm_type=a2a+p2p",
            "draft.enabled=false",
            "parallel.hierarchical_cp_sizes=[2,2]",
            "cluster.num_nodes=16",
        ],
    ),
    "layernorm-biases-tied": (
        "tiny-cpu",
        [
            "model.normalization=LayerNorm",
            "model.add_bias_linear=true",
            "model.add_qkv_bias=false",
            "model.tie_embeddings=true",
            "model.hidden_dropout=0.1",
            "model.swiglu=false",
        ],
    ),
    "qkv-bias": ("qwen3-8b", ["model.add_qkv_bias=true"]),
    "top1-router": ("mixtral-tiny-cpu", ["model.moe_router_topk=1"]),
    "split-and-mapping": (
        "qwen3-8b",
        [
            "parallel.first_stage_layers=17",
            "parallel.last_stage_layers=19",
            "parallel.order=tp-cp-ep-pp-dp",
            "training.grad_reduce_in_bf16=true",
            "training.tp_comm_overlap=true",
            "parallel.sequence_parallel=true",
        ],
    ),
    "accounting": (
        "llama3-70b",
        [
            "model.num_layers=78",
            "parallel.account_for_embedding_in_pipeline_split=true",
            "parallel.account_for_loss_in_pipeline_split=true",
        ],
    ),
}


def _parser() -> argparse.ArgumentParser:
    """Megatron-LM's parser as the table describes it: every flag, its arity, type and choices."""
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False, add_help=False)
    for flag, kind in FLAGS.items():
        if kind in NO_VALUE:
            parser.add_argument(flag, action="store_true", dest=flag)
            continue
        nargs = None
        if isinstance(kind, tuple):
            choices, nargs = (kind[:-1], kind[-1]) if kind[-1] in "+*?" else (kind, None)
            parser.add_argument(flag, choices=choices, nargs=nargs, dest=flag)
            continue
        if kind[-1] in "+*?":
            kind, nargs = kind[:-1], kind[-1]
        parser.add_argument(flag, type={"int": int, "float": float}.get(kind, str), nargs=nargs, dest=flag)
    return parser


PARSER = _parser()


def problems(argv: tuple[str, ...]) -> list[str]:
    """Every way ``argv`` breaks the table, by flag: unknown, repeated, or a value of the wrong kind or count."""
    found, seen = [], set()
    groups: list[list[str]] = []
    for arg in argv:
        if arg.startswith("--"):
            groups.append([arg])
        elif groups:
            groups[-1].append(arg)
        else:
            found.append(f"{arg!r} comes before any flag")
    for flag, *values in groups:
        if flag in seen:
            found.append(f"{flag} is given twice")
        seen.add(flag)
        kind = FLAGS.get(flag)
        if kind is None:
            found.append(f"{flag} is not a Megatron-LM flag (commit {COMMIT[:8]})")
        elif kind in NO_VALUE and values:
            found.append(f"{flag} takes no value, got {values}")
        elif kind == "int" and not (len(values) == 1 and values[0].lstrip("-").isdigit()):
            found.append(f"{flag} takes one integer, got {values}")
    try:
        _, extra = PARSER.parse_known_args(list(argv))
    except argparse.ArgumentError as err:
        found.append(f"Megatron-LM's parser refuses it: {err}")
    else:
        if extra:  # what parse_args (pretrain_gpt.py: ignore_unknown_args=False) stops at
            found.append(f"Megatron-LM's parser refuses it: unrecognized arguments: {' '.join(extra)}")
    return found


def _argv(layout: str, overrides=()) -> tuple[str, ...]:
    return compile(load_layout(SHIPPED / f"{layout}.yaml", list(overrides))).renders.megatron


@pytest.mark.parametrize("layout", LAYOUTS, ids=[p.stem for p in LAYOUTS])
def test_every_shipped_argv_is_megatron_lm_flags_only(layout):
    argv = _argv(layout.stem)
    assert problems(argv) == []
    assert not [a for a in argv if a.startswith("--specdraft")]


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_optional_flags_are_megatron_lm_flags_too(name):
    layout, overrides = VARIANTS[name]
    assert problems(_argv(layout, overrides)) == []


def test_the_check_catches_what_megatron_lm_refuses():
    assert problems(("--specdraft-plan", "plan.json")) == [
        "--specdraft-plan is not a Megatron-LM flag (commit d98e8a64)",
        "Megatron-LM's parser refuses it: unrecognized arguments: --specdraft-plan plan.json",
    ]
    assert any("takes no value" in p for p in problems(("--swiglu", "true")))
    assert any("one integer" in p for p in problems(("--num-layers", "2.5")))
    assert any("invalid choice" in p for p in problems(("--normalization", "rmsnorm")))
    assert any("twice" in p for p in problems(("--bf16", "--bf16")))
    assert any("invalid float" in p for p in problems(("--norm-epsilon", "tiny")))


def test_the_flags_build_the_named_model():
    pairs = {}
    for flag, value in zip(argv := _argv("llama3.1-8b-pat"), (*argv[1:], "")):
        pairs[flag] = value if not value.startswith("--") else None
    assert pairs["--normalization"] == "RMSNorm" and pairs["--norm-epsilon"] == "1e-05"
    assert pairs["--rotary-base"] == "500000" and pairs["--rope-scaling-factor"] == "8.0"
    assert "--use-rope-scaling" in argv and "--disable-bias-linear" in argv and "--swiglu" in argv
    assert pairs["--attention-dropout"] == pairs["--hidden-dropout"] == "0.0"
    assert pairs["--position-embedding-type"] == "rope" and pairs["--num-query-groups"] == "8"
    assert pairs["--max-position-embeddings"] == "131072" and "--untie-embeddings-and-output-weights" in argv
    qwen = _argv("qwen3-8b")
    assert "--qk-layernorm" in qwen and "--use-rope-scaling" not in qwen
    assert dict(zip(qwen, qwen[1:]))["--rotary-base"] == "1000000"
