"""The two layouts of :func:`attnlens.core.inputs.tokenize`, as token ids: the PAPA layout
(Hassid et al. 2022, Appendix A: fixed positions of the special tokens, :func:`papa`) and
ordinary right padding (:func:`padded`), for texts, sentence pairs and word lists; the error for
a text with no token (:class:`BlankText`); and the refusal of a pair format with nothing between
its two sentences (:func:`check_pair_boundary`).

Each returns an :class:`Encoded`, the tensors a :class:`attnlens.core.inputs.Batch` is made of.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from attnlens.errors import InputError


class Encoded(NamedTuple):
    """Token ids of a layout, ``[batch, pos]`` each: ``input_ids``, ``attention_mask`` (1 on real
    tokens), ``token_type_ids``; ``n_truncated``: the examples cut by ``max_len``; ``extra``:
    ``word_index`` / ``word_ids`` ``[batch, pos]`` for word lists, else empty."""

    input_ids: Tensor
    attention_mask: Tensor
    token_type_ids: Tensor
    n_truncated: int
    extra: dict[str, Tensor]


class BlankText(InputError):
    """A text with no real token: blank, or made only of characters the tokenizer drops.
    ``index`` is its position in the texts given (:func:`attnlens.engine.passes.run` reports it as its
    index in the corpus)."""

    def __init__(self, index: int, problem: str) -> None:
        self.index, self.problem = index, problem
        super().__init__(f"text {index} {problem}")

    def at(self, index: int) -> BlankText:
        """The same error for the text at ``index`` of a larger corpus."""
        return BlankText(index, self.problem)


SENTENCES = ("first", "second")
"""The names of a pair's two sentences, as an error names the one at fault."""


def check_tokens(pieces: list[list[int]], *, offset: int = 0, sentence: int | None = None) -> None:
    """:class:`BlankText` for the first text whose tokens (without special tokens) are none;
    ``sentence`` (0 or 1): ``pieces`` are that sentence of each pair, and the error names it."""
    which = "" if sentence is None else f"(its {SENTENCES[sentence]} sentence) "
    for index, ids in enumerate(pieces):
        if len(ids) <= offset:
            raise BlankText(
                index,
                f"{which}has no token: it is made only of characters the tokenizer drops (control "
                "or format characters); remove it from the corpus",
            )


def special_ids(tokenizer: Any) -> tuple[int, int, int]:
    """(start, separator, pad) token ids: [CLS]/[SEP]/[PAD] for BERT, <s>/</s>/<pad> for RoBERTa."""
    start = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else None
    sep = tokenizer.sep_token_id
    pad = tokenizer.pad_token_id
    missing = [
        name
        for name, value in (("cls_token ([CLS] or <s>)", start), ("sep_token", sep), ("pad_token", pad))
        if value is None
    ]
    if missing:
        raise InputError(
            f"The PAPA layout needs a tokenizer with start, separator and pad tokens; "
            f"{type(tokenizer).__name__} has no {', '.join(missing)}. Use a BERT- or RoBERTa-style "
            "tokenizer, or layout='padded'."
        )
    return start, sep, pad


def word_ids_of(tokenizer: Any, examples: Sequence[Any], **options: Any) -> tuple[Any, list[list[int | None]]]:
    """``tokenizer`` on word lists (``is_split_into_words``) and each row's word of every token."""
    if not getattr(tokenizer, "is_fast", False):
        raise InputError(
            f"{type(tokenizer).__name__} cannot map words to sub-tokens (it is not a fast "
            "tokenizer), which token tasks need; load the model with its fast tokenizer "
            "(AutoTokenizer.from_pretrained(name, use_fast=True))."
        )
    encoded = tokenizer(word_lists(tokenizer, examples), is_split_into_words=True,
                        split_special_tokens=True, **options)
    return encoded, [encoded.word_ids(row) for row in range(len(examples))]


def word_lists(tokenizer: Any, examples: Sequence[Any]) -> list[list[str]]:
    """Each example's words (:class:`attnlens.core.inputs.Words`) as ``tokenizer`` must get them
    (``is_split_into_words=True``) to tokenize them as the text of those words separated by
    spaces, as a text's tokens are.

    A byte-level BPE tokenizer without ``add_prefix_space`` (RoBERTa's, GPT-2's by default)
    takes pre-split words as pieces of one word: ``["the", "quick"]`` gives ``the qu ick``, not
    ``the Ġquick``, tokens the model never saw for that sentence. For such a tokenizer every word
    after the first gets its leading space back (``["the", " quick"]``: ``the Ġquick``, the tokens
    of the text ``"the quick"``); Hugging Face's own remedy, ``add_prefix_space=True``, also gives
    the first word a space (``Ġthe``), which a text's first word does not get. A tokenizer that
    already separates words (BERT's WordPiece, SentencePiece) is given the words as they are."""
    words = [list(example.words) for example in examples]
    if not _joins_words(tokenizer):
        return words
    return [[word if index == 0 else " " + word for index, word in enumerate(row)] for row in words]


#: :func:`_joins_words` of each tokenizer seen, found once (a batch of word lists asks up to three times)
_JOINS: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _joins_words(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` runs pre-split words together where the text of those words with
    spaces between them would not (and a leading space on each later word restores the text's
    tokens): two words tokenized apart, each way, against their text; once per tokenizer."""
    if tokenizer not in _JOINS:
        options = dict(add_special_tokens=False, split_special_tokens=True)
        text = tokenizer("a b", **options)["input_ids"]
        as_given = tokenizer(["a", "b"], is_split_into_words=True, **options)["input_ids"]
        spaced = tokenizer(["a", " b"], is_split_into_words=True, **options)["input_ids"]
        _JOINS[tokenizer] = as_given != text and spaced == text
    return _JOINS[tokenizer]


def word_index(word_ids: list[list[int | None]], offsets: list[int], length: int) -> tuple[Tensor, Tensor]:
    """``([batch, length], [batch, length])``: the word whose first sub-token is at each position
    (else -1), and the word of every position (else -1: special tokens, padding)."""
    index = torch.full((len(word_ids), length), -1, dtype=torch.long)
    every = torch.full((len(word_ids), length), -1, dtype=torch.long)
    for row, (ids, offset) in enumerate(zip(word_ids, offsets, strict=True)):
        previous = None
        for position, word in enumerate(ids):
            if word is not None and offset + position < length:
                every[row, offset + position] = word
                if word != previous:
                    index[row, offset + position] = word
            previous = word
    return index, every


def papa(tokenizer: Any, examples: Sequence, max_len: int, is_pair: bool, words: bool) -> Encoded:
    """The PAPA layout (:mod:`attnlens.core.inputs`) of ``examples``: texts, (first, second) pairs
    (``is_pair``) or word lists (``words``: :class:`attnlens.core.inputs.Words`, with the index of
    each word's first sub-token in ``extra``).

    As Appendix A describes it, which the authors' code (``run_papa_glue_avgs_creator.py``,
    ``add_preprocess_func``) departs from in three ways: it cuts a single sentence at
    ``max_len // 2`` positions (its loop over the first segment applies to single sentences
    too), where here a single sentence keeps up to ``max_len − 2`` tokens; it lets the tokenizer
    cut a long pair to ``max_len`` (longest first) before the half-length limits, where here each
    segment is cut to its room alone; and it leaves ``token_type_ids`` as tokenized, so that most
    of a second segment has type 0, where here the second segment and the final separator have
    type 1, as BERT was trained. Constants fitted here therefore differ from the authors' on
    single sentences longer than ``max_len // 2 − 1`` tokens, on long pairs and, for models with
    token types, on every pair."""
    start, sep, pad = special_ids(tokenizer)
    middle = max_len // 2
    n = len(examples)
    input_ids = torch.full((n, max_len), pad, dtype=torch.long)
    attention_mask = torch.zeros((n, max_len), dtype=torch.long)
    token_type_ids = torch.zeros((n, max_len), dtype=torch.long)
    input_ids[:, 0] = start
    input_ids[:, -1] = sep
    attention_mask[:, 0] = 1
    attention_mask[:, -1] = 1
    if is_pair:
        input_ids[:, middle] = sep
        attention_mask[:, middle] = 1
        token_type_ids[:, middle + 1 :] = 1
        firsts = token_ids(tokenizer, [a for a, _ in examples])
        seconds = token_ids(tokenizer, [b for _, b in examples])
        check_tokens(firsts, sentence=0)
        check_tokens(seconds, sentence=1)
        spans = [(1, middle - 1, firsts), (middle + 1, max_len - middle - 2, seconds)]
    elif words:
        encoded, word_ids = word_ids_of(tokenizer, examples, add_special_tokens=False, truncation=False)
        pieces = encoded["input_ids"]
        check_tokens(pieces)
        spans = [(1, max_len - 2, pieces)]
        cut = [ids[: max_len - 2] for ids in word_ids]
        word_starts, every_word = word_index(cut, [1] * n, max_len)
    else:
        pieces = token_ids(tokenizer, list(examples))
        check_tokens(pieces)
        spans = [(1, max_len - 2, pieces)]
    truncated = torch.zeros(n, dtype=torch.bool)
    for begin, room, pieces in spans:
        for row, ids in enumerate(pieces):
            kept = ids[:room]
            truncated[row] |= len(ids) > room
            input_ids[row, begin : begin + len(kept)] = torch.tensor(kept, dtype=torch.long)
            attention_mask[row, begin : begin + len(kept)] = 1
    if not uses_token_types(tokenizer):
        token_type_ids.zero_()
    extra = {"word_index": word_starts, "word_ids": every_word} if words else {}
    return Encoded(input_ids, attention_mask, token_type_ids, int(truncated.sum()), extra)


def padded(tokenizer: Any, examples: Sequence, max_len: int, is_pair: bool, words: bool) -> Encoded:
    """Right padding to the longest example, truncated to ``max_len``, with the tokenizer's own
    special tokens and pair format (``words``: word lists, as :func:`papa`). A pair format must
    put a token between the two sentences (:func:`check_pair_boundary`): on a decoder, the second
    sentence's start token (``<bos> A <bos> B``) is the pair's boundary, a separator of
    :func:`attnlens.methods.stats.token_classes`."""
    if words:
        return padded_words(tokenizer, examples, max_len)
    count = getattr(tokenizer, "num_special_tokens_to_add", None)
    specials = count(pair=is_pair) if count is not None else 0
    if is_pair:
        check_pair_boundary(tokenizer)
        args = ([a for a, _ in examples], [b for _, b in examples])
        # each sentence of a pair has a token of its own (a blank second sentence is refused)
        parts = [token_ids(tokenizer, sentences) for sentences in args]
        for sentence, part in enumerate(parts):
            check_tokens(part, sentence=sentence)
        lengths = [len(first) + len(second) + specials for first, second in zip(*parts, strict=True)]
    else:
        args = (list(examples),)
        full = tokenizer(*args, add_special_tokens=True, truncation=False, split_special_tokens=True)["input_ids"]
        check_tokens(full, offset=specials)
        lengths = [len(ids) for ids in full]
    encoded = tokenizer(
        *args, add_special_tokens=True, truncation=True, max_length=max_len, return_token_type_ids=True,
        split_special_tokens=True,
    )
    rows = encoded["input_ids"]
    types = encoded.get("token_type_ids") if uses_token_types(tokenizer) else None
    n, longest = len(rows), max(len(ids) for ids in rows)
    # padded keys are masked, so any id will do where the tokenizer has no pad token (GPT-2)
    pad = next((i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id) if i is not None), 0)
    input_ids = torch.full((n, longest), pad, dtype=torch.long)
    attention_mask = torch.zeros((n, longest), dtype=torch.long)
    token_type_ids = torch.zeros((n, longest), dtype=torch.long)
    for row, ids in enumerate(rows):  # on the right: every token keeps its position 0 .. n-1
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, : len(ids)] = 1
        if types is not None:
            token_type_ids[row, : len(ids)] = torch.tensor(types[row], dtype=torch.long)
    n_truncated = sum(length > max_len for length in lengths)
    return Encoded(input_ids, attention_mask, token_type_ids, int(n_truncated), {})


#: :func:`pair_boundary` of each tokenizer seen, found once
_BOUNDARIES: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def pair_boundary(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s own pair format puts a token between the two sentences of a pair:
    a separator (BERT's ``[CLS] A [SEP] B [SEP]``, RoBERTa's ``<s> A </s></s> B </s>``) or the
    second sentence's start token (a decoder's ``<bos> A <bos> B``: GPT-2's, Llama's, SmolLM2's),
    which :func:`attnlens.methods.stats.token_classes` counts as the pair's separator. False
    where the tokens of the two sentences follow one another (a decoder that adds no start
    token, Qwen2's): the pair of two one-letter texts holds their tokens side by side. Found once
    per tokenizer."""
    if tokenizer not in _BOUNDARIES:
        first, second = token_ids(tokenizer, ["a", "b"])
        pair = tokenizer("a", "b", add_special_tokens=True, truncation=False,
                         split_special_tokens=True)["input_ids"]
        joined, width = first + second, len(first) + len(second)
        _BOUNDARIES[tokenizer] = not any(pair[i : i + width] == joined for i in range(len(pair) - width + 1))
    return _BOUNDARIES[tokenizer]


def check_pair_boundary(tokenizer: Any) -> None:
    """:class:`attnlens.errors.InputError` unless ``tokenizer`` puts a token between the two
    sentences of a pair (:func:`pair_boundary`): without one, the two sentences' tokens run
    together into one text that nothing (no segment, no separator statistic) could split again."""
    if not pair_boundary(tokenizer):
        raise InputError(
            f"{type(tokenizer).__name__} puts nothing between the two sentences of a pair: it adds "
            "no start token (bos_token) and no separator, so their tokens would run together and "
            "no result could tell the sentences apart. To run pairs, join the two sentences into "
            "one text yourself (e.g. first + ' ' + second), or give the tokenizer a bos_token that "
            "it adds before each sentence (as Llama's and SmolLM2's do)."
        )


def padded_words(tokenizer: Any, examples: Sequence[Any], max_len: int) -> Encoded:
    """:func:`padded` of word lists, with the index of each word's first sub-token in ``extra``."""
    full, _ = word_ids_of(tokenizer, examples, add_special_tokens=True, truncation=False)
    count = getattr(tokenizer, "num_special_tokens_to_add", None)
    check_tokens(full["input_ids"], offset=count(pair=False) if count is not None else 0)
    encoded, word_ids = word_ids_of(tokenizer, examples, add_special_tokens=True, truncation=True,
                                  max_length=max_len, return_token_type_ids=True)
    rows = encoded["input_ids"]
    n, longest = len(rows), max(len(ids) for ids in rows)
    pad = next((i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id) if i is not None), 0)
    input_ids = torch.full((n, longest), pad, dtype=torch.long)
    attention_mask = torch.zeros((n, longest), dtype=torch.long)
    for row, ids in enumerate(rows):
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, : len(ids)] = 1
    n_truncated = sum(len(ids) > max_len for ids in full["input_ids"])
    starts, every = word_index(word_ids, [0] * n, longest)
    return Encoded(input_ids, attention_mask, torch.zeros_like(input_ids), int(n_truncated),
                   {"word_index": starts, "word_ids": every})


def token_ids(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of ``texts`` without special tokens. Literal special-token strings in a text
    (``"[SEP]"``, ``"<s>"``, ``"[PAD]"``) are read as text, never as the special tokens: a user's
    text cannot move the layout's separators or hide itself behind padding."""
    return tokenizer(texts, add_special_tokens=False, truncation=False, split_special_tokens=True)["input_ids"]


def uses_token_types(tokenizer: Any) -> bool:
    """Whether the tokenizer's model reads ``token_type_ids`` (BERT does, RoBERTa does not)."""
    return "token_type_ids" in getattr(tokenizer, "model_input_names", ())
