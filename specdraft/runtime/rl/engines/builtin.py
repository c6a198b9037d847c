"""The built-in rollout engine (CPU torch, fast tests): transformers' own model class serves the HF policy folder,
serve/speculative.draft_chain_batch drafts with the EAGLE-3 folder, and sampling.py verifies, so rollouts are exact
samples of the policy (greedy at temperature 0). All sequences of a call decode as one right-padded batch; no KV
cache: each pass recomputes every prefix, so target passes, not wall clock, are the figure it is built to show."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from specdraft.runtime.rl.engines import sampling
from specdraft.runtime.rl.engines.eagle3_draft import load_folder, load_named
from specdraft.runtime.rl.rollouts import GenerationStats, Rollout, prompt_seeds
from specdraft.runtime.serve.speculative import draft_chain_batch


@dataclass
class _Sequence:
    generator: torch.Generator  # this sequence's own draws: its samples do not depend on its batch
    prompt_index: int
    tokens: list[int]  # prompt + generated
    num_prompt: int
    aux: torch.Tensor | None = None  # (n_taps, rows, h): taps of the rows whose inputs are accepted tokens
    done: bool = False
    finished: bool = False

    @property
    def num_new(self) -> int:
        return len(self.tokens) - self.num_prompt


def _load(transformers, folder: Path):
    """The HF folder's model in float32; from its config.json alone (placeholder weights) when it holds no
    weights, as a rollout instance starts: the first refit loads the real ones."""
    if any(folder.glob("*.safetensors")):
        return transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    config = transformers.AutoConfig.from_pretrained(str(folder))
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)


class BuiltinEngine:
    def __init__(self, policy_dir: Path, draft_dir: Path | None, *, k: int, eos_id: int | None, device: str, seed: int):
        import transformers

        self.device, self.k, self.eos_id, self.seed = torch.device(device), k, eos_id, seed
        self._k_by_batch: list[int] | None = None  # set_k_schedule: index b is the k a batch of b drafts
        model: Any = _load(transformers, Path(policy_dir))
        self.model: Any = model.to(self.device).eval()
        self.draft = load_folder(Path(draft_dir), device) if draft_dir is not None else None
        self._taps: dict[int, torch.Tensor] = {}
        if self.draft is not None:
            layers = self.model.model.layers
            for tap in self.draft.aux_ids:  # vLLM's id i is the input of layer i = the output of layer i - 1
                if not 1 <= tap <= len(layers):
                    raise ValueError(f"the draft taps layer input {tap}; the policy has {len(layers)} layers")
                layers[tap - 1].register_forward_hook(self._hook(tap))
            self._to_target = self.draft.target_ids()

    def _hook(self, tap: int):
        def capture(module, inputs, output):
            self._taps[tap] = (output[0] if isinstance(output, tuple) else output).detach()  # (B, L, h)

        return capture

    @torch.no_grad()
    def _forward(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Right-padded batch of token lists -> logits (B, L, V) float32 and taps (n_taps, B, L, h) or None.
        Padding sits after each row's tokens, so under the causal mask no real position sees it."""
        length = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), length, dtype=torch.long)
        for b, r in enumerate(rows):
            ids[b, : len(r)] = torch.tensor(r)
        self._taps.clear()
        logits = self.model(input_ids=ids.to(self.device)).logits.float()
        if self.draft is None:
            return logits, None
        return logits, torch.stack([self._taps[t] for t in self.draft.aux_ids])

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids.to(self.device))

    @torch.no_grad()
    def _propose(
        self, seqs: list[_Sequence], budgets: list[int], temperature: float
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """max(budgets) draft tokens for each sequence -> (B, k) target ids and, at temperature > 0, (B, k, V) their
        q. Sequence b draws from its generator for its own first budgets[b] tokens only (the rest go unused), so its
        draws never depend on the other sequences of the batch."""
        k = max(budgets)
        assert self.draft is not None
        taps = [s.aux for s in seqs if s.aux is not None]
        rows = [t.shape[1] for t in taps]  # the target processed all tokens but the last
        length = max(rows)
        aux = taps[0].new_zeros(taps[0].shape[0], len(seqs), length, taps[0].shape[2])
        emb_ids = torch.zeros(len(seqs), length, dtype=torch.long)
        for b, s in enumerate(seqs):
            aux[:, b, : rows[b]] = taps[b]
            emb_ids[b, : rows[b]] = torch.tensor(s.tokens[1 : rows[b] + 1])  # the token after each processed row
        vocab = self.model.config.vocab_size

        step = [0]

        def pick(logits: torch.Tensor):  # (B, Vd) -> ((target ids (B,), q (B, V) or None), (B, h))
            if temperature == 0:
                draft_ids, q = logits.argmax(-1), None
            else:
                qd = sampling.probabilities(logits, temperature)
                draft_ids = logits.argmax(-1).cpu()  # past a sequence's budget: unused, and no draw spent on it
                live = [b for b, budget in enumerate(budgets) if step[0] < budget]
                if live:
                    draft_ids[live] = sampling.draw(qd[live].cpu(), [seqs[b].generator for b in live])
                draft_ids = draft_ids.to(logits.device)
                step[0] += 1
                q = qd
                if self._to_target is not None:  # q over the target vocabulary: 0 outside the draft's
                    q = qd.new_zeros(len(seqs), vocab).index_copy_(1, self._to_target, qd)
            ids = draft_ids if self._to_target is None else self._to_target[draft_ids]
            return (ids, q), self._embed(ids)

        chain = draft_chain_batch(self.draft, aux, self._embed(emb_ids), torch.tensor(rows), k, pick)
        drafts = torch.stack([c[0][0] for c in chain], dim=1).cpu()  # (B, k)
        q = None if temperature == 0 else torch.stack([c[0][1] for c in chain], dim=1).cpu()  # (B, k, V)
        return drafts, q

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        num_generations: int,
        max_new_tokens: int,
        temperature: float,
        seed: int | Sequence[int],
    ) -> tuple[list[Rollout], GenerationStats]:
        started = time.perf_counter()
        seeds = prompt_seeds(seed, len(prompts), num_generations)
        seqs = [
            _Sequence(torch.Generator().manual_seed(seeds[i] + j), i, list(p), len(p))
            for i, p in enumerate(prompts)
            for j in range(num_generations)
        ]
        forwards = drafts_n = draft_tokens = accepted = 0
        per_pos = [0] * self.k
        logits, aux = self._forward([s.tokens for s in seqs])  # the prefill
        forwards += len(seqs)
        first = self._next(logits, torch.tensor([s.num_prompt - 1 for s in seqs]), temperature, seqs)
        for b, s in enumerate(seqs):
            if aux is not None:
                s.aux = aux[:, b, : s.num_prompt]
            self._extend(s, [int(first[b])], max_new_tokens)
        while active := [s for s in seqs if not s.done]:
            cap = self._k_at(len(active))
            budget = [min(cap, max_new_tokens - s.num_new - 1) if self.draft is not None else 0 for s in active]
            k = max(budget)
            proposed, q = self._propose(active, budget, temperature) if k > 0 else (torch.empty(0), None)
            rows = [s.tokens + (proposed[b, : budget[b]].tolist() if k > 0 else []) for b, s in enumerate(active)]
            logits, aux = self._forward(rows)
            forwards += len(active)
            starts = torch.tensor([len(s.tokens) - 1 for s in active])  # the row after the context
            if k == 0:
                news = [[int(t)] for t in self._next(logits, starts, temperature, active)]
                kept = [0] * len(active)
            else:
                news, kept = self._verify(logits, starts, proposed, q, torch.tensor(budget), temperature, active)
                drafts_n += sum(kb > 0 for kb in budget)
                draft_tokens += sum(budget)
                accepted += sum(kept)
                for a in kept:
                    for i in range(a):
                        per_pos[i] += 1
            for b, s in enumerate(active):
                if aux is not None:
                    s.aux = aux[:, b, : len(s.tokens) + kept[b]]  # rows whose inputs are now accepted tokens
                self._extend(s, news[b], max_new_tokens)
        rollouts = [Rollout(s.prompt_index, tuple(s.tokens[s.num_prompt :]), s.finished) for s in seqs]
        stats = GenerationStats(
            num_generated_tokens=sum(len(r.response) for r in rollouts),
            num_target_forwards=forwards,
            num_drafts=drafts_n,
            num_draft_tokens=draft_tokens,
            num_accepted_tokens=accepted,
            accepted_per_pos=tuple(per_pos),
            seconds=time.perf_counter() - started,
        )
        return rollouts, stats

    def set_k_schedule(self, schedule: Sequence[tuple[int, int, int]]) -> None:
        """vLLM's rule (num_speculative_tokens_per_batch_size): a batch of b drafts the k of the range holding b,
        a gap the k before it, a batch past the last range the last k; never more than the engine's k."""
        table = [0]  # index 0 unused
        for first, last, k in sorted(schedule):
            while len(table) < first:  # a gap carries the k before it
                table.append(table[-1])
            while len(table) <= last:
                table.append(min(self.k, k))
        self._k_by_batch = table

    def _k_at(self, batch: int) -> int:
        table = self._k_by_batch
        if table is None:
            return self.k
        return table[min(batch, len(table) - 1)]

    def _next(self, logits: torch.Tensor, at: torch.Tensor, temperature: float, seqs: list[_Sequence]):
        """(B,) one token per sequence from logits (B, L, V) at rows ``at`` (B,): the argmax at temperature 0."""
        rows = logits[torch.arange(len(at)), at.to(logits.device)].cpu()  # (B, V)
        if temperature == 0:
            return rows.argmax(-1)
        return sampling.sample(sampling.probabilities(rows, temperature), [s.generator for s in seqs])

    def _verify(self, logits, starts, proposed, q, budgets, temperature: float, seqs: list[_Sequence]):
        """Each sequence's verified tokens and number of kept drafts, from the verify pass's logits (B, L, V) at
        rows starts[b] .. starts[b] + k (after the context and after each draft)."""
        k = proposed.shape[1]
        index = (starts[:, None] + torch.arange(k + 1)[None]).clamp(max=logits.shape[1] - 1)  # (B, k+1)
        window = logits[torch.arange(len(starts))[:, None], index.to(logits.device)].cpu()  # (B, k+1, V)
        if temperature == 0:
            verdicts = window.argmax(-1).tolist()
            pairs = [
                sampling.verify_greedy(verdicts[b][: kb + 1], proposed[b, :kb].tolist())
                for b, kb in enumerate(budgets.tolist())
            ]
            return [p[0] for p in pairs], [p[1] for p in pairs]
        p = sampling.probabilities(window, temperature)
        tokens, kept = sampling.verify_sampled(p, q, proposed, budgets, [s.generator for s in seqs])
        return [tokens[b, : int(a) + 1].tolist() for b, a in enumerate(kept)], kept.tolist()

    def _extend(self, s: _Sequence, new: list[int], max_new_tokens: int) -> None:
        """Append tokens up to and including eos, and at most max_new_tokens in all; mark the sequence done."""
        for token in new:
            if s.num_new >= max_new_tokens:
                break
            s.tokens.append(token)
            if self.eos_id is not None and token == self.eos_id:
                s.done = s.finished = True
                return
        if s.num_new >= max_new_tokens:
            s.done = True

    def refit_policy(self, weights: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Checkpoint names equal to the model's parameter names are copied in place; otherwise (transformers 5
        fuses some checkpoint tensors, e.g. Mixtral's experts) transformers' own loader converts them from a
        temporary folder, and the converted state is copied in."""
        started = time.perf_counter()
        items = [(name, tensor.detach()) for name, tensor in weights]
        own = set(dict(self.model.named_parameters())) | set(dict(self.model.named_buffers()))
        if all(name in own for name, _ in items):
            load_named(self.model, items, strict=False)
        else:
            self._refit_converted(items)
        return time.perf_counter() - started

    def _refit_converted(self, items: list[tuple[str, torch.Tensor]]) -> None:
        import tempfile

        import transformers
        from safetensors.torch import save_file

        with tempfile.TemporaryDirectory() as tmp:
            self.model.config.save_pretrained(tmp)
            save_file(
                {n: t.cpu().contiguous() for n, t in items}, f"{tmp}/model.safetensors", metadata={"format": "pt"}
            )
            fresh = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)
        load_named(self.model, fresh.state_dict().items(), strict=False)

    def refit_draft(self, weights: Iterable[tuple[str, torch.Tensor]]) -> float:
        if self.draft is None:
            raise ValueError("this engine was opened without a draft: there is none to refit")
        started = time.perf_counter()
        self.draft.load(weights, strict=False)
        self._to_target = self.draft.target_ids()
        return time.perf_counter() - started

    def sleep(self) -> None:
        """Nothing to free: the built-in engine holds no cache between calls."""

    def close(self) -> None:
        self.model = None
        self.draft = None
