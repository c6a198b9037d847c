"""`specdraft search`: exact best-first order against naive enumeration, the bounds it prunes with, the fast
placement arithmetic against the full estimate, the JSON rows, pins, and the YAML that `plan` accepts as is."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdraft.assemble import check, compile
from specdraft.errors import SpecError
from specdraft.perf.estimate import Estimator, estimate
from specdraft.perf.layout import layout_of
from specdraft.plan.compile import plan_memory
from specdraft.plan.memory import peak_lower_bound
from specdraft.search.ranking import search
from specdraft.search.space import bases, candidate_spec, splits
from specdraft.spec.load import load_layout, spec_sha256
from specdraft.spec.schema import ClusterSpec, LayoutSpec, ModelSpec, TrainingSpec
from specdraft.spec.validate.parallel import divisors
from tests.support.cli import run_cli
from tests.support.layouts import valid_layouts
from tests.support.paths import REPO

ROOT = REPO
BIG = ROOT / "layouts" / "llama3-70b.yaml"
ISSUE_KEYS = {
    "parallel",
    "training",
    "draft_stage",
    "step_time_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "peak_memory_bytes",
    "breakdown",
}


def run(*args):
    return run_cli(*args, cwd=ROOT, env={"COLUMNS": "200"})


def small_spec(**training) -> LayoutSpec:
    """A 16-layer model on 2 x 4 H100s: small enough to enumerate every candidate through the real rules."""
    return LayoutSpec(
        name="small",
        model=ModelSpec(
            num_layers=16,
            hidden_size=2048,
            ffn_hidden_size=5632,
            num_attention_heads=16,
            num_query_groups=4,
            vocab_size=32000,
            seq_length=8192,
        ),
        cluster=ClusterSpec(num_nodes=2, gpus_per_node=4, gpu="h100-80gb"),
        training=TrainingSpec(global_batch_size=16, **training),
    )


def naive_order(spec: LayoutSpec) -> list[tuple[float, LayoutSpec]]:
    """Every candidate through the whole validation, estimated one spec at a time, best first."""
    out = []
    for base in bases(spec, frozenset()):
        d = base.dims
        for split in splits(spec, d.pp, frozenset()):
            m = spec.training.global_batch_size // (d.micro_batch_size * d.dp)
            if split.vpp and (m < d.pp or m % d.pp):
                continue
            for stage in range(d.pp):
                candidate = candidate_spec(spec, base, split, stage)
                if not check(candidate)[0]:
                    out.append((estimate(candidate).step_time_s, candidate))
    return sorted(out, key=lambda item: item[0])


def test_search_returns_exactly_the_naive_best_first_order():
    spec = small_spec()
    naive = naive_order(spec)
    result = search(spec, top_k=12)
    assert len(naive) > 100 and len(result.rows) == 12
    got = [row.estimate.step_time_s for row in result.rows]
    assert got == pytest.approx([t for t, _ in naive[:12]], rel=1e-9)
    # The branch and bound skipped work, yet found the same layouts.
    assert result.num_estimated < result.num_candidates
    assert spec_sha256(result.rows[0].spec) in {spec_sha256(s) for t, s in naive if t == pytest.approx(got[0])}


def test_rows_pass_validation_and_report_the_full_estimate():
    result = search(load_layout(BIG), top_k=6)
    steps = [row.estimate.step_time_s for row in result.rows]
    assert steps == sorted(steps)
    for row in result.rows:
        assert check(row.spec)[0] == []
        full = estimate(row.spec)
        assert full.step_time_s == pytest.approx(row.estimate.step_time_s, rel=1e-12)
        assert sum(full.breakdown.values()) == pytest.approx(full.step_time_s, rel=1e-9)
        assert row.peak_memory_bytes == max(s.total for s in plan_memory(row.spec))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_layouts(max_world=64))
def test_fast_placements_equal_the_full_step_and_bounds_hold(spec):
    spec = dataclasses.replace(spec, cluster=dataclasses.replace(spec.cluster, gpu="h100-80gb"))
    lay = layout_of(spec)
    est = Estimator(spec)
    full = est.estimate(lay).step_time_s
    pipe = est.pipeline(lay, detail=False)
    [(_, fast)] = est.placements(lay, pipe, [lay.draft_stage])
    assert fast == pytest.approx(full, rel=1e-9)
    assert est.lower_bound(lay, lay.vpp) <= full * (1 + 1e-12)
    peak = max(s.total for s in plan_memory(spec))
    assert peak_lower_bound(spec, lay.dims) <= peak + 1


def test_json_rows_carry_the_issue_keys_and_yaml_round_trips(tmp_path):
    target = tmp_path / "best.yaml"
    out = run("search", str(BIG), "--top", "3", "--format", "json", "-o", str(target))
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["layouts"]
    assert len(rows) == 3
    for row in rows:
        assert ISSUE_KEYS <= set(row), sorted(row)
        assert set(row["parallel"]) == {"tp", "cp", "pp", "vpp", "dp", "ep", "etp", "sequence_parallel"}
        assert set(row["training"]) == {"micro_batch_size", "recompute"}
        assert sum(row["breakdown"].values()) == pytest.approx(row["step_time_s"], rel=1e-4)
    assert [r["step_time_s"] for r in rows] == sorted(r["step_time_s"] for r in rows)
    best = load_layout(target)
    plan = compile(best)  # plan and launch accept the file as is
    assert plan.parallel.tp == rows[0]["parallel"]["tp"] and plan.parallel.pp == rows[0]["parallel"]["pp"]
    assert estimate(best).step_time_s == pytest.approx(rows[0]["step_time_s"], rel=1e-5)
    shown = run("plan", str(target))
    assert shown.returncode == 0, shown.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["best.yaml"], "written atomically, no temp file left"


def test_text_table_shows_breakdown_and_memory():
    out = run("search", str(BIG), "--top", "2")
    assert out.returncode == 0, out.stderr
    for needle in ("step s", "tok/s/GPU", "peak GiB", "compute", "verified by the full validation"):
        assert needle in out.stdout


def test_pins_fix_fields_and_bad_pins_are_refused():
    result = search(
        load_layout(BIG, ["parallel.tp=8", "training.micro_batch_size=1"]),
        top_k=4,
        pins=frozenset({"parallel.tp", "training.micro_batch_size"}),
    )
    assert result.rows and all(r.layout.dims.tp == 8 and r.layout.dims.micro_batch_size == 1 for r in result.rows)
    out = run("search", str(BIG), "--pin", "parallel.tpp=8")
    assert out.returncode == 2 and "parallel.tp" in out.stderr and "Traceback" not in out.stderr
    out = run("search", str(BIG), "--pin", "model.num_layers=8")
    assert out.returncode == 2 and "not a field the search varies" in out.stderr
    out = run("search", str(BIG), "--pin", "parallel.tp=eight")
    assert out.returncode == 2 and "parallel.tp" in out.stderr


def test_nothing_fits_is_a_clear_error():
    out = run("search", str(BIG), "cluster.num_nodes=1", "--pin", "parallel.pp=1")
    assert out.returncode == 2 and "no valid layout" in out.stderr and "Traceback" not in out.stderr


def test_a_cluster_over_the_gpu_bound_gets_the_bound_from_search_as_from_validate():
    """Over 131,072 GPUs no layout is valid, and "add nodes" would be the opposite of the fix: search names the
    bound with validate's own message."""
    over = ["cluster.num_nodes=16385", "cluster.gpus_per_node=8"]
    searched, validated = run("search", *over), run("validate", *over)
    assert searched.returncode == validated.returncode == 2
    assert "131,072 GPUs" in searched.stderr and "add nodes" not in searched.stderr
    assert searched.stderr == validated.stderr
    with pytest.raises(SpecError, match="bound of 131,072 GPUs"):
        search(load_layout(None, over))


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=-5, max_value=20_000)
    | st.sampled_from([2**24, 2**31 - 1, 2**4 * 3**3 * 5**2 * 7 * 11 * 13 * 17])
)
def test_divisors_by_factorisation_equal_trial_division(n):
    if n > 20_000:  # trial division of the largest bounds would take seconds: check every divisor's cofactor
        got = divisors(n)
        assert got == sorted(set(got)) and all(n % d == 0 for d in got) and got == [n // d for d in reversed(got)]
        assert len(got) == {2**24: 25, 2**31 - 1: 2, 2**4 * 3**3 * 5**2 * 7 * 11 * 13 * 17: 5 * 4 * 3 * 2**4}[n]
        return
    assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0] if n > 0 else divisors(n) == []
