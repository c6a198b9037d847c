"""A real tokenizer (tests/support/hf_tokenizer.py: a BPE trained with `tokenizers`, saved with a chat template and
loaded through AutoTokenizer) turns a data file into samples, and the samples into packed rows.

- Rendering: specdraft's token ids of a conversation equal `tokenizer.apply_chat_template`'s, with a Llama-3-like
  template that has {% generation %} markers and a ChatML-like one without.
- The loss mask covers exactly the assistant tokens: each masked run decodes to one assistant message's content and
  its end-of-turn marker, in order. Both ways of finding them (transformers' generation mask, specdraft's prefix
  rendering) agree on the same template text; a template that rewrites earlier turns is refused by row.
- prompt/response rows render as a user/assistant turn (with a template) or concatenate with EOS (without); text
  rows train on every token.
- Packing: the rows are a function of (samples, seed, step) only: equal in two instances (every rank builds its
  own), every sample once per epoch, lengths multiples of the plan's length multiple, the rows' loss mask the
  samples' trained mask shifted by one (the draft's validity too), and a restored position continues exactly.
- The token-length check, the tokenizer's size against model.vocab_size, and a template-less tokenizer for chat
  data each stop with one message naming the file, the row and the field.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from specdraft.assemble import compile
from specdraft.datafile import DataError, read_records
from specdraft.runtime.train import corpus as corpus_mod
from specdraft.runtime.train.batches import make_microbatch
from specdraft.runtime.train.corpus import encode, load_corpus, load_tokenizer, mask_method
from specdraft.runtime.train.data import shifted
from specdraft.runtime.train.packing import PackedData
from specdraft.spec.load import load_layout
from tests.support.hf_tokenizer import (
    CHATML,
    LLAMA3,
    LLAMA3_PLAIN,
    REWRITING,
    VOCAB_SIZE,
    conversations,
    make_model_folder,
    write_jsonl,
)

CHATS = conversations(24, seed=3, max_turns=3)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {
        name: make_model_folder(root / name, template)
        for name, template in (
            ("llama3", LLAMA3),
            ("llama3-plain", LLAMA3_PLAIN),
            ("chatml", CHATML),
            ("rewriting", REWRITING),
            ("none", None),
        )
    }


@pytest.fixture(scope="module")
def tokenizers(folders):
    return {name: load_tokenizer(str(folder)) for name, folder in folders.items()}


def _plan(tmp_path, data_file, folder, *extra):
    overrides = [f"data.path={data_file}", f"model.path={folder}", f"model.vocab_size={VOCAB_SIZE}", *extra]
    return compile(load_layout(None, ["model.seq_length=256", *overrides]))


def _runs(ids, mask) -> list[list[int]]:
    """The maximal runs of masked token ids."""
    runs, current = [], []
    for token, bit in zip(ids, mask):
        if bit:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


@pytest.mark.parametrize("name", ["llama3", "llama3-plain", "chatml"])
def test_the_rendering_equals_apply_chat_template(tokenizers, name):
    tok = tokenizers[name]
    method = mask_method(tok, "messages")
    assert method == ("generation" if name == "llama3" else "prefix")
    for chat in CHATS:
        ids, _ = encode(tok, "messages", tuple((m["role"], m["content"]) for m in chat), method)
        assert ids == list(tok.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"])


@pytest.mark.parametrize(
    "name,end", [("llama3", "<|eot_id|>"), ("llama3-plain", "<|eot_id|>"), ("chatml", "<|im_end|>\n")]
)
def test_the_mask_covers_exactly_the_assistant_tokens(tokenizers, name, end):
    tok = tokenizers[name]
    method = mask_method(tok, "messages")
    for chat in CHATS:
        ids, mask = encode(tok, "messages", tuple((m["role"], m["content"]) for m in chat), method)
        assert len(mask) == len(ids)
        wanted = [m["content"] + end for m in chat if m["role"] == "assistant"]
        assert [tok.decode(run) for run in _runs(ids, mask)] == wanted


def test_generation_markers_and_prefix_rendering_agree(tokenizers):
    for chat in CHATS:
        value = tuple((m["role"], m["content"]) for m in chat)
        assert encode(tokenizers["llama3"], "messages", value, "generation") == encode(
            tokenizers["llama3-plain"], "messages", value, "prefix"
        )


def test_prompt_response_and_text_rows(tokenizers):
    pair = ("why is the cat red", "the dog runs")
    chat = [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    tok = tokenizers["llama3"]
    assert encode(tok, "prompt_response", pair, "generation") == encode(
        tok, "messages", tuple((m["role"], m["content"]) for m in chat), "generation"
    )
    plain = tokenizers["none"]
    assert mask_method(plain, "prompt_response") == "plain"
    ids, mask = encode(plain, "prompt_response", pair, "plain")
    head = plain(pair[0])["input_ids"]  # BOS + the prompt
    assert ids == head + plain(pair[1], add_special_tokens=False)["input_ids"] + [plain.eos_token_id]
    assert mask == [0] * len(head) + [1] * (len(ids) - len(head))
    ids, mask = encode(plain, "text", "hello world", "all")
    assert ids == plain("hello world")["input_ids"] + [plain.eos_token_id] and mask == [1] * len(ids)


def test_load_corpus_reads_the_file_through_the_plans_tokenizer(tmp_path, folders, tokenizers):
    data = write_jsonl(tmp_path / "chats.jsonl", [{"messages": chat} for chat in CHATS])
    corpus = load_corpus(_plan(tmp_path, data, folders["chatml"]))
    assert corpus.format == "messages" and corpus.mask_method == "prefix" and len(corpus.samples) == len(CHATS)
    tok = tokenizers["chatml"]
    for sample, chat in zip(corpus.samples, CHATS):
        assert sample.tokens.tolist() == list(
            tok.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"]
        )
    assert load_corpus(_plan(tmp_path, data, folders["chatml"])).digest == corpus.digest


def test_bad_rows_are_named_by_line_and_field(tmp_path, folders):
    long = [{"role": "user", "content": " ".join(["hello"] * 300)}, {"role": "assistant", "content": "sure"}]
    data = write_jsonl(tmp_path / "long.jsonl", [{"messages": CHATS[0]}, {"messages": long}])
    with pytest.raises(DataError) as err:
        load_corpus(_plan(tmp_path, data, folders["llama3"]))
    message = str(err.value)
    assert (
        str(data) in message
        and "line 2, field `messages`" in message
        and "longer than model.seq_length (256)" in message
    )
    assert "line 1" not in message

    one_turn = next(c for c in CHATS if sum(m["role"] == "assistant" for m in c) == 1)
    two_turns = next(c for c in CHATS if sum(m["role"] == "assistant" for m in c) > 1)
    data = write_jsonl(tmp_path / "turns.jsonl", [{"messages": one_turn}, {"messages": two_turns}])
    with pytest.raises(DataError, match=r"line 2, field `messages`: the chat template refused it.*prefix-stable"):
        load_corpus(_plan(tmp_path, data, folders["rewriting"]))

    with pytest.raises(DataError, match=r"has no chat template"):
        load_corpus(_plan(tmp_path, write_jsonl(tmp_path / "c.jsonl", [{"messages": CHATS[0]}]), folders["none"]))


def test_a_tokenizer_larger_than_the_model_is_refused(tmp_path, folders):
    data = write_jsonl(tmp_path / "t.jsonl", [{"text": "hello world"}])
    small = tmp_path / "small"  # the tokenizer's 320 tokens beside a config.json of 256 (it fills model.vocab_size)
    shutil.copytree(folders["none"], small)
    config = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 256}))
    plan = compile(load_layout(None, [f"data.path={data}", f"model.path={small}", "model.vocab_size=256"]))
    with pytest.raises(DataError, match=rf"has {VOCAB_SIZE} tokens, more than model.vocab_size \(256\)"):
        load_corpus(plan)


# ---------------------------------------------------------------------------------------------------- packing
@pytest.fixture(scope="module")
def corpus(folders, tmp_path_factory):
    data = write_jsonl(tmp_path_factory.mktemp("data") / "chats.jsonl", [{"messages": c} for c in CHATS])
    return load_corpus(_plan(None, data, folders["llama3"]))


def _packed(corpus, **kw):
    args = dict(vocab_size=VOCAB_SIZE, row_tokens=256, rows_per_step=4, length_multiple=16, seed=7, shuffle=True)
    return PackedData(corpus, **{**args, **kw})


def _digest(rows) -> list:
    return [(r.tokens.tolist(), r.labels.tolist(), r.loss_mask.tolist(), r.cu_seqlens.tolist()) for r in rows]


def test_packing_is_deterministic_and_visits_each_sample_once_per_epoch(corpus):
    a, b = _packed(corpus), _packed(corpus)
    steps = range(12)
    assert [_digest(a.step_rows(s, 4)) for s in steps] == [_digest(b.step_rows(s, 4)) for s in steps]
    assert a.position(12)["epoch"] >= 2, "the steps run past two epochs"
    other = _packed(corpus, seed=8)
    assert _digest(other.step_rows(0, 4)) != _digest(_packed(corpus).step_rows(0, 4))
    assert _packed(corpus, shuffle=False).order(0) == list(range(len(CHATS)))
    for epoch in range(3):
        assert sorted(a.order(epoch)) == list(range(len(CHATS)))
    assert a.order(0) != a.order(1)


def test_rows_hold_the_samples_with_the_loss_on_trained_tokens(corpus):
    data = _packed(corpus, shuffle=False)
    rows = data.step_rows(0, 4)
    first = corpus.samples[0]
    n = len(first.tokens)
    row = rows[0]
    assert row.tokens.numel() == 256 and all(int(x) % 16 == 0 for x in row.cu_seqlens)
    assert row.tokens[:n].tolist() == first.tokens.tolist()
    assert row.labels[: n - 1].tolist() == first.tokens[1:].tolist()
    assert row.loss_mask[: n - 1].tolist() == first.trained[1:].float().tolist()
    assert row.loss_mask[n - 1 : int(row.cu_seqlens[1])].sum() == 0, "no loss on the padding"
    # The draft's validity at TTT step j is the same mask, j + 1 rows on (its target row p+1+j carries loss).
    mb = make_microbatch(0, row, cp=1, cp_rank=0, steps=3, device="cpu")
    for j in range(3):
        assert torch.equal(mb.draft_valid[j], shifted(row.loss_mask, row.cu_seqlens, 1 + j))
    seen = [i for r in data._layout((0, 0), 4)[0] for i in r]
    assert seen == list(range(len(seen))), "file order, no sample skipped"
    assert sum(r.loss_mask.sum() for r in rows) == sum(corpus.samples[i].trained[1:].sum() for i in seen)


def test_a_restored_position_continues_exactly(corpus):
    reference = _packed(corpus)
    rows = [_digest(reference.step_rows(s, 4)) for s in range(8)]
    saved = reference.position(5)
    resumed = _packed(corpus)
    assert resumed.restore(5, saved) is None
    assert [_digest(resumed.step_rows(s, 4)) for s in range(5, 8)] == rows[5:]
    assert resumed.position(8) == reference.position(8)
    # A checkpoint of other data (or of the Markov chain) starts this data from its first sample, with a warning.
    fresh = _packed(corpus)
    assert "other data" in fresh.restore(5, {**saved, "digest": "0" * 64})
    assert _digest(fresh.step_rows(5, 4)) == rows[0]
    assert "Markov" in _packed(corpus).restore(5, None)


def test_a_sample_field_error_is_also_raised_by_read_records(tmp_path):
    data = write_jsonl(tmp_path / "x.jsonl", [{"messages": CHATS[0]}, {"messages": [{"role": "user"}]}])
    with pytest.raises(DataError, match=r"line 2, field `messages\[0\].content`: is missing"):
        read_records(str(data))
    assert corpus_mod.GENERATION_RE.search(LLAMA3) and not corpus_mod.GENERATION_RE.search(LLAMA3_PLAIN)
