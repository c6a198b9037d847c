#!/usr/bin/env python3
"""mypy over specdraft/ against a per-module baseline of error counts that may only shrink.

    scripts/mypy_baseline.py            check: fails when a module has more errors than its baseline, a module
                                        outside the baseline has any, or a module has fewer (then run --update)
    scripts/mypy_baseline.py --update   lower or drop the counts that went down; refuses to raise any
    scripts/mypy_baseline.py --init     record the baseline from scratch (only when there is none)

mypy reads its settings from pyproject.toml ([tool.mypy]). The baseline (mypy-baseline.json) maps each module's
file to its error count, sorted, one module per line; a module with no errors is not listed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASELINE = REPO / "mypy-baseline.json"
TARGET = "specdraft"
# "path/to/module.py:12: error: ..." or "path/to/module.py:12:5: error: ..." (notes and the summary are not errors)
ERROR = re.compile(r"^(?P<path>[^:\n]+\.pyi?):\d+(?::\d+)?: error: ", re.MULTILINE)


def run_mypy() -> str:
    """mypy's output over TARGET, run from the repository root with this interpreter's mypy."""
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", TARGET],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    # 0: clean, 1: type errors found; anything else (2) is mypy failing to run (a bad config, a crash).
    if proc.returncode not in (0, 1):
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"mypy could not check {TARGET}/ (exit {proc.returncode}); see its output above")
    return proc.stdout


def count_errors(output: str) -> dict[str, int]:
    """Errors per module file (posix path relative to the repository root), from mypy's text output."""
    return dict(Counter(Path(m["path"]).as_posix() for m in ERROR.finditer(output)))


def read_baseline(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise SystemExit(f"no baseline at {path}; record one with `scripts/mypy_baseline.py --init`") from None
    except json.JSONDecodeError as err:
        raise SystemExit(f"{path} is not JSON ({err}); restore it from git") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and type(v) is int and v > 0 for k, v in data.items()):
        raise SystemExit(f"{path} must map module files to positive error counts; restore it from git")
    return data


def write_baseline(path: Path, counts: dict[str, int]) -> None:
    """Sorted, one module per line, so a change to the baseline reads as a one-line diff."""
    kept = {module: n for module, n in sorted(counts.items()) if n > 0}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(kept, indent=2) + "\n")
    tmp.replace(path)


def regressions(current: dict[str, int], baseline: dict[str, int]) -> list[str]:
    """Modules with more errors than the baseline allows (a module outside the baseline allows none)."""
    out = []
    for module in sorted(current):
        now, allowed = current[module], baseline.get(module, 0)
        if now > allowed:
            where = f"baseline {allowed}" if module in baseline else "not in the baseline, so 0 allowed"
            out.append(f"{module}: {now} mypy errors ({where})")
    return out


def improvements(current: dict[str, int], baseline: dict[str, int]) -> list[str]:
    """Modules with fewer errors than their baseline: the baseline must shrink with them."""
    out = []
    for module in sorted(baseline):
        now = current.get(module, 0)
        if now < baseline[module]:
            out.append(f"{module}: {now} mypy errors (baseline {baseline[module]})")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--update", action="store_true", help="lower the baseline to the current counts")
    mode.add_argument("--init", action="store_true", help="record a baseline where there is none")
    parser.add_argument("--baseline", type=Path, default=BASELINE, help="the baseline file (default: %(default)s)")
    parser.add_argument(
        "--mypy-output", type=Path, help="read mypy's output from this file instead of running mypy (for tests)"
    )
    args = parser.parse_args(argv)

    output = args.mypy_output.read_text() if args.mypy_output else run_mypy()
    current = count_errors(output)
    total = sum(current.values())

    if args.init:
        if args.baseline.exists():
            print(f"{args.baseline} exists; use --update, which only lowers counts", file=sys.stderr)
            return 1
        write_baseline(args.baseline, current)
        print(f"recorded {total} mypy errors in {len(current)} modules to {args.baseline}")
        return 0

    baseline = read_baseline(args.baseline)
    worse = regressions(current, baseline)
    if worse:
        print("mypy: more errors than the baseline allows:", file=sys.stderr)
        for line in worse:
            print(f"  {line}", file=sys.stderr)
        print("fix them (run `mypy specdraft` to see them); the baseline never grows", file=sys.stderr)
        if args.update:
            print(f"--update refused: it only lowers counts; {args.baseline} is unchanged", file=sys.stderr)
        return 1
    better = improvements(current, baseline)
    if args.update:
        write_baseline(args.baseline, current)
        print(f"{args.baseline}: {len(better)} modules lowered; {total} mypy errors in {len(current)} modules")
        return 0
    if better:
        print("mypy: fewer errors than the baseline records (good), so the baseline must shrink too:", file=sys.stderr)
        for line in better:
            print(f"  {line}", file=sys.stderr)
        print("run `scripts/mypy_baseline.py --update` and commit mypy-baseline.json", file=sys.stderr)
        return 1
    print(f"mypy: {total} errors in {len(current)} modules, as the baseline records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
