"""Where things are, for every test: the repository root, the shipped layouts, the golden files."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "layouts"
GOLDEN = REPO / "tests" / "golden"
