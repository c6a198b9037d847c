"""How many optimizer steps a draft needs to learn its later TTT steps for a fixed policy: the EAGLE-3 draft
(draft.norm_output false) against EAGLE-3.1 (true), from random weights and from the run's own draft.

Run: `.venv/bin/python benchmarks/draft_positions.py RUN [--steps 40] [--every 4] [--samples 256]`.
RUN is a finished run folder (a GRPO run of layouts/grpo-tiny-cpu.yaml, say) with a full-vocabulary draft. The policy
of its newest checkpoint is held fixed. The data is what a GRPO step trains its draft on: `--samples` responses of
MAX_NEW tokens sampled at temperature 1 from held-out prompts of the run's Markov chain. Each arm trains only the
draft, with the trainer's TTT loss (forward KL to the policy's distribution at row p+1+j, averaged over each step's
response rows, then over steps) and Adam at draft.lr with draft.clip_grad, on batches of 32 sequences. Every
`--every` steps it prints each TTT step's top-1 agreement with the policy, teacher-forced, on 16 greedy sequences
of the policy (what greedy speculative decoding drafts on); at the end, as JSON, also how often each step's top-1 is
step 0's and the RMS of the hidden state each step carries into the next.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPT_LENGTH, MAX_NEW, BATCH, GREEDY = 8, 8, 32, 16


def features(engine, tokens, vocab: int):
    """(tokens (L,), the policy's log-probs (L, V) over its vocabulary without padding, taps (n_taps, L, h))."""
    import torch

    ids = torch.tensor(tokens)
    logits, aux = engine.forward(ids)
    return ids, logits[:, :vocab].log_softmax(-1), aux


def continuation(engine, prompt: list[int], greedy: bool, generator, vocab: int) -> list[int]:
    import torch

    tokens = list(prompt)
    for _ in range(MAX_NEW):
        logits, _ = engine.forward(torch.tensor(tokens))
        probs = logits[-1, :vocab].softmax(-1)
        tokens.append(int(probs.argmax()) if greedy else int(torch.multinomial(probs, 1, generator=generator)))
    return tokens


def batch(engine, items, steps: int):
    """The TTT inputs of a packed batch: taps, (S, t, h) embeddings of x_{p+1+j}, positions, cu_seqlens, and per
    step the policy's log-probs at row p+1+j with the rows that carry a loss (the response's labels)."""
    import torch

    length = len(items[0][0])
    aux = torch.cat([it[2] for it in items], 1)
    zero = torch.zeros_like(engine.embed(items[0][0][:1]))
    embs, targets, valid = [], [], []
    for j in range(steps):
        rows, logp, ok = [], [], []
        for ids, lp, _ in items:
            ahead = torch.arange(length) + 1 + j
            inside = ahead < length
            rows.append(torch.where(inside[:, None], engine.embed(ids[ahead.clamp(max=length - 1)]), zero))
            logp.append(torch.where(inside[:, None], lp[ahead.clamp(max=length - 1)], 0.0))
            ok.append((ahead >= PROMPT_LENGTH - 1) & (ahead <= length - 2))
        embs.append(torch.cat(rows))
        targets.append(torch.cat(logp))
        valid.append(torch.cat(ok))
    positions = torch.stack([torch.arange(length).repeat(len(items)) + j for j in range(steps)])
    cu = torch.arange(len(items) + 1, dtype=torch.int32) * length
    return aux, torch.stack(embs), positions, cu, targets, valid


def agreement(engine, draft, items, steps: int) -> dict:
    """Per TTT step: top-1 agreement with the policy on the response rows; how often its top-1 is step 0's; the
    RMS of the hidden state it carries into the next step."""
    import torch

    aux, emb, positions, cu, targets, valid = batch(engine, items, steps)
    with torch.no_grad():
        hidden = draft.ttt(aux, emb, positions, cu)
        top = [draft.head(h)[:, : t.shape[1]].argmax(-1) for h, t in zip(hidden, targets)]
        carried = [draft.carry(h) for h in hidden]
    v0 = valid[0]
    return {
        "agreement": [
            round(float(((p == t.argmax(-1)) & v).sum() / v.sum()), 3) for p, t, v in zip(top, targets, valid)
        ],
        "repeats_step_0": [round(float(((p == top[0]) & v0).sum() / v0.sum()), 3) for p in top],
        "carried_rms": [round(float(c[v0].pow(2).mean(-1).sqrt().mean()), 2) for c in carried],
    }


def train_arm(engine, draft, plan, data, greedy, steps: int, every: int) -> list[dict]:
    import torch

    s = plan.draft.ttt_steps
    optimizer = torch.optim.Adam(draft.parameters(), lr=plan.draft.lr)
    generator = torch.Generator().manual_seed(1)
    rows = [{"step": 0, **agreement(engine, draft, greedy, s)}]
    print(f"  start: {rows[0]}", flush=True)
    for step in range(1, steps + 1):
        picked = torch.randperm(len(data), generator=generator)[:BATCH].tolist()
        aux, emb, positions, cu, targets, valid = batch(engine, [data[i] for i in picked], s)
        hidden = draft.ttt(aux, emb, positions, cu)
        loss = 0.0
        for h, t, v in zip(hidden, targets, valid):
            kl = (t.exp() * (t - draft.head(h)[:, : t.shape[1]].float().log_softmax(-1))).sum(-1)
            loss = loss + (kl * v).sum() / v.sum().clamp(min=1)
        optimizer.zero_grad()
        (loss / s).backward()
        if plan.draft.clip_grad:
            torch.nn.utils.clip_grad_norm_(draft.parameters(), plan.draft.clip_grad)
        optimizer.step()
        if step % every == 0:
            rows.append({"step": step, **agreement(engine, draft, greedy, s)})
            print(f"  step {step:3d}  per TTT step {rows[-1]['agreement']}", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--samples", type=int, default=256)
    args = parser.parse_args()
    import torch

    from specdraft.runtime.models.target import init_parameters
    from specdraft.runtime.serve import offline
    from specdraft.runtime.serve.speculative import Engine
    from specdraft.runtime.train.data import MarkovData

    plan = offline.read_run_plan(args.run)
    if plan.draft.vocab_size != plan.model.vocab_size:
        raise SystemExit("draft_positions.py measures full-vocabulary drafts (draft.vocab_size null)")
    folder, meta = offline.checkpoint(args.run, None)
    results = {}
    with offline.single_process():
        cpu = torch.device("cpu")
        target, _ = offline.load(plan, folder, draft=False, device=cpu, dtype=torch.float32, meta=meta)
        engine = Engine(target, None, plan.draft.aux_layers, cpu)
        chain = MarkovData.for_plan(plan)
        step = int(meta["step"]) - 1
        generator = torch.Generator().manual_seed(0)
        prompts = [chain.prompt(step, 10_000 + i, PROMPT_LENGTH).tolist() for i in range(args.samples + GREEDY)]
        vocab = plan.model.vocab_size
        sampled = [continuation(engine, p, False, generator, vocab) for p in prompts[: args.samples]]
        data = [features(engine, tokens, vocab) for tokens in sampled]
        greedy = [features(engine, continuation(engine, p, True, generator, vocab), vocab) for p in prompts[-GREEDY:]]
        own = plan.draft.norm_output
        arms = [("EAGLE-3, random weights", False, True), ("EAGLE-3.1, random weights", True, True)]
        arms.append((f"EAGLE-3{'.1' if own else ''}, the run's draft", own, False))
        for name, norm_output, scratch in arms:
            _, draft = offline.load(plan, folder, target=False, device=cpu, dtype=torch.float32, meta=meta)
            draft.shape = dataclasses.replace(draft.shape, norm_output=norm_output)
            engine.aux_layers, engine.draft = list(plan.draft.aux_layers), draft
            if scratch:  # the trainer's initialisation of a draft from random weights
                with torch.no_grad():
                    init_parameters(draft, 0, 1, plan.training.seed ^ 0x5EED, vocab=draft.shape.vocab)
            print(name, flush=True)
            results[name] = train_arm(engine, draft, plan, data, greedy, args.steps, args.every)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
