"""What the tests share: process launchers, references, golden files, layouts and paths."""
