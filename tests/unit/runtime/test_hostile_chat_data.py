"""A model folder's tokenizer and chat template are code and data the user brings: each is bounded before training.

- Token ids: a tokenizer that maps a token to an id at or past model.vocab_size (its length still within it) is
  refused by name before any row is read; it would train on a zero embedding and an impossible label at tp 2 and
  end in an IndexError at tp 1.
"""

from __future__ import annotations

import json
import shutil

import pytest

from specdraft.assemble import compile
from specdraft.datafile import DataError
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
