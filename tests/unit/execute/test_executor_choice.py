"""`launch` runs where the user said: --executor, else the layout's cluster.executor, else exit 2 with the fix; and
a dry run claims nothing it did not do."""

from __future__ import annotations

from tests.support.cli import run_cli


def test_no_executor_chosen_is_refused_with_the_fix(tmp_path):
    out = run_cli("launch", "qwen3-8b", "cluster.executor=null", "--dry-run", cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert (
        "no executor chosen: the layout sets no cluster.executor and --executor was not given, and specdraft never "
        "picks a cluster by itself" in out.stderr
    )
    assert "pass --executor local (this machine) or --executor slurm, or set cluster.executor" in out.stderr
    assert not (tmp_path / "runs").exists()


def test_the_layout_chooses_and_the_flag_overrides(tmp_path):
    out = run_cli("launch", "--dry-run", cwd=tmp_path)
    assert out.returncode == 0 and "executor: local (the layout's cluster.executor)" in out.stderr
    flag = run_cli("launch", "--dry-run", "--executor", "slurm", cwd=tmp_path)
    assert "executor: slurm (requested, over the layout's cluster.executor local)" in flag.stderr
    bad = run_cli("launch", "--dry-run", "--executor", "k8s", cwd=tmp_path)
    assert bad.returncode == 2 and "--executor 'k8s' is not an executor" in bad.stderr


def test_a_dry_run_says_what_it_wrote_and_tells_nobody_to_submit_a_missing_plan(tmp_path):
    out = run_cli("launch", "--dry-run", "--executor", "slurm", cwd=tmp_path)
    assert out.returncode == 0 and not (tmp_path / "runs").exists()
    assert "# dry run: nothing written, nothing submitted" in out.stderr
    assert "plan.json, which only a launch writes: run the same command without --dry-run" in out.stderr
    header = out.stdout.split("#SBATCH")[0]
    assert "Submit it" not in header and "sbatch " not in header
    assert "`specdraft launch` writes this script as" in header


def test_every_shipped_cpu_layout_runs_here_as_docs_launch_md_says(tmp_path):
    """docs/grpo.md's `specdraft launch layouts/grpo-tiny-cpu.yaml grpo.engine=vllm` needs no --executor: the
    shipped CPU layouts set cluster.executor: local (grpo-tiny-cpu did not, and that command said "no executor
    chosen")."""
    import yaml

    from tests.support.paths import SHIPPED

    cpu = [p for p in sorted(SHIPPED.glob("*.yaml")) if yaml.safe_load(p.read_text())["cluster"].get("gpu") == "cpu"]
    assert {p.stem for p in cpu} >= {"tiny-cpu", "grpo-tiny-cpu", "mixtral-tiny-cpu"}
    for layout in cpu:
        assert yaml.safe_load(layout.read_text())["cluster"].get("executor") == "local", layout.name
    out = run_cli("launch", str(SHIPPED / "grpo-tiny-cpu.yaml"), "grpo.engine=vllm", "--dry-run", cwd=tmp_path)
    assert out.returncode == 0 and "executor: local (the layout's cluster.executor)" in out.stderr, out.stderr
