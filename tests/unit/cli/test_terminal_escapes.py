"""What the CLI prints from run files reaches the terminal without escape sequences, control characters or markup.

A crafted run folder plants clear-screen, cursor moves, window titles, hyperlinks, C1 controls, bidi overrides and
rich markup in a rank's hostname and error, a check's value, a metrics field, run.json's free text, a folder name and
a rank's stderr; `status`, `runs`, `logs` (its headers) and `launch`'s failure message must show the words only.
"""

from __future__ import annotations

import json
import re

from hypothesis import given
from hypothesis import strategies as st

from specdraft.cli.terminal import plain, safe
from tests.support.cli import run_cli
from tests.support.rank_procs import write_plan
from tests.unit.execute.test_launch_hostile import _edit_record, _run_folder

HOSTILE = "\x1b[2J\x1b[H\x1b]0;owned\x07\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\\x9b31m\u202e\x85\r"
MARKUP = "[link=http://evil.example/]x[/link][blink]y[/blink]"
# What a terminal would act on: ESC, BEL, CR, C1 controls, bidi overrides.
ACTIVE = re.compile("[\x1b\x07\r\x80-\x9f\u202a-\u202e\u2066-\u2069]")


def _hostile_run(tmp_path):
    folder = _run_folder(
        tmp_path / "runs" / f"evil{HOSTILE.replace('/', '')}run", executor="local", job_id="local-4242", state="FAILED"
    )
    write_plan(folder, ["cluster.gpus_per_node=2", "parallel.cp=1"])
    _edit_record(folder, submitted=f"2026-01-01{HOSTILE}", message=f"msg{HOSTILE}")
    (folder / "results").mkdir()
    for rank in range(2):
        result = {
            "global_rank": rank,
            "ok": False,
            "hostname": f"node{HOSTILE}{MARKUP}",
            "error": f"Traceback\nRuntimeError: boom{HOSTILE}{MARKUP}",
            "checks": [{"name": f"c{HOSTILE}", "passed": False, "value": f"v{HOSTILE}", "expected": 1}],
        }
        (folder / "results" / f"rank-{rank:05d}.json").write_text(json.dumps(result))
    (folder / "logs").mkdir()
    (folder / "logs" / "rank-0.err").write_text(f"stderr line{HOSTILE}{MARKUP}\n")
    row = {"step": 0, f"key{HOSTILE}": f"value{HOSTILE}{MARKUP}", "target_loss": 1.0}
    (folder / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    return folder


def _clean(text: str) -> None:
    assert not ACTIVE.search(text), repr(ACTIVE.search(text).group())


def test_status_runs_and_logs_print_run_files_without_escapes_or_markup(tmp_path):
    folder = _hostile_run(tmp_path)
    status = run_cli("status", folder, cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    _clean(status.stdout + status.stderr)
    shown = status.stdout
    for words in ("evilclickrun", "failed first", "stderr lineclick", "keyclick=valueclick", "cclick: got vclick"):
        assert words in shown, words
    assert "[link=http://evil.example/]" in shown and "[blink]" in shown  # shown as text, not made a link
    listing = run_cli("runs", cwd=tmp_path)
    assert listing.returncode == 0 and "evil" in listing.stdout, listing.stderr
    _clean(listing.stdout + listing.stderr)
    logs = run_cli("logs", folder, "--rank", "0", cwd=tmp_path)
    assert logs.returncode == 0 and "==> rank 0 stderr" in logs.stdout, logs.stderr
    _clean("\n".join(line for line in logs.stdout.splitlines() if line.startswith("==>")))


def test_an_error_message_quoting_run_files_is_printed_clean(tmp_path):
    folder = _hostile_run(tmp_path)
    _edit_record(folder, state="RUNNING")
    (folder / "run.json").write_text((folder / "run.json").read_text().replace('"job_id": "local-4242"', '"job_id": 7'))
    result = run_cli("status", folder, cwd=tmp_path)  # refused: its message echoes the folder's name
    assert result.returncode == 2 and "evil" in result.stderr
    _clean(result.stderr)


TEXT = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x2100), max_size=40)


@given(TEXT, TEXT)
def test_plain_leaves_no_sequence_a_terminal_acts_on(left, right):
    for text in (left + right, f"{left}\x1b[{right}", f"{left}\x1b]{right}", f"{left}\x9b{right}"):
        out = plain(text)
        _clean(out)
        assert "\n" not in plain(text, one_line=True) and "\t" not in plain(text, one_line=True)
        assert not re.search(r"(?<!\\)\[[a-z/]", safe(text)), "a '[' left able to open rich markup"
