"""Both layouts put special tokens exactly where specified (issue: foundation)."""

from __future__ import annotations

import pytest

import attnlens
from tests import tiny


@pytest.fixture(scope="module", params=["bert", "roberta"])
def tokenizer(request):
    return tiny.bert_tokenizer() if request.param == "bert" else tiny.roberta_tokenizer()


def content(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("max_len", [8, 16, 17])
def test_papa_single_sentences(tokenizer, max_len):
    texts = ["a film .", "the quick brown fox jumps over the lazy dog , funny and moving and wise ."]
    batch = attnlens.tokenize(tokenizer, texts, max_len=max_len, layout="papa")
    assert batch.input_ids.shape == (2, max_len)
    for row, text in enumerate(texts):
        ids, mask = batch.input_ids[row].tolist(), batch.attention_mask[row].tolist()
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        pieces = content(tokenizer, text)[: max_len - 2]
        assert ids[1 : 1 + len(pieces)] == pieces
        assert ids[1 + len(pieces) : -1] == [tokenizer.pad_token_id] * (max_len - 2 - len(pieces))
        assert mask == [1] * (1 + len(pieces)) + [0] * (max_len - 2 - len(pieces)) + [1]
    expected_truncated = sum(len(content(tokenizer, t)) > max_len - 2 for t in texts)
    assert batch.n_truncated == expected_truncated


@pytest.mark.parametrize("max_len", [12, 13, 32])
def test_papa_pairs(tokenizer, max_len):
    pairs = [("a film .", "it is funny ."), ("the quick brown fox jumps over the lazy dog", "wise ; slow")]
    batch = attnlens.tokenize(tokenizer, pairs, max_len=max_len, layout="papa")
    middle = max_len // 2
    truncated = 0
    for row, (first, second) in enumerate(pairs):
        ids, mask = batch.input_ids[row].tolist(), batch.attention_mask[row].tolist()
        assert ids[0] == tokenizer.cls_token_id
        assert ids[middle] == tokenizer.sep_token_id and ids[-1] == tokenizer.sep_token_id
        a, b = content(tokenizer, first), content(tokenizer, second)
        room_a, room_b = middle - 1, max_len - middle - 2
        truncated += len(a) > room_a or len(b) > room_b
        a, b = a[:room_a], b[:room_b]
        assert ids[1 : 1 + len(a)] == a
        assert ids[middle + 1 : middle + 1 + len(b)] == b
        assert mask[1 : middle] == [1] * len(a) + [0] * (room_a - len(a))
        assert mask[middle + 1 : -1] == [1] * len(b) + [0] * (room_b - len(b))
        if "token_type_ids" in tokenizer.model_input_names:
            assert batch.token_type_ids[row].tolist() == [0] * (middle + 1) + [1] * (max_len - middle - 1)
    assert batch.n_truncated == truncated


def test_padded_layout_is_right_padding(tokenizer):
    texts = ["a film .", "the quick brown fox jumps over the lazy dog ."]
    batch = attnlens.tokenize(tokenizer, texts, max_len=8, layout="padded")
    reference = tokenizer(texts, truncation=True, max_length=8, padding="longest")
    assert batch.input_ids.tolist() == reference["input_ids"]
    assert batch.attention_mask.tolist() == reference["attention_mask"]
    assert batch.input_ids[1, -1] == tokenizer.sep_token_id
    assert batch.n_truncated == 1
    assert batch.input_ids[0, 0] == tokenizer.cls_token_id


def test_padded_layout_pairs(tokenizer):
    pairs = [("a film .", "it is funny .")]
    batch = attnlens.tokenize(tokenizer, pairs, max_len=64, layout="padded")
    assert batch.input_ids.tolist() == tokenizer(*zip(*pairs, strict=True))["input_ids"]
    assert batch.n_truncated == 0


def test_tokenizer_without_special_tokens_is_refused():
    with pytest.raises(ValueError, match="cls_token"):
        attnlens.tokenize(tiny.gpt2_tokenizer(), ["a film ."], max_len=8, layout="papa")
    with pytest.raises(ValueError, match="pad token"):
        attnlens.tokenize(tiny.gpt2_tokenizer(), ["a film .", "b"], max_len=8, layout="padded")


def test_bad_inputs_are_refused():
    tokenizer = tiny.bert_tokenizer()
    with pytest.raises(ValueError, match="Unknown layout"):
        attnlens.tokenize(tokenizer, ["a"], max_len=8, layout="left")
    with pytest.raises(ValueError, match="empty"):
        attnlens.tokenize(tokenizer, [], max_len=8)
    with pytest.raises(ValueError, match="Mix"):
        attnlens.tokenize(tokenizer, ["a", ("b", "c")], max_len=8)
