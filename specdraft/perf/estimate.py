"""Estimated training step time of a layout, with the draft in it: per-stage microbatch times from
specdraft.perf.costs, the 1F1B / interleaved pipeline, the distributed optimizer, TapChannel and the draft.

The pipeline of m microbatches over stages taking t_i each (forward + backward) runs m * max(t) plus a fill and
drain of sum(t) - max(t), which interleaving over v virtual stages divides by v (Narayanan et al. 2021, sec. 2.2).
Pipeline sends follow megatron-core's schedules: without interleaving every send blocks its stage; interleaved,
the steady state overlaps each send with the next chunk's compute (overlap_p2p_comm, on by default) while the
warm-up and flush sends stay exposed (overlap_p2p_comm_warmup_flush, off by default; schedules.py).
A draft on the last stage runs inside each microbatch's loss; elsewhere it runs after the schedule (as
specdraft's runtime does), behind whatever slack that stage has left when the pipeline drains.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from specdraft.perf.costs import PASSES, Bandwidths, CostModel, Efficiency, LayerCost, Shape
from specdraft.perf.layout import BREAKDOWN_KEYS, Layout, StepEstimate, layout_of
from specdraft.perf.locality import Locality, strides
from specdraft.plan.memory import draft_params, layer_params
from specdraft.spec import derived
from specdraft.spec.schema import LayoutSpec

# The kernel efficiencies fitted by benchmarks/calibrate.py to NVIDIA's published H100 figures
# (benchmarks/calibration_h100.yaml); every other constant keeps its documented prior (specdraft.perf.costs).
CALIBRATED = Efficiency(gemm_fp8=0.5307, attention=0.4414)
OPTIMIZER_BYTES_PER_PARAM = 34  # Adam on fp32 master, m, v and grad: 16 bytes read, 16 written, 2 (bf16) written


class Pipeline(NamedTuple):
    """Per-stage seconds per microbatch before the draft, with their parts, and the per-stage step-end costs."""

    times: tuple[float, ...]
    parts: tuple[tuple[float, ...], ...]  # (compute, tp, cp, ep, p2p) per stage
    end: tuple[tuple[float, float], ...]  # (dp comm, optimizer) per stage
    num_microbatches: int
    vpp: int
    fill: float  # exposed warm-up and flush sends of the interleaved schedule, per step


class _Unit(NamedTuple):
    """Per-(dims, recompute) pieces of an estimate, shared by every split and draft stage."""

    layer: LayerCost
    layer_time: float
    embedding: float
    head: float
    send: float
    end_layer: tuple[float, float]  # (DP comm, optimizer) step-end seconds per layer a stage holds
    end_first: tuple[float, float]  # ... for the embedding
    end_last: tuple[float, float]  # ... for the output layer
    hidden: float
    logits: float
    node: tuple[int, ...]  # node of each stage's rank 0
    link: float
    net: float
    microbatches: int


class Estimator:
    """Estimates for one spec's model, cluster and batch; the layouts come in as `Layout`s (cached pieces)."""

    def __init__(self, spec: LayoutSpec, eff: Efficiency = CALIBRATED):
        self.spec = spec
        self.eff = eff
        self.costs = CostModel(spec, eff)
        self.gpn = spec.cluster.gpus_per_node
        self.distributed_optimizer = spec.training.distributed_optimizer
        t = spec.training
        # The parameter all-gather moves the model's weights (fp8 under --fp8-param-gather), the reduce-scatter
        # its main gradients (bf16 under --grad-reduce-in-bf16).
        self.weight_bytes = {"fp32": 4, "fp8": 1}.get(t.dtype, 2)
        self.grad_bytes = 2 if t.grad_reduce_in_bf16 and t.dtype != "fp32" else 4
        self.aux = derived.aux_layers(spec) if spec.draft.enabled else []
        self.dense_layer, self.expert_layer = layer_params(spec)
        m = spec.model
        self.embed = m.vocab_size * m.hidden_size
        self.tied = m.tie_embeddings
        self.draft_params = draft_params(spec) if spec.draft.enabled else 0
        self.locality = Locality(self.costs.gpu, eff, self.gpn)
        self._source_cache: dict[tuple, list[int]] = {}
        self._units: dict[tuple, _Unit] = {}
        self._drafts: dict[tuple, tuple[float, tuple[float, float]]] = {}

    def bandwidths(self, lay: Layout) -> Bandwidths:
        return self.locality.bandwidths(lay.dims)

    def _unit(self, lay: Layout) -> _Unit:
        """Everything about a layout that does not depend on its split or its draft stage (cached)."""
        key = lay[:2]
        hit = self._units.get(key)
        if hit is not None:
            return hit
        c, bw, d = self.costs, self.bandwidths(lay), lay.dims
        shape = Shape.of(d, lay.recompute)
        layer = c.layer(shape, bw)
        hidden, logits = c.tap_bytes(shape, logits=True)
        pp_stride = strides(d.order, d.tp, d.cp, d.pp, d.dp)["pp"]
        link, net = c.gpu.link_bw * self.eff.link, c.gpu.net_bw * self.eff.network
        end_layer, end_first, end_last = self._step_ends(lay, bw)
        hit = self._units[key] = _Unit(
            layer=layer,
            layer_time=sum(layer),
            embedding=c.embedding(shape, bw),
            head=c.head(shape, bw),
            send=c.p2p_send(shape, bw) if d.pp > 1 else 0.0,
            end_layer=end_layer,
            end_first=end_first,
            end_last=end_last,
            hidden=hidden,
            logits=logits,
            node=tuple(stage * pp_stride // self.gpn for stage in range(d.pp)),
            link=link,
            net=net,
            microbatches=d.num_microbatches,
        )
        return hit

    def _draft_unit(self, lay: Layout) -> tuple[float, tuple[float, float]]:
        """(draft seconds per microbatch, (its gradient all-reduce, its optimizer)) on its stage (cached)."""
        key = lay[:2]
        hit = self._drafts.get(key)
        if hit is None:
            shape = Shape.of(lay.dims, lay.recompute)
            hit = self._drafts[key] = (sum(self.costs.draft(shape, self.bandwidths(lay))), self._draft_end(lay))
        return hit

    def lower_bound(self, lay: Layout, max_vpp: int) -> float:
        """A step-time lower bound for every split (interleaved at most ``max_vpp`` ways) and draft stage of
        ``lay``'s sizes.

        With stage times t summing to at least S (every layer, the embedding, the head and, without interleaving,
        one blocking send each way per stage boundary), m * max(t) + (S - max(t)) / vpp grows with
        max(t) >= S / pp; the stage holding the most layers (at least ceil(N / pp)) pays at least their step-end
        costs; the interleaved warm-up and flush sends and the draft only add.
        """
        u = self._unit(lay)
        pp, n = lay.dims.pp, self.costs.num_layers
        sends = 2 * (pp - 1) * u.send if max_vpp <= 1 else 0.0  # interleaved, steady-state sends may all hide
        total = n * u.layer_time + u.embedding + u.head + sends
        mean = total / pp
        vpp = max_vpp if pp > 1 else 1
        return u.microbatches * mean + (total - mean) / vpp + -(-n // pp) * sum(u.end_layer)

    # ---- the pipeline without the draft ---------------------------------------------------------------------
    def pipeline(self, lay: Layout, detail: bool = True) -> Pipeline:
        """Per-stage microbatch times; the draft is added per placement by `placements` / `_step`.

        ``detail`` keeps each stage's parts and the (DP comm, optimizer) split of its step end; a search ranking
        thousands of splits skips them (the sums are the same)."""
        u = self._unit(lay)
        layer, pp, vpp = u.layer, lay.dims.pp, lay.vpp
        last_stage = pp - 1
        layer_time, send = u.layer_time, u.send
        end_layer, end_first, end_last = u.end_layer, u.end_first, u.end_last
        times, parts, end = [], [], []
        m = u.microbatches
        for stage, chunks in enumerate(lay.chunks):
            n = sum(chunks)
            sends = 2 * vpp - (stage == 0) - (stage == last_stage) if pp > 1 else 0
            extra = (u.embedding if stage == 0 else 0.0) + (u.head if stage == last_stage else 0.0)
            work = n * layer_time + extra
            # Interleaved, a steady-state send runs behind the next chunk's compute (at least a chunk's forward);
            # only a send longer than that shows. Without interleaving every send blocks the stage.
            p2p = sends * (max(0.0, send - work / (PASSES * vpp)) if vpp > 1 else send)
            times.append(work + p2p)
            comm, opt = n * end_layer[0], n * end_layer[1]
            if stage == 0:
                comm, opt = comm + end_first[0], opt + end_first[1]
            if stage == last_stage:
                comm, opt = comm + end_last[0], opt + end_last[1]
            end.append((comm, opt))
            if detail:
                parts.append((n * layer.compute + extra, n * layer.tp_comm, n * layer.cp_ring, n * layer.ep_a2a, p2p))
        fill = 0.0
        if pp > 1 and vpp > 1:
            # Stage 0 runs the most warm-up forwards, each followed by a blocking send, and as many flush backwards
            # (megatron-core schedules.get_pp_rank_microbatches).
            fill = 2 * min(2 * (pp - 1) + (vpp - 1) * pp, m * vpp) * send
        return Pipeline(
            times=tuple(times),
            parts=tuple(parts),
            end=tuple(end),
            num_microbatches=m,
            vpp=vpp if pp > 1 else 1,
            fill=fill,
        )

    def _step_ends(self, lay: Layout, bw: Bandwidths) -> tuple[tuple[float, float], ...]:
        """(exposed DP reduce-scatter + all-gather, optimizer step) per layer, for the embedding and for the output
        layer: a stage's step end is linear in what it holds (collective time is linear in bytes)."""
        d = lay.dims
        group, edp = d.dp * d.cp, d.edp
        coll, g, w = self.costs.collective, self.grad_bytes, self.weight_bytes
        out = []
        for dense, expert in (
            (self.dense_layer / d.tp, self.expert_layer / (d.etp * d.ep)),
            (self.embed / d.tp, 0.0),
            (self.embed / d.tp if not self.tied or d.pp > 1 else 0.0, 0.0),
        ):
            if self.distributed_optimizer:
                comm = (
                    coll(dense * g, group, bw.dp)
                    + coll(dense * w, group, bw.dp)
                    + coll(expert * g, edp, bw.edp)
                    + coll(expert * w, edp, bw.edp)
                )
                local = dense / group + expert / edp
            else:
                comm = coll(dense * g, group, bw.dp, allreduce=True) + coll(expert * g, edp, bw.edp, allreduce=True)
                local = dense + expert
            out.append((comm * self.eff.dp_exposed, local * OPTIMIZER_BYTES_PER_PARAM / self.costs.hbm))
        return tuple(out)

    # ---- the draft on a stage ---------------------------------------------------------------------------------
    def _sources(self, lay: Layout) -> list[int]:
        """The stages the draft's taps come from: the embedding (stage 0) and each aux layer's owner.

        Megatron assigns layers chunk by chunk, virtual stage outermost."""
        hit = self._source_cache.get(lay.chunks)
        if hit is None:
            owner = []
            for v in range(lay.vpp):
                for stage in range(lay.dims.pp):
                    owner += [stage] * lay.chunks[stage][v]
            hit = self._source_cache[lay.chunks] = [0] + [owner[a] for a in self.aux]
        return hit

    def _draft_terms(self, lay: Layout, pipe: Pipeline, stage: int) -> tuple[float, float, float]:
        """(per-microbatch draft seconds, per-microbatch tap seconds, seconds after the schedule) on ``stage``.

        Tap routes within a node ride NVLink, others the NIC, all arriving at this stage's ranks."""
        u = self._unit(lay)
        node = u.node[stage]
        taps = 0.0
        for src in self._sources(lay):
            if src != stage:
                taps += u.hidden / (u.link if u.node[src] == node else u.net)
        last = stage == lay.dims.last_stage
        if not last:
            taps += u.logits / (u.link if u.node[-1] == node else u.net)
        taps *= self.eff.p2p_exposed
        draft = self._draft_unit(lay)[0]
        if last:
            return draft, taps, 0.0
        # Off the last stage the draft runs after the schedule; backward drains towards stage 0, so a stage k
        # finishes about k stage-backwards (2/3 of a microbatch) before the end.
        slack = stage * (2 / 3) * (sum(pipe.times) / lay.dims.pp) / pipe.vpp
        return 0.0, taps, max(0.0, pipe.num_microbatches * draft - slack)

    def _draft_end(self, lay: Layout) -> tuple[float, float]:
        """The draft's gradient all-reduce (replicated over dp x cp) and its own Adam, on its stage."""
        bw = self.bandwidths(lay)
        d = lay.dims
        local = self.draft_params / d.tp
        comm = self.costs.collective(local * 4, d.dp * d.cp, bw.dp, allreduce=True) * self.eff.dp_exposed
        return comm, local * OPTIMIZER_BYTES_PER_PARAM / self.costs.hbm

    # ---- the step ------------------------------------------------------------------------------------------
    def _step(self, lay: Layout, pipe: Pipeline, detail: bool):
        times, end = list(pipe.times), [list(e) for e in pipe.end]
        draft_mb = taps_mb = post = 0.0
        k = lay.draft_stage
        if k is not None and self.aux:
            draft_mb, taps_mb, post = self._draft_terms(lay, pipe, k)
            times[k] += draft_mb + taps_mb
            d_comm, d_opt = self._draft_unit(lay)[1]
            end[k][0] += d_comm
            end[k][1] += d_opt
        t_max = max(times)
        bubble = (sum(times) - t_max) / pipe.vpp
        ends = [a + b for a, b in end]
        step = pipe.num_microbatches * t_max + bubble + post + max(ends) + pipe.fill
        if not detail:
            return step, None
        crit = times.index(t_max)
        m = pipe.num_microbatches
        compute, tp, cp, ep, p2p = (m * x for x in pipe.parts[crit])
        on_crit = crit == k
        e = ends.index(max(ends))
        breakdown = dict(
            zip(
                BREAKDOWN_KEYS,
                (
                    compute,
                    tp,
                    cp,
                    ep,
                    p2p + pipe.fill,
                    bubble,
                    end[e][0],
                    end[e][1],
                    m * taps_mb if on_crit else 0.0,
                    (m * draft_mb if on_crit else 0.0) + post,
                ),
            )
        )
        return step, breakdown

    def placements(self, lay: Layout, pipe: Pipeline, stages) -> list[tuple[Optional[int], float]]:
        """(draft stage, step seconds) for each of ``stages`` (None: no draft), in O(1) per stage.

        The same arithmetic as `_step` (a search ranks by this, `estimate` reports `_step`; tests keep them equal):
        adding the draft to stage k only changes that stage's time and step-end cost.
        """
        times = pipe.times
        ends = [a + b for a, b in pipe.end]
        total, m, vpp, pp = sum(times), pipe.num_microbatches, pipe.vpp, lay.dims.pp
        (t_first, i_first), (t_second, _) = _top2(times)
        (e_first, j_first), (e_second, _) = _top2(ends)
        plain = m * t_first + (total - t_first) / vpp + e_first + pipe.fill  # the step without a draft
        if not self.aux or stages == [None]:
            return [(k, plain) for k in stages]
        u = self._unit(lay)
        node = u.node
        near, far = u.hidden / u.link * self.eff.p2p_exposed, u.hidden / u.net * self.eff.p2p_exposed
        logits_near, logits_far = u.logits / u.link * self.eff.p2p_exposed, u.logits / u.net * self.eff.p2p_exposed
        sources = [(src, node[src]) for src in self._sources(lay)]
        draft, (d_comm, d_opt) = self._draft_unit(lay)
        draft_end, last = d_comm + d_opt, pp - 1
        slack_unit = (2 / 3) * (total / pp) / vpp
        out = []
        for k in stages:
            here = node[k]
            added = 0.0
            for src, src_node in sources:
                if src != k:
                    added += near if src_node == here else far
            if k == last:
                added += draft
                post = 0.0
            else:
                added += logits_near if node[last] == here else logits_far
                post = m * draft - k * slack_unit
                if post < 0.0:
                    post = 0.0
            t_k = times[k] + added
            t_max = t_second if k == i_first else t_first
            if t_k > t_max:
                t_max = t_k
            e_k = ends[k] + draft_end
            end = e_second if k == j_first else e_first
            if e_k > end:
                end = e_k
            out.append((k, m * t_max + (total + added - t_max) / vpp + post + end + pipe.fill))
        return out

    def estimate(self, lay: Layout) -> StepEstimate:
        step, breakdown = self._step(lay, self.pipeline(lay), detail=True)
        tokens = lay.dims.global_batch_size * self.costs.seq / step / lay.dims.world_size
        peak = self.costs.gpu.fp8_flops if self.costs.fp8 and self.costs.gpu.fp8_flops else self.costs.gpu.peak_flops
        return StepEstimate(
            step_time_s=step,
            tokens_per_s_per_gpu=tokens,
            mfu=self.costs.model_flops_per_token() * tokens / peak,
            breakdown=breakdown,
        )


def _top2(values) -> tuple[tuple[float, int], tuple[float, int]]:
    """((largest, its index), (second largest, its index)); the second is (0.0, -1) for one value."""
    first, second = (values[0], 0), (0.0, -1)
    for i in range(1, len(values)):
        v = values[i]
        if v > first[0]:
            first, second = (v, i), first
        elif v > second[0]:
            second = (v, i)
    return first, second


def estimate(spec: LayoutSpec, eff: Efficiency = CALIBRATED) -> StepEstimate:
    """The estimate of one validated spec (what `specdraft search` ranks by)."""
    return Estimator(spec, eff).estimate(layout_of(spec))
