"""The NCCL/CUDA environment a GPU layout calls for: one list, which the sbatch script exports and the rank payload
sets itself (for the local launcher) when the launcher did not."""

from __future__ import annotations

from specdraft.plan.model import LaunchPlan


def nccl_env(plan: LaunchPlan) -> list[tuple[str, str, str]]:
    """(name, value, why) of the NCCL/CUDA settings this layout calls for; empty on CPU."""
    cluster = plan.cluster
    if cluster.gpu == "cpu":
        return []
    out = [
        (
            "TORCH_NCCL_ASYNC_ERROR_HANDLING",
            "1",
            "a collective whose peer died raises on the surviving ranks instead of hanging until the time limit",
        )
    ]
    if plan.parallel.tp > 1:
        out.append(
            (
                "CUDA_DEVICE_MAX_CONNECTIONS",
                "1",
                "Megatron needs one hardware queue so TP/sequence-parallel communication kernels start before "
                "the GEMMs they overlap with",
            )
        )
    if cluster.num_nodes > 1:
        out.append(
            (
                "NCCL_DEBUG",
                "WARN",
                "a failed cross-node connection (IB/RoCE/socket) logs NCCL's own reason in the task's stderr",
            )
        )
    return out
