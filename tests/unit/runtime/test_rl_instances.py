"""The rollout instances' pure parts: the refit's buckets (a slice bigger than a bucket split by rows, every bucket
within the bound, pieces of mixed dtypes and column splits reassembled exactly, one reused send buffer, a missing
piece refused), the instance layout with and without rollout planning, the CPU core binding of each instance, the
engine registry against the spec's grpo.engine kinds, and the vLLM engine arguments taken from the plan's render."""

from __future__ import annotations

import typing

import pytest
import torch

from specdraft.assemble import compile
from specdraft.runtime.rl.engine import ENGINES, EngineConfig
from specdraft.runtime.rl.engines.vllm import cpu_binding, engine_args
from specdraft.runtime.rl.instances.buckets import Assembler, Packer, Slice, layout
from specdraft.runtime.rl.instances.layout import instance_layout
from specdraft.spec.engines import ENGINE_KINDS
from specdraft.spec.load import load_layout
from specdraft.spec.rl import GrpoSpec
from tests.support.paths import SHIPPED

GRPO = SHIPPED / "grpo-tiny-cpu.yaml"


def _slices(whole: dict[str, torch.Tensor]) -> list[Slice]:
    """Each tensor sent in two halves by rows, and the 2-D ones also as two column blocks of their first half."""
    out = []
    for name, t in whole.items():
        n = t.shape[0]
        if t.dim() == 2:
            half, c = n // 2, t.shape[1] // 2
            out.append(Slice(name, tuple(t.shape), t.dtype, (0, half), (0, c), t[:, :c], 0))
            out.append(Slice(name, tuple(t.shape), t.dtype, (0, half), (c, t.shape[1]), t[:, c:].contiguous(), 0))
            out.append(Slice(name, tuple(t.shape), t.dtype, (half, n), None, t, half))
        else:
            out.append(Slice(name, tuple(t.shape), t.dtype, (0, n), None, t, 0))
    return out


def test_buckets_stay_within_the_bound_and_reassemble_every_tensor_exactly():
    g = torch.Generator().manual_seed(0)
    whole = {
        "a.weight": torch.randn(37, 10, generator=g),  # 40 B rows: split over several buckets
        "b.norm": torch.randn(50, generator=g).to(torch.bfloat16),  # 1-D: one element per row
        "c.ids": torch.arange(7, dtype=torch.int64),
        "d.mask": torch.tensor([True, False, True]),
        "e.weight": torch.randn(5, 3, 4, generator=g),  # 3-D: a row is 12 floats
    }
    bound = 128
    buckets, sources = layout(_slices(whole), bound)
    assert len(buckets) > 10
    assert all(b.nbytes <= bound for b in buckets)
    assert sum(len(b.items) for b in buckets) > len(_slices(whole)), "slices bigger than a bucket were split"
    packer, assembler = Packer("cpu"), Assembler("cpu")
    packer.reserve(max(b.nbytes for b in buckets))
    done = {}
    for bucket, source in zip(buckets, sources):
        for name, tensor in assembler.feed(packer.pack(bucket, source), bucket):
            assert name not in done
            done[name] = tensor.clone()
    assembler.finish()
    assert packer.allocated == [max(b.nbytes for b in buckets)], "one buffer, allocated once and reused"
    assert sorted(done) == sorted(whole)
    for name, t in whole.items():
        assert done[name].dtype == t.dtype and done[name].equal(t), name


def test_a_row_larger_than_the_bound_travels_alone_and_a_missing_piece_is_refused():
    t = torch.randn(3, 64)  # 256 B rows against a 100 B bound
    buckets, sources = layout([Slice("w", (3, 64), torch.float32, (0, 3), None, t, 0)], 100)
    assert [len(b.items) for b in buckets] == [1, 1, 1] and all(b.nbytes == 256 for b in buckets)
    packer, assembler = Packer("cpu"), Assembler("cpu")
    for bucket, source in list(zip(buckets, sources))[:2]:
        assert list(assembler.feed(packer.pack(bucket, source), bucket)) == []
    with pytest.raises(ValueError, match="incomplete.*'w' \\(128 of 192"):
        assembler.finish()


def test_a_slice_is_cast_to_the_wire_dtype_in_place():
    t = torch.randn(4, 4)
    buckets, sources = layout([Slice("w", (4, 4), torch.bfloat16, (0, 4), None, t, 0)], 1 << 20)
    (name, got), *_ = Assembler("cpu").feed(Packer("cpu").pack(buckets[0], sources[0]), buckets[0])
    assert got.dtype == torch.bfloat16 and got.equal(t.to(torch.bfloat16))


def test_instances_tile_the_ranks_with_or_without_rollout_planning():
    for enabled in ("true", "false"):
        plan = compile(load_layout(GRPO, [f"rollout.enabled={enabled}", "rollout.tp=2", "grpo.engine=vllm"]))
        got = instance_layout(plan)
        assert [(i.index, i.ranks, i.lead, i.node, i.local_gpus) for i in got] == [
            (0, (0, 1), 0, 0, (0, 1)),
            (1, (2, 3), 2, 0, (2, 3)),
        ], enabled
    plan = compile(load_layout(GRPO, ["rollout.enabled=true"]))
    assert [i.ranks for i in instance_layout(plan)] == [(0,), (1,), (2,), (3,)]


def test_cpu_binding_gives_each_tp_rank_its_slot_of_the_cores():
    assert cpu_binding((0,), 2, [0, 1]) == "0" and cpu_binding((1,), 2, [0, 1]) == "1"
    assert cpu_binding((0, 1), 2, [0, 1]) == "0|1"  # TP2 on this machine: one core per rank
    assert cpu_binding((2, 3), 4, [0, 1]) == "0|1"  # fewer cores than slots: slot g on core g mod 2
    assert cpu_binding((2, 3), 4, list(range(16))) == "8,9,10,11|12,13,14,15"
    assert cpu_binding((1,), 2, [4, 5, 6, 7]) == "6,7"  # the cores this rank may use, not 0..n-1


def test_the_engine_registry_lists_the_specs_engine_kinds():
    hinted = typing.get_args(typing.get_type_hints(GrpoSpec)["engine"])
    assert tuple(ENGINES) == ENGINE_KINDS == hinted


def test_vllm_engine_arguments_are_the_plans_rendered_settings(tmp_path):
    plan = compile(
        load_layout(
            GRPO,
            ["grpo.engine=vllm", "rollout.tp=2", "rollout.gpu_memory_utilization=0.2", "rollout.max_num_seqs=16",
             "rollout.prompt_length=24", "rollout.num_speculative_tokens=2"],
        )
    )  # fmt: skip
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "config.json").write_text('{"max_position_embeddings": 32}')
    (tmp_path / "draft").mkdir()
    config = EngineConfig(
        policy_dir=tmp_path / "policy", draft_dir=tmp_path / "draft", k=2, eos_id=None, device="cpu", seed=3,
        vllm_args=plan.renders.vllm.engine_args, local_gpus=(0, 1), slots_per_node=4,
    )  # fmt: skip
    args = engine_args(config)
    assert {k: args[k] for k in ("tensor_parallel_size", "gpu_memory_utilization", "max_num_seqs", "dtype")} == {
        "tensor_parallel_size": 2,
        "gpu_memory_utilization": 0.2,
        "max_num_seqs": 16,
        "dtype": "float32",  # a CPU plan
    }
    assert args["max_model_len"] == 32 and args["model"] == str(tmp_path / "policy")
    assert args["speculative_config"]["model"] == str(tmp_path / "draft")
    assert args["speculative_config"]["num_speculative_tokens"] == 2
    assert args["load_format"] == "dummy", "config-only folders: placeholder weights until the first refit"
    assert args["enable_sleep_mode"] is False  # CPU
    # validate refuses a max_model_len over the layout's positions; a served folder whose config.json says fewer
    # positions than the plan is refused here, before vLLM starts
    (tmp_path / "policy" / "config.json").write_text('{"max_position_embeddings": 16}')
    with pytest.raises(ValueError, match="rollout.max_model_len 32 .* max_position_embeddings 16"):
        engine_args(config)
