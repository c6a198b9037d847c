"""User-facing errors: a Problem names the field path, the bad value, the rule and a fix.

The CLI's single error boundary (specdraft.cli.boundary) turns these into one clear message and exit code 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One thing wrong (or worth a warning) in a layout."""

    path: str
    value: Any
    rule: str
    fix: str
    severity: str = "error"

    def render(self) -> str:
        value = "<missing>" if self.value is _MISSING_VALUE else repr(self.value)
        fix = f"; {self.fix}" if self.fix else ""
        return f"{self.path} = {value}: {self.rule}{fix}"

    def to_dict(self) -> dict:
        value = None if self.value is _MISSING_VALUE else self.value
        return {"path": self.path, "value": value, "rule": self.rule, "fix": self.fix}


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING_VALUE = _Missing()
MISSING = _MISSING_VALUE


class SpecdraftError(Exception):
    """Base for every error that is the user's to fix; the CLI prints it without a traceback."""

    exit_code = 2


class SpecError(SpecdraftError):
    """A layout with one or more problems; every problem is reported at once."""

    def __init__(self, problems: Iterable[Problem], source: str | None = None):
        self.problems = tuple(problems)
        self.source = source
        n = len(self.problems)
        where = f" in {source}" if source else ""
        lines = [f"{n} problem{'s' if n != 1 else ''}{where}:"]
        lines += [f"  - {p.render()}" for p in self.problems]
        super().__init__("\n".join(lines))


class UserError(SpecdraftError):
    """A problem outside the layout itself (a missing file, a run folder in the way, a failed job)."""

    def __init__(self, message: str, fix: str = ""):
        self.message = message
        self.fix = fix
        super().__init__(f"{message}\n  fix: {fix}" if fix else message)
