"""Golden-file comparison: `SPECDRAFT_REGEN_GOLDEN=1 pytest` rewrites the files; otherwise text must match."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.paths import GOLDEN


def check_golden(name: str | Path, text: str) -> None:
    """``name`` is relative to tests/golden, or a Path (e.g. a generated document under docs/)."""
    path = name if isinstance(name, Path) else GOLDEN / name
    if os.environ.get("SPECDRAFT_REGEN_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"missing golden file {path}; run with SPECDRAFT_REGEN_GOLDEN=1 to create it"
    expected = path.read_text()
    assert text == expected, f"{name} differs from its golden file; review the diff, then regenerate"
