"""An EAGLE-3 export is readable as the umask allows: its folder 0o777 and its files 0o666 less the umask (mkdtemp's
0o700 and safetensors' 0o600 kept out the serving job of a colleague or a group). Real files, real safetensors."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from specdraft.assemble import compile
from specdraft.runtime.serve import eagle3
from specdraft.spec.load import load_layout


def _state(plan) -> dict[str, torch.Tensor]:
    """A whole draft state dict under the runtime's names (the values do not matter to the writer)."""
    h, n = plan.model.hidden_size, len(plan.draft.aux_layers)
    names = [f"layers.0.{name}" for name in eagle3.LAYER_NAMES] + [n for n in eagle3.TOP_NAMES]
    state = {name: torch.zeros(4, 4) for name in names}
    state["fc.weight"] = torch.zeros(h, n * h)
    return state


@pytest.mark.parametrize("umask", [0o077, 0o022, 0o027], ids=lambda m: f"umask{m:03o}")
def test_an_export_follows_the_umask(tmp_path, umask):
    plan = compile(load_layout(None, []))
    previous = os.umask(umask)
    try:
        folder = eagle3.write(tmp_path / "export", plan, _state(plan), {"source": "test"})
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o777 & ~umask
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["config.json", "model.safetensors", "specdraft-export.json"]
    for name in names:
        assert stat.S_IMODE(os.stat(folder / name).st_mode) == 0o666 & ~umask, name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no temp folder left
