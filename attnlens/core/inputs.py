"""Tokenize sentences and sentence pairs into the PAPA layout or ordinary right padding.

The PAPA layout (Hassid et al. 2022, Appendix A) fixes the positions of the special tokens so
that a head's mean attention over a corpus is a meaningful constant matrix:

- every sequence has exactly ``max_len`` positions;
- the start token ([CLS] / <s>) is at position 0;
- the final separator ([SEP] / </s>) is always at ``max_len - 1``, after the padding;
- for a pair, the middle separator is always at ``max_len // 2``; the first segment fills
  positions ``1 .. max_len//2 - 1`` (then padding), the second fills ``max_len//2 + 1 ..
  max_len - 2`` (then padding).

Pairs use one middle separator for every tokenizer (RoBERTa's own pair format has two).

**Compact batches** (``tokenize(..., compact=True)``, :func:`compact_batch`; the default of every pass
of the engine, :func:`attnlens.engine.passes.run`). The layout is a statement about *positions*, not
about padding: ``[CLS] w1 … wk [SEP]`` with position ids ``0, 1, …, k, max_len-1`` is the same
input as the text padded to ``max_len``, because padded keys are masked (they get exactly 0
attention) and no result reads a padded query. A compact batch keeps each text's real tokens
left-aligned (its width is the longest real text of the batch, not ``max_len``) and carries the
layout position of every column in ``Batch.position_ids``. The model gets them as
``position_ids`` where it numbers columns (BERT); a model that numbers the real tokens itself
(RoBERTa from its padding token, decoders from the mask:
:attr:`attnlens.core.models.Architecture.counts_positions`) gives a padded PAPA text the same
positions as its compact form, so it runs without them. PAPA constants ``C[pos_q, pos_k]`` are
gathered by these positions (:func:`attnlens.methods.papa.replace.constant_pattern`), and fitting
scatter-adds each pattern back to them (:class:`attnlens.methods.papa.fitting.PatternSums`): constants,
features and interventions equal the padded layout's up to float32 rounding, for a fraction of
the cost (an SST-2 sentence is about 25 of 64 positions).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, SupportsIndex

import torch
from jaxtyping import Int
from torch import Tensor

from attnlens.core import layouts, models
from attnlens.core.checks import describe, flag, whole_number
from attnlens.core.corpus import corpus_iterator
from attnlens.core.layouts import BlankText
from attnlens.core.loading import is_causal
from attnlens.errors import InputError, InputTypeError

Layout = Literal["papa", "padded"]
LAYOUTS: tuple[str, ...] = ("papa", "padded")


@dataclass
class Batch:
    """A tokenized batch.

    ``input_ids``, ``attention_mask`` and ``token_type_ids`` are ``[batch, pos]``: one row per
    example, one column per token position. ``attention_mask`` is 1 for real tokens (special
    tokens included) and 0 for padding. ``n_truncated`` counts examples that lost tokens.
    ``token_types``: whether the model takes ``token_type_ids``; ``positions_from_mask``: whether
    position ids come from the mask (decoders); see :meth:`model_kwargs`.

    ``position_ids``: ``[batch, pos]``, the layout position of every column of a compact batch
    (see the module docstring; 0 on padding), or ``None`` when every column is its own position
    (:attr:`positions` gives them in both cases). ``counts_positions``: the model numbers the
    real tokens itself (:attr:`attnlens.core.models.Architecture.counts_positions`), so a compact
    batch needs no ``position_ids`` argument.
    """

    input_ids: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]
    token_type_ids: Int[Tensor, "batch pos"]
    n_truncated: int
    layout: str
    max_len: int
    is_pair: bool = False
    extra: dict = field(default_factory=dict)
    token_types: bool = True
    positions_from_mask: bool = False
    position_ids: Int[Tensor, "batch pos"] | None = None
    counts_positions: bool = False

    @property
    def compact(self) -> bool:
        """Whether this is a compact PAPA batch (its columns are not its positions)."""
        return self.position_ids is not None

    @property
    def positions(self) -> Int[Tensor, "batch pos"]:
        """The layout position of every column: :attr:`position_ids` of a compact batch, else
        the column index ``0 .. pos-1``. Constants, probes and fits index by it."""
        if self.position_ids is not None:
            return self.position_ids
        n, width = self.input_ids.shape
        return torch.arange(width, device=self.input_ids.device).expand(n, width)

    def model_kwargs(self) -> dict[str, Tensor | None]:
        """Keyword arguments for ``bridge(batch.input_ids, **batch.model_kwargs())``.

        ``token_type_ids`` only when the model uses them (``token_types``; GPT-2 has no
        token-type embedding and would add its word embedding of token 0 instead).

        Encoders get ``position_ids=None`` on purpose: given a mask with padding *before* a real
        token (the PAPA layout's final [SEP]), TransformerBridge would otherwise derive positions
        from the mask and move that token to position ``n_real - 1``. With ``None`` the HF model
        uses its own positions (``0 .. pos-1`` for BERT; RoBERTa's padding-aware ones), exactly
        as when it is called directly. Decoders (``positions_from_mask``) get no ``position_ids``,
        so the bridge derives them from the mask: a left-padded sequence's real tokens then keep
        the positions they have when the sequence runs alone.

        A compact batch (:attr:`compact`) passes its layout positions as ``position_ids`` to a
        model that numbers columns (BERT): its final [SEP] is then at ``max_len - 1`` as in the
        padded layout. A model that numbers real tokens itself (``counts_positions``: RoBERTa,
        decoders) gives the same positions to the padded and the compact form, so it gets
        ``None`` (or nothing) as above.
        """
        kwargs: dict[str, Tensor | None] = {"attention_mask": self.attention_mask}
        if self.token_types:
            kwargs["token_type_ids"] = self.token_type_ids
        if self.position_ids is not None and not self.counts_positions:
            kwargs["position_ids"] = self.position_ids
        elif not self.positions_from_mask:
            kwargs["position_ids"] = None
        return kwargs

    def to(self, device: str | torch.device, *, non_blocking: bool = False) -> Batch:
        """The batch on ``device``; ``non_blocking`` copies from pinned memory (:meth:`pin_memory`)
        without waiting, as ``Tensor.to`` does."""
        return self._apply(lambda value: value.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        """The batch in page-locked host memory, from which a copy to a GPU runs asynchronously
        (``Tensor.pin_memory``; the input pipeline of :func:`attnlens.engine.passes.run` on CUDA)."""
        return self._apply(Tensor.pin_memory)

    def _apply(self, move: Callable[[Tensor], Tensor]) -> Batch:
        return Batch(
            move(self.input_ids),
            move(self.attention_mask),
            move(self.token_type_ids),
            self.n_truncated,
            self.layout,
            self.max_len,
            self.is_pair,
            {key: move(value) if isinstance(value, Tensor) else value for key, value in self.extra.items()},
            self.token_types,
            self.positions_from_mask,
            None if self.position_ids is None else move(self.position_ids),
            self.counts_positions,
        )

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def __repr__(self) -> str:
        n, positions = self.input_ids.shape
        return (
            f"Batch({n} {'pairs' if self.is_pair else 'texts'} x {positions} positions, "
            f"layout={self.layout!r}{', compact' if self.compact else ''}, max_len={self.max_len}, "
            f"{int(self.attention_mask.sum())} real tokens, {self.n_truncated} truncated)"
        )


def tokenize(
    model: Any,
    texts_or_pairs: str | tuple[str, str] | Words | Iterable[str] | Iterable[tuple[str, str]] | Iterable[Words],
    *,
    max_len: SupportsIndex,
    layout: Layout | None = None,
    compact: bool = False,
) -> Batch:
    """Tokenize single sentences, (first, second) pairs or :class:`Words` (pre-split words of a
    token task) for ``model`` (a bridge or a tokenizer).

    ``layout``: default the model's (:func:`default_layout`: ``"papa"`` for an encoder or a bare
    tokenizer, ``"padded"`` for a decoder, which has no [CLS]/[SEP] to fix in place).
    ``layout="papa"`` gives the fixed-position PAPA layout described in this module's docstring;
    ``layout="padded"`` gives ordinary right padding to the longest example, truncated to
    ``max_len`` (the tokenizer's own special tokens and pair format: a decoder's ``<bos> A <bos>
    B``, whose second start token is the pair's separator; a pair format with nothing between the
    two sentences, a decoder's that adds no start token, is refused:
    :func:`attnlens.core.layouts.check_pair_boundary`); a tokenizer without a pad
    token (GPT-2) is padded with its eos token, which the mask hides. The padding goes on the
    right whatever the tokenizer's ``padding_side``: every token then keeps its position
    ``0 .. n-1`` (as when its text runs alone), and PAPA constants, indexed by position, do not
    depend on how texts are grouped into batches.

    ``compact=True`` (``layout="papa"``): the PAPA layout at the length of the longest real
    text, with the layout's positions in ``Batch.position_ids`` (:func:`compact_batch`; the padded
    layout is already as long as its longest text, so it is unchanged).

    ``max_len`` must leave room for one real token per segment besides the special tokens
    (:func:`min_max_len`) and, when ``model`` is a bridge, fit in its position embeddings
    (:func:`position_limit`); otherwise ``ValueError`` names the limit.
    """
    if hasattr(model, "config") and not hasattr(model, "cfg"):  # a Hugging Face model
        raise InputTypeError(
            f"tokenize takes a bridge from attnlens.load or a tokenizer, got a "
            f"{type(model).__name__}; pass attnlens.load(model) or its tokenizer."
        )
    tokenizer = getattr(model, "tokenizer", None) or model
    layout = default_layout(model) if layout is None else layout
    if layout not in LAYOUTS:
        raise InputError(f"Unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}.")
    flag(compact, "compact")
    examples = _as_examples(texts_or_pairs)
    is_pair = isinstance(examples[0], tuple)
    if any(isinstance(example, tuple) != is_pair for example in examples):
        raise InputError("Mix of single sentences and pairs in one batch; tokenize them apart.")
    max_len = check_max_len(model, max_len, layout=layout, is_pair=is_pair)
    words = isinstance(examples[0], Words)
    encoded = (layouts.papa if layout == "papa" else layouts.padded)(tokenizer, examples, max_len, is_pair, words)
    batch = Batch(encoded.input_ids, encoded.attention_mask, encoded.token_type_ids, encoded.n_truncated,
                  layout, max_len, is_pair, encoded.extra)
    batch.token_types = layouts.uses_token_types(tokenizer)
    batch.positions_from_mask = model is not tokenizer and _positions_from_mask(model)
    batch.counts_positions = model is not tokenizer and _counts_positions(model)
    return compact_batch(batch) if compact and layout == "papa" else batch


def compact_batch(batch: Batch, *, multiple: int = 1) -> Batch:
    """``batch`` (PAPA layout, padded to ``max_len``) as a compact batch: each row's real tokens
    in order, left-aligned, the batch as wide as its longest row, and the position of each kept
    column in ``position_ids`` (0 on the padding after it). The inputs are the same (see the
    module docstring); ``extra`` tensors of ``[batch, pos]`` (word indices) are moved alike.
    ``multiple``: the width is rounded up to a multiple of it (at most the padded width), so that
    a pass sees few distinct shapes (a GPU's kernels are chosen, and cached, per shape); the
    extra columns are padding.
    A compact batch is returned as it is; a batch of another layout raises ``ValueError``."""
    if batch.compact:
        return batch
    if batch.layout != "papa":
        raise InputError(
            f"only PAPA-layout batches can be made compact (this one has layout={batch.layout!r}, "
            "which is already as long as its longest text); tokenize with layout='papa'."
        )
    keep = batch.attention_mask.bool()
    n, length = keep.shape
    counts = keep.sum(1)
    width = min(-(-int(counts.max()) // multiple) * multiple, length) if n else 0
    rows = torch.arange(n, device=keep.device)[:, None].expand(n, length)[keep]
    columns = (keep.cumsum(1) - 1)[keep]  # the kept token's column in the compact row
    source = torch.arange(length, device=keep.device).expand(n, length)[keep]

    def moved(values: Tensor, fill: int) -> Tensor:
        out = values.new_full((n, width), fill)
        out[rows, columns] = values[keep]
        return out

    pad = int(batch.input_ids[~keep][0]) if bool((~keep).any()) else 0
    position_ids = torch.zeros(n, width, dtype=torch.long, device=keep.device)
    position_ids[rows, columns] = source
    extra = {
        key: moved(value, -1) if isinstance(value, Tensor) and value.shape == keep.shape else value
        for key, value in batch.extra.items()
    }
    return Batch(
        moved(batch.input_ids, pad), moved(batch.attention_mask, 0), moved(batch.token_type_ids, 0),
        batch.n_truncated, batch.layout, batch.max_len, batch.is_pair, extra, batch.token_types,
        batch.positions_from_mask, position_ids, batch.counts_positions,
    )


def default_layout(model: Any) -> str:
    """The layout a model's PAPA constants are fitted in when none is named (``papa.fit``,
    ``compare``, ``attnlens fit-papa``): its architecture's
    (:attr:`attnlens.core.models.Architecture.layout`): ``"padded"`` for a decoder, which has no
    [CLS]/[SEP] to fix in place, ``"papa"`` for an encoder. A bare tokenizer gets ``"papa"``."""
    architecture = models.find(model)
    return architecture.layout if architecture is not None else "papa"


def _positions_from_mask(model: Any) -> bool:
    """Whether the model's position ids come from the mask: its architecture's fact
    (:attr:`attnlens.core.models.Architecture.positions_from_mask`), else whether it is causal."""
    architecture = models.find(model)
    return architecture.positions_from_mask if architecture is not None else is_causal(model)


def _counts_positions(model: Any) -> bool:
    """Whether the model numbers the real tokens itself, skipping padding: its architecture's
    fact (:attr:`attnlens.core.models.Architecture.counts_positions`), else whether it is causal."""
    architecture = models.find(model)
    return architecture.counts_positions if architecture is not None else is_causal(model)


def position_limit(model: Any) -> int | None:
    """How many tokens a text of ``model`` may hold, or ``None`` if unknown.

    ``config.max_position_embeddings`` of the Hugging Face model behind a bridge (GPT-2's
    ``n_positions``); for RoBERTa, whose positions start at ``padding_idx + 1``, that many fewer;
    at most the model's sliding window (:attr:`attnlens.core.models.Architecture.window`), which
    attnlens's own patterns do not apply. A bare tokenizer knows no model, hence ``None``.
    """
    config = getattr(getattr(model, "original_model", None), "config", None)
    positions = getattr(config, "max_position_embeddings", None)
    if not isinstance(positions, int):
        return None
    window = _window(config)
    limit = positions - _reserved_positions(config)
    return limit if window is None else min(limit, window)


def _window(config: Any) -> int | None:
    architecture = models.find(config)
    return None if architecture is None else architecture.window(config)


def _reserved_positions(config: Any) -> int:
    """Position embeddings a model never uses: the architecture's
    :attr:`~attnlens.core.models.Architecture.reserved_positions` (``padding_idx + 1`` for RoBERTa)."""
    architecture = models.find(config)
    return 0 if architecture is None else architecture.reserved_positions(config)


def min_max_len(tokenizer: Any, *, layout: Layout = "papa", is_pair: bool = False) -> int:
    """The smallest ``max_len`` that keeps one real token per segment besides the special tokens.

    PAPA layout: start, separator(s) and one token per segment (3 for sentences, 5 for pairs).
    Padded layout: the tokenizer's own special tokens plus one token per segment (BERT: 3 and 5).
    """
    segments = 2 if is_pair else 1
    if layout == "papa":
        return 2 + (segments - 1) + segments
    count = getattr(tokenizer, "num_special_tokens_to_add", None)
    return (count(pair=is_pair) if count is not None else 0) + segments


def as_max_len(max_len: Any) -> int:
    """``max_len`` as an ``int`` (:func:`attnlens.core.checks.whole_number`)."""
    return whole_number(max_len, "max_len", " of tokens (e.g. max_len=128)")


def check_max_len(
    model: Any, max_len: SupportsIndex, *, layout: Layout = "papa", is_pair: bool = False
) -> int:
    """``max_len`` as an ``int`` (:func:`as_max_len`); ``ValueError`` unless it fits ``model`` (a
    bridge or a tokenizer).

    Too small: below :func:`min_max_len` (no room for a real token). Too large: above
    :func:`position_limit` (the forward pass would run out of position embeddings).
    """
    max_len = as_max_len(max_len)
    tokenizer = getattr(model, "tokenizer", None) or model
    minimum = min_max_len(tokenizer, layout=layout, is_pair=is_pair)
    if max_len < minimum:
        inputs = "sentence pairs" if is_pair else "single sentences"
        raise InputError(
            f"max_len={max_len} leaves no room for tokens in the {layout!r} layout: {inputs} "
            f"need max_len >= {minimum} (special tokens plus one token per segment)."
        )
    limit = position_limit(model)
    if limit is not None and max_len > limit:
        config = model.original_model.config
        if limit == _window(config):
            raise InputError(
                f"max_len={max_len} is more than the model's sliding window of {limit} tokens "
                f"(config.sliding_window): attnlens's constant and uniform patterns do not apply "
                f"the window, so a replaced head would read keys the model cannot; use max_len={limit} or less."
            )
        reserved = _reserved_positions(config)
        unused = f" minus padding_idx + 1 = {reserved}" if reserved else ""
        raise InputError(
            f"max_len={max_len} is more than the {limit} token positions of the model "
            f"(config.max_position_embeddings={config.max_position_embeddings}{unused}); "
            f"use max_len={limit} or less."
        )
    return max_len


@dataclass(frozen=True)
class Words:
    """One example given as words (a token task: NER, POS): tokenized with
    ``is_split_into_words=True``, so every token knows its word. The batch then holds
    ``extra["word_index"]`` ``[batch, pos]``: the index of the word whose *first* sub-token sits
    at that position, and -1 everywhere else (later sub-tokens, special tokens, padding), the
    convention of PAPA and BERT's NER fine-tuning (Devlin et al. 2019, §5.3), and
    ``extra["word_ids"]`` ``[batch, pos]``: the word of *every* sub-token (-1 for special tokens
    and padding), to turn token attention into word attention. Words cut by ``max_len`` have no
    position. Needs a fast (Rust) tokenizer, which knows each token's word."""

    words: tuple[str, ...]

    def __post_init__(self) -> None:
        if isinstance(self.words, str) or not all(isinstance(word, str) for word in self.words):
            raise InputTypeError("Words takes a sequence of strings, e.g. Words(('EU', 'rejects', 'German')).")
        object.__setattr__(self, "words", tuple(self.words))

    def __len__(self) -> int:
        return len(self.words)


def example_kind(example: Any) -> str | None:
    """What one corpus example is: ``"text"`` (a string), ``"pair"`` (two strings, a tuple or a
    list), ``"words"`` (:class:`Words`), or ``None`` (none of these, which :func:`tokenize`
    refuses)."""
    if isinstance(example, str):
        return "text"
    if isinstance(example, Words):
        return "words"
    if isinstance(example, tuple | list) and len(example) == 2 and all(isinstance(part, str) for part in example):
        return "pair"
    return None


def by_length(tokenizer: Any, examples: Sequence) -> list[int]:
    """Indices of ``examples`` from the fewest to the most tokens (``tokenizer``'s, without
    special tokens; a stable order). :func:`attnlens.engine.passes.run` and
    :func:`attnlens.evaluation.probing.extract` run examples in this order, so that each batch (compact,
    :func:`compact_batch`, or padded to its longest example) holds examples of similar lengths
    and computes little padding. An example's result does not depend on its batch (up to
    float32 rounding), so the order changes no result."""
    if not examples:
        return []
    options = dict(add_special_tokens=False, truncation=False, split_special_tokens=True)
    kind = example_kind(examples[0])
    if kind == "words":
        encoded = tokenizer(layouts.word_lists(tokenizer, examples), is_split_into_words=True, **options)
        sizes = [len(ids) for ids in encoded["input_ids"]]
    elif kind == "pair":
        sizes = [0] * len(examples)
        for part in range(2):
            encoded = tokenizer([example[part] for example in examples], **options)
            sizes = [size + len(ids) for size, ids in zip(sizes, encoded["input_ids"], strict=True)]
    else:
        sizes = [len(ids) for ids in tokenizer(list(examples), **options)["input_ids"]]
    return sorted(range(len(examples)), key=sizes.__getitem__)


def _as_examples(texts_or_pairs: Any) -> list:
    """The examples of :func:`tokenize`'s argument: one text, pair or :class:`Words` as a list of
    one, else the iterable's items (pairs as tuples), each checked; a table (a dict of columns, a
    DataFrame, a Dataset) or a non-iterable is refused (:func:`attnlens.core.corpus.corpus_iterator`)."""
    if isinstance(texts_or_pairs, Words | str) or (isinstance(texts_or_pairs, tuple)
                                                    and example_kind(texts_or_pairs) == "pair"):
        texts_or_pairs = [texts_or_pairs]
    given = corpus_iterator(texts_or_pairs, name="texts_or_pairs")
    examples = [tuple(e) if isinstance(e, list | tuple) else e for e in given]
    if not examples:
        raise InputError("Nothing to tokenize: the list of texts is empty.")
    if isinstance(examples[0], Words):
        return _as_words(examples)
    for index, example in enumerate(examples):
        if example_kind(example) not in ("text", "pair"):
            raise InputTypeError(f"Expected a string or a (str, str) pair, got {describe(example)} (text {index}).")
        parts = example if isinstance(example, tuple) else (example,)
        for sentence, part in enumerate(parts):
            if not part.strip():
                which = f"(its {layouts.SENTENCES[sentence]} sentence) " if len(parts) == 2 else ""
                raise BlankText(index, f"{which}is blank (empty or only whitespace); remove blank texts from the corpus")
    return examples


def _as_words(examples: list) -> list[Words]:
    for index, example in enumerate(examples):
        if not isinstance(example, Words):
            raise InputError("Mix of Words and texts in one batch; tokenize them apart.")
        if not example.words or any(not word.strip() for word in example.words):
            raise BlankText(index, "has no words, or a blank word; remove it from the corpus")
    return examples


