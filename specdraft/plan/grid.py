"""The rank grid: each global rank's (tp, cp, dp, pp) and expert (etp, ep, edp) coordinates, node and local rank.

Mirrors megatron-core's RankGenerator without importing it: the order string lists dimensions innermost first,
so a rank's coordinate in a dimension is (rank // stride) % size, stride being the product of the sizes before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from specdraft.plan.dims import ParallelDims
from specdraft.plan.model import RankPlacement


def _strides(order: str, sizes: dict[str, int]) -> dict[str, int]:
    stride, out = 1, {}
    for name in order.split("-"):
        out[name] = stride
        stride *= sizes[name]
    return out


@dataclass(frozen=True, kw_only=True)
class RankGrid:
    """Coordinates of every rank, computed arithmetically (16K ranks in milliseconds)."""

    sizes: ParallelDims
    gpus_per_node: int

    @property
    def world_size(self) -> int:
        return self.sizes.world_size

    @cached_property
    def _decoder(self) -> dict[str, int]:
        s = self.sizes
        # The decoder generator has ep folded away (ep=1): Megatron builds experts with a second generator.
        return _strides(s.order, {"tp": s.tp, "cp": s.cp, "ep": 1, "dp": s.dp, "pp": s.pp})

    @cached_property
    def _expert(self) -> dict[str, int]:
        s = self.sizes
        return _strides(s.order, {"tp": s.etp, "cp": 1, "ep": s.ep, "dp": s.edp, "pp": s.pp})

    def coords(self, global_rank: int) -> dict[str, int]:
        """tp, cp, dp, pp, etp, ep, edp coordinates of one rank."""
        s = self.sizes
        d = self._decoder
        e = self._expert
        return {
            "tp": (global_rank // d["tp"]) % s.tp,
            "cp": (global_rank // d["cp"]) % s.cp,
            "dp": (global_rank // d["dp"]) % s.dp,
            "pp": (global_rank // d["pp"]) % s.pp,
            "etp": (global_rank // e["tp"]) % s.etp,
            "ep": (global_rank // e["ep"]) % s.ep,
            "edp": (global_rank // e["dp"]) % s.edp,
        }

    def rank_of(self, *, tp: int, cp: int, dp: int, pp: int) -> int:
        """Inverse of coords for the decoder dimensions."""
        d = self._decoder
        return tp * d["tp"] + cp * d["cp"] + dp * d["dp"] + pp * d["pp"]

    def node_of(self, global_rank: int) -> int:
        return global_rank // self.gpus_per_node

    def placement(self, r: int) -> RankPlacement:
        """The plan's record of global rank ``r``."""
        s = self.sizes
        d = self._decoder
        e = self._expert
        g = self.gpus_per_node
        return RankPlacement(
            global_rank=r,
            node=r // g,
            local_rank=r % g,
            tp=(r // d["tp"]) % s.tp,
            cp=(r // d["cp"]) % s.cp,
            dp=(r // d["dp"]) % s.dp,
            pp=(r // d["pp"]) % s.pp,
            ep=(r // e["ep"]) % s.ep,
            etp=(r // e["tp"]) % s.etp,
            edp=(r // e["dp"]) % s.edp,
        )

    def ranks(self) -> tuple[RankPlacement, ...]:
        """One record per global rank, in rank order (the plan's `ranks`)."""
        return tuple(self.placement(r) for r in range(self.world_size))

    def stage_ranks(self, pp: int) -> list[int]:
        """Every global rank of pipeline stage ``pp``, ascending."""
        s = self.sizes
        return sorted(
            self.rank_of(tp=t, cp=c, dp=x, pp=pp) for t in range(s.tp) for c in range(s.cp) for x in range(s.dp)
        )

    def groups(self, dim: str) -> list[list[int]]:
        """All groups of one decoder dimension (tp, cp, dp or pp), like RankGenerator.get_ranks(dim)."""
        others = [k for k in ("tp", "cp", "dp", "pp") if k != dim]
        seen: dict[tuple, list[int]] = {}
        for r in range(self.world_size):
            c = self.coords(r)
            seen.setdefault(tuple(c[k] for k in others), []).append(r)
        return sorted(seen.values())
