"""`rollout simulate --acceptance-from`: every number of a measurement is bounded before any arithmetic.

An accept_len is the target's own token plus at most k accepted drafts (1..k+1), a per-position rate is in [0, 1],
k is the layout's own bound on draft tokens; anything else is refused naming the file, the field and the bound.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdraft.errors import UserError
from specdraft.rollout.model import measured
from tests.support.paths import REPO


def _write(tmp_path, text: str, name: str = "m.json") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "text, field, bound",
    [
        ('{"accept_len": 1e308, "k": 3}', "accept_len = 1e+308", "1..4 at k = 3"),
        ('{"accept_len": 0.5, "k": 3}', "accept_len = 0.5", "1..4 at k = 3"),
        ('{"accept_len": NaN, "k": 3}', "accept_len = nan", "finite number"),
        ('{"accept_len": Infinity, "k": 3}', "accept_len = inf", "finite number"),
        ('{"accept_len": 1' + "0" * 400 + ', "k": 3}', "accept_len = ", "1..4 at k = 3"),
        ('{"accept_len": "2", "k": 3}', "accept_len = '2'", "finite number"),
        ('{"accept_len": 2, "k": 0}', "k = 0", "1..64"),
        ('{"accept_len": 2, "k": 1000000000}', "k = 1000000000", "1..64"),
        ('{"accept_len": 2, "k": true}', "k = True", "1..64"),
        ('{"accept_len": 2, "k": 3.0}', "k = 3.0", "1..64"),
        ('{"accept_len": 2, "k": 3, "acceptance": [0.5, 1.5, 0.1]}', "acceptance[1] = 1.5", "[0, 1]"),
        ('{"accept_len": 2, "k": 3, "acceptance": [-0.1]}', "acceptance[0] = -0.1", "[0, 1]"),
        ('{"accept_len": 2, "k": 3, "acceptance": "high"}', "acceptance = 'high'", "list of 1..64"),
    ],
)
def test_an_impossible_measurement_is_refused_naming_file_field_and_bound(tmp_path, text, field, bound):
    path = _write(tmp_path, text)
    with pytest.raises(UserError) as err:
        measured.read(path)
    assert path in err.value.message and field in err.value.message and bound in err.value.message, err.value.message


def test_json_a_parser_rejects_otherwise_is_a_user_error(tmp_path):
    for text in ('{"accept_len": ' + "9" * 5000 + ', "k": 3}', "[" * 100_000 + "]" * 100_000, "not json"):
        with pytest.raises(UserError, match="is not JSON"):
            measured.read(_write(tmp_path, text))


def test_a_possible_measurement_gives_its_per_token_acceptance(tmp_path):
    draft = measured.read(_write(tmp_path, '{"accept_len": 4, "k": 3, "acceptance": [1, 1, 1]}'))
    assert draft.accept_len == 4.0 and draft.k == 3 and draft.per_token_acceptance > 0.999
    draft = measured.read(_write(tmp_path, '{"accept_len": 1, "k": 3}'))
    assert draft.per_token_acceptance == pytest.approx(0.0, abs=1e-9)


def test_a_run_folders_metrics_are_bounded_row_by_row(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    rows = [
        {"step": 0, "target_loss": 3.0},  # a warm-up step: no draft, skipped
        {"step": 1, "accept_len": 2.0, "acceptance": [0.6, 0.3, 0.1]},
        {"step": 2, "accept_len": 2.2, "acceptance": [0.7, 0.4, 0.1]},
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "acc')
    draft = measured.read(str(folder))
    assert draft.k == 3 and draft.accept_len == pytest.approx(2.1) and draft.kind == "training"
    for bad, field in (
        ({"step": 3, "accept_len": 1e308, "acceptance": [0.5, 0.5, 0.5]}, "line 4: accept_len = 1e+308"),
        ({"step": 3, "accept_len": 2.0, "acceptance": [0.5, 2.0, 0.5]}, "line 4: acceptance[1] = 2.0"),
        ({"step": 3, "accept_len": 2.0, "acceptance": [0.5] * 65}, "1..64 acceptance rates (it has 65)"),
        ({"step": 3, "accept_len": 5.0, "acceptance": [0.5, 0.5, 0.5]}, "1..4 at k = 3"),
    ):
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*rows, bad]))
        with pytest.raises(UserError) as err:
            measured.read(str(folder))
        assert str(folder / "metrics.jsonl") in err.value.message and field in err.value.message, err.value.message


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(accept_len=JSON_VALUES, k=JSON_VALUES, acceptance=JSON_VALUES)
def test_any_json_measurement_is_bounded_or_refused(tmp_path, accept_len, k, acceptance):
    path = _write(tmp_path, json.dumps({"accept_len": accept_len, "k": k, "acceptance": acceptance}))
    try:
        draft = measured.read(path)
    except UserError as err:
        assert path in err.message
        return
    assert 1 <= draft.k <= measured.MAX_K and 1 <= draft.accept_len <= draft.k + 1
    assert math.isfinite(draft.per_token_acceptance) and 0 <= draft.per_token_acceptance < 1


def test_simulate_refuses_an_impossible_measurement_with_exit_2(tmp_path):
    path = _write(tmp_path, '{"accept_len": 1e308, "k": 3}')
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("SPECDRAFT_DEBUG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "specdraft.cli", "rollout", "simulate", "--acceptance-from", path, "--seeds", "1"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 2 and "accept_len = 1e+308" in proc.stderr and "1..4 at k = 3" in proc.stderr
    assert "speedup" not in proc.stdout and "internal error" not in proc.stderr
