"""A HF checkpoint imported under a layout gives transformers' own logits (fp32, max abs difference <= 1e-4).

Tiny Llama-3-style, Llama-3.1 (rope_scaling), Qwen3 (QK norm) and Mixtral checkpoints are made with transformers'
config classes (tests/support/hf_models.py; vocabulary 257, which no tp > 1 divides, so the padded vocabulary is
exercised). Each layout loads its slices from the safetensors files on 2 gloo ranks and runs one packed row (two
sequences) through the runtime's GPTModel chunks; the vocab shards, CP shards and pipeline stages are put back
together and compared with transformers' forward of each sequence alone. All layouts run in one launch of 2
processes. The Qwen3 and Llama-3.1 cases take their settings from config.json through the spec.
"""

from __future__ import annotations

import pytest
import torch

from tests.support import hf_models
from tests.support.distributed import run_distributed

pytestmark = pytest.mark.dist
TOLERANCE = 1e-4
ONE = ["parallel.tp=1", "parallel.cp=1", "parallel.pp=1", "parallel.sequence_parallel=false", "cluster.gpus_per_node=2"]
DENSE = {
    "tp1": [],  # dp 2: both ranks hold the whole model
    "tp2": ["parallel.tp=2"],
    "pp2": ["parallel.pp=2"],
    "pp2-vpp2": ["parallel.pp=2", "parallel.vpp=2", "training.global_batch_size=2"],
    "cp2": ["parallel.cp=2"],
    "tp2-sp": ["parallel.tp=2", "parallel.sequence_parallel=true"],
}
# Qwen3 (QK norm, RoPE base 1e6, epsilon 1e-6) and Llama-3.1 (rope_scaling, base 5e5): the settings the spec fills
# from config.json and the runtime builds; q/k norms are per head, so tp splits the heads they apply to.
SEMANTICS = {
    "tp2": ["parallel.tp=2"],
    "cp2": ["parallel.cp=2"],
}
MOE = {
    "ep2": ["parallel.ep=2"],
    "tp2-sp-etp2": ["parallel.tp=2", "parallel.sequence_parallel=true", "parallel.etp=2"],
    "tp2-sp-ep2-etp1": ["parallel.tp=2", "parallel.sequence_parallel=true", "parallel.ep=2", "parallel.etp=1"],
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {kind: hf_models.make(kind, root / kind) for kind in ("llama", "mixtral", "qwen3", "llama31")}


def _plan(overrides):
    from specdraft.assemble import compile
    from specdraft.spec.load import load_layout

    return compile(load_layout(None, list(overrides)))


def _logits(rank: int, plan, ids: torch.Tensor):
    """The full (t, V) logits on every last-stage rank, None elsewhere."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from specdraft.runtime.attention.halo import local_global_rows
    from specdraft.runtime.models.hf.checkpoint import folder_of, open_checkpoint
    from specdraft.runtime.models.target import build_chunks
    from specdraft.runtime.train.batches import make_microbatch

    par, me = plan.parallel, plan.ranks[rank]
    chunks = build_chunks(
        plan,
        me.pp,
        torch.device("cpu"),
        torch.float32,
        0,
        checkpoint=open_checkpoint(plan.model, folder_of(plan.model.path)),
    )
    row = hf_models.row(ids)
    mb = make_microbatch(0, row, cp=par.cp, cp_rank=me.cp, steps=1, device="cpu")
    inputs = dict(
        input_ids=mb.tokens[None],
        position_ids=mb.positions[None],
        attention_mask=None,
        packed_seq_params=mb.packed_seq_params(),
    )
    tokens = len(mb.tokens) // (par.tp if par.sequence_parallel else 1)
    out = None
    # Chunks in schedule order: chunk v of stage 0, 1, ... then chunk v+1 (the interleaved pipeline's order).
    for model in chunks:
        if not model.pre_process:
            hidden = torch.empty(tokens, 1, plan.model.hidden_size)
            dist.recv(hidden, ps.get_pipeline_model_parallel_prev_rank())
            model.set_input_tensor(hidden)
        out = model(**inputs)
        if not model.post_process:
            dist.send(out.contiguous(), ps.get_pipeline_model_parallel_next_rank())
            out = None
    if out is None:
        return None
    local = out[0].detach()  # (t/cp, Vp/tp)
    if par.tp > 1:
        parts = [torch.empty_like(local) for _ in range(par.tp)]
        dist.all_gather(parts, local.contiguous(), group=ps.get_tensor_model_parallel_group())
        local = torch.cat(parts, dim=-1)
    assert local.shape[-1] == -(-hf_models.VOCAB // par.tp) * par.tp
    padding = local[:, hf_models.VOCAB :]
    assert torch.all(padding == 0), "padded rows of the output layer are zero"
    local = local[:, : hf_models.VOCAB]
    if par.cp == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(par.cp)]
    dist.all_gather(parts, local.contiguous(), group=ps.get_context_parallel_group())
    full = torch.empty(len(ids), local.shape[-1])
    cu = row.cu_seqlens.tolist()
    for r, part in enumerate(parts):
        full[local_global_rows(cu, par.cp, r)] = part
    return full


def _worker(rank, world_size, cases, ids):
    from megatron.core import parallel_state as ps

    from specdraft.runtime import cpu_compat

    cpu_compat.apply()
    results = {}
    for name, plan in cases.items():
        par = plan.parallel
        ps.initialize_model_parallel(
            tensor_model_parallel_size=par.tp,
            pipeline_model_parallel_size=par.pp,
            virtual_pipeline_model_parallel_size=par.vpp,
            context_parallel_size=par.cp,
            expert_model_parallel_size=par.ep,
            expert_tensor_parallel_size=par.etp,
            order=par.order,
            create_gloo_process_groups=False,
        )
        try:
            results[name] = _logits(rank, plan, ids)
        finally:
            ps.destroy_model_parallel()
    return results


@pytest.mark.parametrize("kind", ["qwen3", "llama31"])
def test_qwen3_and_llama31_settings_come_from_config_json(checkpoints, kind):
    """The parity cases above give only the shape: QK norm, RoPE base, epsilon and rope_scaling are config.json's."""
    m = _plan(ONE + hf_models.overrides(checkpoints[kind], kind)).model
    if kind == "qwen3":
        assert (m.qk_layernorm, m.rotary_base, m.norm_epsilon) == (True, 1_000_000, 1e-6)
    else:
        assert m.rotary_base == 500_000 and m.rope_scaling.factor == 8.0 and m.max_position_embeddings == 131072


@pytest.mark.timeout(600)
def test_logits_equal_transformers_under_every_layout(checkpoints):
    ids = hf_models.tokens()
    cases, want = {}, {}
    kinds = [("llama", DENSE), ("mixtral", MOE), ("qwen3", SEMANTICS), ("llama31", SEMANTICS)]
    for kind, layouts in kinds:
        want[kind] = hf_models.reference_logits(checkpoints[kind], ids)
        for name, extra in layouts.items():
            cases[f"{kind}-{name}"] = _plan(ONE + hf_models.overrides(checkpoints[kind], kind) + extra)
    results = run_distributed(_worker, 2, cases, ids, timeout=500)
    for name in cases:
        got = [r[name] for r in results if r[name] is not None]
        assert got, name
        for logits in got:
            worst = float((logits - want[name.split("-")[0]]).abs().max())
            assert worst <= TOLERANCE, (name, worst)
