"""What a plan's draft needs of the EAGLE-3 checkpoint at draft.path, from the plan's resolved sections: the
launch's check before anything is submitted and the ranks' before they read a tensor (eagle3_checkpoint.py)."""

from __future__ import annotations

from pathlib import Path

from specdraft.eagle3_checkpoint import DraftConfig, Expected, Finding, check, import_notes, read
from specdraft.plan.model import LaunchPlan

SCALING = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def expected(plan: LaunchPlan) -> Expected:
    """spec/checkpoints/draft.expected, from the plan's model and draft sections."""
    m, d = plan.model, plan.draft
    scaling = m.rope_scaling
    n = m.num_layers
    return Expected(
        hidden_size=m.hidden_size,
        ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups,
        head_dim=m.head_dim,
        vocab_size=m.vocab_size,
        draft_vocab_size=d.vocab_size,
        draft_vocab_given=d.vocab_size != m.vocab_size,
        num_layers=d.num_layers,
        aux_layers=tuple(d.aux_layers),
        default_aux=(1, n // 2 - 1, n - 4),  # spec.derived.default_aux_layers
        rotary_base=float(m.rotary_base),
        rope_scaling={k: float(getattr(scaling, k)) for k in SCALING} if scaling is not None else None,
        norm_epsilon=m.norm_epsilon,
        norm_before_residual=d.norm_before_residual,
        norm_output=d.norm_output,
        seq_length=m.seq_length,
    )


def review(plan: LaunchPlan) -> tuple[DraftConfig | None, list[Finding], list[str]]:
    """(the checkpoint's config, what keeps it from starting the plan's draft, notes); (None, [], []) without
    draft.path."""
    if plan.draft.path is None or not plan.draft.enabled:
        return None, [], []
    found, findings = read(Path(plan.draft.path))
    if found is None:
        return None, findings, []
    findings, notes = check(found, expected(plan))
    return found, findings, notes + import_notes(Path(plan.draft.path), found)
