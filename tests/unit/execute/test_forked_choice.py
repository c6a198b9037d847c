"""Which local launches fork their ranks from the runtime's starter: the runtime entry, on a CPU plan, with this
interpreter, with more ranks than cores or SPECDRAFT_LOCAL_FORK=1, unless it is 0; anything else starts each rank
as its own interpreter."""

from __future__ import annotations

import os
import sys

import pytest

from specdraft.execute import forked

ENTRY = [sys.executable, "-u", "-m", "specdraft.runtime.entry", "run/plan.json", "--workload", "grpo"]


CORES = os.cpu_count() or 1


def test_the_runtime_entry_on_cpu_forks_with_its_arguments(monkeypatch):
    monkeypatch.delenv(forked.SWITCH_ENV, raising=False)
    assert forked.entry_args(ENTRY, "cpu", CORES + 1) == ["run/plan.json", "--workload", "grpo"]
    assert forked.entry_args(ENTRY, "cpu", CORES) is None, "as many ranks as cores import side by side"
    monkeypatch.setenv(forked.SWITCH_ENV, "1")
    assert forked.entry_args(ENTRY, "cpu", 1) == ["run/plan.json", "--workload", "grpo"]


@pytest.mark.parametrize(
    "argv, gpu, switch",
    [
        (ENTRY, "h100", None),  # each rank initialises CUDA for itself
        (ENTRY, "cpu", "0"),
        (["/opt/other/python", *ENTRY[1:]], "cpu", None),  # --python: another environment
        ([sys.executable, "-c", "print(1)", "run/plan.json"], "cpu", None),  # a mounted package's payload
        ([sys.executable, "-u", "-m", "specdraft.runtime.entry"][:3], "cpu", None),
    ],
)
def test_anything_else_starts_one_interpreter_per_rank(monkeypatch, argv, gpu, switch):
    if switch is None:
        monkeypatch.delenv(forked.SWITCH_ENV, raising=False)
    else:
        monkeypatch.setenv(forked.SWITCH_ENV, switch)
    assert forked.entry_args(argv, gpu, CORES + 1) is None
