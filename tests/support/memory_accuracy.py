"""The plan's memory estimate against what the runtime allocates: for every rank of a finished `cotrain` launch,
the weights, grads and optimizer state it measured (results/rank-N.json, `memory`) against plan.memory of its
stage, and the bytes each stage saved for backward per microbatch (launched with activations.MEASURE_ENV) against
the plan's per-microbatch activation estimate. Used by the dense and the MoE parity tests, so both paths are held
to the same bounds."""

from __future__ import annotations

import json
from pathlib import Path

from specdraft.plan.model import LaunchPlan
from specdraft.runtime.train.activations import MEASURE_ENV

# Weights and grads are counted exactly (TP-split matrices, TP-replicated norms and MoE routers, experts split over
# ep and etp); the optimizer state differs only by AdamW's per-tensor `step` counters (4 bytes per parameter
# tensor, about 1e-4 of these tiny models). Dense and MoE layouts are held to the same bound.
RELATIVE_BOUND = 1e-3
# Activations: the estimate names every tensor the local layer spec saves (plan/activations.py), so dense stages
# agree to about 1e-4. MoE ranks differ by their routing (each rank's experts get what the router sends them, up
# to 15% from the mean in these tiny models), so a stage's mean over its ranks, whose sum of routed rows is exact,
# is what the balanced-routing estimate is held to.
ACTIVATION_BOUND = 0.05
MEASURE = {MEASURE_ENV: "1"}  # the env a launch needs for the runtime to measure activations


def memory_errors(folder: Path) -> dict[int, dict[str, float]]:
    """Per rank, (estimate - measured) / measured of weights, grads and optimizer bytes."""
    plan = LaunchPlan.from_json((folder / "plan.json").read_text())
    # The runtime keeps a whole AdamW per rank: only the estimate without the distributed optimizer describes it.
    assert not plan.spec.training.distributed_optimizer, "compare layouts with training.distributed_optimizer=false"
    errors = {}
    for path in sorted((folder / "results").glob("rank-*.json")):
        result = json.loads(path.read_text())
        rank, measured = result["global_rank"], result["memory"]
        estimate = plan.memory[plan.ranks[rank].pp]
        errors[rank] = {
            key: (getattr(estimate, key) - measured[key]) / measured[key] for key in ("weights", "grads", "optimizer")
        }
    assert sorted(errors) == list(range(plan.world_size)), f"missing result files in {folder}"
    return errors


def assert_memory_matches_plan(folder: Path) -> float:
    """Every rank within RELATIVE_BOUND; returns the largest relative error (for the figures in docs/runtime.md)."""
    errors = memory_errors(folder)
    worst = max(abs(e) for per_rank in errors.values() for e in per_rank.values())
    assert worst <= RELATIVE_BOUND, {
        rank: e for rank, e in errors.items() if max(map(abs, e.values())) > RELATIVE_BOUND
    }
    return worst


def activation_errors(folder: Path) -> dict[int, float]:
    """Per pipeline stage, (estimate - measured) / measured of the bytes one microbatch saves for backward: the
    heaviest microbatch of the stage's mean over its ranks."""
    from specdraft.plan.compile import parallel_dims
    from specdraft.plan.memory import microbatch_activation_bytes

    plan = LaunchPlan.from_json((folder / "plan.json").read_text())
    dims = parallel_dims(plan.spec)
    per_stage: dict[int, list[list[int]]] = {}
    for path in sorted((folder / "results").glob("rank-*.json")):
        result = json.loads(path.read_text())
        measured = result["memory"].get("activations_per_microbatch")
        assert measured, f"{path} has no activations: launch with {MEASURE}"
        per_stage.setdefault(plan.ranks[result["global_rank"]].pp, []).append(measured)
    errors = {}
    for pp, ranks in sorted(per_stage.items()):
        heaviest = max(sum(column) / len(ranks) for column in zip(*ranks))
        layers = sum(chunk.num_layers for chunk in plan.stages[pp].chunks)
        estimate = microbatch_activation_bytes(plan.spec, dims, layers, pp == 0, pp == dims.pp - 1)
        errors[pp] = (estimate - heaviest) / heaviest
    assert sorted(errors) == list(range(dims.pp)), f"missing result files in {folder}"
    return errors


def assert_activations_match_plan(folder: Path) -> float:
    """Every stage within ACTIVATION_BOUND; returns the largest relative error."""
    errors = activation_errors(folder)
    worst = max(map(abs, errors.values()))
    assert worst <= ACTIVATION_BOUND, errors
    return worst
