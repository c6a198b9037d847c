"""`python -m specdraft.cli` runs the CLI (used by tests and when the console script is not on PATH)."""

from specdraft.cli.main import main

main()
