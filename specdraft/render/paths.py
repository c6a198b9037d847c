"""The checkpoint paths a render writes: the layout's own, or, where the layout leaves one unset, a named
placeholder that no engine resolves (vLLM, NeMo-RL and Megatron-LM refuse `<model.path>` as a folder and as a hub
id), so a render is never started against a path that means something else where it runs."""

from __future__ import annotations

from specdraft.plan.model import LaunchPlan

MODEL_PLACEHOLDER = "<model.path>"
DRAFT_PLACEHOLDER = "<draft.model>"


def model_path(plan: LaunchPlan) -> str:
    return plan.model.path if plan.model.path is not None else MODEL_PLACEHOLDER


def draft_model(plan: LaunchPlan) -> str:
    return plan.draft.model if plan.draft.model is not None else DRAFT_PLACEHOLDER


def placeholder_notes(plan: LaunchPlan, speculative: bool) -> list[str]:
    """What a render's reader must fill in before an engine can start from it."""
    notes = []
    if plan.model.path is None:
        notes.append(
            f"the policy is the placeholder {MODEL_PLACEHOLDER} (model.path is unset): set model.path to the "
            "policy's Hugging Face folder or hub id"
        )
    if speculative and plan.draft.model is None:
        notes.append(
            f"speculative_config.model is the placeholder {DRAFT_PLACEHOLDER} (draft.model is unset): set "
            "draft.model to the EAGLE-3 folder the engine starts from, e.g. the one `specdraft export RUN -o DIR` "
            "writes"
        )
    return notes
