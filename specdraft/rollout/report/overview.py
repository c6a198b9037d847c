"""What `specdraft rollout plan` shows: instances, vLLM settings, KV room and model-based per-step estimates."""

from __future__ import annotations

from specdraft.errors import SpecError, UserError
from specdraft.plan.compile import check
from specdraft.rollout.model import costmodel, trainer
from specdraft.rollout.model.instances import check_rollout, max_model_len, plan_rollout, planned
from specdraft.rollout.model.speculation import with_adaptive_k
from specdraft.spec.schema import LayoutSpec

BUILTIN = "qwen3-8b"


def load(path: str | None, overrides: list[str]) -> LayoutSpec:
    """The layout the rollout commands use: ``path``, or the shipped default rollout layout; rollout must be on."""
    from specdraft.spec.load import builtin_layout_text, load_layout, load_layout_text

    if path is None:
        spec = load_layout_text(builtin_layout_text(BUILTIN), overrides, source=f"<built-in {BUILTIN}>")
    else:
        spec = load_layout(path, overrides)
    if not planned(spec):  # a grpo layout always plans its instances: its job runs them
        raise UserError(
            f"rollout is disabled in {path or BUILTIN} (rollout.enabled = false, workload {spec.workload})",
            "set rollout.enabled=true (e.g. append the override rollout.enabled=true)",
        )
    errors = [p for p in _problems(spec)[0] if not p.path.startswith("memory.")]
    if errors:
        raise SpecError(errors, path or f"<built-in {BUILTIN}>")
    return spec


def _problems(spec: LayoutSpec):
    """The training rules (memory included) and the rollout rules, as `specdraft validate` reports them."""
    errors, warnings = check(spec)
    r_errors, r_warnings = check_rollout(spec)
    return errors + r_errors, warnings + r_warnings


def training_notes(spec: LayoutSpec) -> list[str]:
    """Training-side memory problems: reported next to the rollout plan, not fatal to it (`specdraft validate`)."""
    errors, warnings = _problems(spec)
    return [p.render() for p in errors + warnings if p.path.startswith("memory.")]


def plan_overview(spec: LayoutSpec) -> dict:
    """The plan's rollout section (as compile builds it) plus the cost model's view of one instance."""
    plan = with_adaptive_k(spec, plan_rollout(spec))
    if plan is None:
        raise UserError("the layout's rollout section is disabled", "set rollout.enabled=true")
    r = spec.rollout
    cost = costmodel.from_spec(spec)
    train = trainer.from_spec(spec)
    n = r.num_generations_per_prompt
    per_instance = max(1, r.num_prompts_per_step * n // plan.num_instances)
    ctx = r.prompt_length + min(r.max_response_length, 4096)
    batch = min(per_instance, cost.max_num_seqs)
    speculating = cost.use_speculation(r.tp, batch, batch * ctx)
    step = cost.decode_step(r.tp, batch, batch * ctx, speculating)
    tokens = cost.tokens_per_step(speculating)
    mb = max(1, spec.training.global_batch_size // n) * n
    typical = [r.prompt_length + min(r.max_response_length, 3000)] * mb
    return {
        "plan": plan,
        "training_notes": training_notes(spec),
        "max_model_len": max_model_len(spec),
        "kv_capacity_tokens": cost.kv_capacity_tokens(r.tp),
        "expected_accepted_tokens": cost.tokens_per_step(cost.speculative),
        "speculation_below_batch": cost.speculation_threshold(r.tp, ctx),
        "typical": {
            "batch": batch,
            "context": ctx,
            "speculating": speculating,
            "decode_step_s": step,
            "tokens_per_s_per_gpu": batch * tokens / step / r.tp,
            "training_minibatch_s": train.minibatch(typical)[0],
            "minibatch_samples": mb,
        },
    }
