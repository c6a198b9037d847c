"""`draft.path` checked when a layout loads: the EAGLE-3 checkpoint's config.json (eagle3_checkpoint.py, no torch)
must fit the policy and the draft section, each mismatch a Problem naming both values. The ranks check the
tensors themselves (runtime/models/eagle3_import.py)."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

from specdraft import eagle3_checkpoint
from specdraft.errors import Problem
from specdraft.spec.derived import aux_layers, default_aux_layers, draft_vocab_size, head_dim, kv_heads
from specdraft.spec.schema import LayoutSpec


def expected(spec: LayoutSpec) -> eagle3_checkpoint.Expected:
    """What ``spec`` needs of the checkpoint at draft.path."""
    m, d = spec.model, spec.draft
    return eagle3_checkpoint.Expected(
        hidden_size=m.hidden_size,
        ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=kv_heads(m),
        head_dim=head_dim(m),
        vocab_size=m.vocab_size,
        draft_vocab_size=draft_vocab_size(spec),
        draft_vocab_given=d.vocab_size is not None,
        num_layers=d.num_layers,
        aux_layers=tuple(aux_layers(spec)),
        default_aux=tuple(default_aux_layers(m.num_layers)),
        rotary_base=float(m.rotary_base),
        rope_scaling={k: float(v) for k, v in asdict(m.rope_scaling).items()} if m.rope_scaling else None,
        norm_epsilon=m.norm_epsilon,
        norm_before_residual=d.norm_before_residual,
        norm_output=d.norm_output,
        seq_length=m.seq_length,
    )


def fill(data: dict) -> None:
    """draft.norm_output, when the layout names a draft.path and leaves it out, is the checkpoint's own: EAGLE-3
    checkpoints carry the un-normalised hidden state from step to step, EAGLE-3.1 ones the post-norm one. A folder
    that cannot be read is left to `problems`, which names what is wrong with it."""
    draft = data.get("draft")
    if not isinstance(draft, dict) or "norm_output" in draft or not isinstance(draft.get("path"), str):
        return
    if not os.path.isabs(draft["path"]) or draft.get("enabled") is False:
        return
    found, _ = eagle3_checkpoint.read(Path(draft["path"]))
    if found is not None:
        draft["norm_output"] = found.norm_output


def problems(spec: LayoutSpec) -> list[Problem]:
    """Every reason the checkpoint at ``spec.draft.path`` cannot start ``spec``'s draft ([] without draft.path)."""
    return review(spec)[0]


def review(spec: LayoutSpec) -> tuple[list[Problem], list[str]]:
    """(problems, notes) of ``spec.draft.path``: notes say what fits but deserves a word (a short max_position)."""
    d = spec.draft
    if d.path is None:
        return [], []
    if not d.enabled:
        return [
            Problem(
                path="draft.path",
                value=d.path,
                rule="names a checkpoint for a draft that is off (draft.enabled false)",
                fix="drop draft.path, or set draft.enabled=true",
            )
        ], []
    if not os.path.isabs(d.path):
        return [
            Problem(
                path="draft.path",
                value=d.path,
                rule="must be an absolute path: the ranks run in the run folder, where a relative one names "
                "something else",
                fix=f"draft.path={os.path.abspath(d.path)}",
            )
        ], []
    found, findings = eagle3_checkpoint.read(Path(d.path))
    notes: list[str] = []
    if found is not None:
        findings, notes = eagle3_checkpoint.check(found, expected(spec))
        notes += eagle3_checkpoint.import_notes(Path(d.path), found)
    return [Problem(path=f.field, value=f.value, rule=f.rule, fix=f.fix) for f in findings], notes


def model_problems(spec: LayoutSpec) -> list[Problem]:
    """draft.model, the folder the renders hand to vLLM, where it is a local EAGLE-3 folder here: one vLLM would
    refuse to load is refused now, with the fix ([] for a hub id, a folder elsewhere or the placeholder)."""
    model = spec.draft.model
    if model is None or not os.path.isabs(model) or not (Path(model) / eagle3_checkpoint.CONFIG).is_file():
        return []
    found, _ = eagle3_checkpoint.read(Path(model))
    refused = eagle3_checkpoint.vllm_refuses_d2t(Path(model), found) if found is not None else None
    if refused is None:
        return []
    return [
        Problem(
            path="draft.model",
            value=model,
            rule=refused,
            fix="serve the folder `specdraft export RUN -o DIR` writes from a run that imported it (it writes d2t "
            "only for a reduced vocabulary), or save this one again without its d2t and t2d tensors",
        )
    ]
