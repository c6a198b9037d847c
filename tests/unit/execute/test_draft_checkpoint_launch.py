"""The launch's check of draft.path from the plan's own sections (a plan.json launch skips the layout's load-time
check): a checkpoint changed since the plan was compiled is refused before anything is written, and a draft limited
below seq_length (SpecForge's configs say max_position_embeddings 2048) is a note naming the field, and so is a full
vocabulary's d2t, which vLLM would refuse."""

from __future__ import annotations

import json

import pytest

from specdraft.assemble import compile
from specdraft.errors import SpecError
from specdraft.execute.launch import check_draft_checkpoint
from specdraft.spec.load import load_layout
from tests.support import eagle3_formats

pytest.importorskip("safetensors")
SHAPE = dict(hidden=64, ffn=256, heads=4, kv_heads=2, head_dim=16, vocab=128)


def _write(folder, fmt="specforge"):
    tensors = eagle3_formats.weights(**SHAPE, draft_vocab=128)
    return eagle3_formats.write(fmt, folder, tensors, eagle3_formats.llama_fields(**SHAPE), 128, [1, 3, 4])


def test_a_checkpoint_changed_since_the_plan_is_refused_at_launch(tmp_path):
    folder = _write(tmp_path / "v", "vllm")
    plan = compile(load_layout(None, [f"draft.path={folder}"]))
    assert check_draft_checkpoint(plan) == ()
    config = json.loads((folder / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = [1, 3, 4]
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [0, 2, 3]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecError, match=r"outputs of layers \[0, 2, 3\]"):
        check_draft_checkpoint(plan)


def test_a_draft_limited_below_seq_length_is_a_launch_note(tmp_path):
    folder = _write(tmp_path / "s")
    plan = compile(load_layout(None, [f"draft.path={folder}", "model.seq_length=4096"]))
    note, d2t = check_draft_checkpoint(plan)
    assert "max_position_embeddings 2048 is below model.seq_length 4096" in note
    assert "writes the policy's max_position_embeddings" in note
    # SpecForge's identity d2t beside its full vocabulary: vLLM would not serve that folder as it is
    assert "holds a d2t tensor with a full draft vocabulary" in d2t and "serve the run's export" in d2t
