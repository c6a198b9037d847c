"""`specdraft rollout plan | simulate | profile` as users run them: exit codes, JSON shape, clear errors."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import run_cli
from tests.support.paths import REPO

ROOT = REPO


def run(*args):
    return run_cli("rollout", *args, cwd=ROOT, env={"COLUMNS": "200"})


def test_plan_shows_the_default_rollout_layout():
    out = run("plan")
    assert out.returncode == 0, out.stderr
    for needle in ("8 x 1 (8 GPUs", "eagle3, k=3", "KV capacity per instance", "instances"):
        assert needle in out.stdout
    data = json.loads(run("plan", "--format", "json").stdout)
    assert data["plan"]["num_instances"] == 8 and data["kv_capacity_tokens"] > 0


def test_disabled_or_invalid_rollout_is_a_clear_user_error():
    out = run("plan", "rollout.enabled=false")
    assert out.returncode == 2
    assert "rollout.enabled=true" in out.stderr and "Traceback" not in out.stderr
    bad = run("simulate", "rollout.tp=3", "--seeds", "1")
    assert bad.returncode == 2 and "rollout.tp = 3" in bad.stderr and "Traceback" not in bad.stderr


def test_simulate_json_has_every_policy_metric_and_the_generation_comparison(tmp_path):
    png = tmp_path / "timeline.png"
    out = run(
        "simulate",
        "--seeds",
        "2",
        "--steps",
        "1",
        "--adaptive-tp",
        "--format",
        "json",
        "--plot",
        str(png),
        "rollout.num_prompts_per_step=16",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert set(data["policies"]) == {"verl", "fifo", "random", "sorted", "longest_first", "asp", "oracle"}
    for rec in data["policies"].values():
        assert set(rec["iteration_time_s"]) == {"mean", "ci95"}
        assert set(rec["bubbles"]) == {"padding", "skewness", "sorting"}
        for key in ("makespan_s", "tokens_per_gpu_s", "trainer_idle_s", "max_policy_lag", "mean_policy_lag"):
            assert key in rec
        assert rec["max_policy_lag"] <= 1
    gen = data["generation"]
    assert set(gen["static"]) == {"1", "2", "4", "8"} and gen["best_static_tp"]["tp"] in (1, 2, 4, 8)
    # The target keys (docs/rollout.md, "Targets"), each with makespan_s as a mean and a spread over the seeds.
    for rec in (gen["adaptive"], gen["verl"], gen["best_static_tp"], *gen["static"].values()):
        assert {"mean", "ci95", "std", "min", "max"} <= set(rec["makespan_s"])
    assert gen["verl"]["tp"] == 2 and gen["verl"]["max_num_seqs"] == 1024 and gen["verl"]["dispatch"] == "even"
    ad = gen["adaptive"]
    assert ad["x_verl"] == ad["makespan_s"]["mean"] / gen["verl"]["makespan_s"]["mean"]
    assert ad["x_best_static"] <= 1.01 and isinstance(ad["switches"], list)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_malformed_workload_names_the_line(tmp_path):
    bad = tmp_path / "lengths.jsonl"
    bad.write_text('{"lengths": [100, 200]}\n{"lengths": "long"}\n')
    out = run("simulate", "--workload", str(bad), "--seeds", "1")
    assert out.returncode == 2
    assert "line 2" in out.stderr and "Traceback" not in out.stderr


def test_profile_csv_feeds_simulate_and_bad_rows_are_named(tmp_path):
    csv = tmp_path / "profile.csv"
    out = run("profile", "--csv", str(csv))
    assert out.returncode == 0, out.stderr
    assert "decode step ms at tp 8" in out.stdout
    assert "calibration against published figures" in out.stdout and "180 us" in out.stdout
    assert csv.read_text().startswith("tp,batch,context,decode_s,speculative_decode_s\n")
    sim = run(
        "simulate",
        "--profile",
        str(csv),
        "--seeds",
        "1",
        "--steps",
        "1",
        "--format",
        "json",
        "rollout.num_prompts_per_step=16",
    )
    assert sim.returncode == 0, sim.stderr
    assert json.loads(sim.stdout)["policies"]["asp"]["iteration_time_s"]["mean"] > 0
    lines = csv.read_text().splitlines()
    lines[5] = lines[5].replace(",", ",oops,", 1)
    csv.write_text("\n".join(lines) + "\n")
    bad = run("simulate", "--profile", str(csv), "--seeds", "1")
    assert bad.returncode == 2 and "line 6" in bad.stderr and "Traceback" not in bad.stderr


def test_length_presets_and_the_verl_tp_are_checked():
    bad = run("simulate", "--lengths", "short", "--seeds", "1")
    assert bad.returncode == 2 and "deepscaler" in bad.stderr and "Traceback" not in bad.stderr
    odd = run("simulate", "--verl-tp", "3", "--seeds", "1")
    assert odd.returncode == 2 and "--verl-tp 3" in odd.stderr and "Traceback" not in odd.stderr
    out = run(
        "simulate",
        "layouts/qwen3-14b-pat.yaml",
        "--lengths",
        "deepscaler",
        "--sigma",
        "0.5",
        "--seeds",
        "1",
        "--steps",
        "1",
        "--format",
        "json",
        "rollout.num_prompts_per_step=8",
    )
    assert out.returncode == 0, out.stderr
    work = json.loads(out.stdout)["workload"]
    assert (work["lengths"], work["median"], work["sigma"], work["cap"]) == ("deepscaler", 2700, 0.5, 8192)


def test_check_every_has_a_lower_bound_that_keeps_adaptive_tp_bounded():
    """The planner runs at every check-point, so its cost grows as 1/--check-every (1 step cost ~50x the default);
    below MIN_CHECK_EVERY the option and the library both refuse, naming the bound."""
    from specdraft.errors import UserError
    from specdraft.rollout.report.compare import SimulateOptions
    from specdraft.rollout.report.compare import run as simulate
    from specdraft.spec.bounds import MIN_CHECK_EVERY
    from specdraft.spec.load import load_layout

    out = run("simulate", "--adaptive-tp", "--check-every", "1", "--seeds", "1")
    assert out.returncode == 2 and "--check-every" in out.stderr and str(MIN_CHECK_EVERY) in out.stderr
    assert "Traceback" not in out.stderr
    with pytest.raises(UserError, match=f"outside {MIN_CHECK_EVERY}[.][.]"):
        simulate(load_layout(None, []), SimulateOptions(adaptive_tp=True, check_every_steps=MIN_CHECK_EVERY - 1))
