"""draft.path when a layout loads: a tiny EAGLE-3 checkpoint of each published layout (vLLM, SpecForge, speculators)
that fits the built-in layout loads; each aux-layer numbering is converted (the naive reading is one layer off and
refused, naming both sets); every mismatch of shape, vocabulary, layers, heads, RoPE, norm_before_residual or an
unsupported flag is refused with the config key, the layout field and both values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdraft import eagle3_checkpoint
from specdraft.errors import SpecError
from specdraft.spec.checkpoints.draft import expected, review
from specdraft.spec.load import load_layout
from tests.support import eagle3_formats

pytest.importorskip("safetensors")
# tiny-cpu: 8 layers, hidden 64, ffn 256, 4 heads, 2 K/V heads (head_dim 16), vocabulary 128; default taps [1, 3, 4]
SHAPE = dict(hidden=64, ffn=256, heads=4, kv_heads=2, head_dim=16, vocab=128)
FORMATS = ("vllm", "specforge", "speculators")


def make(folder: Path, fmt: str, aux=(1, 3, 4), draft_vocab=128, fields=None, **extra) -> Path:
    tensors = eagle3_formats.weights(**SHAPE, draft_vocab=draft_vocab)
    f = eagle3_formats.llama_fields(**SHAPE) | (fields or {})
    return eagle3_formats.write(fmt, folder, tensors, f, draft_vocab, None if aux is None else list(aux), **extra)


def load(folder: Path, *over: str):
    return load_layout(None, [f"draft.path={folder}", *over])


def refused(folder: Path, *over: str) -> str:
    with pytest.raises(SpecError) as err:
        load(folder, *over)
    return str(err.value)


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_that_fits_the_layout_loads(tmp_path, fmt):
    spec = load(make(tmp_path / fmt, fmt))
    assert spec.draft.path == str(tmp_path / fmt)


def test_each_formats_numbering_of_the_taps_is_converted(tmp_path):
    """The same taps (outputs of layers 1, 3, 4) as each writer numbers them."""
    vllm = json.loads((make(tmp_path / "v", "vllm") / "config.json").read_text())
    assert vllm["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]  # vLLM counts layer inputs
    specforge = json.loads((make(tmp_path / "s", "specforge") / "config.json").read_text())
    assert specforge["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]  # SpecForge counts outputs
    for folder in ("v", "s"):
        found, problems = eagle3_checkpoint.read(tmp_path / folder)
        assert problems == [] and found.aux_outputs == (1, 3, 4)
    found, _ = eagle3_checkpoint.read(make(tmp_path / "sp", "speculators"))
    assert found.aux_outputs == (1, 3, 4)
    found, _ = eagle3_checkpoint.read(make(tmp_path / "none", "specforge", aux=None))
    assert found.aux_outputs is None  # SpecForge's default taps: the layout's default ones
    load(tmp_path / "none")


def test_vllm_ids_read_as_outputs_would_be_one_layer_off_and_are_refused(tmp_path):
    """A vLLM-format file whose top-level ids are [1, 3, 4] taps the outputs of layers 0, 2, 3."""
    folder = make(tmp_path / "v", "vllm", aux=(0, 2, 3))
    config = json.loads((folder / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    message = refused(folder)
    assert "draft.aux_layers" in message and "outputs of layers [0, 2, 3]" in message
    assert "not the layout's [1, 3, 4]" in message and "set draft.aux_layers=[0, 2, 3]" in message
    load(folder, "draft.aux_layers=[0,2,3]")
    # speculators numbers them as vLLM does: [2, 4, 5] is the default taps, [1, 3, 4] is not
    assert "outputs of layers [0, 2, 3]" in refused(make(tmp_path / "sp", "speculators", aux=(0, 2, 3)))


def test_unsorted_layout_taps_match_a_checkpoint_as_a_set(tmp_path):
    load(make(tmp_path / "v", "vllm", aux=(1, 3, 4)), "draft.aux_layers=[4,1,3]")


def test_two_contradicting_tap_sets_in_one_file_are_refused(tmp_path):
    folder = make(tmp_path / "v", "vllm", eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 4, 5]})
    assert "name different layers" in refused(folder)


@pytest.mark.parametrize(
    ("fields", "key", "layout"),
    [
        ({"hidden_size": 32}, "hidden_size is 32", "model.hidden_size is 64"),
        ({"intermediate_size": 128}, "intermediate_size is 128", "model.ffn_hidden_size is 256"),
        ({"num_attention_heads": 2, "head_dim": 16}, "num_attention_heads is 2", "model.num_attention_heads is 4"),
        ({"num_key_value_heads": 4}, "num_key_value_heads is 4", "model.num_query_groups is 2"),
        ({"vocab_size": 256}, "vocab_size is 256", "model.vocab_size is 128"),
        ({"num_hidden_layers": 2}, "num_hidden_layers is 2", "draft.num_layers is 1"),
        ({"rope_theta": 500000.0}, "rope_theta is 500000.0", "model.rotary_base is 10000.0"),
        ({"rms_norm_eps": 1e-6}, "rms_norm_eps is 1e-06", "model.norm_epsilon is 1e-05"),
    ],
)
@pytest.mark.parametrize("fmt", ("vllm", "speculators"))
def test_a_draft_that_does_not_fit_the_policy_is_refused_naming_both(tmp_path, fmt, fields, key, layout):
    message = refused(make(tmp_path / fmt, fmt, fields=fields))
    assert "draft.path" in message and key in message and layout in message


def test_the_draft_vocabulary_must_be_the_layouts(tmp_path):
    message = refused(make(tmp_path / "v", "vllm", draft_vocab=32))
    assert "draft_vocab_size is 32" in message and "set draft.vocab_size=32" in message
    load(tmp_path / "v", "draft.vocab_size=32")
    assert "draft_vocab_size is 128" in refused(make(tmp_path / "w", "vllm"), "draft.vocab_size=32")


def test_norm_before_residual_must_be_what_the_draft_was_trained_with(tmp_path):
    folder = make(tmp_path / "sp", "speculators", norm_before_residual=True)
    message = refused(folder)
    assert "norm_before_residual is True" in message and "set draft.norm_before_residual=true" in message
    assert load(folder, "draft.norm_before_residual=true").draft.norm_before_residual
    folder = make(tmp_path / "v", "vllm")
    assert "norm_before_residual is False" in refused(folder, "draft.norm_before_residual=true")


@pytest.mark.parametrize("fmt", ["vllm", "speculators"])
def test_norm_output_is_the_checkpoints_unless_the_layout_says_otherwise(tmp_path, fmt):
    eagle31 = make(tmp_path / "31", fmt, norm_output=True)
    assert load(eagle31).draft.norm_output is True
    eagle3 = make(tmp_path / "3", fmt)
    assert load(eagle3).draft.norm_output is False  # EAGLE-3: the un-normalised hidden state from step to step
    message = refused(eagle3, "draft.norm_output=true")
    assert "norm_output is False, but draft.norm_output is True" in message
    assert "set draft.norm_output=false" in message
    assert "set draft.norm_output=true" in refused(eagle31, "draft.norm_output=false")


def test_a_draft_from_random_weights_carries_the_post_norm_hidden_state():
    assert load_layout(None).draft.norm_output is True  # EAGLE-3.1's norm_output


def test_speculators_without_norm_before_residual_is_ambiguous_and_refused(tmp_path):
    folder = make(tmp_path / "sp", "speculators")
    config = json.loads((folder / "config.json").read_text())
    del config["norm_before_residual"]
    (folder / "config.json").write_text(json.dumps(config))
    message = refused(folder)
    assert "norm_before_residual is missing" in message and "vLLM reads it as true" in message


@pytest.mark.parametrize(
    ("fmt", "extra", "text"),
    [
        ("vllm", {"fc_norm": True}, "fc_norm is true"),
        ("speculators", {"norm_before_fc": True}, "norm_before_fc is true"),
        ("specforge", {"norm_output": False}, "norm_output is false in a SpecForge-layout config"),
        ("specforge", {"norm_output": True}, "norm_output is true in a SpecForge-layout config"),
        ("vllm", {"attention_bias": True}, "attention_bias is true"),
        ("vllm", {"target_hidden_size": 128}, "target_hidden_size 128"),
        ("vllm", {"architectures": ["LlamaForCausalLM"]}, "is no EAGLE-3 draft"),
        ("vllm", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "llama3 scaling only"),
    ],
)
def test_what_specdrafts_draft_cannot_build_is_refused(tmp_path, fmt, extra, text):
    assert text in refused(make(tmp_path / fmt, fmt, **extra))


def test_a_qwen3_speculators_layer_is_refused(tmp_path):
    folder = make(tmp_path / "sp", "speculators")
    config = json.loads((folder / "config.json").read_text())
    config["transformer_layer_config"]["model_type"] = "qwen3"
    (folder / "config.json").write_text(json.dumps(config))
    assert "transformer_layer_config.model_type 'qwen3'" in refused(folder)


def test_a_missing_relative_or_broken_path_is_refused(tmp_path):
    assert "is not a folder" in refused(tmp_path / "nowhere")
    assert "must be an absolute path" in refused(Path("relative/draft"))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    assert "is not JSON" in refused(tmp_path / "broken")
    assert "for a draft that is off" in refused(make(tmp_path / "v", "vllm"), "draft.enabled=false")


def test_a_draft_limited_below_seq_length_gets_a_note_naming_the_field(tmp_path):
    spec = load(make(tmp_path / "s", "specforge"))  # SpecForge's configs say max_position_embeddings 2048
    assert not [n for n in review(spec)[1] if "max_position_embeddings" in n]  # seq_length 64
    found, _ = eagle3_checkpoint.read(tmp_path / "s")
    want = expected(spec)
    _, notes = eagle3_checkpoint.check(found, type(want)(**{**want.__dict__, "seq_length": 4096}))
    assert len(notes) == 1 and "max_position_embeddings 2048 is below model.seq_length 4096" in notes[0]


def test_a_full_vocabulary_d2t_which_vllm_refuses_is_noted_on_import_and_refused_as_draft_model(tmp_path):
    """SpecForge saves its identity d2t/t2d with a full vocabulary; vLLM 0.32 makes draft_id_to_target_id only for
    a reduced one and fails that load ("There is no module or parameter named 'draft_id_to_target_id'"). The import
    ignores d2t (tests/unit/runtime/test_eagle3_import.py: its export holds none), so draft.path takes it with a
    note; draft.model, the folder the renders hand to vLLM, is refused with the fix."""
    from safetensors import safe_open

    folder = make(tmp_path / "s", "specforge")
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert {"d2t", "t2d"} <= set(f.keys())  # the real file holds them
    assert eagle3_checkpoint.tensor_names(folder) >= {"d2t", "t2d", "fc.weight"}
    [note] = review(load(folder))[1]
    assert "holds a d2t tensor with a full draft vocabulary (draft_vocab_size = vocab_size = 128)" in note
    assert "draft_id_to_target_id" in note and "serve the run's export" in note
    text = refused(folder, f"draft.model={folder}")
    assert "draft.model" in text and "which vLLM refuses to load" in text and "specdraft export RUN -o DIR" in text
    # vLLM loads a reduced vocabulary's d2t, and a full vocabulary without one
    reduced = make(tmp_path / "r", "specforge", draft_vocab=64)
    assert load(reduced, "draft.vocab_size=64", f"draft.model={reduced}").draft.model == str(reduced)
    plain = make(tmp_path / "v", "vllm")
    assert "d2t" not in eagle3_checkpoint.tensor_names(plain)
    assert review(load(plain, f"draft.model={plain}"))[1] == []


def test_draft_model_is_an_absolute_path_or_a_hub_id(tmp_path):
    from specdraft.assemble import compile

    assert compile(load_layout(None, ["draft.model=org/eagle3-draft"])).draft.model == "org/eagle3-draft"
    for relative in ("checkpoints/draft/step-3", "./draft", "~/draft", "../draft"):
        with pytest.raises(SpecError, match="must be an absolute path or a hub id"):
            compile(load_layout(None, [f"draft.model={relative}"]))


def test_an_imported_draft_warms_its_learning_rate_up_by_default(tmp_path):
    """draft.lr_warmup_steps null: 20 steps with draft.path (one full-rate AdamW step cut an imported draft's
    accept length from 2.39 to 1.45, docs/models.md), none for a random draft; a value given is kept."""
    from specdraft.assemble import compile

    folder = make(tmp_path / "v", "vllm")
    assert compile(load(folder)).draft.lr_warmup_steps == 20
    assert compile(load(folder, "draft.lr_warmup_steps=0")).draft.lr_warmup_steps == 0
    assert compile(load_layout(None)).draft.lr_warmup_steps == 0
    assert compile(load_layout(None, ["draft.lr_warmup_steps=5"])).draft.lr_warmup_steps == 5
    with pytest.raises(SpecError, match="draft.lr_warmup_steps = -1: must be >= 0"):
        compile(load_layout(None, ["draft.lr_warmup_steps=-1"]))
