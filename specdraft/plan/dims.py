"""ParallelDims: one layout's parallel sizes with every default resolved, built once (by compile, or per search
candidate) and read by memory, taps, stages, the step estimate, the renders and the runtime; it checks its own sums.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cache
from typing import Any, Optional

from specdraft.plan.codec import PlanFormatError
from specdraft.spec.derived import pad_multiple

DEFAULT_ORDER = "tp-cp-ep-dp-pp"
_DIMENSIONS = ("cp", "dp", "ep", "pp", "tp")


def _dependent(
    *,
    world_size: int,
    tp: int,
    cp: int,
    pp: int,
    dp: int,
    ep: int,
    etp: int,
    sequence_parallel: bool,
    micro_batch_size: int,
    global_batch_size: int,
    **_rest,
) -> dict:
    """The sizes that follow from the others: edp, the packing multiple and the microbatches per step."""
    return {
        # megatron-core's expert rank generator: world / (etp * ep * pp).
        "edp": max(world_size // max(etp * ep * pp, 1), 1),
        "pad_multiple": pad_multiple(cp, tp, sequence_parallel),
        "num_microbatches": max(global_batch_size // max(micro_batch_size * dp, 1), 1),
    }


@dataclass(frozen=True, kw_only=True)
class ParallelDims:
    """The plan's `parallel` section: sizes as Megatron names them (dp, etp, edp and vpp resolved), the batch cut
    into microbatches and the pipeline's layer split. Build one with `resolve`; construction checks the sums."""

    tp: int
    cp: int
    pp: int
    dp: int
    ep: int
    etp: int
    edp: int  # expert data-parallel size: world / (etp * ep * pp)
    vpp: Optional[int]  # virtual stages per pipeline rank, None without interleaving
    order: str
    sequence_parallel: bool
    cp_comm_type: str
    hierarchical_cp_sizes: Optional[tuple[int, ...]]
    pad_multiple: int  # per-sequence packing multiple: 2*cp, times tp under sequence parallelism
    world_size: int  # tp * cp * pp * dp
    micro_batch_size: int  # sequences per microbatch per data-parallel rank
    global_batch_size: int  # sequences per optimizer step
    num_microbatches: int  # per data-parallel rank and step: global_batch_size / (micro_batch_size * dp)
    first_stage_layers: Optional[int]
    last_stage_layers: Optional[int]
    account_for_embedding_in_pipeline_split: bool
    account_for_loss_in_pipeline_split: bool

    def __post_init__(self) -> None:
        self._validate()

    @classmethod
    def resolve(
        cls,
        *,
        world_size: int,
        tp: int,
        cp: int,
        pp: int,
        dp: int,
        ep: int,
        etp: int,
        micro_batch_size: int,
        global_batch_size: int,
        sequence_parallel: bool = False,
        vpp: Optional[int] = None,
        order: str = DEFAULT_ORDER,
        cp_comm_type: str = "p2p",
        hierarchical_cp_sizes: Optional[tuple[int, ...]] = None,
        first_stage_layers: Optional[int] = None,
        last_stage_layers: Optional[int] = None,
        account_for_embedding_in_pipeline_split: bool = False,
        account_for_loss_in_pipeline_split: bool = False,
    ) -> "ParallelDims":
        """The dims of these independent sizes (``vpp`` already resolved: None or > 1), the dependent ones derived."""
        given: dict[str, Any] = dict(
            world_size=world_size,
            tp=tp,
            cp=cp,
            pp=pp,
            dp=dp,
            ep=ep,
            etp=etp,
            sequence_parallel=sequence_parallel,
            micro_batch_size=micro_batch_size,
            global_batch_size=global_batch_size,
        )
        return cls(
            **given,
            **_dependent(**given),
            vpp=vpp,
            order=order,
            cp_comm_type=cp_comm_type,
            hierarchical_cp_sizes=hierarchical_cp_sizes,
            first_stage_layers=first_stage_layers,
            last_stage_layers=last_stage_layers,
            account_for_embedding_in_pipeline_split=account_for_embedding_in_pipeline_split,
            account_for_loss_in_pipeline_split=account_for_loss_in_pipeline_split,
        )

    def _validate(self) -> None:
        """Refuse sizes that cannot come from one layout (a hand-edited plan.json), naming each."""
        args = vars(self)  # every field (a search builds thousands of these: no fields() walk per instance)
        problems = [f"{name} = {args[name]!r} is not a positive size" for name in _sizes() if args[name] < 1]
        if not problems:
            inner = self.tp * self.cp * self.pp * self.dp
            if inner != self.world_size:
                problems.append(f"tp*cp*pp*dp = {inner} differs from world_size = {self.world_size}")
            if self.world_size % (self.etp * self.ep * self.pp):
                problems.append(f"etp*ep*pp = {self.etp * self.ep * self.pp} does not divide world_size")
            for name, value in _dependent(**args).items():
                if args[name] != value:
                    problems.append(f"{name} = {args[name]} where these sizes give {value}")
        if self.vpp is not None and (self.vpp < 2 or self.pp < 2):
            problems.append(f"vpp = {self.vpp}: interleaving is null or > 1 virtual stages over pp > 1")
        if sorted(self.order.split("-")) != list(_DIMENSIONS):
            problems.append(f"order {self.order!r} does not name each of tp, cp, ep, dp, pp once")
        if problems:
            raise PlanFormatError("parallel: " + "; ".join(problems))

    @property
    def num_chunks(self) -> int:
        """Model chunks per pipeline rank (vpp with interleaving, else 1)."""
        return self.vpp or 1

    @property
    def last_stage(self) -> int:
        return self.pp - 1

    def local_tokens(self, seq_length: int) -> int:
        """Tokens of one microbatch one rank holds: micro batch tokens / cp, / tp under sequence parallelism."""
        tokens = self.cp_tokens(seq_length)
        return tokens // self.tp if self.sequence_parallel else tokens

    def cp_tokens(self, seq_length: int) -> int:
        """Tokens of one microbatch one context-parallel rank works on (every tp rank on all of them)."""
        return self.micro_batch_size * seq_length // self.cp


@cache
def _sizes() -> tuple[str, ...]:
    """The fields that are sizes (plain ints, each at least 1)."""
    return tuple(f.name for f in fields(ParallelDims) if f.type == "int")
