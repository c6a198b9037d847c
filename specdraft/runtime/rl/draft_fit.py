"""Fit an EAGLE-3 folder draft (engines/eagle3_draft.FolderDraft) to a transformers policy in plain torch, by the
training-time test objective specdraft's cotrain uses: step j at row t reads [emb(x_{t+1+j}) ; step j-1's output]
at position t + j, attends to step 0's keys causally and to steps 1..j's keys at its own row (models/draft.ttt's
mask), and matches the policy's distribution at row t + 1 + j (forward KL). For tests and the RL benchmark's
single-process arms; a real run trains its draft on TapChannel taps (workloads/cotrain, workloads/grpo)."""

from __future__ import annotations

import math
from typing import Any

import torch

from specdraft.runtime.rl.engines.eagle3_draft import FolderDraft


@torch.no_grad()
def policy_pass(model: Any, draft: FolderDraft, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens (B, L) -> taps (n_taps, B, L, h) at the draft's aux ids (hidden_states[i] is the input of layer i,
    vLLM's id i) and the policy's log-probabilities (B, L, V)."""
    out = model(input_ids=tokens, output_hidden_states=True)  # hidden_states[0] is the embedding output
    taps = torch.stack([out.hidden_states[i] for i in draft.aux_ids])
    return taps.float(), out.logits.float().log_softmax(-1)


def ttt_loss(draft: FolderDraft, embed, tokens: torch.Tensor, taps: torch.Tensor, logp: torch.Tensor, k: int):
    """The mean over steps 0..k-1 of the forward KL from the policy to the draft; also returns each step's top-1
    agreement with the policy. tokens (B, L); taps (n_taps, B, L, h); logp (B, L, V) the policy's."""
    b, length = tokens.shape
    rows = length - 1  # row t reads x_{t+1}
    layer = draft.midlayer
    hidden = draft.fc(taps[:, :, :rows].permute(1, 2, 0, 3).flatten(2))  # (B, R, h)
    t = torch.arange(rows)
    causal = t[None, :] <= t[:, None]  # (R, R) key row <= query row
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    losses, agree = [], []
    for j in range(k):
        index = (t + 1 + j).clamp(max=length - 1)
        emb = embed(tokens[:, index])  # (B, R, h): x_{t+1+j}
        positions = (t + j).repeat(b)
        q, key, value = layer.project(hidden.flatten(0, 1), emb.flatten(0, 1), positions)
        q, key, value = (x.unflatten(0, (b, rows)) for x in (q, key, value))  # (B, R, heads, d)
        group = q.shape[2] // key.shape[2]
        key, value = key.repeat_interleave(group, dim=2), value.repeat_interleave(group, dim=2)
        keys.append(key)
        values.append(value)
        scale = 1.0 / math.sqrt(q.shape[-1])
        trunk = torch.einsum("brhd,bshd->bhrs", q, keys[0]) * scale
        trunk = trunk.masked_fill(~causal, float("-inf"))
        diag = [torch.einsum("brhd,brhd->bhr", q, kk)[..., None] * scale for kk in keys[1:]]  # (B, H, R, 1) each
        probs = torch.cat([trunk, *diag], dim=-1).softmax(-1)
        attn = torch.einsum("bhrs,bshd->brhd", probs[..., :rows], values[0])
        for i, vv in enumerate(values[1:]):
            attn = attn + probs[..., rows + i].permute(0, 2, 1)[..., None] * vv
        hidden = layer.finish(hidden.flatten(0, 1), attn.flatten(0, 1)).unflatten(0, (b, rows))
        valid = t + 1 + j <= length - 1  # (R,): row t has a label x_{t+2+j}'s distribution at row t+1+j
        draft_logp = _target_logp(draft, draft.head(hidden[:, valid]))  # (B, R_j, V)
        target = logp[:, index[valid]]
        losses.append(-(target.exp() * draft_logp.clamp(min=-1e4)).sum(-1).mean())
        agree.append((draft_logp.argmax(-1) == target.argmax(-1)).float().mean().item())
    return torch.stack(losses).mean(), agree


def _target_logp(draft: FolderDraft, logits: torch.Tensor) -> torch.Tensor:
    """(…, Vd) draft logits -> (…, V) log-probabilities over the target vocabulary (-inf outside the draft's)."""
    logp = logits.float().log_softmax(-1)
    ids = draft.target_ids()
    if ids is None:
        return logp
    full = logp.new_full((*logp.shape[:-1], draft.vocab_size), float("-inf"))
    return full.index_copy(-1, ids, logp)


def fit(
    model: Any, draft: FolderDraft, sequences: torch.Tensor, *, k: int, steps: int, lr: float = 3e-3, batch: int = 16
) -> list[float]:
    """Adam on ttt_loss over minibatches of ``sequences`` (N, L) (the policy's own samples); returns the losses.
    The policy stays frozen; taps and log-probs are computed once."""
    taps, logp = policy_pass(model, draft, sequences)
    embed = model.get_input_embeddings()
    optimizer = torch.optim.Adam(draft.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(0)
    out = []
    draft.train()
    for _ in range(steps):
        pick = torch.randperm(sequences.shape[0], generator=generator)[:batch]
        loss, _ = ttt_loss(draft, lambda ids: embed(ids).detach(), sequences[pick], taps[:, pick], logp[pick], k)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        optimizer.step()
        out.append(loss.item())
    draft.eval()
    return out


def state(draft: FolderDraft) -> dict[str, torch.Tensor]:
    """The draft's tensors by EAGLE-3 name (what refit_draft takes and a folder holds)."""
    return {name: value.detach().clone() for name, value in draft.state_dict().items()}
