"""Loading layouts: YAML + dotlist overrides into frozen dataclasses, every problem reported at once."""

from __future__ import annotations

import dataclasses

import pytest

from specdraft.errors import SpecError, UserError
from specdraft.spec.docs import all_fields, explain
from specdraft.spec.load import builtin_layout_text, load_layout, load_layout_text, spec_from_dict, spec_to_dict
from specdraft.spec.schema import LayoutSpec
from tests.support.paths import REPO, SHIPPED

MINIMAL = """
name: t
model: {num_layers: 8, hidden_size: 64, ffn_hidden_size: 128, num_attention_heads: 4, vocab_size: 100, seq_length: 64}
"""


def problems_of(text, overrides=()):
    with pytest.raises(SpecError) as info:
        load_layout_text(text, overrides)
    return {p.path: p for p in info.value.problems}


def test_builtin_default_loads_and_is_frozen():
    spec = load_layout(None)
    assert isinstance(spec, LayoutSpec)
    assert spec.name == "tiny-cpu" and spec.cluster.gpu == "cpu"
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "x"
    with pytest.raises(TypeError):
        LayoutSpec("positional", None)  # keyword-only


def test_dotlist_overrides_apply():
    spec = load_layout(None, ["parallel.cp=4", "cluster.num_nodes=2", "draft.stage=0", "slurm.env.FOO=bar"])
    assert spec.parallel.cp == 4 and spec.cluster.num_nodes == 2 and spec.draft.stage == 0
    assert spec.slurm.env == {"FOO": "bar"}


def test_unknown_key_suggests_closest_name():
    found = problems_of(MINIMAL + "paralel: {tp: 2}\n")
    assert "paralel" in found and "parallel" in found["paralel"].fix
    found = problems_of(MINIMAL, ["parallel.cpp=2"])
    assert "parallel.cpp" in found and "parallel.cp" in found["parallel.cpp"].fix


def test_wrong_types_and_missing_fields_are_all_reported():
    text = "name: t\nmodel: {num_layers: eight, hidden_size: 64}\nparallel: {tp: 1.5, sequence_parallel: maybe}\n"
    found = problems_of(text)
    assert found["model.num_layers"].rule.startswith("must be an integer")
    assert found["parallel.tp"].rule.startswith("must be an integer")
    assert found["parallel.sequence_parallel"].rule.startswith("must be a boolean")
    for required in ("model.ffn_hidden_size", "model.num_attention_heads", "model.vocab_size", "model.seq_length"):
        assert found[required].rule == "is required"


def test_literal_fields_suggest_a_valid_choice():
    found = problems_of(MINIMAL, ["training.dtype=bf61", "parallel.cp_comm_type=p2"])
    assert "'bf16'" in found["training.dtype"].fix
    assert "'p2p'" in found["parallel.cp_comm_type"].fix


def test_yaml_syntax_error_names_the_position():
    found = problems_of("name: t\nmodel: [unclosed\n")
    assert "<yaml>" in found and "line" in str(found["<yaml>"].value)


def test_bad_override_syntax_is_reported():
    found = problems_of(MINIMAL, ["parallel.cp"])
    assert found["<override>"].value == "parallel.cp"


def test_field_rules_run_even_when_a_field_failed_to_load():
    found = problems_of(MINIMAL, ["parallel.bogus=1", "parallel.tp=3"])
    assert "parallel.bogus" in found and "parallel.tp" in found


def test_no_rule_judges_the_default_that_stood_in_for_a_bad_value():
    # train_iters='abc' loads as its default (20): the warmup rule would then blame warmup_steps=30 for a limit
    # the user never set. Rules that do not read the bad field still run.
    found = problems_of(builtin_layout_text(), ["training.train_iters=abc", "parallel.tp=3"])
    assert "training.train_iters" in found and "parallel.tp" in found
    assert "training.warmup_steps" not in found


@pytest.mark.parametrize(
    "overrides, kept",
    [
        (["rollout.tp=abc", "parallel.tp=1", "parallel.sequence_parallel=true"], "parallel.sequence_parallel"),
        (["rollout.tp=abc", "parallel.tp=3"], "parallel"),  # the world-size rule reads parallel.tp, not rollout.tp
        (["training.time=1", "slurm.time=abc"], "slurm.time"),  # an unknown field stands in for nothing
        (["parallel.use=1", "parallel.tp=3"], "parallel.tp"),
    ],
)
def test_rules_that_do_not_read_the_bad_field_still_run(overrides, kept):
    assert kept in problems_of(builtin_layout_text(), overrides)


def test_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_layout(tmp_path / "nope.yaml")


def test_spec_round_trips_through_its_dict():
    spec = load_layout(None, ["draft.aux_layers=[1,2,3]"])
    assert spec_from_dict(spec_to_dict(spec)) == spec


def test_every_field_is_documented_and_explainable():
    docs = all_fields()
    assert len(docs) > 60
    assert [d.path for d in docs if not d.doc] == []
    (cp,) = explain("parallel.cp")
    assert cp.default == "1" and "Context-parallel" in cp.doc
    assert {d.path for d in explain("draft")} >= {"draft", "draft.ttt_steps", "draft.stage"}
    with pytest.raises(UserError, match="parallel.cp"):
        explain("parallel.cpx")


def test_shipped_default_is_the_packaged_file():

    assert builtin_layout_text() == (SHIPPED / "tiny-cpu.yaml").read_text()


def test_docs_spec_reference_is_current():

    from specdraft.spec.docs import markdown_reference
    from tests.support.golden_util import check_golden

    check_golden(REPO / "docs" / "spec.md", markdown_reference())
