"""Lossless speculative decoding with a run's own target and EAGLE-3 draft, greedy, one sequence at a time.

Each verify step runs the target once over the sequence plus K chain-drafted tokens, accepts the longest prefix
of drafts equal to the target's own greedy tokens and adds the target's next (bonus) token, so the output is
exactly plain greedy decoding's. Drafting is the training-time test run forward: step 0 at the last processed row
r reads [emb(bonus token) ; fc(aux(r))] at position r and sees the trunk (step 0 at every row <= r); step j reads
[emb(draft j) ; step j-1's output as the draft carries it] at position r + j and also sees steps 1..j at row r, the
mask the draft trained under (draft.py). Neither model keeps a KV cache: every target forward recomputes the whole
prefix, in both arms, so tokens per target forward is what the wall-clock ratio reflects.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F


class Engine:
    """The target GPTModel (one process, THD packed input), its aux taps, and the draft."""

    def __init__(self, target, draft, aux_layers, device):
        self.target, self.draft, self.device = target, draft, device
        self.aux_layers = list(aux_layers)
        self._taps: dict[int, torch.Tensor] = {}
        for index, layer in enumerate(target.decoder.layers):
            if index in self.aux_layers:
                layer.register_forward_hook(self._hook(index))
        vocab = getattr(draft, "vocab", None) if draft is not None else None
        self.draft_to_target = vocab.target_ids() if vocab is not None else None

    def _hook(self, index: int):
        def capture(module, inputs, output):
            hidden = output[0] if isinstance(output, tuple) else output  # (t, 1, h)
            self._taps[index] = hidden.detach().flatten(0, 1)

        return capture

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(L,) token ids -> (logits (L, V), aux (n_taps, L, h)): one target forward over one packed sequence."""
        from megatron.core.packed_seq_params import PackedSeqParams

        n = tokens.numel()
        length = n + n % 2  # the ring kernel's causal chunks want an even length; a pad at the end sees nothing later
        ids = F.pad(tokens, (0, length - n)).to(self.device)
        cu = torch.tensor([0, length], dtype=torch.int32, device=self.device)
        params = PackedSeqParams(
            qkv_format="thd",
            cu_seqlens_q=cu,
            cu_seqlens_kv=cu,
            cu_seqlens_q_padded=cu,
            cu_seqlens_kv_padded=cu,
            max_seqlen_q=length,
            max_seqlen_kv=length,
        )
        positions = torch.arange(length, device=self.device)
        self._taps.clear()
        logits = self.target(
            input_ids=ids[None], position_ids=positions[None], attention_mask=None, packed_seq_params=params
        )  # (1, L, V)
        aux = torch.stack([self._taps[a] for a in self.aux_layers])  # (n_taps, L, h), in the plan's tap order
        return logits[0, :n].float(), aux[:, :n]

    @torch.no_grad()
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """(n,) -> (n, h) the target's token embeddings (the draft reads the policy's own)."""
        return self.target.embedding.word_embeddings(ids.to(self.device)[None])[0]

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.draft_to_target is None else self.draft_to_target[draft_ids]

    @torch.no_grad()
    def propose(self, tokens: torch.Tensor, aux: torch.Tensor, k: int) -> list[int]:
        """K greedy draft tokens after ``tokens`` (x_0..x_{r+1}; the target has processed x_0..x_r, giving ``aux``
        (n_taps, r+1, h)). Returns target ids."""
        rows = aux.shape[1]
        emb = self.embed(tokens[1 : rows + 1])  # (r+1, h): the token after each processed row

        def pick(logits: torch.Tensor) -> tuple[int, torch.Tensor]:
            token = self.to_target_ids(logits.argmax(-1))  # (1,)
            return int(token), self.embed(token)

        return [t for t, _ in draft_chain(self.draft, aux, emb, k, pick)]


def draft_chain(
    draft, aux: torch.Tensor, emb: torch.Tensor, k: int, pick: Callable[[torch.Tensor], tuple[object, torch.Tensor]]
) -> list[tuple[object, torch.Tensor]]:
    """Run the draft's TTT steps 0..k-1 for the last row of one sequence, each step's input token chosen by
    ``pick`` from the previous step's (1, Vd) logits; returns what ``pick`` returned per step (its choice and the
    (1, h) embedding fed to the next step). aux: (n_taps, L, h); emb: (L, h) step-0 embeddings of every row."""
    lengths = torch.tensor([aux.shape[1]], device=aux.device)
    return draft_chain_batch(draft, aux[:, None], emb[None], lengths, k, pick)


def draft_chain_batch(
    draft,
    aux: torch.Tensor,
    emb: torch.Tensor,
    lengths: torch.Tensor,
    k: int,
    pick: Callable[[torch.Tensor], tuple[Any, torch.Tensor]],
) -> list[tuple[Any, torch.Tensor]]:
    """draft_chain for B right-padded sequences at once: aux (n_taps, B, L, h), emb (B, L, h), lengths (B,) the
    valid rows of each; the chain starts at each sequence's last valid row r_b. ``pick`` maps (B, Vd) logits to
    (its choice, (B, h) embeddings of the chosen tokens). Padded rows sit after the valid ones, so under the causal
    trunk mask no valid row sees them; the branch steps are masked to each sequence's rows <= r_b."""
    b, length = emb.shape[:2]
    rows = torch.arange(length, device=aux.device)
    positions = rows.repeat(b)  # (B*L,) the trunk's RoPE positions, row index within each sequence
    x = draft.fc(aux.permute(1, 2, 0, 3).flatten(2)).flatten(0, 1)  # (B*L, n_taps*h) -> (B*L, h)
    flat_emb = emb.flatten(0, 1)
    causal = torch.ones(length, length, dtype=torch.bool, device=aux.device).tril()[None].expand(b, -1, -1)
    trunk = []
    for i, layer in enumerate(draft.layers):  # step 0 at every row: causal attention over the trunk
        q, key, value = layer.project(x, flat_emb if i == 0 else None, positions)
        q, key, value = (t.unflatten(0, (b, length)) for t in (q, key, value))  # (B, L, heads, d)
        trunk.append((key, value))
        x = layer.finish(x, _masked_attention(q, key, value, causal).flatten(0, 1))
    last = lengths.to(aux.device) - 1  # (B,)
    hidden = x.unflatten(0, (b, length))[torch.arange(b, device=aux.device), last]  # (B, h)
    out = [pick(draft.head(hidden))]
    seen = (rows[None] <= last[:, None])[:, None]  # (B, 1, L): each sequence's trunk rows
    branch: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in draft.layers]
    for j in range(1, k):
        x = draft.carry(hidden)  # what the next step reads (post-norm under EAGLE-3.1's norm_output)
        position = last + j
        for i, layer in enumerate(draft.layers):
            q, key, value = layer.project(x, out[-1][1] if i == 0 else None, position)  # (B, heads, d)
            branch[i].append((key, value))
            keys = torch.cat([trunk[i][0]] + [kv[0][:, None] for kv in branch[i]], dim=1)  # trunk, then steps 1..j
            values = torch.cat([trunk[i][1]] + [kv[1][:, None] for kv in branch[i]], dim=1)
            mask = F.pad(seen, (0, j), value=True)  # (B, 1, L + j)
            x = layer.finish(x, _masked_attention(q[:, None], keys, values, mask)[:, 0])
        hidden = x
        out.append(pick(draft.head(hidden)))
    return out


def _masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Dense batched attention. q (B, n, H, d), k/v (B, m, Hkv, d), allowed (B, n, m) -> (B, n, H, d); query head h
    reads kv head h // (H / Hkv) (megatron's GQA grouping)."""
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bnhd,bmhd->bhnm", q.float(), k.float()) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    return torch.einsum("bhnm,bmhd->bnhd", scores.softmax(-1), v.float()).to(q.dtype)


@dataclass
class Decoded:
    tokens: list[int]
    target_forwards: int
    accepted: list[int] = field(default_factory=list)  # per verify step: draft tokens accepted (0..K)
    seconds: float = 0.0


def greedy(engine: Engine, prompt: torch.Tensor, max_new: int) -> Decoded:
    """Plain greedy decoding with the target alone: one target forward per token."""
    started = time.perf_counter()
    tokens = prompt.tolist()
    new: list[int] = []
    for _ in range(max_new):
        logits, _ = engine.forward(torch.tensor(tokens + new))
        new.append(int(logits[-1].argmax()))
    return Decoded(new, max_new, seconds=time.perf_counter() - started)


def speculative(engine: Engine, prompt: torch.Tensor, max_new: int, k: int) -> Decoded:
    """Greedy chain drafting of k tokens, one target forward to verify, the longest matching prefix plus the bonus."""
    started = time.perf_counter()
    logits, aux = engine.forward(prompt)
    new = [int(logits[-1].argmax())]  # the prefill's token
    forwards, accepted = 1, []
    while len(new) < max_new:
        context = torch.cat([prompt, torch.tensor(new)])  # the target has processed all but the last token
        drafts = engine.propose(context, aux, k)
        logits, aux = engine.forward(torch.cat([context, torch.tensor(drafts)]))
        forwards += 1
        # The target's greedy token after the context and after each draft: (k + 1,)
        verdict = logits[context.numel() - 1 :].argmax(-1).tolist()
        a = 0
        while a < k and drafts[a] == verdict[a]:
            a += 1
        accepted.append(a)
        new += verdict[: a + 1]
        aux = aux[:, : context.numel() + a]  # rows whose inputs are now accepted tokens
    return Decoded(new[:max_new], forwards, accepted, seconds=time.perf_counter() - started)


def summarize(plain: list[Decoded], spec: list[Decoded], k: int) -> dict:
    """The measured figures: accept_len (tokens per verify step: accepted drafts + the bonus), tokens per target
    forward (the prefill included, as in plain decoding), acceptance[i] (share of verify steps that accepted at
    least i+1 drafts, so accept_len = 1 + sum(acceptance)), lossless, the wall-clock ratio plain / speculative and
    both tokens/s. The last verify step counts whole even where max_new cuts its tokens (vLLM counts it so too)."""
    steps = [a for d in spec for a in d.accepted]
    tokens = sum(len(d.tokens) for d in spec)
    forwards = sum(d.target_forwards for d in spec)
    plain_s, spec_s = sum(d.seconds for d in plain), sum(d.seconds for d in spec)
    return {
        "accept_len": round(1 + sum(steps) / len(steps), 6) if steps else None,
        "tokens_per_target_forward": round(tokens / forwards, 6),
        "acceptance": [round(sum(a > i for a in steps) / len(steps), 6) if steps else 0.0 for i in range(k)],
        "lossless": all(p.tokens == s.tokens for p, s in zip(plain, spec)),
        "speedup_wall": round(plain_s / spec_s, 4) if spec_s > 0 else None,
        "k": k,
        "prompts": len(spec),
        "verify_steps": len(steps),
        "new_tokens": tokens,
        "plain_s": round(plain_s, 4),
        "speculative_s": round(spec_s, 4),
        "plain_tokens_per_s": round(sum(len(d.tokens) for d in plain) / plain_s, 2) if plain_s > 0 else None,
        "speculative_tokens_per_s": round(tokens / spec_s, 2) if spec_s > 0 else None,
    }
