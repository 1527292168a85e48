"""Both layouts put special tokens exactly where specified (issue: foundation)."""

from __future__ import annotations

import copy

import pytest
import torch

import attnlens
from attnlens.core.layouts import BlankText
from attnlens.errors import InputTypeError
from attnlens.evaluation import probing
from tests import tiny
from tests.typechecks import unchecked


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


@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_layout_without_a_pad_token_pads_like_hugging_face_with_eos(side):
    """A bare GPT-2 tokenizer has no pad token; padded positions are masked, so attnlens pads
    with eos, as HF does once ``pad_token = eos_token`` is set (the user's tokenizer is left as
    it is). Padding goes on the right whatever the tokenizer's padding_side."""
    texts = ["a film .", "it is a very funny film", "b"]
    tokenizer = copy.deepcopy(tiny.gpt2_tokenizer())
    tokenizer.padding_side = side
    assert tokenizer.pad_token_id is None
    batch = attnlens.tokenize(tokenizer, texts, max_len=5, layout="padded")
    assert tokenizer.pad_token_id is None and tokenizer.padding_side == side
    reference = copy.deepcopy(tokenizer)
    reference.pad_token, reference.padding_side = reference.eos_token, "right"
    expected = reference(texts, truncation=True, max_length=5, padding="longest")
    assert batch.input_ids.tolist() == expected["input_ids"]
    assert batch.attention_mask.tolist() == expected["attention_mask"]
    assert batch.n_truncated == 1 and not batch.token_types


def test_bad_inputs_are_refused():
    tokenizer = tiny.bert_tokenizer()
    with unchecked(), pytest.raises(ValueError, match="Unknown layout"):
        attnlens.tokenize(tokenizer, ["a"], max_len=8, layout="left")
    with pytest.raises(ValueError, match="empty"):
        attnlens.tokenize(tokenizer, [], max_len=8)
    with pytest.raises(ValueError, match="Mix"):
        attnlens.tokenize(tokenizer, ["a", ("b", "c")], max_len=8)


# -- max_len: the model's position embeddings and the special tokens ------------------------------


@pytest.fixture(scope="module", params=["bert", "roberta"])
def bridge(request):
    if request.param == "bert":
        return tiny.bert_bridge()
    return attnlens.load(tiny.tiny_roberta(), tokenizer=tiny.roberta_tokenizer())


def hf_forward_accepts(hf_model, tokenizer, n_tokens: int) -> bool:
    """Whether the Hugging Face model itself runs on ``n_tokens`` real (non-pad) tokens."""
    ids = torch.full((1, n_tokens), tokenizer.cls_token_id, dtype=torch.long)
    try:
        with torch.no_grad():
            hf_model(input_ids=ids)
    except (IndexError, RuntimeError):
        return False
    return True


def test_max_len_beyond_position_embeddings_is_refused(bridge):
    """The limit is where the HF model's own forward starts failing (BERT: 128 positions;
    RoBERTa: 130 embeddings of which padding_idx + 1 = 2 are never used), and a larger max_len
    is a ValueError naming both numbers and the fix, not an error deep in the forward."""
    from attnlens.core.inputs import position_limit

    limit = position_limit(bridge)
    assert hf_forward_accepts(bridge.original_model, bridge.tokenizer, limit)
    assert not hf_forward_accepts(bridge.original_model, bridge.tokenizer, limit + 1)
    long_text = " ".join(tiny.CORPUS)
    for layout in ("papa", "padded"):
        batch = attnlens.tokenize(bridge, [long_text], max_len=limit, layout=layout)
        assert batch.input_ids.shape == (1, limit)
        with torch.no_grad():
            bridge(batch.input_ids, **batch.model_kwargs())
        with pytest.raises(ValueError) as error:
            attnlens.tokenize(bridge, [long_text], max_len=limit + 1, layout=layout)
        message = str(error.value)
        assert f"max_len={limit + 1}" in message and f"use max_len={limit} or less" in message
        assert f"max_position_embeddings={bridge.original_model.config.max_position_embeddings}" in message


def shortest_example_length(tokenizer, is_pair: bool) -> int:
    """Length of the shortest real example the tokenizer encodes: one token per segment plus its
    own special tokens."""
    segments = ("a", "a") if is_pair else ("a",)
    assert all(len(content(tokenizer, part)) == 1 for part in segments)
    return len(tokenizer(*segments, add_special_tokens=True)["input_ids"])


@pytest.mark.parametrize("layout", ["papa", "padded"])
@pytest.mark.parametrize("is_pair", [False, True], ids=["sentences", "pairs"])
def test_max_len_too_small_for_the_special_tokens_is_refused(tokenizer, layout, is_pair):
    """The smallest max_len keeps one real token per segment besides the special tokens: in the
    PAPA layout (module docstring) start + separator(s) + one token per segment; in the padded
    layout the length of the shortest example the tokenizer itself encodes."""
    segments = 2 if is_pair else 1
    if layout == "papa":
        minimum = 2 + (segments - 1) + segments
    else:
        minimum = shortest_example_length(tokenizer, is_pair)
    example = ("a film that is funny", "it rained all day") if is_pair else "a film that is funny"
    batch = attnlens.tokenize(tokenizer, [example], max_len=minimum, layout=layout)
    real = [
        token for token, valid in zip(batch.input_ids[0].tolist(), batch.attention_mask[0].tolist(), strict=True)
        if valid and token not in tokenizer.all_special_ids
    ]
    assert len(real) == segments  # exactly one real token per segment at the minimum
    for max_len in sorted({minimum - 1, 2, 1, 0}):
        if max_len >= minimum:
            continue
        with pytest.raises(ValueError, match=rf"max_len={max_len} leaves no room.*max_len >= {minimum}"):
            attnlens.tokenize(tokenizer, [example], max_len=max_len, layout=layout)


def test_encoders_are_padded_on_the_right_whatever_the_tokenizer_says():
    """BERT keeps positions 0 .. n-1 (position_ids=None): left padding would move a short
    example's tokens and make its attention depend on the rest of the batch."""
    tokenizer = copy.deepcopy(tiny.bert_tokenizer())
    tokenizer.padding_side = "left"
    model = attnlens.load(tiny.tiny_bert(), tokenizer=tokenizer)
    texts = ["a film .", "it is a very funny film"]
    batch = attnlens.tokenize(model, texts, max_len=16, layout="padded")
    reference = copy.deepcopy(model.tokenizer)
    reference.padding_side = "right"
    assert batch.input_ids.tolist() == reference(texts, padding="longest")["input_ids"]
    with torch.no_grad():
        together = model(batch.input_ids, **batch.model_kwargs())[0, :5]
        alone = model(batch.input_ids[:1, :5], **batch.model_kwargs() | {"attention_mask": None, "token_type_ids": None})
    torch.testing.assert_close(together, alone[0], atol=1e-5, rtol=0)


# -- words (token tasks) ---------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "layout"), [("bert", "papa"), ("bert", "padded"), ("roberta", "papa"),
                                            ("roberta", "padded"), ("gpt2", "padded")])
def test_words_get_the_tokens_of_their_text(name, layout):
    """Pre-split words (NER, POS, UD) are tokenized as the text of those words joined by spaces,
    on every tokenizer: a byte-level BPE one (RoBERTa's, GPT-2's) took each later word as the
    continuation of the one before (``the qu ick``, not ``the Ġquick``). Reference: the tokenizer
    on the joined text, and each token's word found by tokenizing the words one at a time."""
    tokenizer = {"bert": tiny.bert_tokenizer, "roberta": tiny.roberta_tokenizer, "gpt2": tiny.gpt2_tokenizer}[name]()
    sentences = [("the", "quick", "fox", "jumps", "."), ("Tokenization", "is", "unbelievably", "hard", "!")]
    batch = attnlens.tokenize(tokenizer, [attnlens.Words(words) for words in sentences], max_len=32, layout=layout)
    for row, words in enumerate(sentences):
        every = batch.extra["word_ids"][row]
        real = every >= 0
        assert batch.input_ids[row][real].tolist() == content(tokenizer, " ".join(words))
        pieces = [len(content(tokenizer, word if index == 0 else " " + word)) for index, word in enumerate(words)]
        assert every[real].tolist() == [index for index, count in enumerate(pieces) for _ in range(count)]
        starts = batch.extra["word_index"][row]
        assert starts[starts >= 0].tolist() == list(range(len(words)))


def test_one_text_or_pair_given_alone_is_checked_as_in_a_list():
    """A text or pair given alone, not in a list, was returned before the blank check: a pair
    with a blank sentence was tokenized as ``[CLS] [SEP] hello [SEP]`` (and a blank text got the
    message of a text of dropped characters); in the padded layout a pair was checked as a whole,
    so a second sentence of only dropped characters passed."""
    tokenizer = tiny.bert_tokenizer()
    for given in [("", "hello"), ("   ", "hello"), ["   "], "   "]:
        for layout in ("papa", "padded"):
            with pytest.raises(BlankText, match="is blank"):
                attnlens.tokenize(tokenizer, given, max_len=16, layout=layout)
    for layout in ("papa", "padded"):
        with pytest.raises(BlankText, match="has no token"):
            attnlens.tokenize(tokenizer, [("hello", "\u200b")], max_len=16, layout=layout)


def test_a_pair_s_blank_sentence_is_named():
    """The error named the pair (``text 1 is blank``) but not which of its sentences was blank."""
    tokenizer = tiny.bert_tokenizer()
    for layout in ("papa", "padded"):
        for sentence, pair in enumerate([("", "hello"), ("hello", "  ")]):
            which = ("first", "second")[sentence]
            with pytest.raises(BlankText, match=rf"^text 1 \(its {which} sentence\) is blank"):
                attnlens.tokenize(tokenizer, [("a", "b"), pair], max_len=16, layout=layout)
            dropped = tuple("\u200b" if part.strip() == "" else part for part in pair)
            with pytest.raises(BlankText, match=rf"^text 1 \(its {which} sentence\) has no token"):
                attnlens.tokenize(tokenizer, [("a", "b"), dropped], max_len=16, layout=layout)
    with pytest.raises(BlankText, match=r"^text 0 is blank"):  # a single text names no sentence
        attnlens.tokenize(tokenizer, ["  "], max_len=16)
    assert attnlens.tokenize(tokenizer, ("a b", "c"), max_len=16, layout="padded").input_ids.shape[0] == 1
    assert attnlens.tokenize(tokenizer, ["a b", "c"], max_len=16, layout="padded").input_ids.shape[0] == 2


def test_a_table_or_a_non_iterable_is_refused_by_name():
    """A dict of columns or a DataFrame was iterated as its column names (``[CLS] sentence
    [SEP]``), and an int raised Python's TypeError from inside; both now get the corpus' error,
    naming the argument (tokenize's, and probing's feature extraction's), as a user without the
    tests' run-time type checks meets it."""
    pandas = pytest.importorskip("pandas")
    tokenizer = tiny.bert_tokenizer()
    table = pandas.DataFrame({"sentence": ["a great movie", "awful"], "label": [1, 0]})
    with unchecked():
        for given in ({"sentence": ["a great movie"]}, table):
            with pytest.raises(InputTypeError, match=r"texts_or_pairs\['sentence'\]"):
                attnlens.tokenize(tokenizer, given, max_len=16)
        for given in (5, None, 3.0):
            with pytest.raises(InputTypeError, match="texts_or_pairs must be an iterable"):
                attnlens.tokenize(tokenizer, given, max_len=16)
        with pytest.raises(InputTypeError, match=r"examples\['sentence'\]"):
            probing.extract(tiny.bert_bridge(), table, cache=False, max_len=16, progress=False)
