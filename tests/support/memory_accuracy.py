"""The plan's memory estimate against what the runtime allocates: for every rank of a finished `cotrain` launch,
the weights, grads and optimizer state it measured (results/rank-N.json, `memory`) against plan.memory of its
stage. Used by the dense and the MoE parity tests, so both paths are held to the same bound."""

from __future__ import annotations

import json
from pathlib import Path

from specdraft.plan.model import LaunchPlan

# Weights and grads are counted exactly (TP-split matrices, TP-replicated norms and MoE routers, experts split over
# ep and etp); the optimizer state differs only by AdamW's per-tensor `step` counters (4 bytes per parameter
# tensor, about 1e-4 of these tiny models). Dense and MoE layouts are held to the same bound.
RELATIVE_BOUND = 1e-3


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
