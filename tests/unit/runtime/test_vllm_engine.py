"""`rollout measure --engine vllm` without vLLM running: its refusals (vLLM missing, a head size vLLM's CPU backend
cannot serve, an unknown engine) name the option or field and the fix; the served-export cache is reused only while
the checkpoint's hash and the files are what its marker recorded."""

from __future__ import annotations

import json

import pytest

from specdraft.assemble import compile
from specdraft.runtime.folders import LoadError, write_folder
from specdraft.runtime.serve import vllm_engine
from specdraft.spec.load import load_layout
from tests.support.cli import run_cli

MANIFEST = {"manifest": {"a.distcp": {"size": 3, "sha256": "0" * 64}}}


def test_a_missing_vllm_names_the_option_and_the_install(monkeypatch):
    monkeypatch.setattr(vllm_engine.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(LoadError) as err:
        vllm_engine.require_vllm()
    assert "--engine vllm" in err.value.message and "not installed" in err.value.message
    assert "specdraft[vllm]" in err.value.fix and "--engine builtin" in err.value.fix


def test_a_head_dim_the_cpu_backend_cannot_serve_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setattr(vllm_engine, "_on_cpu", lambda: True)
    plan = compile(load_layout(None, []))  # tiny-cpu: hidden 64 / 4 heads
    with pytest.raises(LoadError) as err:
        vllm_engine.require_servable(plan)
    message = err.value.message
    assert "head_dim is 16" in message and "model.hidden_size 64 / model.num_attention_heads 4" in message
    assert "32..512" in message and "model.hidden_size=128" in err.value.fix
    vllm_engine.require_servable(compile(load_layout(None, ["model.hidden_size=128"])))  # head_dim 32 serves
    monkeypatch.setattr(vllm_engine, "_on_cpu", lambda: False)
    vllm_engine.require_servable(plan)  # on a GPU the head size is vLLM's to judge


def test_a_draft_of_two_layers_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(vllm_engine, "_on_cpu", lambda: False)
    with pytest.raises(LoadError, match="draft.num_layers is 2"):
        vllm_engine.require_servable(compile(load_layout(None, ["draft.num_layers=2"])))


def test_the_cli_refuses_an_unknown_engine():
    proc = run_cli("rollout", "measure", "nowhere", "--engine", "sglang")
    assert proc.returncode == 2 and "--engine 'sglang'" in proc.stderr and "--engine vllm" in proc.stderr


def _export(folder, sha: str) -> None:
    def fill(tmp):
        (tmp / "config.json").write_text("{}\n")
        (tmp / "model.safetensors").write_bytes(b"weights")

    write_folder(folder, fill, {"checkpoint_sha256": sha})


def test_the_cache_is_reused_only_for_the_same_checkpoint_and_intact_files(tmp_path):
    sha = vllm_engine.checkpoint_sha256(MANIFEST)
    folder = tmp_path / "policy"
    assert not vllm_engine._holds(folder, sha)  # nothing there yet
    _export(folder, sha)
    assert vllm_engine._holds(folder, sha)
    other = {"manifest": {"a.distcp": {"size": 3, "sha256": "1" * 64}}}
    assert not vllm_engine._holds(folder, vllm_engine.checkpoint_sha256(other)), "another checkpoint's content"
    (folder / "model.safetensors").write_bytes(b"damaged")
    assert not vllm_engine._holds(folder, sha), "a file changed after the export"
    _export(folder, sha)
    (folder / "extra.bin").write_bytes(b"")
    assert not vllm_engine._holds(folder, sha), "a file the export did not write"
    _export(folder, sha)
    (folder / "specdraft-export.json").write_text(json.dumps(["not", "a", "record"]))
    assert not vllm_engine._holds(folder, sha)


def test_the_cache_is_read_through_the_run_folder_guards(tmp_path):
    """A FIFO where the marker names a file (or a link, or a marker that is no JSON) is no cached export: it is
    exported again, never opened and waited on. Without a writer the FIFO would block a plain open() forever; the
    check runs on a thread so that old behaviour fails this test instead of hanging it."""
    import os
    import threading

    sha = vllm_engine.checkpoint_sha256(MANIFEST)
    folder = tmp_path / "policy"
    weights = folder / "model.safetensors"
    cases = {
        "fifo": lambda: (weights.unlink(), os.mkfifo(weights)),
        "link": lambda: (weights.unlink(), weights.symlink_to("/dev/zero")),
        "marker": lambda: (folder / "specdraft-export.json").write_text('{"checkpoint_sha256": ' + "1" * 5000 + "}"),
    }
    for name, break_it in cases.items():
        _export(folder, sha)
        break_it()
        got: list = []
        worker = threading.Thread(target=lambda out=got: out.append(vllm_engine._holds(folder, sha)), daemon=True)
        worker.start()
        worker.join(60)
        assert not worker.is_alive(), f"{name}: _holds blocked"
        assert got == [False], name
