"""One tensor check for every import (specdraft/hf_files.py::header_entries), policy and draft alike: safetensors'
own rules (offsets from 0, contiguous, no overlap, every byte a tensor's, bytes = prod(shape) x itemsize, known
dtypes), then the dtypes each import reads. Each hostile file is a real checkpoint with its header rewritten; the
policy's are also refused by safetensors' own loader (the reference), and a draft weight stored as int8 or fp8 is
refused by name, never converted.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specdraft.assemble import compile
from specdraft.runtime.models.eagle3_import import open_source
from specdraft.runtime.models.hf.checkpoint import CheckpointError, open_checkpoint
from specdraft.spec.load import load_layout
from tests.support import eagle3_formats, hf_models
from tests.support.model_files import rewrite_header

safetensors = pytest.importorskip("safetensors")
from safetensors.torch import load_file  # noqa: E402


def _name_of(header: dict, suffix: str) -> str:
    return next(n for n in header if n.endswith(suffix))


def _into_the_header(header: dict) -> None:
    """The norm's bytes moved 16 bytes back: into the header, with as many bytes as its shape needs."""
    entry = header[_name_of(header, "model.norm.weight")]
    begin, end = entry["data_offsets"]
    entry["data_offsets"] = [begin - (begin + 16), end - (begin + 16)]


def _overlap(header: dict) -> None:
    """Two tensors of one shape share their bytes."""
    a, b = _name_of(header, "layers.0.input_layernorm.weight"), _name_of(header, "layers.1.input_layernorm.weight")
    header[b]["data_offsets"] = list(header[a]["data_offsets"])


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return hf_models.make("llama", tmp_path_factory.mktemp("hf") / "llama")


@pytest.mark.parametrize(("change", "needle"), [(_into_the_header, "negative"), (_overlap, "overlap")])
def test_policy_bytes_their_header_does_not_own_are_refused_as_safetensors_refuses_them(
    llama, tmp_path, change, needle
):
    import shutil

    folder = Path(shutil.copytree(llama, tmp_path / "llama"))
    rewrite_header(folder / "model.safetensors", change)
    with pytest.raises(safetensors.SafetensorError):  # the reference: safetensors' own loader refuses the file
        load_file(str(folder / "model.safetensors"))
    plan = compile(load_layout(None, hf_models.overrides(folder)))
    with pytest.raises(CheckpointError) as err:
        open_checkpoint(plan.model, folder)
    text = str(err.value)
    assert str(folder / "model.safetensors") in text and needle in text and "tensor 'model." in text, text


SHAPE = dict(hidden=64, ffn=256, heads=4, kv_heads=2, head_dim=16, vocab=128)
AUX = [1, 3, 4]


def _draft(folder: Path, change=None, dtype=None) -> object:
    """A vLLM-format draft in ``folder``, its header changed by ``change`` or its up_proj stored as ``dtype``;
    returns the plan that imports it."""
    tensors = eagle3_formats.weights(**SHAPE, draft_vocab=128)
    if dtype is not None:
        name = "midlayer.mlp.up_proj.weight"
        tensors[name] = (tensors[name] * 100).to(dtype)
    eagle3_formats.write("vllm", folder, tensors, eagle3_formats.llama_fields(**SHAPE), 128, AUX)
    if change is not None:
        rewrite_header(folder / "model.safetensors", change)
    return compile(load_layout(None, [f"draft.path={folder}", f"draft.aux_layers={AUX}"]))


def _short(header: dict) -> None:
    """fc.weight promises fewer bytes than its shape needs (it would read its neighbour's)."""
    entry = header["fc.weight"]
    entry["shape"] = [entry["shape"][0] * 2, entry["shape"][1]]


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("short", "tensor 'fc.weight': data_offsets"),
        (torch.int8, "tensor 'midlayer.mlp.up_proj.weight' is I8"),
        (torch.float8_e4m3fn, "tensor 'midlayer.mlp.up_proj.weight' is F8_E4M3"),
    ],
    ids=["fewer bytes than its shape", "int8 weight", "fp8 weight"],
)
def test_draft_tensors_are_held_to_the_same_rules_and_dtypes(tmp_path, case, needle):
    plan = _draft(tmp_path / "d", change=_short if case == "short" else None, dtype=None if case == "short" else case)
    with pytest.raises(CheckpointError) as err:
        open_source(plan)
    text = str(err.value)
    assert needle in text and str(tmp_path / "d") in text, text
    if case != "short":
        assert "dequantise" in text, "the fix says what to do"


def test_a_draft_that_keeps_the_rules_still_imports(tmp_path):
    source = open_source(_draft(tmp_path / "d"))
    assert source is not None and source.tensors["fc.weight"].dtype == "F32"
