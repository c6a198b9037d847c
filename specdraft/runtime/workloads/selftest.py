"""Workload `selftest`: all-reduce over every tp, cp, pp and dp group and every TapChannel route pair, checked."""

from __future__ import annotations

# Each rank contributes (global_rank + 1) in float64 (exact for any realistic world), so a group's sum names its
# members: a group with the right size but the wrong members still gives a wrong sum.
DIMS = ("tp", "cp", "pp", "dp")


def plan_group(plan, rank: int, dim: str) -> list[int]:
    """Ranks that share every decoder coordinate with ``rank`` except ``dim``: its ``dim`` group in the plan."""
    me = plan.ranks[rank]
    others = [k for k in DIMS if k != dim]
    return [r.global_rank for r in plan.ranks if all(getattr(r, k) == getattr(me, k) for k in others)]


def route_pairs(plan) -> list[tuple[int, int]]:
    """Distinct (src, dst) rank pairs of the non-local tap routes, sorted: the same list on every rank."""
    return sorted({(r.src_rank, r.dst_rank) for r in plan.tap_routes if not r.local})


def _all_reduce_check(
    name: str, group, members: list[int], expected_members: list[int], rank: int, device: str
) -> dict:
    import torch
    import torch.distributed as dist

    value = torch.tensor([float(rank + 1)], dtype=torch.float64, device=device)
    dist.all_reduce(value, group=group)
    got, expected = value.item(), float(sum(m + 1 for m in expected_members))
    return {
        "name": name,
        "members": members,
        "expected_members": expected_members,
        "value": got,
        "expected": expected,
        "passed": members == expected_members and got == expected,
    }


def run(ctx) -> dict:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    groups = {
        "tp": ps.get_tensor_model_parallel_group(),
        "cp": ps.get_context_parallel_group(),
        "pp": ps.get_pipeline_model_parallel_group(),
        "dp": ps.get_data_parallel_group(),
    }
    checks = []
    for dim in DIMS:
        group = groups[dim]
        members = sorted(dist.get_process_group_ranks(group))
        checks.append(
            _all_reduce_check(
                dim, group, members, plan_group(ctx.plan, ctx.global_rank, dim), ctx.global_rank, ctx.device
            )
        )
    # dist.new_group is collective over the whole world: every rank creates every pair's group, in one order.
    for src, dst in route_pairs(ctx.plan):
        group = dist.new_group([src, dst])
        if ctx.global_rank in (src, dst):
            checks.append(
                _all_reduce_check(
                    f"tap {src}->{dst}", group, sorted((src, dst)), sorted((src, dst)), ctx.global_rank, ctx.device
                )
            )
    return {"checks": checks}
