"""A model folder's tokenizer and chat template are code and data the user brings: each is bounded before training.

- Token ids: a tokenizer that maps a token to an id at or past model.vocab_size (its length still within it) is
  refused by name before any row is read; it would train on a zero embedding and an impossible label at tp 2 and
  end in an IndexError at tp 1.
- Chat templates: every row renders in a child process under a time, memory and size budget (runtime/train/chat.py).
  A template that loops past the budget, asks for more memory than it has, recurses without end or raises is
  refused naming the data file, the row and the template's file; render_chat renders what apply_chat_template does.
"""

from __future__ import annotations

import json
import shutil

import pytest

from specdraft.assemble import compile
from specdraft.datafile import DataError
from specdraft.runtime.train import chat
from specdraft.runtime.train.corpus import load_corpus, load_tokenizer
from specdraft.spec.load import load_layout
from tests.support.hf_tokenizer import LLAMA3, VOCAB_SIZE, conversations, make_model_folder, write_jsonl

CHATS = conversations(3, seed=5)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_model_folder(tmp_path_factory.mktemp("models") / "llama3", LLAMA3)


def _plan(data, folder):
    overrides = [f"data.path={data}", f"model.path={folder}", f"model.vocab_size={VOCAB_SIZE}", "model.seq_length=256"]
    return compile(load_layout(None, overrides))


def test_a_token_id_past_the_vocabulary_is_refused_by_name(model, tmp_path):
    folder = shutil.copytree(model, tmp_path / "sparse")
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    for added in tokenizer["added_tokens"]:
        if added["content"] == "<|eot_id|>":
            added["id"] = 100_000  # still 320 tokens: only the id is out of range
    tokenizer["model"]["vocab"]["<|eot_id|>"] = 100_000
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert len(load_tokenizer(str(folder))) == VOCAB_SIZE, "the length check alone lets it through"
    data = write_jsonl(tmp_path / "chats.jsonl", [{"messages": c} for c in CHATS])
    with pytest.raises(DataError) as err:
        load_corpus(_plan(data, folder))
    text = str(err.value)
    assert f"the tokenizer in {folder} maps '<|eot_id|>' to id 100,000, outside model.vocab_size (320)" in text, text


# Each misbehaves on the row whose first message says "boom" and renders every other row as LLAMA3 does.
HOSTILE = {
    "loop": "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "memory": "{{ 'x' * 4000000000 }}",
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "raise": "{{ raise_exception('this row is not for this model') }}",
}
SAYS = {
    "loop": "ran past its budget for one row: it did not finish within 2 s",
    "memory": "ran past its budget for one row: it needed more than",
    "recursion": "refused it (RecursionError: it recursed without end",
    "raise": "refused it (TemplateError: this row is not for this model)",
}


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_template_past_its_budget_is_refused_naming_file_row_and_template(model, tmp_path, monkeypatch, kind):
    monkeypatch.setattr(chat, "TIME_BUDGET_S", 2.0)  # a real row renders in milliseconds
    monkeypatch.setattr(chat, "MEMORY_BUDGET_BYTES", 256 << 20)
    folder = shutil.copytree(model, tmp_path / kind)
    template = "{%- if messages[0]['content'] == 'boom' %}" + HOSTILE[kind] + "{%- else %}" + LLAMA3 + "{%- endif %}"
    (folder / "chat_template.jinja").write_text(template)
    boom = [{"role": "user", "content": "boom"}, {"role": "assistant", "content": "ok"}]
    data = write_jsonl(tmp_path / "chats.jsonl", [{"messages": CHATS[0]}, {"messages": boom}, {"messages": CHATS[1]}])
    with pytest.raises(DataError) as err:
        load_corpus(_plan(data, folder))
    text = " ".join(str(err.value).split())
    assert str(data) in text and "line 2, field `messages`" in text and SAYS[kind] in text, text
    assert "line 1" not in text and "line 3" not in text, text
    assert str(folder / "chat_template.jinja") in text, text


def test_render_chat_renders_what_apply_chat_template_does(model):
    tokenizer = load_tokenizer(str(model))
    prompt = CHATS[0][:-1]
    for add in (True, False):
        want = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=add)
        assert chat.render_chat(tokenizer, prompt, add_generation_prompt=add, where="prompt 0") == want
    with chat.Renderer(tokenizer) as renderer:  # one worker for many rows
        got = [chat.render_chat(tokenizer, c, add_generation_prompt=False, where="x", renderer=renderer) for c in CHATS]
    assert got == [tokenizer.apply_chat_template(c, tokenize=False) for c in CHATS]
