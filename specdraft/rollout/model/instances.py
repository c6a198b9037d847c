"""Rollout instances: how rollout GPUs split into vLLM instances, where they sit, and whether they fit in HBM."""

from __future__ import annotations

from specdraft.errors import Problem
from specdraft.plan.memory import draft_params, layer_params
from specdraft.plan.rollout import KvBudget, RolloutInstance, RolloutPlan
from specdraft.spec.derived import head_dim, kv_heads, max_model_len, num_speculative_tokens, rollout_gpus
from specdraft.spec.gpus import CATALOGUE
from specdraft.spec.schema import LayoutSpec

KV_DTYPE_BYTES = 2  # vLLM's default bf16 KV cache


def model_params(spec: LayoutSpec) -> int:
    """Total parameters of the policy (every expert counted)."""
    m = spec.model
    dense, expert = layer_params(spec)
    embed = m.vocab_size * m.hidden_size * (1 if m.tie_embeddings else 2)
    return m.num_layers * (dense + expert) + embed


def kv_bytes_per_token(spec: LayoutSpec) -> int:
    """K and V for every layer and KV head: 2 * layers * kv_heads * head_dim * bytes."""
    m = spec.model
    return 2 * m.num_layers * kv_heads(m) * head_dim(m) * KV_DTYPE_BYTES


def planned(spec: LayoutSpec) -> bool:
    """Whether the layout plans rollout instances: rollout.enabled, or a grpo layout (its job runs them)."""
    return spec.rollout.enabled or spec.workload == "grpo"


def speculating(spec: LayoutSpec) -> bool:
    """Whether the instances load the EAGLE-3 draft (speculation on and a draft to speculate with)."""
    return spec.rollout.speculative and spec.draft.enabled


def draft_kv_bytes_per_token(spec: LayoutSpec) -> int:
    """K and V of the draft's decoder layer(s): the target's attention shape, draft.num_layers deep."""
    m = spec.model
    return 2 * spec.draft.num_layers * kv_heads(m) * head_dim(m) * KV_DTYPE_BYTES


def kv_budget(spec: LayoutSpec) -> KvBudget:
    """Per-GPU HBM split of one instance: weights, KV budget, and how many full-length sequences fit.

    The weights are the target's plus, when the instance speculates, the EAGLE-3 draft's (plan.memory.draft_params;
    its embeddings are the target's). Both are bf16 and sharded over the instance's tp, and a speculating token also
    keeps the draft layers' KV. KV heads shard over tp up to their count and replicate beyond it (vLLM). This is the
    split costmodel.CostModel.kv_capacity_tokens uses.
    """
    r, m = spec.rollout, spec.model
    gpu = CATALOGUE[spec.cluster.gpu]
    draft = draft_params(spec) if speculating(spec) else 0
    target_weights = model_params(spec) * 2 / r.tp  # bf16 weights, sharded over the instance's tp
    draft_weights = draft * 2 / r.tp
    weights = target_weights + draft_weights
    usable = gpu.hbm_bytes * r.gpu_memory_utilization
    kv = usable - weights
    shards = max(1, min(r.tp, kv_heads(m)))
    per_token = (kv_bytes_per_token(spec) + (draft_kv_bytes_per_token(spec) if draft else 0)) / shards
    per_seq = per_token * max_model_len(spec)
    return KvBudget(
        weights_bytes_per_gpu=int(weights),
        target_weights_bytes_per_gpu=int(target_weights),
        draft_weights_bytes_per_gpu=int(draft_weights),
        kv_bytes_per_gpu=int(max(kv, 0)),
        kv_bytes_per_token_per_gpu=per_token,
        max_full_length_sequences=int(kv // per_seq) if per_seq > 0 and kv > 0 else 0,
    )


def check_rollout(spec: LayoutSpec) -> tuple[list[Problem], list[Problem]]:
    """Rollout rules: instances tile the GPUs, TP fits a node, counts and fractions in range, the KV cache fits."""
    r, c, m = spec.rollout, spec.cluster, spec.model
    errors: list[Problem] = []
    warnings: list[Problem] = []
    if not planned(spec):
        return errors, warnings

    def err(path, value, rule, fix):
        errors.append(Problem(path=path, value=value, rule=rule, fix=fix))

    if r.tp < 1:
        err("rollout.tp", r.tp, "must be >= 1", "use 1, 2, 4 or 8")
        return errors, warnings
    if not r.colocated and r.num_nodes < 1:
        err(
            "rollout.num_nodes",
            r.num_nodes,
            "dedicated rollout (colocated=false) needs nodes",
            "set rollout.num_nodes >= 1, or rollout.colocated=true",
        )
        return errors, warnings
    gpus = rollout_gpus(spec)
    if r.tp > c.gpus_per_node:
        err(
            "rollout.tp",
            r.tp,
            f"an instance's TP must fit in one node (gpus_per_node = {c.gpus_per_node})",
            f"use rollout.tp <= {c.gpus_per_node}",
        )
    elif c.gpus_per_node % r.tp or gpus % r.tp:
        err(
            "rollout.tp",
            r.tp,
            f"must divide the GPUs per node ({c.gpus_per_node}) so instances tile the {gpus} rollout GPUs",
            f"use one of {[d for d in range(1, c.gpus_per_node + 1) if c.gpus_per_node % d == 0]}",
        )
    heads = m.num_attention_heads
    if heads % r.tp:
        err("rollout.tp", r.tp, f"must divide model.num_attention_heads ({heads})", "vLLM shards heads over TP")
    if r.max_policy_lag < 0:
        err("rollout.max_policy_lag", r.max_policy_lag, "must be >= 0 (0 is synchronous on-policy)", "use 0 or 1")
    for fname in ("num_prompts_per_step", "num_generations_per_prompt", "max_response_length", "prompt_length"):
        if getattr(r, fname) < 1:
            err(f"rollout.{fname}", getattr(r, fname), "must be >= 1", "set a positive count")
    if not 0 <= r.acceptance_rate < 1:
        err("rollout.acceptance_rate", r.acceptance_rate, "must be in [0, 1)", "e.g. 0.7 for a trained EAGLE-3 draft")
    if r.num_speculative_tokens is not None and r.num_speculative_tokens < 1:
        err("rollout.num_speculative_tokens", r.num_speculative_tokens, "must be >= 1", "use null (= draft.ttt_steps)")
    if not 0 < r.gpu_memory_utilization <= 1:
        err("rollout.gpu_memory_utilization", r.gpu_memory_utilization, "must be in (0, 1]", "use 0.85")
    if r.max_num_seqs < 1:
        err(
            "rollout.max_num_seqs",
            r.max_num_seqs,
            "must be >= 1 (the sequences one vLLM instance runs at once)",
            "use 1024 (VeRL's default) or 256 (vLLM's)",
        )
    if errors or c.gpu not in CATALOGUE:
        return errors, warnings
    budget = kv_budget(spec)
    gib = 2**30
    if budget.kv_bytes_per_gpu <= 0:
        what = "target + draft" if budget.draft_weights_bytes_per_gpu else "target"
        err(
            "rollout.tp",
            r.tp,
            f"the bf16 weights ({what}: {budget.weights_bytes_per_gpu / gib:.1f} GiB per GPU) "
            f"do not fit in {r.gpu_memory_utilization:.0%} of the {c.gpu} HBM",
            "raise rollout.tp",
        )
    elif budget.max_full_length_sequences < 1:
        err(
            "rollout.max_model_len",
            max_model_len(spec),
            "not even one full-length sequence's KV cache fits after "
            f"the weights ({budget.kv_bytes_per_gpu / gib:.1f} GiB KV budget per GPU)",
            "raise rollout.tp or rollout.gpu_memory_utilization, or lower rollout.max_response_length",
        )
    if max_model_len(spec) > m.seq_length:
        warnings.append(
            Problem(
                path="rollout.max_response_length",
                value=r.max_response_length,
                rule=(
                    f"prompt_length + max_response_length ({max_model_len(spec)}) exceeds model.seq_length "
                    f"({m.seq_length}): the trainer cannot take the longest rollouts whole"
                ),
                fix=f"raise model.seq_length to {max_model_len(spec)} or cap the responses",
                severity="warning",
            )
        )
    if r.adaptive_k and not speculating(spec):
        err(
            "rollout.adaptive_k",
            r.adaptive_k,
            "chooses how many draft tokens to verify, but the instances do not speculate (rollout.speculative: "
            f"{str(r.speculative).lower()}, draft.enabled: {str(spec.draft.enabled).lower()})",
            "set rollout.speculative: true and draft.enabled: true, or rollout.adaptive_k: false",
        )
    if r.speculative and not spec.draft.enabled:
        warnings.append(
            Problem(
                path="rollout.speculative",
                value=True,
                rule="speculative decoding needs the co-trained draft, but draft.enabled is false",
                fix="set draft.enabled=true",
                severity="warning",
            )
        )
    return errors, warnings


def plan_rollout(spec: LayoutSpec) -> RolloutPlan | None:
    """The plan's `rollout`: instances with their nodes, local GPUs (and training ranks when colocated); its
    adaptive_k is speculation.with_adaptive_k's (the cost model imports this module)."""
    r, c = spec.rollout, spec.cluster
    if not planned(spec):
        return None
    gpus = rollout_gpus(spec)
    first_node = 0 if r.colocated else c.num_nodes
    instances = []
    for i in range(gpus // r.tp):
        start = i * r.tp
        instances.append(
            RolloutInstance(
                instance=i,
                node=first_node + start // c.gpus_per_node,
                local_gpus=tuple(start % c.gpus_per_node + k for k in range(r.tp)),
                training_ranks=tuple(start + k for k in range(r.tp)) if r.colocated else None,
            )
        )
    return RolloutPlan(
        colocated=r.colocated,
        num_gpus=gpus,
        tp=r.tp,
        num_instances=len(instances),
        instances=tuple(instances),
        samples_per_step=r.num_prompts_per_step * r.num_generations_per_prompt,
        max_policy_lag=r.max_policy_lag,
        speculative=speculating(spec),
        num_speculative_tokens=num_speculative_tokens(spec),
        acceptance_rate=r.acceptance_rate,
        kv=kv_budget(spec),
    )
