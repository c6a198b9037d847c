"""Field-level rules of a layout: every problem at once, each with the path, the value, the rule and a fix.

Rules that need the compiled stage map (memory, the draft stage's load) live in specdraft.plan.check.
"""

from __future__ import annotations

import re

from specdraft.errors import Problem
from specdraft.spec.bounds import check as check_bounds
from specdraft.spec.derived import default_aux_layers, kv_heads, resolved_dp
from specdraft.spec.gpus import CATALOGUE
from specdraft.spec.schema import LayoutSpec
from specdraft.spec.validate.container import container_rules
from specdraft.spec.validate.data import data_rules
from specdraft.spec.validate.grpo import grpo_rules
from specdraft.spec.validate.model import model_rules
from specdraft.spec.validate.parallel import divisors, parallel_rules
from specdraft.spec.validate.run import checkpoint_rules, slurm_rules

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")  # Hugging Face's [ORG/]NAME


def validate_fields(spec: LayoutSpec) -> tuple[list[Problem], list[Problem]]:
    """Return (errors, warnings) for every field rule."""
    out_of_bounds = check_bounds(spec)
    if out_of_bounds:
        # Reported alone: the rules below do arithmetic (divisors, products, memory sums) that assumes sane sizes.
        return out_of_bounds, []
    errors: list[Problem] = []
    warnings: list[Problem] = []

    def err(path, value, rule, fix):
        errors.append(Problem(path=path, value=value, rule=rule, fix=fix))

    def warn(path, value, rule, fix):
        warnings.append(Problem(path=path, value=value, rule=rule, fix=fix, severity="warning"))

    m, c, t = spec.model, spec.cluster, spec.training
    if not NAME_RE.match(spec.name):
        err(
            "name",
            spec.name,
            "must be 1-64 letters, digits, '.', '_' or '-' (it names jobs and run folders)",
            f"use e.g. {re.sub(r'[^A-Za-z0-9._-]+', '-', spec.name).strip('-.') or 'my-layout'!r}",
        )

    for fname in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size", "seq_length"):
        if getattr(m, fname) < 1:
            err(f"model.{fname}", getattr(m, fname), "must be a positive integer", "take it from the model's config")
    heads = max(m.num_attention_heads, 1)
    groups = kv_heads(m)
    if m.num_query_groups is not None and (groups < 1 or heads % groups):
        err(
            "model.num_query_groups",
            groups,
            f"must divide model.num_attention_heads ({heads})",
            f"use one of {divisors(heads)}",
        )
    # Optional sizes where null means "derive it": 0 must not quietly mean null (`x or default` downstream).
    for fname in ("kv_channels", "moe_ffn_hidden_size"):
        if getattr(m, fname) is not None and getattr(m, fname) < 1:
            err(f"model.{fname}", getattr(m, fname), "must be >= 1, or null for the default", "use null")
    if m.kv_channels is None and m.hidden_size % heads:
        err(
            "model.kv_channels",
            None,
            f"hidden_size ({m.hidden_size}) is not a multiple of num_attention_heads ({heads})",
            "set model.kv_channels (the head dim) explicitly",
        )
    if m.num_experts is not None:
        if m.num_experts < 1:
            err("model.num_experts", m.num_experts, "must be >= 1, or null for a dense model", "set it to null")
        if m.moe_ffn_hidden_size is None:
            err(
                "model.moe_ffn_hidden_size",
                None,
                "is required with model.num_experts",
                "set it to the expert MLP size (HF moe_intermediate_size)",
            )
        if not 1 <= m.moe_router_topk <= max(m.num_experts, 1):
            err(
                "model.moe_router_topk",
                m.moe_router_topk,
                f"must be in 1..num_experts ({m.num_experts})",
                "take it from HF num_experts_per_tok",
            )
    if m.moe_aux_loss_coeff < 0:
        err(
            "model.moe_aux_loss_coeff",
            m.moe_aux_loss_coeff,
            "must be >= 0 (0 turns the load-balancing loss off)",
            "take it from HF router_aux_loss_coef (Mixtral: 0.001), or use 0",
        )
    elif m.moe_aux_loss_coeff and m.num_experts is None:
        err(
            "model.moe_aux_loss_coeff",
            m.moe_aux_loss_coeff,
            "the router's load-balancing loss needs an MoE model (model.num_experts)",
            "set model.moe_aux_loss_coeff=0 or model.num_experts",
        )

    model_rules(spec, err, warn)

    if c.num_nodes < 1:
        err("cluster.num_nodes", c.num_nodes, "must be >= 1", "set the number of nodes in the allocation")
    if c.gpus_per_node < 1:
        err("cluster.gpus_per_node", c.gpus_per_node, "must be >= 1", "usually 8")
    if c.gpu not in CATALOGUE:
        import difflib

        close = difflib.get_close_matches(c.gpu, list(CATALOGUE), n=1)
        err(
            "cluster.gpu",
            c.gpu,
            f"unknown accelerator; known: {', '.join(CATALOGUE)}",
            f"did you mean {close[0]!r}?" if close else "pick one from `specdraft explain cluster.gpu`",
        )

    parallel_rules(spec, err, warn)
    _draft_rules(spec, err, warn)

    dp = resolved_dp(spec)
    if t.micro_batch_size < 1:
        err("training.micro_batch_size", t.micro_batch_size, "must be >= 1", "usually 1 with packing")
    if t.global_batch_size < 1:
        err("training.global_batch_size", t.global_batch_size, "must be >= 1", "a multiple of micro_batch_size * dp")
    elif dp and t.micro_batch_size >= 1 and t.global_batch_size % (t.micro_batch_size * dp):
        unit = t.micro_batch_size * dp
        err(
            "training.global_batch_size",
            t.global_batch_size,
            f"must be a multiple of micro_batch_size * dp ({t.micro_batch_size} * {dp} = {unit})",
            f"use {max(unit, t.global_batch_size // unit * unit)} or {(t.global_batch_size // unit + 1) * unit}",
        )
    if t.sequence_lengths == []:
        err(
            "training.sequence_lengths",
            [],
            "must list at least one length, or be null (= [model.seq_length])",
            "use null",
        )
    if spec.rollout.max_model_len is not None and spec.rollout.max_model_len < 1:
        err(
            "rollout.max_model_len",
            spec.rollout.max_model_len,
            "must be >= 1, or null (= prompt_length + max_response_length)",
            "use null",
        )
    for i, length in enumerate(t.sequence_lengths or []):
        if not 1 <= length <= m.seq_length:
            err(
                f"training.sequence_lengths[{i}]",
                length,
                f"must be in 1..model.seq_length ({m.seq_length})",
                "list typical packed-sequence lengths",
            )
    for fname in ("train_iters",):
        if getattr(t, fname) < 1:
            err(f"training.{fname}", getattr(t, fname), "must be >= 1", "run at least one step")
    if not 0 <= t.warmup_steps < t.train_iters:
        err(
            "training.warmup_steps",
            t.warmup_steps,
            f"must be in 0..train_iters-1 ({t.train_iters - 1}) so the draft trains at least one step",
            "lower it or raise training.train_iters",
        )
    if t.data_drift_interval < 0:
        err(
            "training.data_drift_interval",
            t.data_drift_interval,
            "must be >= 0 (steps between data shifts; 0 = no drift)",
            "use 0",
        )
    if not 0.0 <= t.data_drift_fraction <= 1.0:
        err("training.data_drift_fraction", t.data_drift_fraction, "must be in [0, 1]", "use 0.5")
    if t.lr <= 0:
        err("training.lr", t.lr, "must be > 0", "e.g. 1e-5 for RL post-training")
    if t.clip_grad < 0:
        err("training.clip_grad", t.clip_grad, "must be >= 0 (0 disables clipping)", "use 1.0")
    if c.gpu == "cpu" and t.dtype != "fp32":
        warn(
            "training.dtype",
            t.dtype,
            "CPU runs compute in fp32; the memory estimate uses this dtype",
            "set training.dtype=fp32 for local CPU layouts",
        )
    _precision_rules(spec, err)

    slurm_rules(spec, err)
    container_rules(spec, err)
    checkpoint_rules(spec, err)
    data_rules(spec, err, warn)
    grpo_rules(spec, err, warn)
    return errors, warnings


def _precision_rules(spec: LayoutSpec, err) -> None:
    t = spec.training
    gpu = CATALOGUE.get(spec.cluster.gpu)
    if t.dtype == "fp8" and gpu is not None and not gpu.fp8_flops:
        fp8 = [g.name for g in CATALOGUE.values() if g.fp8_flops]
        err(
            "training.dtype",
            "fp8",
            f"FP8 GEMMs need FP8 tensor cores (Hopper or Blackwell); {gpu.name} has none",
            f"use training.dtype=bf16, or cluster.gpu one of {', '.join(fp8)}",
        )
    if t.grad_reduce_in_bf16 and t.dtype not in ("bf16", "fp8"):
        err(
            "training.grad_reduce_in_bf16",
            True,
            f"reduces gradients in bf16, but training.dtype is {t.dtype}",
            "set training.grad_reduce_in_bf16=false, or training.dtype=bf16",
        )


def _draft_rules(spec: LayoutSpec, err, warn) -> None:
    m, p, d, t = spec.model, spec.parallel, spec.draft, spec.training
    if not d.enabled:
        return
    n = m.num_layers
    aux = d.aux_layers if d.aux_layers is not None else default_aux_layers(n)
    path = "draft.aux_layers"
    if not aux:
        err(path, aux, "needs at least one target layer", "use null for the EAGLE-3 default [1, N//2-1, N-4]")
    bad = [a for a in aux if not 0 <= a < n]
    if bad:
        shown = aux if d.aux_layers is not None else f"default {aux} for num_layers={n}"
        err(
            path,
            shown,
            f"layers {bad} are out of range 0..{n - 1}",
            "list 0-indexed target layers" if d.aux_layers is not None else "set draft.aux_layers explicitly",
        )
    if len(set(aux)) != len(aux):
        shown = aux if d.aux_layers is not None else f"default {aux} for num_layers={n}"
        err(
            path,
            shown,
            "layers must be distinct",
            "drop the duplicates"
            if d.aux_layers is not None
            else "set draft.aux_layers explicitly (num_layers >= 8 gives a distinct default)",
        )
    if d.num_layers < 1:
        err("draft.num_layers", d.num_layers, "must be >= 1", "EAGLE-3 uses 1")
    if d.ttt_steps < 1:
        err("draft.ttt_steps", d.ttt_steps, "must be >= 1", "use 3 (EAGLE-3's usual unroll)")
    if isinstance(d.stage, int) and not isinstance(d.stage, bool) and not 0 <= d.stage < max(p.pp, 1):
        err(
            "draft.stage",
            d.stage,
            f"no such pipeline stage (pp = {p.pp})",
            f"use 'last', 'first' or an index in 0..{max(p.pp, 1) - 1}",
        )
    if d.loss_weight < 0:
        err("draft.loss_weight", d.loss_weight, "must be >= 0", "use 1.0")
    if d.lr <= 0:
        err("draft.lr", d.lr, "must be > 0", "use 1e-4")
    if d.model is not None and not (d.model.startswith("/") or HUB_ID.match(d.model)):
        # The renders hand it to an engine that runs elsewhere: a relative path would name something else there.
        err(
            "draft.model",
            d.model,
            "must be an absolute path or a hub id ([ORG/]NAME): an engine resolves a relative path where it runs",
            "give the EAGLE-3 folder's absolute path, e.g. draft.model=/ckpt/draft-eagle3",
        )
    if d.lr_warmup_steps is not None and d.lr_warmup_steps < 0:
        err("draft.lr_warmup_steps", d.lr_warmup_steps, "must be >= 0", "use 0 for none, or null for the default")
    if d.clip_grad < 0:
        err("draft.clip_grad", d.clip_grad, "must be >= 0 (0 disables clipping)", "use 1.0")
    if d.vocab_size is not None:
        if not 1 <= d.vocab_size <= m.vocab_size:
            err(
                "draft.vocab_size",
                d.vocab_size,
                f"must be in 1..model.vocab_size ({m.vocab_size})",
                "use null for the target's vocabulary, or e.g. 32000 against Llama-3's 128256",
            )
        elif p.tp >= 1 and d.vocab_size % p.tp:
            lower = max(p.tp, d.vocab_size - d.vocab_size % p.tp)
            err(
                "draft.vocab_size",
                d.vocab_size,
                f"must be a multiple of parallel.tp ({p.tp}): the draft's LM head is split over tp",
                f"use {lower}",
            )
    if d.export_interval < 0:
        err(
            "draft.export_interval",
            d.export_interval,
            "must be >= 0 (steps between publishing the draft; 0 turns it off)",
            "use 0, or e.g. 100",
        )
    elif d.export_interval and d.num_layers != 1:
        err(
            "draft.export_interval",
            d.export_interval,
            f"publishes the EAGLE-3 format, which has one decoder layer, but draft.num_layers is {d.num_layers}",
            "set draft.num_layers=1, or draft.export_interval=0",
        )
    if p.cp > 1:
        if not t.packing:
            err(
                "training.packing",
                False,
                "the draft's CP branch attention (zigzag_ring_branch_merge) needs packed "
                "sequences padded per sequence to a multiple of 2*cp",
                "set training.packing=true",
            )
        if p.cp_comm_type != "p2p":
            err(
                "parallel.cp_comm_type",
                p.cp_comm_type,
                "the draft's branch attention rides a p2p zigzag ring "
                "(trunk K/V travels, branch K/V stays rank-local); other CP comm types are not supported with a draft",
                "set parallel.cp_comm_type=p2p",
            )
