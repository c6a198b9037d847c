"""After generation: every rank learns every sample's length, reward and finish, and the per-instance figures, in
one all-reduce of a few floats per sample; then the response tokens go from the instance leads that generated them
straight to the ranks that train them (their data-parallel rank's rows), one message per (lead, rank) pair. No rank
receives samples it does not train, and nothing passes through one rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

# Per-instance figures summed over the leads (each lead fills its own row): their order in the all-reduce.
INSTANCE_FIELDS = (
    "samples",
    "generated_tokens",
    "busy_s",
    "drafts",
    "draft_tokens",
    "accepted",
    "target_forwards",
    "requests",
)


@dataclass(frozen=True)
class Generated:
    """One sample an instance lead generated and scored."""

    sample: int  # prompt-major index in the step: prompt * G + generation
    ids: tuple[int, ...]
    finished: bool
    reward: float


@dataclass(frozen=True)
class Shared:
    """What every rank knows of the step after the exchange."""

    lengths: torch.Tensor  # (S,) int64
    rewards: torch.Tensor  # (S,) float64
    finished: torch.Tensor  # (S,) bool
    instances: list[dict]  # per instance: INSTANCE_FIELDS and accepted_per_pos
    responses: dict[int, tuple[int, ...]]  # this rank's samples (the ones it trains)


def share(
    num_samples: int,
    num_instances: int,
    k: int,
    mine: int | None,
    generated: list[Generated],
    figures: dict | None,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[dict]]:
    """Every rank: (lengths, rewards, finished, per-instance figures) of the whole step, from each lead's own
    samples and figures (``mine``: the instance this rank leads, else None)."""
    width = len(INSTANCE_FIELDS) + k
    flat = torch.zeros(num_samples * 3 + num_instances * width, dtype=torch.float64)
    per_sample = flat[: num_samples * 3].view(num_samples, 3)
    per_instance = flat[num_samples * 3 :].view(num_instances, width)
    for g in generated:
        per_sample[g.sample] = torch.tensor([len(g.ids), g.reward, float(g.finished)], dtype=torch.float64)
    if mine is not None and figures is not None:
        row = [float(figures[name]) for name in INSTANCE_FIELDS] + [float(x) for x in figures["accepted_per_pos"]]
        per_instance[mine, : len(row)] = torch.tensor(row, dtype=torch.float64)
    reduced = flat.to(device)
    dist.all_reduce(reduced)
    reduced = reduced.cpu()
    per_sample = reduced[: num_samples * 3].view(num_samples, 3)
    per_instance = reduced[num_samples * 3 :].view(num_instances, width)
    instances = []
    for i in range(num_instances):
        values = per_instance[i].tolist()
        entry = {name: values[j] for j, name in enumerate(INSTANCE_FIELDS)}
        entry["accepted_per_pos"] = values[len(INSTANCE_FIELDS) :]
        instances.append(entry)
    lengths = per_sample[:, 0].round().to(torch.int64)
    return lengths, per_sample[:, 1].clone(), per_sample[:, 2] > 0.5, instances


def deliver(
    generated: list[Generated],
    *,
    lead_of_sample: list[int],
    wanted: range,
    rank: int,
    need: dict[int, range],
    lengths: torch.Tensor,
    device: torch.device,
) -> dict[int, tuple[int, ...]]:
    """Every rank: the response tokens of the samples ``wanted`` (this rank's rows), straight from their leads.

    ``lead_of_sample[s]``: the global rank that generated sample s; ``need[r]``: the samples rank r trains (every
    rank's, for a lead to know whom to send what). Messages are ordered by sample, so no header is needed: their
    sizes follow from ``lengths``, which every rank has."""
    own = {g.sample: g.ids for g in generated}
    sends: list = []
    recvs: list = []
    pending: list[tuple[list[int], torch.Tensor]] = []
    out: dict[int, tuple[int, ...]] = {}
    if own:
        for peer, theirs in need.items():
            part = [s for s in theirs if s in own]
            if not part:
                continue
            if peer == rank:
                out.update({s: own[s] for s in part})
                continue
            payload = torch.tensor([t for s in part for t in own[s]] or [0], dtype=torch.int64, device=device)
            sends.append(dist.isend(payload, dst=peer))
    by_lead: dict[int, list[int]] = {}
    for s in wanted:
        if lead_of_sample[s] != rank:
            by_lead.setdefault(lead_of_sample[s], []).append(s)
    for lead, from_lead in sorted(by_lead.items()):
        size = max(int(lengths[from_lead].sum()), 1)  # an empty message still carries one placeholder token
        buffer = torch.empty(size, dtype=torch.int64, device=device)
        recvs.append(dist.irecv(buffer, src=lead))
        pending.append((from_lead, buffer))
    for work in recvs + sends:
        if work is not None:
            work.wait()
    for wanted_samples, buffer in pending:
        values, at = buffer.cpu().tolist(), 0
        for s in wanted_samples:
            n = int(lengths[s])
            out[s] = tuple(values[at : at + n])
            at += n
    return out
