"""Hypothesis strategies for random *valid* layouts, shared by the compiler's property tests."""

from __future__ import annotations

import math

from hypothesis import strategies as st

from specdraft.spec.schema import ClusterSpec, DraftSpec, LayoutSpec, ModelSpec, ParallelSpec, SlurmSpec, TrainingSpec


@st.composite
def valid_layouts(draw, max_world: int = 512, moe: bool | None = None) -> LayoutSpec:
    tp = draw(st.sampled_from([1, 2, 4]))
    cp = draw(st.sampled_from([1, 2, 4]))
    pp = draw(st.sampled_from([1, 2, 3, 4]))
    dp = draw(st.sampled_from([1, 2, 3]))
    world = tp * cp * pp * dp
    if world > max_world:
        dp = 1
        world = tp * cp * pp
    gpn = math.gcd(world, draw(st.sampled_from([1, 2, 4, 8])))
    order = draw(st.sampled_from(["tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"]))
    if order == "tp-cp-ep-pp-dp" and pp > 1 and cp > 1:
        order = "tp-cp-ep-dp-pp"  # megatron needs equal expert/attention dp there (validation refuses it)
    # Layers: a per-stage count, optional vpp, optional uneven first/last stage.
    vpp = draw(st.sampled_from([None, 2])) if pp >= 2 else None
    unit = vpp or 1
    per_stage = unit * draw(st.integers(1, 3))
    counts = [per_stage] * pp
    first = last = None
    if pp >= 2 and draw(st.booleans()):
        first = unit * draw(st.integers(1, 3))
        counts[0] = first
    if pp >= 2 and draw(st.booleans()):
        last = unit * draw(st.integers(1, 3))
        counts[-1] = last
    if pp == 2 and first is not None and last is not None and vpp:
        last = None  # megatron needs a middle stage for interleaving with an uneven split (validation refuses it)
        counts[-1] = per_stage
    num_layers = sum(counts)
    if first is None and last is None and num_layers % pp:
        num_layers = per_stage * pp
    # Megatron's --account-for-embedding/loss-in-pipeline-split: each counts as a layer of the even split.
    account_embedding = account_loss = False
    if first is None and last is None and draw(st.booleans()):
        account_embedding, account_loss = draw(st.sampled_from([(True, False), (False, True), (True, True)]))
        accounted = account_embedding + account_loss
        # Every chunk keeps a layer; a single chunk gives both slots away.
        low = accounted + 1 if pp * unit == 1 else max(account_embedding, account_loss) + 1
        per_chunk = draw(st.integers(low, 3 + low))
        num_layers = pp * unit * per_chunk - account_embedding - account_loss
    heads = tp * draw(st.sampled_from([1, 2]))
    groups = draw(st.sampled_from([tp, heads]))
    sp = tp > 1 and draw(st.booleans())
    seq = 2 * cp * tp * draw(st.integers(1, 4))
    use_moe = draw(st.booleans()) if moe is None else moe
    ep, etp, experts = 1, None, None
    if use_moe:
        options = []
        for e in (1, 2, 4):
            for t in (1, 2):
                if world % (t * e * pp) == 0 and (order.endswith("pp") or pp == 1 or t * e == tp * cp):
                    options.append((e, t))
        if options:
            ep, etp = draw(st.sampled_from(options))
            experts = ep * draw(st.sampled_from([1, 2]))
            sp = sp or tp > 1  # Megatron requires sequence parallelism for MoE with tp > 1 (validation refuses it)
    if num_layers >= 8 and draw(st.booleans()):
        aux = None
    else:
        aux = sorted(draw(st.sets(st.integers(0, num_layers - 1), min_size=1, max_size=min(3, num_layers))))
    stage = draw(st.sampled_from(["last", "first"] + list(range(pp))))
    mbs = draw(st.sampled_from([1, 2]))
    m = draw(st.integers(1, 4))
    return LayoutSpec(
        name="prop",
        model=ModelSpec(
            num_layers=num_layers,
            hidden_size=heads * 8,
            ffn_hidden_size=heads * 16,
            num_attention_heads=heads,
            num_query_groups=groups,
            vocab_size=64 * tp,
            seq_length=seq,
            num_experts=experts,
            moe_ffn_hidden_size=16 if experts else None,
            moe_router_topk=1 if experts else 2,
        ),
        cluster=ClusterSpec(num_nodes=world // gpn, gpus_per_node=gpn, gpu="b200"),
        parallel=ParallelSpec(
            tp=tp,
            cp=cp,
            pp=pp,
            dp=draw(st.sampled_from([dp, -1])),
            ep=ep,
            etp=etp,
            vpp=vpp,
            sequence_parallel=sp,
            first_stage_layers=first,
            last_stage_layers=last,
            order=order,
            account_for_embedding_in_pipeline_split=account_embedding,
            account_for_loss_in_pipeline_split=account_loss,
        ),
        draft=DraftSpec(enabled=True, aux_layers=aux, ttt_steps=draw(st.integers(1, 4)), stage=stage),
        training=TrainingSpec(
            micro_batch_size=mbs, global_batch_size=mbs * dp * m, dtype=draw(st.sampled_from(["bf16", "fp32", "fp8"]))
        ),
        slurm=SlurmSpec(),
    )
