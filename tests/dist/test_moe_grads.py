"""The target's grad reduction groups and global grad norm (runtime/train/grads.py) on real MoE models, 4 gloo ranks.

For each layout, every rank sets each parameter's grad to (its weight / R), R being the number of ranks the
parameter's grad must be summed over: dp*cp for dense parameters (times tp for sequence-parallel norms and the
router), the expert data-parallel size world/(etp*ep*pp) for experts. After `reduce_target_grads` every grad must
equal its weight again, which a wrong group (say dp*cp for experts where edp differs) breaks. The global grad norm
must then be the norm of the whole model's weights: the same in every layout, and equal to what one rank holding
the whole model (dp4, ep1) sums by itself. Weights are initialised from their global names, so every layout holds
the same model: where pp = cp = 1 one packed row's logits, and the norm of its reduced gradient after a real
backward (the load-balancing loss included), must also equal the dp4-ep1 rank's (ep, etp and sequence parallelism
through megatron's all-to-all dispatcher, forward and backward).
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.support.distributed import run_distributed
from tests.support.paths import SHIPPED

pytestmark = pytest.mark.dist
LAYOUT = SHIPPED / "mixtral-tiny-cpu.yaml"
BASE = [
    "cluster.gpus_per_node=4",
    "parallel.tp=1",
    "parallel.cp=1",
    "parallel.pp=1",
    "parallel.vpp=null",
    "parallel.ep=1",
    "parallel.etp=null",
    "parallel.sequence_parallel=false",
]
CASES = {  # name -> overrides on BASE (4 ranks each)
    "dp4-ep1": [],  # every rank holds the whole model: the reference norm; experts summed over edp = 4
    "dp4-ep4": ["parallel.ep=4"],
    "tp2-etp1-ep2-dp2": ["parallel.tp=2", "parallel.sequence_parallel=true", "parallel.ep=2", "parallel.etp=1"],
    "tp2-etp2-ep2-dp2": ["parallel.tp=2", "parallel.sequence_parallel=true", "parallel.ep=2", "parallel.etp=2"],
    "tp2-etp1-ep1-dp2": ["parallel.tp=2", "parallel.sequence_parallel=true", "parallel.etp=1"],  # edp 4 spans tp
    "tp2-etp1-ep1-pp2": ["parallel.tp=2", "parallel.sequence_parallel=true", "parallel.pp=2", "parallel.etp=1"],
    "cp2-ep2-dp2": ["parallel.cp=2", "parallel.ep=2"],
    "pp2-vpp2-ep2-dp2": ["parallel.pp=2", "parallel.vpp=2", "parallel.ep=2"],
}


def _plan(overrides):
    from specdraft.assemble import compile
    from specdraft.spec.load import load_layout

    return compile(load_layout(LAYOUT, list(overrides)))


def _case(rank: int, plan) -> dict:
    from megatron.core import parallel_state as ps

    from specdraft.runtime.models import moe
    from specdraft.runtime.models.target import build_chunks
    from specdraft.runtime.train.grads import TargetParams, reduce_target_grads, target_grad_norm

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
        chunks = build_chunks(plan, plan.ranks[rank].pp, torch.device("cpu"), torch.float32, plan.spec.training.seed)
        params = TargetParams.of(chunks)
        logits = trained_norm = aux_norm = None
        if par.pp == 1 and par.cp == 1:
            logits, trained_norm = _forward_backward(plan, chunks[0], params, main=1.0)
            _, aux_norm = _forward_backward(plan, chunks[0], params, main=0.0)  # the load-balancing loss alone
        expert_ids = {id(p) for p in params.experts}
        replicas = {}
        for chunk in chunks:
            for name, p in chunk.named_parameters():
                if moe.is_expert(name):
                    r = par.edp
                else:
                    r = par.dp * par.cp * (par.tp if getattr(p, "sequence_parallel", False) else 1)
                replicas[id(p)] = r
                p.grad = p.detach().clone() / r
        reduce_target_grads(params, par.sequence_parallel)
        worst = max(
            float(((p.grad - p.detach()).abs().max() / p.detach().abs().max().clamp(min=1e-30))) for p in params.all()
        )
        local_sq = sum(float(p.detach().double().pow(2).sum()) for p in params.all())
        return {
            "norm": target_grad_norm(params, torch.device("cpu")),
            "worst_grad_error": worst,
            "logits": logits,
            "trained_norm": trained_norm,
            "aux_norm": aux_norm,
            "local_sq": local_sq,
            "num_experts_local": len(expert_ids),
            "edp": par.edp,
            "sp_params": sum(1 for p in params.dense if getattr(p, "sequence_parallel", False)),
        }
    finally:
        ps.destroy_model_parallel()


def _forward_backward(plan, model, params, main: float) -> tuple[torch.Tensor, float]:
    """One packed row through the whole model (pp = cp = 1), the same row on every data-parallel rank: its (t, V)
    logits gathered over the vocab shards, and the grad norm of main * sum(logits * fixed weights) + the router's
    load-balancing loss after the real backward and reduce_target_grads."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from specdraft.runtime.models import moe
    from specdraft.runtime.train.batches import make_microbatch
    from specdraft.runtime.train.data import MarkovData
    from specdraft.runtime.train.grads import reduce_target_grads, target_grad_norm

    m, par = plan.model, plan.parallel
    data = MarkovData(
        vocab_size=m.vocab_size, row_tokens=m.seq_length, pad_multiple=par.pad_multiple, seed=plan.spec.training.seed
    )
    mb = make_microbatch(0, data.row(0, 0), cp=1, cp_rank=0, steps=1, device="cpu")
    out = model(
        input_ids=mb.tokens[None],
        position_ids=mb.positions[None],
        attention_mask=None,
        packed_seq_params=mb.packed_seq_params(),
    )[0]  # (t, V/tp)
    weights = torch.randn(out.shape[0], m.vocab_size, generator=torch.Generator().manual_seed(7))
    mine = weights.chunk(par.tp, dim=-1)[ps.get_tensor_model_parallel_rank()]  # (t, V/tp)
    for p in params.all():
        p.grad = None
    (out * mine).sum().mul(main / par.dp).backward()  # dp ranks repeat the row: their summed grads are one row's
    reduce_target_grads(params, par.sequence_parallel)
    norm = target_grad_norm(params, torch.device("cpu"))
    moe.take_aux_loss()
    parts = [torch.empty_like(out) for _ in range(par.tp)]
    dist.all_gather(parts, out.detach().contiguous(), group=ps.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=-1), norm


def _worker(rank, world_size, cases):
    from specdraft.runtime import cpu_compat

    cpu_compat.apply()
    return {name: _case(rank, _plan(BASE + overrides)) for name, overrides in cases.items()}


@pytest.mark.timeout(300)
def test_expert_grads_are_summed_over_expert_dp_and_the_norm_counts_every_shard_once():
    results = run_distributed(_worker, 4, CASES, timeout=240)
    reference = math.sqrt(results[0]["dp4-ep1"]["local_sq"])  # one rank holding the whole model
    assert results[0]["dp4-ep1"]["edp"] == 4 and results[0]["tp2-etp1-ep1-pp2"]["edp"] == 2
    assert results[0]["tp2-etp1-ep2-dp2"]["sp_params"] > 0, "SP norms and routers are tagged for the tp all-reduce"
    want_logits, want_trained = results[0]["dp4-ep1"]["logits"], results[0]["dp4-ep1"]["trained_norm"]
    want_aux = results[0]["dp4-ep1"]["aux_norm"]
    assert want_aux > 0, "the load-balancing loss reaches the router"
    for name in CASES:
        for rank, per_rank in enumerate(results):
            got = per_rank[name]
            if got["logits"] is not None:  # the same model and output, whatever the expert layout (ep, etp, SP)
                torch.testing.assert_close(got["logits"], want_logits, rtol=1e-5, atol=1e-6, msg=(name, rank))
                # ... and the same gradient through the dispatcher's backward (the norm of every reduced grad)
                assert got["trained_norm"] == pytest.approx(want_trained, rel=1e-5), (name, rank)
                # the load-balancing gradient alone: megatron's coefficient scaled for summed (not averaged) grads
                assert got["aux_norm"] == pytest.approx(want_aux, rel=1e-5), (name, rank)
            assert got["worst_grad_error"] < 1e-6, (name, rank, got)  # each grad summed over exactly its R ranks
            assert got["norm"] == pytest.approx(reference, rel=1e-12), (name, rank, got["norm"], reference)


def test_config_and_render_agree_on_the_moe_settings():
    from specdraft.render.megatron import megatron_argv
    from specdraft.runtime.models.target import transformer_config

    for topk in (1, 2):
        plan = _plan(["model.moe_router_topk=%d" % topk])
        config = transformer_config(plan, torch.float32)  # megatron refuses top-1 softmax without pre-softmax
        argv = megatron_argv(plan)
        assert config.moe_router_pre_softmax == (topk == 1) == ("--moe-router-pre-softmax" in argv)
        assert config.moe_token_dispatcher_type == argv[argv.index("--moe-token-dispatcher-type") + 1] == "alltoall"
        # megatron sees the coefficient divided by cp*dp (it averages grads over them; specdraft sums)
        assert float(argv[argv.index("--moe-aux-loss-coeff") + 1]) == 0.01
        assert config.moe_aux_loss_coeff == pytest.approx(0.01 / (plan.parallel.cp * plan.parallel.dp))
        assert (config.expert_model_parallel_size, config.expert_tensor_parallel_size) == (2, 1)
