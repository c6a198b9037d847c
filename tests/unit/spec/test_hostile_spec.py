"""Hostile and absurd layouts end in a SpecError naming the field (exit 2 at the CLI), never an internal error.

Each class of hostile value (non-finite floats, absurd integers, 0 for null, control characters, the missing
marker) is tested over every field it applies to, found from the schema's types, not over one example.
"""

from __future__ import annotations

import typing
from dataclasses import fields, is_dataclass

import pytest
from omegaconf import OmegaConf

from specdraft.assemble import check, compile
from specdraft.errors import MAX_LISTED_PROBLEMS, SpecError, UserError
from specdraft.spec import bounds
from specdraft.spec.load import builtin_layout_text, load_layout, load_layout_text
from specdraft.spec.schema import LayoutSpec

TINY = builtin_layout_text()


def leaf_fields(cls=LayoutSpec, prefix=""):
    """(path, type) of every non-section field."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        tp = hints[f.name]
        if is_dataclass(tp):
            yield from leaf_fields(tp, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", tp


def admits(tp, kind) -> bool:
    return tp is kind or kind in typing.get_args(tp)


FLOAT_FIELDS = [p for p, tp in leaf_fields() if admits(tp, float)]
INT_FIELDS = [p for p, tp in leaf_fields() if admits(tp, int) or any(admits(a, int) for a in typing.get_args(tp))]
LIST_FIELDS = {
    p
    for p, tp in leaf_fields()
    if typing.get_origin(tp) is list or any(typing.get_origin(a) is list for a in typing.get_args(tp))
}
STR_FIELDS = [p for p, tp in leaf_fields() if tp is str or tp == typing.Optional[str]]


def problems_of(overrides=(), text=TINY) -> list:
    """Every problem `validate` (and so `plan`) reports; [] for a valid layout."""
    try:
        spec = load_layout_text(text, list(overrides))
    except SpecError as err:
        return list(err.problems)
    return check(spec)[0]


def refused(path, overrides=(), text=TINY):
    found = problems_of(overrides, text)
    assert any(p.path == path for p in found), f"{path} not refused: {[p.render() for p in found]}"
    return [p for p in found if p.path == path]


def test_the_float_fields_are_the_ones_the_issue_names_and_more():
    assert {
        "training.lr",
        "training.clip_grad",
        "draft.lr",
        "draft.loss_weight",
        "draft.clip_grad",
        "rollout.acceptance_rate",
        "rollout.gpu_memory_utilization",
    } <= set(FLOAT_FIELDS)


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "1e400"])
def test_nan_and_inf_are_refused_for_every_float_field(value):
    for path in FLOAT_FIELDS:
        [problem] = refused(path, [f"{path}={value}"])
        assert "finite" in problem.rule, problem.render()
    # and through a YAML file, and never as far as the Megatron argv
    with pytest.raises(SpecError, match="training.lr = nan"):
        compile(load_layout_text(TINY.replace("lr: 3.0e-3", "lr: .nan")))


def test_absurd_integers_are_refused_by_name_for_every_int_field():
    for path in INT_FIELDS:
        is_list = path in LIST_FIELDS
        for value in ("1e300", "1e30", str(2**70), str(-(2**70))):
            [problem] = refused(
                f"{path}[0]" if is_list else path, [f"{path}=[{value}]" if is_list else f"{path}={value}"]
            )
            assert "bound" in problem.rule, problem.render()
    refused("training.seed", ["training.seed=-1"])
    assert problems_of(["training.seed=4294967295"]) == []


@pytest.mark.parametrize(
    "overrides, path",
    [
        (["training.global_batch_size=0"], "training.global_batch_size"),
        (["training.global_batch_size=-8"], "training.global_batch_size"),
        (["model.kv_channels=0"], "model.kv_channels"),
        (["model.kv_channels=-16"], "model.kv_channels"),
        (["rollout.max_model_len=0"], "rollout.max_model_len"),
        (["training.sequence_lengths=[]"], "training.sequence_lengths"),
        (["model.num_experts=8", "model.moe_ffn_hidden_size=0", "parallel.ep=2"], "model.moe_ffn_hidden_size"),
    ],
)
def test_zero_is_an_error_where_null_means_the_default(overrides, path):
    refused(path, overrides)


def test_control_characters_and_undecodable_text_are_refused_in_every_string_field():
    # Raw in the argument (as a shell passes NUL-free bytes, or undecodable ones as surrogates), and as YAML escapes.
    values = ["a\x1bb", "a\udcffb", '"a\\0b"', '"a\\eb"', '"a\\nb"', '"a\\x85b"', '"a\\tb"']
    for path in STR_FIELDS:
        for bad in values:
            found = problems_of([f"{path}={bad}"])
            assert any(p.path == path for p in found), (path, repr(bad), [p.render() for p in found])
    refused("slurm.container_mounts[0]", ['slurm.container_mounts=["/a:/b\\0"]'])
    refused("slurm.env.X", ['slurm.env={X: "a\\0b"}'])
    assert problems_of(['slurm.env={X: "two\\nlines\\tand a tab"}']) == [], "shell-quoted env values keep them"


def test_missing_marker_and_resolvers_are_refused_not_ignored(monkeypatch):
    refused("parallel.tp", ["parallel.tp=???"])
    refused("name", text=TINY.replace("name: tiny-cpu", "name: ???"))
    monkeypatch.setenv("SPECDRAFT_TEST_SECRET", "s3cret")
    [problem] = refused("model.path", ["model.path=${oc.env:SPECDRAFT_TEST_SECRET}"])
    assert "resolvers" in problem.rule and "s3cret" not in problem.render()
    calls = []
    OmegaConf.register_resolver("spy", lambda *a: calls.append(a) or "x", replace=True)
    try:
        refused("model.path", ["model.path=${spy:1}"])
        refused("draft.model", text=TINY.replace("  lr: 1.0e-2", "  lr: 1.0e-2\n  model: ${spy:2}"))
    finally:
        OmegaConf.clear_resolver("spy")
    assert calls == [], "a resolver ran"


def test_colon_numbers_stay_text_as_in_yaml_1_2():
    # YAML 1.1 reads 1:30:00 as the base-60 integer 5400: slurm.time would silently become 5400 minutes.
    assert load_layout_text(TINY, ["slurm.time=1:30:00"]).slurm.time == "1:30:00"
    assert load_layout_text(TINY.replace('time: "00:10:00"', "time: 1:30:00")).slurm.time == "1:30:00"
    refused("parallel.tp", ["parallel.tp=1:2"])  # not 62


def test_plain_references_work_and_explosive_ones_are_refused():
    spec = load_layout_text(TINY, ["draft.model=${name}-eagle3", "draft.lr=${training.lr}"])
    assert spec.draft.model == "tiny-cpu-eagle3" and spec.draft.lr == spec.training.lr
    refused("draft.model", ["draft.model=${model}"])  # a whole section
    refused("draft.model", ["draft.model=${name}${name}"])  # two references
    refused("draft.model", ["draft.model=${nope}"])
    refused("draft.model", ["draft.model=${draft.model}"])  # a cycle
    # A doubling chain would resolve to 2**40 characters; it is refused before anything resolves.
    chain = "".join(f"c{i}: ${{c{i - 1}}}${{c{i - 1}}}\n" for i in range(1, 41))
    assert problems_of(text=TINY + "c0: ab\n" + chain)
    lists = "".join(f"l{i}: [${{l{i - 1}}}, ${{l{i - 1}}}]\n" for i in range(1, 41))
    assert problems_of(text=TINY + "l0: [1]\n" + lists)
    # Resolving builds OmegaConf's slow containers, so a layout that interpolates is bounded in size too.
    lengths = ", ".join(["16"] * 30_000)
    long = TINY.replace("  lr: 3.0e-3", f"  lr: 3.0e-3\n  sequence_lengths: [{lengths}]")
    with pytest.raises(SpecError, match="at most 20,000 values"):
        load_layout_text(long, ["draft.model=${name}"])
    assert len(load_layout_text(long).training.sequence_lengths) == 30_000


@pytest.mark.parametrize(
    "text, needle",
    [
        ("42\n", "mapping"),
        ("- a\n- b\n", "mapping"),
        ("name: ${\n", "not a valid interpolation"),
        ("name: [unclosed\n", "YAML syntax error"),
        ("name: x\nname: y\n", "YAML syntax error"),
        (
            "a: &a [1, 2]\nb: *a\n"
            + "".join(f"x{i}: &x{i} [*x{i - 1}, *x{i - 1}, *x{i - 1}]\n" for i in range(1, 30)).replace("*x0", "*a"),
            "YAML nodes",
        ),
        ("k: " + "[" * 2000 + "]" * 2000 + "\n", "YAML syntax error"),
        ("n: 1" + "0" * 5000 + "\n", "cannot read a value"),
    ],
)
def test_malformed_yaml_is_a_spec_error(text, needle):
    with pytest.raises(SpecError, match=needle):
        load_layout_text(text)


def test_non_utf8_and_oversized_files_are_refused(tmp_path):
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(TINY.replace("tiny-cpu", "tiny-cpu-\xe9").encode("latin-1"))
    with pytest.raises(SpecError, match="not UTF-8"):
        load_layout(bad)
    big = tmp_path / "big.yaml"
    big.write_text(TINY + "#" * bounds.MAX_LAYOUT_BYTES)
    with pytest.raises(UserError, match="the limit is"):
        load_layout(big)


def test_a_long_legitimate_list_loads_and_an_over_long_one_is_bounded():
    lengths = ", ".join(["16"] * 12_000)
    text = TINY.replace("  lr: 3.0e-3", f"  lr: 3.0e-3\n  sequence_lengths: [{lengths}]")
    assert len(load_layout_text(text).training.sequence_lengths) == 12_000
    block = "".join("  - 16\n" for _ in range(12_000))
    assert (
        len(
            load_layout_text(
                TINY.replace("  lr: 3.0e-3", "  lr: 3.0e-3\n  sequence_lengths:\n" + block)
            ).training.sequence_lengths
        )
        == 12_000
    )
    too_many = ", ".join(["1"] * 110_000)
    [problem] = refused(
        "training.sequence_lengths",
        text=TINY.replace("  lr: 3.0e-3", f"  lr: 3.0e-3\n  sequence_lengths: [{too_many}]"),
    )
    assert "bound" in problem.rule


def test_echoed_values_and_problem_lists_are_bounded():
    huge = "x" * 50_000_000
    with pytest.raises(SpecError) as err:
        load_layout_text(TINY, [f"model.path={huge}"])
    assert len(str(err.value)) < 2000
    with pytest.raises(SpecError) as err:
        load_layout_text(TINY + f"model_typo: {'y' * 500_000}\n")
    assert len(str(err.value)) < 2000
    zeros = ", ".join(["0"] * 5000)
    spec = load_layout_text(TINY.replace("  lr: 3.0e-3", f"  lr: 3.0e-3\n  sequence_lengths: [{zeros}]"))
    errors = check(spec)[0]
    assert len(errors) == 5000
    text = str(SpecError(errors))
    assert text.count("\n  - ") == MAX_LISTED_PROBLEMS and "4900 more" in text


@pytest.mark.parametrize(
    "overrides, path",
    [
        (["cluster.num_nodes=1000000", "cluster.gpus_per_node=8"], "cluster.num_nodes"),
        (["cluster.num_nodes=131072", "cluster.gpus_per_node=64"], "cluster"),
        (
            ["rollout.enabled=true", "rollout.colocated=false", "rollout.num_nodes=100000", "cluster.gpus_per_node=8"],
            "rollout.num_nodes",
        ),
        (["rollout.num_prompts_per_step=100000"], "rollout.num_prompts_per_step"),
        (
            ["rollout.num_prompts_per_step=16384", "rollout.num_generations_per_prompt=8"],
            "rollout.num_prompts_per_step",
        ),
    ],
)
def test_validate_and_plan_refuse_the_same_out_of_bound_layouts(overrides, path):
    try:
        spec = load_layout_text(TINY, overrides)
    except SpecError as err:
        assert any(p.path == path for p in err.problems)
        return
    errors = check(spec)[0]
    assert [p.path for p in errors] == [path], errors
    with pytest.raises(SpecError) as err:
        compile(spec)
    assert [p.path for p in err.value.problems] == [path]
