"""Per-position acceptance of a run's draft on given greedy token sequences, three ways that do not depend on each
other's code paths:

- `ttt_acceptance`: the draft's own training-time test (models/draft.py `Eagle3Draft.ttt`, the unroll the trainer
  optimises, loaded from the run's checkpoint) over each whole sequence at once, teacher-forced with the greedy
  tokens, then replayed as greedy speculative decoding does it: a verify step at row r accepts the leading TTT
  steps whose top-1 is the policy's, and the next one starts after them and the bonus token;
- the built-in decode of `rollout measure` (serve/speculative.py: the chained drafting, one step at a time);
- the GRPO builtin rollout engine (rl/engines/builtin.py: transformers' policy, the EAGLE-3 folder's draft).

`acceptance[i]` is the share of verify steps that accepted at least i + 1 drafts, vLLM's per-position counter
over its number of drafts."""

from __future__ import annotations

from pathlib import Path

import torch


def per_position(accepted: list[int], k: int) -> list[float]:
    return [sum(a > i for a in accepted) / len(accepted) for i in range(k)]


def replay(matches: torch.Tensor, prompt_length: int, max_new: int, budgeted: bool = False) -> list[int]:
    """Drafts accepted per verify step of greedy speculative decoding, from ``matches`` (k, L): whether TTT step j
    at row p proposes the policy's greedy token after row p + 1 + j. The prefill gives the first new token; each
    verify step starts at the last row whose token the target has processed. vLLM and `rollout measure` draft k
    tokens every step and count the last step whole; ``budgeted``: the GRPO builtin engine drafts only as many as
    are left to generate, and a step with none to draft is no verify step."""
    k = matches.shape[0]
    row, new, accepted = prompt_length - 1, 1, []
    while new < max_new:
        budget = min(k, max_new - new - 1) if budgeted else k
        a = 0
        while a < budget and bool(matches[a, row]):
            a += 1
        if budget > 0:
            accepted.append(a)
        new += a + 1
        row += a + 1
    return accepted


def _extend(engine, tokens: list[int], extra: int) -> list[int]:
    """``tokens`` plus ``extra`` greedy tokens of the target: the rows a last verify step's drafts are checked at."""
    out = list(tokens)
    for _ in range(extra):
        logits, _ = engine.forward(torch.tensor(out))
        out.append(int(logits[-1].argmax()))
    return out


def _ttt_matches(engine, draft, tokens: list[int], k: int) -> torch.Tensor:
    """(k, L) the TTT unroll's top-1 at step j and row p against the policy's top-1 at row p + 1 + j."""
    ids = torch.tensor(tokens)
    length = ids.numel()
    logits, aux = engine.forward(ids)
    embedded = engine.embed(ids)
    table = torch.cat([embedded, torch.zeros_like(embedded[:1])])  # row -1: past the end
    rows = torch.arange(length)
    index = torch.stack([torch.where(rows + 1 + j < length, rows + 1 + j, -1) for j in range(k)])
    positions = torch.stack([rows + j for j in range(k)])
    cu = torch.tensor([0, length], dtype=torch.int32)
    with torch.no_grad():
        hidden = draft.ttt(aux, table[index], positions, cu)
    greedy = logits.argmax(-1)
    out = torch.zeros(k, length, dtype=torch.bool)
    for j, h in enumerate(hidden):
        proposed = engine.to_target_ids(draft.head(h).argmax(-1))
        out[j, : length - 1 - j] = proposed[: length - 1 - j] == greedy[1 + j :]
    return out


def measure(rank, world, run_dir: str, policy_dir: str, draft_dir: str, sequences, prompt_length: int, k: int):
    """{ttt, ttt_budgeted, builtin, rl_builtin: per-position acceptance; builtin_tokens: the built-in decode's
    new tokens} for
    ``sequences`` (prompt + greedy new tokens each, all the same lengths). Runs in one spawned process."""
    from specdraft.runtime.rl.engines.builtin import BuiltinEngine
    from specdraft.runtime.serve import offline, speculative

    run = Path(run_dir)
    plan = offline.read_run_plan(run)
    folder, meta = offline.checkpoint(run, None)
    max_new = len(sequences[0]) - prompt_length
    with offline.single_process():
        target, draft = offline.load(plan, folder, device=torch.device("cpu"), dtype=torch.float32, meta=meta)
        engine = speculative.Engine(target, draft, plan.draft.aux_layers, torch.device("cpu"))
        ttt, budgeted, builtin, tokens = [], [], [], []
        for seq in sequences:
            extra = 2 * k + 1
            extended = _extend(engine, seq, extra + (len(seq) + extra) % 2)  # an even length for the ring kernel
            matches = _ttt_matches(engine, draft, extended, k)
            ttt += replay(matches, prompt_length, max_new)
            budgeted += replay(matches, prompt_length, max_new, budgeted=True)
            decoded = speculative.speculative(engine, torch.tensor(seq[:prompt_length]), max_new, k)
            builtin += decoded.accepted
            tokens.append(decoded.tokens)
    rl = BuiltinEngine(Path(policy_dir), Path(draft_dir), k=k, eos_id=None, device="cpu", seed=0)
    _, stats = rl.generate(
        [s[:prompt_length] for s in sequences], num_generations=1, max_new_tokens=max_new, temperature=0.0, seed=0
    )
    return {
        "ttt": per_position(ttt, k),
        "ttt_budgeted": per_position(budgeted, k),
        "builtin": per_position(builtin, k),
        "rl_builtin": list(stats.acceptance_per_pos),
        "builtin_tokens": tokens,
        "verify_steps": len(ttt),
    }
