"""The draft's weights from an EAGLE-3 checkpoint (runtime/models/eagle3_import.py), at tp 1 in one process:

- each layout's tensors land in the draft bit for bit, fc's blocks permuted to draft.aux_layers order, and the
  EAGLE-3 export of the imported draft is the vLLM-format file again, byte for byte;
- the three layouts holding the same weights give the same draft;
- the reduced vocabulary's d2t/t2d are the checkpoint's (t2d derived where only d2t is stored);
- norm_before_residual reaches the draft's forward and its export;
- tensors the draft has no place for, wrong shapes, missing ones and a bad d2t are refused by name.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specdraft.assemble import compile
from specdraft.runtime.models.draft import Eagle3Draft, draft_shape
from specdraft.runtime.models.eagle3_import import load, open_source
from specdraft.runtime.models.hf.checkpoint import CheckpointError
from specdraft.runtime.models.target import transformer_config
from specdraft.runtime.serve import eagle3
from specdraft.spec.load import load_layout
from tests.support import eagle3_formats

safetensors = pytest.importorskip("safetensors.torch")
SHAPE = dict(hidden=64, ffn=256, heads=4, kv_heads=2, head_dim=16, vocab=128)
AUX = [4, 1, 3]  # unsorted: the checkpoint's fc blocks are in ascending order, the draft's in this one
FORMATS = ("vllm", "specforge", "speculators")


def plan_for(folder: Path, *over: str):
    return compile(load_layout(None, [f"draft.path={folder}", f"draft.aux_layers={AUX}", *over]))


def make(folder: Path, fmt: str, draft_vocab: int = 128, seed: int = 0, **extra):
    tensors = eagle3_formats.weights(**SHAPE, draft_vocab=draft_vocab, seed=seed)
    fields = eagle3_formats.llama_fields(**SHAPE)
    eagle3_formats.write(fmt, folder, tensors, fields, draft_vocab, sorted(AUX), **extra)
    return tensors


def imported(plan, read: list | None = None) -> Eagle3Draft:
    draft = Eagle3Draft(draft_shape(plan, tp=1), transformer_config(plan, torch.float32, torch.device("cpu")))
    for p in draft.parameters():
        torch.nn.init.constant_(p, 7.0)  # nothing of this may survive the import
    count = load(draft, open_source(plan), plan, tp_rank=0)
    if read is not None:
        read.append(count)
    return draft


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_layout_imports_bit_for_bit_and_exports_as_the_vllm_file(tmp_path, fmt):
    written = make(tmp_path / fmt, fmt)
    plan = plan_for(tmp_path / fmt)
    read: list[int] = []
    draft = imported(plan, read)
    assert read == [sum(v.nbytes for v in written.values())]  # each tensor once; no embed_tokens, no identity d2t
    state = draft.state_dict()
    h = SHAPE["hidden"]
    blocks = written["fc.weight"].split(h, dim=1)  # layers 1, 3, 4
    assert torch.equal(state["fc.weight"], torch.cat([blocks[2], blocks[0], blocks[1]], dim=1))
    assert torch.equal(state["layers.0.q_proj.weight"], written["midlayer.self_attn.q_proj.weight"])
    assert torch.equal(state["layers.0.hidden_norm.weight"], written["midlayer.hidden_norm.weight"])
    out = eagle3.tensors(state, plan)
    assert sorted(out) == sorted(written)
    for name, value in written.items():
        assert out[name].dtype == value.dtype, name
        assert torch.equal(out[name].view(torch.uint8), value.view(torch.uint8)), name


def test_the_three_layouts_holding_the_same_weights_give_the_same_draft(tmp_path):
    states = []
    for fmt in FORMATS:
        make(tmp_path / fmt, fmt, draft_vocab=48)
        states.append(imported(plan_for(tmp_path / fmt, "draft.vocab_size=48")).state_dict())
    for other in states[1:]:
        assert sorted(other) == sorted(states[0])
        for name, value in states[0].items():
            if not name.endswith("._extra_state"):  # megatron's per-layer metadata: None here
                assert torch.equal(other[name], value), name


def test_the_reduced_vocabulary_is_the_checkpoints(tmp_path):
    written = make(tmp_path / "v", "vllm", draft_vocab=48)
    draft = imported(plan_for(tmp_path / "v", "draft.vocab_size=48"))
    assert torch.equal(draft.vocab.d2t, written["d2t"]) and torch.equal(draft.vocab.t2d, written["t2d"])
    # vLLM reads d2t alone: a file without t2d gets it from d2t
    tensors = safetensors.load_file(str(tmp_path / "v" / "model.safetensors"))
    del tensors["t2d"]
    safetensors.save_file(tensors, str(tmp_path / "v" / "model.safetensors"))
    assert torch.equal(imported(plan_for(tmp_path / "v", "draft.vocab_size=48")).vocab.t2d, written["t2d"])


def test_a_d2t_that_is_no_ascending_mapping_or_disagrees_with_t2d_is_refused(tmp_path):
    make(tmp_path / "v", "vllm", draft_vocab=48)
    tensors = safetensors.load_file(str(tmp_path / "v" / "model.safetensors"))
    tensors["t2d"] = torch.roll(tensors["t2d"], 1)
    safetensors.save_file(tensors, str(tmp_path / "v" / "model.safetensors"))
    with pytest.raises(CheckpointError, match="d2t and t2d name different draft vocabularies"):
        imported(plan_for(tmp_path / "v", "draft.vocab_size=48"))
    tensors["d2t"] = torch.flip(tensors["d2t"], [0])
    safetensors.save_file(tensors, str(tmp_path / "v" / "model.safetensors"))
    with pytest.raises(CheckpointError, match="not ascending"):
        imported(plan_for(tmp_path / "v", "draft.vocab_size=48"))


class _Dense(torch.nn.Module):
    """A megatron linear's weight applied without a TP group (megatron's forward needs one)."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.w = weight

    def forward(self, x):
        return x @ self.w.T, None


def test_norm_before_residual_reaches_the_forward_and_the_export(tmp_path):
    make(tmp_path / "sp", "speculators", norm_before_residual=True)
    plan = plan_for(tmp_path / "sp", "draft.norm_before_residual=true")
    layer = imported(plan).layers[0]
    w = {name: getattr(layer, name).weight.detach() for name in ("o_proj", "gate_proj", "up_proj", "down_proj")}
    for name, weight in w.items():
        setattr(layer, name, _Dense(weight))
    hidden, attn = torch.randn(5, 64), torch.randn(5, 4, 16)

    def want(residual):
        out = residual + attn.flatten(1) @ w["o_proj"].T
        x = layer.post_attention_layernorm(out)
        return out + (torch.nn.functional.silu(x @ w["gate_proj"].T) * (x @ w["up_proj"].T)) @ w["down_proj"].T

    with torch.no_grad():
        assert torch.allclose(layer.finish(hidden, attn), want(layer.hidden_norm(hidden)), atol=1e-5)
        assert not torch.allclose(layer.finish(hidden, attn), want(hidden), atol=1e-3)
    assert eagle3.config(plan, torch.float32)["norm_before_residual"] is True


def _rewrite(folder: Path, change) -> None:
    tensors = safetensors.load_file(str(folder / "model.safetensors"))
    change(tensors)
    safetensors.save_file(tensors, str(folder / "model.safetensors"))


@pytest.mark.parametrize(
    ("change", "text"),
    [
        (lambda t: t.update({"midlayer.self_attn.q_norm.weight": torch.ones(16)}), "has no place for"),
        (lambda t: t.update({"fc_norm.0.weight": torch.ones(64)}), "has no place for: fc_norm.0.weight"),
        (lambda t: t.update({"midlayer.mlp.up_proj.weight": torch.ones(128, 64)}), "midlayer.mlp.up_proj.weight [128"),
        (lambda t: t.pop("norm.weight"), "tensors missing: norm.weight"),
    ],
)
def test_tensors_that_do_not_make_the_plans_draft_are_refused_by_name(tmp_path, change, text):
    make(tmp_path / "v", "vllm")
    _rewrite(tmp_path / "v", change)
    with pytest.raises(CheckpointError, match=text.replace("[", r"\[")):
        open_source(plan_for(tmp_path / "v"))


def test_the_ranks_refuse_a_config_that_changed_since_the_plan(tmp_path):
    make(tmp_path / "v", "vllm")
    plan = plan_for(tmp_path / "v")
    config = json.loads((tmp_path / "v" / "config.json").read_text())
    config["hidden_size"] = 32
    (tmp_path / "v" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="hidden_size is 32, but model.hidden_size is 64"):
        open_source(plan)
