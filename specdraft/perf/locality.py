"""Where a layout's groups live and the bandwidth a rank sees in each: NVLink inside a node, its NIC across nodes.

Group membership follows megatron-core's rank order (innermost first), as specdraft.plan.grid does.
"""

from __future__ import annotations

from specdraft.perf.costs import Bandwidths, Efficiency
from specdraft.plan.dims import ParallelDims
from specdraft.spec.gpus import Gpu


def strides(order: str, tp: int, cp: int, pp: int, dp: int, ep: int = 1) -> dict[str, int]:
    """Each dimension's rank stride in ``order`` (innermost first)."""
    sizes = {"tp": tp, "cp": cp, "ep": ep, "dp": dp, "pp": pp}
    stride, out = 1, {}
    for name in order.split("-"):
        out[name] = stride
        stride *= sizes[name]
    return out


class Locality:
    """Node spread and bandwidths of a cluster's groups (cached per layout sizes)."""

    def __init__(self, gpu: Gpu, eff: Efficiency, gpus_per_node: int):
        self.gpu, self.eff, self.gpn = gpu, eff, gpus_per_node
        self._nodes: dict[tuple, tuple[int, int]] = {}
        self._cache: dict[tuple, Bandwidths] = {}

    def spread(self, dims: tuple[tuple[int, int], ...]) -> tuple[int, int]:
        """(nodes, members per node) of rank 0's group spanning ``dims`` (stride, size) pairs."""
        hit = self._nodes.get(dims)
        if hit is None:
            ranks = [0]
            for stride, size in dims:
                ranks = [r + i * stride for r in ranks for i in range(size)]
            nodes = len({r // self.gpn for r in ranks})
            hit = self._nodes[dims] = (nodes, len(ranks) // nodes)
        return hit

    def bw(self, dims: tuple[tuple[int, int], ...], collective: bool = True) -> float:
        nodes, per_node = self.spread(dims)
        if nodes == 1:
            return self.gpu.link_bw * self.eff.link
        # A collective spanning nodes runs hierarchically: the members on one node share their NICs.
        return min(self.gpu.link_bw, (per_node if collective else 1) * self.gpu.net_bw) * self.eff.network

    def bandwidths(self, dims: ParallelDims) -> Bandwidths:
        d = dims
        key = (d.order, d.tp, d.cp, d.pp, d.dp, d.ep, d.etp)
        hit = self._cache.get(key)
        if hit is None:
            order, tp, cp, pp, dp, ep, etp, edp = key + (d.edp,)
            st = strides(order, tp, cp, pp, dp)
            # The expert generator: etp innermost, then ep, with cp folded away (megatron-core).
            es = strides(order, etp, 1, pp, edp, ep)
            ep_nodes, ep_per_node = self.spread(((es["ep"], ep),))
            ep_bw = self.bw(((es["ep"], ep),))
            if ep_nodes > 1:
                # All-to-all: the share bound for other nodes leaves through this rank's NIC.
                cross = 1 - ep_per_node / ep
                ep_bw = 1 / (
                    cross / (self.gpu.net_bw * self.eff.network) + (1 - cross) / (self.gpu.link_bw * self.eff.link)
                )
            hit = self._cache[key] = Bandwidths(
                tp=self.bw(((st["tp"], tp),)),
                cp=self.bw(((st["cp"], cp),), collective=False),
                ep=ep_bw,
                dp=self.bw(((st["cp"], cp), (st["dp"], dp))),
                edp=self.bw(((es["dp"], edp),)),
                p2p=self.bw(((st["pp"], min(pp, 2)),), collective=False),
            )
        return hit
