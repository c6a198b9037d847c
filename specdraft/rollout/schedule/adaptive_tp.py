"""PAT-style adaptive tensor parallelism for the generation tail: remaining-length predictor, planner, overheads.

At a check-point the planner predicts each group's remaining makespan from predicted remaining lengths, then
searches every regrouping that merges idle GPUs into wider aligned TP groups inside a node (a DP over the node's
binary tree of aligned blocks), and switches only when predicted gain minus reconfiguration overhead beats a margin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist

from specdraft.rollout.model.costmodel import HBM_EFFICIENCY, KV_WATERMARK, steps_time, steps_within

# Creating an NCCL communicator for a new group: an assumption (hundreds of ms within a node). PAT caches groups,
# so the default charges it never (every aligned group is built at start-up); `groups_cached=False` charges it.
GROUP_SETUP_S = 0.5
# Switch only when the predicted saving beats this margin: a floor plus a share of the predicted remainder,
# so prediction noise alone does not trigger a reconfiguration.
MARGIN_S = 0.5
MARGIN_FRACTION = 0.05
# A group counts as freed once its batch fell below this share of its peak (PAT: the effective batch shrinks).
# It only gates when the planner looks; the switch rule decides. A batch that never shrinks never qualifies.
SHRINK_FRACTION = 0.9
# Deferral horizons, as fractions of the merged group's predicted makespan: a merge is postponed when merging after
# one of them is predicted to finish sooner (the bulk keeps the narrow groups' throughput a while longer).
DEFER_FRACTIONS = (0.1, 0.2, 0.3)
_NORMAL = NormalDist()


@dataclass(frozen=True)
class RemainingPredictor:
    """Remaining tokens of a request: conditional median of a log-normal length given length > generated.

    ``request`` mode centres the log-normal on the request's predicted length with log-std ``sigma`` (the
    prediction error); ``population`` mode uses the workload's median and sigma and ignores per-request guesses.
    Median of L | L > g: ln x = mu + sigma * Phi^-1((1 + Phi((ln g - mu) / sigma)) / 2).
    """

    mode: str = "request"
    sigma: float = 0.2
    median: float = 3000.0
    cap: int = 16384

    def remaining(self, predicted: float, generated: float) -> float:
        med = predicted if self.mode == "request" else self.median
        sigma = max(self.sigma, 1e-3)
        mu = math.log(max(med, 1.0))
        g = max(generated, 1.0)
        q = _NORMAL.cdf((math.log(g) - mu) / sigma)
        p = min((1.0 + q) / 2.0, 1.0 - 1e-12)
        total = math.exp(mu + sigma * _NORMAL.inv_cdf(p))
        total = min(max(total, generated + 1.0), float(self.cap))
        return max(total - generated, 0.0)


def run_requests(cost, tp: int, reqs: list[tuple[float, float]], horizon: float = math.inf) -> tuple[float, list]:
    """Run ``reqs`` (context tokens, predicted remaining tokens) together on a tp group for up to ``horizon`` s.

    Returns (seconds run, the unfinished requests as (context, remaining)). All requests run together (the tail is
    far below the KV limit); the batch shrinks as they finish, and each phase between finishes is the closed-form
    affine step sum of costmodel.steps_time.
    """
    items = sorted(reqs, key=lambda r: r[1])
    batch = len(items)
    ctx = sum(c for c, _ in items)
    done = 0.0  # tokens every surviving request has gained
    t = 0.0
    for i, (c, rem) in enumerate(items):
        if rem > done:
            speculating = cost.use_speculation(tp, batch, ctx) if cost.speculative else False
            a, b = cost.affine(tp, batch, speculating, ctx)
            e = cost.tokens_per_step(speculating)
            phase = steps_time(a, b, ctx, batch * e, (rem - done) / e)
            if t + phase > horizon:
                gained = done + e * steps_within(a, b, ctx, batch * e, horizon - t)
                return horizon, [(cj + gained, rj - gained) for cj, rj in items[i:]]
            t += phase
            ctx += batch * (rem - done)
            done = rem
        batch -= 1
        ctx -= c + rem
    return t, []


def predict_makespan(cost, tp: int, reqs: list[tuple[float, float]]) -> float:
    """Seconds until the last of ``reqs`` (context tokens, predicted remaining tokens) finishes on a tp group."""
    return run_requests(cost, tp, reqs)[0] if reqs else 0.0


@dataclass
class Overhead:
    """Reconfiguration cost of one merged group (seconds), and the per-request KV decision."""

    reshard_s: float = 0.0
    group_setup_s: float = 0.0
    kv_s: float = 0.0
    moves: list = field(default_factory=list)  # (request id, "migrate" | "recompute", seconds)

    @property
    def total_s(self) -> float:
        return self.reshard_s + self.group_setup_s + self.kv_s


def reshard_bytes(old_tps: list[int], new_tp: int, weight_bytes: float) -> float:
    """Bytes a GPU must receive to hold its 1/new_tp weight shard.

    Merging aligned groups whose tp divides new_tp nests the shards (rank r of the wider group takes a slice of
    what it already holds, with the ranks interleaved), so nothing crosses the link; otherwise the whole new
    shard does. Either way the GPU copies its new shard into place once (counted in `reshard_seconds`).
    """
    if all(new_tp % t == 0 for t in old_tps):
        return 0.0
    return weight_bytes / new_tp


def reshard_seconds(cost, old_tps: list[int], new_tp: int) -> float:
    weights = cost.weight_bytes()
    moved = reshard_bytes(old_tps, new_tp, weights)
    local_copy = weights / new_tp / (HBM_EFFICIENCY * cost.hbm_bw)
    return moved / cost.link_bw + local_copy


def merge_overhead(
    cost, old_tps: list[int], new_tp: int, reqs: list, *, groups_cached: bool = True, scale: float = 1.0
) -> Overhead:
    """Overhead of merging groups of ``old_tps`` into one ``new_tp`` group that takes over ``reqs``.

    Each request either migrates the KV that must change GPU (its old group held t/new_tp of the new layout's
    shards) over the link, or recomputes its context by prefill on the new group, whichever is cheaper.
    ``reqs`` are (request id, old tp, context tokens).
    """
    ov = Overhead(
        reshard_s=reshard_seconds(cost, old_tps, new_tp) * scale,
        group_setup_s=0.0 if groups_cached else GROUP_SETUP_S * scale,
    )
    per_token = cost.target.kv_bytes_per_token
    floor = cost.prefill_floor_s() * scale  # no recompute is cheaper: skip pricing it when migrating beats this
    for rid, tp, ctx in reqs:
        if ctx <= 0:
            continue
        migrate = ctx * per_token * (1.0 - tp / new_tp) / cost.link_bw * scale
        recompute = math.inf if migrate <= floor else cost.prefill(new_tp, ctx) * scale
        if migrate <= recompute:
            ov.moves.append((rid, "migrate", migrate))
            ov.kv_s += migrate
        else:
            ov.moves.append((rid, "recompute", recompute))
            ov.kv_s += recompute
    return ov


@dataclass
class PlannerConfig:
    predictor: RemainingPredictor
    max_tp: int = 8
    heads: int = 32
    overhead_scale: float = 1.0
    groups_cached: bool = True
    margin_s: float = MARGIN_S
    margin_fraction: float = MARGIN_FRACTION
    shrink_fraction: float = SHRINK_FRACTION
    defer_fractions: tuple = DEFER_FRACTIONS


@dataclass
class Plan:
    """A decided switch: the new groups (offset, size) of one node, with their overheads."""

    predicted_now_s: float
    predicted_after_s: float
    merges: list  # (offset, size, [old group ids], Overhead)


def group_requests(inst) -> list:
    """(request, tokens generated so far, the group's tp) for every running or queued request of a group."""
    out = []
    for req in list(inst.stack) + list(inst.queue):
        generated = inst.progress - req.base if req.running else req.generated
        out.append((req, max(generated, 0.0), inst.tp))
    return out


def plan_node(
    cfg: PlannerConfig, cost, groups: dict[int, object], offsets: dict[int, int], node_size: int
) -> Plan | None:
    """Best coarsening of one node's groups (ids -> Instance, ids -> offset in the node), or None to stay put."""
    idle = {g for g, inst in groups.items() if inst.batch == 0 and not inst.queue}
    # GPUs a merge can put to better use: idle groups, and groups whose batch has shrunk (finished requests
    # left the batch, nothing is queued). A batch that never shrinks (no length skew) never triggers a switch.
    freed = idle | {
        g
        for g, inst in groups.items()
        if not inst.queue and inst.batch <= cfg.shrink_fraction * max(inst.peak_batch, 1)
    }
    if not freed or len(groups) == 1:
        return None
    cache: dict = {}
    # Per group, once per check: its requests, their (context, predicted remaining) and its predicted makespan.
    reqs = {g: group_requests(inst) for g, inst in groups.items()}
    rem = {
        g: [(req.prompt_len + gen, cfg.predictor.remaining(req.predicted, gen)) for req, gen, _ in items]
        for g, items in reqs.items()
    }
    alone = {g: predict_makespan(cost, groups[g].tp, rem[g]) for g in groups}

    def deferred(inside, size, merged):
        """Predicted makespan of merging later instead: each group runs on alone for d seconds, then merges."""
        best_later = math.inf
        for frac in cfg.defer_fractions:
            d = frac * merged
            survivors = []
            for g in inside:
                survivors += run_requests(cost, groups[g].tp, rem[g], d)[1]
            best_later = min(best_later, d + predict_makespan(cost, size, survivors))
        return best_later

    def members(offset, size):
        return [g for g in groups if offset <= offsets[g] < offset + size]

    def best(offset, size):
        """(predicted makespan, [(offset, size)]) of the best coarsening of this aligned block."""
        key = (offset, size)
        if key in cache:
            return cache[key]
        inside = members(offset, size)
        if len(inside) == 1 and groups[inside[0]].tp == size:
            out = (alone[inside[0]], [(offset, size)])
            cache[key] = out
            return out
        half = size // 2
        left, right = best(offset, half), best(offset + half, half)
        out = (max(left[0], right[0]), left[1] + right[1])
        if size <= cfg.max_tp and cfg.heads % size == 0 and freed.intersection(inside):
            items = [it for g in inside for it in reqs[g]]
            ctx = sum(req.prompt_len + gen for req, gen, _ in items)
            if len(items) <= cost.max_num_seqs and ctx <= cost.kv_capacity_tokens(size) * (1.0 - KV_WATERMARK):
                ov = merge_overhead(
                    cost,
                    [groups[g].tp for g in inside],
                    size,
                    [(req.rid, tp, req.prompt_len + gen) for req, gen, tp in items],
                    groups_cached=cfg.groups_cached,
                    scale=cfg.overhead_scale,
                )
                merged = ov.total_s + predict_makespan(cost, size, [r for g in inside for r in rem[g]])
                # Merging now gives up the narrow groups' throughput at once; when merging a little later is
                # predicted to finish sooner still, keep the groups as they are and look again at the next check.
                if merged < out[0]:
                    later = deferred(inside, size, merged) + ov.total_s if cfg.defer_fractions else math.inf
                    out = (merged, [(offset, size)]) if merged <= later else (later, out[1])
        cache[key] = out
        return out

    now = max(alone.values())
    after, blocks = best(0, node_size)
    margin = max(cfg.margin_s, cfg.margin_fraction * now)
    if now - after <= margin:
        return None
    merges = []
    for offset, size in blocks:
        inside = members(offset, size)
        if len(inside) == 1 and groups[inside[0]].tp == size:
            continue
        items = [it for g in inside for it in reqs[g]]
        ov = merge_overhead(
            cost,
            [groups[g].tp for g in inside],
            size,
            [(req.rid, tp, req.prompt_len + gen) for req, gen, tp in items],
            groups_cached=cfg.groups_cached,
            scale=cfg.overhead_scale,
        )
        merges.append((offset, size, inside, ov))
    if not merges:
        return None
    return Plan(predicted_now_s=now, predicted_after_s=after, merges=merges)
