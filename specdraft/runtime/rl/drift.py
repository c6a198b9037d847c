"""draft.refit_policy: drift. After a step the draft is refit when the engines' accept length on that step fell more
than draft.refit_drift_margin below the co-trained draft's training-time accept length on the same step's forward;
otherwise the engines keep theirs. Every decision is recorded with its reason (metrics.jsonl's draft_refit)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def engine_accept_length(instances: list[dict]) -> float | None:
    """1 + accepted / drafts over every instance (every rank has the counters after the exchange); None when no
    instance drafted (nothing was measured)."""
    drafts = sum(i["drafts"] for i in instances)
    return 1.0 + sum(i["accepted"] for i in instances) / drafts if drafts else None


def training_accept_length(trainer) -> float | None:
    """The draft's training-time accept length on this step's forward, summed over the world (only the draft's
    ranks count positions): the figure metrics.jsonl's accept_len reports. Every rank calls it (a collective)."""
    counts = [float(trainer.stats["accepted"]), float(trainer.stats["positions"])]
    sums = torch.tensor(counts, dtype=torch.float64, device=trainer.device)
    dist.all_reduce(sums)
    accepted, positions = sums.cpu().tolist()
    return accepted / positions if positions else None


def decide(engine: float | None, training: float | None, margin: float) -> dict:
    """Whether to refit, and why; the same on every rank (from the same reduced figures)."""
    out = {"engine_accept_length": engine, "training_accept_length": training, "margin": margin}
    if engine is None or training is None:
        missing = "the engines drafted nothing" if engine is None else "the draft trained on no position"
        return {**out, "refit": True, "reason": f"unmeasured ({missing}): refit to stay current"}
    if engine < training - margin:
        return {**out, "refit": True, "reason": f"drift: engines {engine:.3f} < training {training:.3f} - {margin}"}
    return {**out, "refit": False, "reason": f"held: engines {engine:.3f} >= training {training:.3f} - {margin}"}
