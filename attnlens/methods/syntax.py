"""Which attention heads find syntactic dependencies (Clark et al. 2019, §4)?

Clark, Khandelwal, Levy and Manning (2019), "What does BERT look at? An analysis of BERT's
attention", §4.2: a head *predicts* a word's syntactic head as the word it attends to most. For
every dependency relation and direction, the best single head's accuracy is compared with the
best fixed-offset baseline (always predicting the word ``k`` positions away)::

    import attnlens
    from attnlens import syntax

    model = attnlens.load()
    table = syntax.dependency_heads(model, "en_ewt-ud-dev.conllu", limit=300)
    table[table.beats_baseline]

How it is computed:

- sentences come from a CoNLL-U treebank (:func:`read_conllu`): the FORM, HEAD and DEPREL of
  every word; multiword-token ranges (``3-4``) and empty nodes (``5.1``) are skipped, and a
  relation's subtype is dropped (``nmod:poss`` counts as ``nmod``);
- each sentence runs as :class:`attnlens.Words`, so every sub-token knows its word; token
  attention becomes word attention as in Clark §4.1 (:func:`word_attention`): the attention *to*
  a word is the sum over its sub-tokens, the attention *from* a word the mean over its
  sub-tokens; special tokens and padding are dropped;
- a head's prediction for a word is the argmax of its word-attention row over the other words of
  the sentence (attention to the word itself is ignored, as in Clark's code: no word is its own
  head), :func:`predicted_words`;
- *dependent -> head*: for each arc, is the dependent's prediction its head word? *head ->
  dependent*: for each arc, is the head word's prediction that dependent? (Counted per arc, so a
  head word with several dependents of one relation can get at most one of them right. Clark's
  released notebook scores this direction on the transposed map instead, "which word attends
  most to the dependent"; the paper's wording, used here, is the head word attending to the
  dependent.) The ``root`` arc has no head word and is not counted;
- baseline: for each relation and direction, the most accurate single offset among
  :data:`OFFSETS` (``-3 .. +3`` words, 0 excluded);
- the counting is an :class:`attnlens.passes.Accumulator` (:class:`DependencyCounts`) whose
  state is count tensors that add up, so it checkpoints, merges and runs under ``torchrun``.

Views: ``"standard"`` (the model's attention), ``"effective"`` (effective attention,
:mod:`attnlens.effective`; it is signed, and the argmax is taken over the signed word attention,
so a strongly negative weight never counts as "attended to"), or fitted
:class:`~attnlens.papa.PapaConstants` (every head replaced by its constant, read back from the
patterns; the inputs then take the constants' layout and ``max_len``).
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, SupportsIndex

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from attnlens.core.checks import describe, whole_number
from attnlens.core.inputs import Words, _word_ids
from attnlens.core.loading import require_bridge
from attnlens.engine import passes
from attnlens.engine.passes import Accumulator, FwdHooks, LayerPatterns, PassBatch
from attnlens.errors import InputError, InputTypeError, MissingFileError
from attnlens.methods import view_setup, views

#: the fixed offsets (in words) of the baseline, dependent -> head ("the word k to the right")
OFFSETS: tuple[int, ...] = (-3, -2, -1, 1, 2, 3)
#: the two directions, in the order of the count tensors' second axis
DIRECTIONS: tuple[str, ...] = ("dependent->head", "head->dependent")
#: the name of the pooled row of :func:`dependency_heads`
ALL = "all relations"
#: the columns of :func:`dependency_heads`'s table
COLUMNS: tuple[str, ...] = (
    "relation", "direction", "count", "best_layer", "best_head", "accuracy", "baseline_offset",
    "baseline_accuracy", "beats_baseline",
)

_PLAIN_ID = re.compile(r"[1-9][0-9]*")
_RANGE_ID = re.compile(r"[1-9][0-9]*-[1-9][0-9]*")
_EMPTY_ID = re.compile(r"[0-9]+\.[1-9][0-9]*")
_HEAD = re.compile(r"[0-9]+")
_FIELDS = "ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC"


# ------------------------------------------------------------------------------------------------
# reading a treebank


@dataclass(frozen=True)
class Sentence:
    """One dependency tree: ``words`` (FORM), ``heads`` (the 0-based index of each word's
    syntactic head, -1 for the root), ``relations`` (DEPREL without subtype: ``nmod:poss`` ->
    ``nmod``) and ``line``, where the sentence starts in its file (1-based)."""

    words: tuple[str, ...]
    heads: tuple[int, ...]
    relations: tuple[str, ...]
    line: int = 0

    def __len__(self) -> int:
        return len(self.words)

    def arcs(self) -> list[tuple[int, int, str]]:
        """``(dependent, head, relation)`` for every word but the root (0-based word indices)."""
        return [(i, h, r) for i, (h, r) in enumerate(zip(self.heads, self.relations, strict=True)) if h >= 0]


def _source(conllu: str | os.PathLike) -> tuple[str, str]:
    """(text, name for messages) of a path or of CoNLL-U text itself."""
    if isinstance(conllu, str) and ("\n" in conllu or "\t" in conllu):
        return conllu, "the CoNLL-U text"
    if not isinstance(conllu, str | os.PathLike):
        raise InputTypeError(
            f"conllu must be the path of a CoNLL-U file or its text, got {describe(conllu)}."
        )
    path = Path(conllu)
    if not path.is_file():
        raise MissingFileError(
            f"CoNLL-U file {path} not found: give the path of a treebank file (e.g. "
            "en_ewt-ud-dev.conllu from Universal Dependencies) or its text."
        )
    try:
        return path.read_text(encoding="utf-8-sig"), str(path)
    except UnicodeDecodeError as error:
        raise InputError(
            f"{path} is not a CoNLL-U file: it is not UTF-8 text ({error.reason} at byte "
            f"{error.start}). Give a CoNLL-U treebank (UTF-8, one word per line, 10 tab-separated columns)."
        ) from None


def _check_line(name: str, number: int, line: str) -> tuple[str, str, str] | None:
    """``(id, head, deprel)`` of a CoNLL-U word line (None for a range or an empty node);
    ``ValueError`` naming the file and line for anything else."""
    fields = line.split("\t")
    if len(fields) != 10:
        raise InputError(
            f"{name}, line {number}: not a CoNLL-U word line ({len(fields)} tab-separated "
            f"column{'s' if len(fields) != 1 else ''}; CoNLL-U has 10: {_FIELDS}). Give a "
            "CoNLL-U treebank, e.g. en_ewt-ud-dev.conllu from Universal Dependencies."
        )
    word_id, head, deprel = fields[0], fields[6], fields[7]
    if _RANGE_ID.fullmatch(word_id) or _EMPTY_ID.fullmatch(word_id):
        return None
    if not _PLAIN_ID.fullmatch(word_id):
        raise InputError(
            f"{name}, line {number}: {word_id!r} is not a CoNLL-U word ID (1, 2, ...; 3-4 for a "
            "multiword token, 5.1 for an empty node). Give a CoNLL-U treebank."
        )
    if not _HEAD.fullmatch(head) or deprel in ("", "_"):
        raise InputError(
            f"{name}, line {number}: word {word_id} has no dependency (HEAD={head!r}, "
            f"DEPREL={deprel!r}). dependency_heads needs gold trees in the HEAD and DEPREL "
            "columns, as in Universal Dependencies treebanks; give such a file."
        )
    return word_id, head, deprel


def _blocks(text: str, name: str, limit: int | None) -> list[tuple[int, list[str]]]:
    """The sentences of ``text`` as ``(first line, lines)``, every word line checked."""
    blocks: list[tuple[int, list[str]]] = []
    current: list[str] = []
    start, ids, heads = 0, 0, []

    def close() -> None:
        nonlocal current, ids, heads
        if ids:
            for number, head in heads:
                if head > ids:
                    raise InputError(
                        f"{name}, line {number}: HEAD {head} points past the sentence's last "
                        f"word ({ids}). Give a well-formed CoNLL-U treebank."
                    )
            blocks.append((start, current))
        current, ids, heads = [], 0, []

    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            close()
            if limit is not None and len(blocks) >= limit:
                break
            continue
        if not current:
            start = number
        current.append(line)
        if line.startswith("#"):
            continue
        checked = _check_line(name, number, line)
        if checked is None:
            continue
        word_id, head = int(checked[0]), int(checked[1])
        if word_id != ids + 1:
            raise InputError(
                f"{name}, line {number}: word ID {word_id} where {ids + 1} was expected (IDs run "
                "1, 2, ... within a sentence, sentences end with a blank line). Give a "
                "well-formed CoNLL-U treebank."
            )
        ids = word_id
        heads.append((number, head))
    else:
        close()
    return blocks[:limit] if limit is not None else blocks


def read_conllu(conllu: str | os.PathLike, *, limit: int | None = None) -> list[Sentence]:
    """The dependency trees of a CoNLL-U treebank (a path, or the text itself), read with the
    ``conllu`` package: FORM, HEAD and DEPREL of every word (Clark et al. 2019, §4.2).

    Multiword-token ranges (IDs like ``3-4``) and empty nodes (``5.1``) are skipped: the words
    are the syntactic words ``1 .. n``. Relations lose their subtype after ``:``
    (``nmod:poss`` -> ``nmod``, ``obl:tmod`` -> ``obl``). ``limit``: the first ``limit``
    sentences only.

    ``FileNotFoundError`` for a missing file; ``ValueError`` naming the file and line for
    anything that is not CoNLL-U with gold trees (wrong number of columns, a bad ID, no HEAD or
    DEPREL, a head outside the sentence).
    """
    import conllu as conllu_package
    from conllu.exceptions import ParseException

    if limit is not None:
        limit = whole_number(limit, "limit", " of sentences (e.g. limit=300)", minimum=1)
    text, name = _source(conllu)
    sentences = []
    for start, lines in _blocks(text, name, limit):
        try:
            (tokens,) = conllu_package.parse("\n".join(lines) + "\n\n")
        except ParseException as error:
            raise InputError(
                f"{name}, sentence at line {start}: not CoNLL-U ({error}). Give a CoNLL-U treebank."
            ) from None
        words = [token for token in tokens if isinstance(token["id"], int)]
        sentences.append(Sentence(
            words=tuple(str(token["form"]) if token["form"] is not None else "_" for token in words),
            heads=tuple(int(token["head"]) - 1 for token in words),
            relations=tuple(str(token["deprel"]).split(":")[0] for token in words),
            line=start,
        ))
    if not sentences:
        raise InputError(
            f"{name} has no sentence: a CoNLL-U treebank has one word per line (10 tab-separated "
            f"columns: {_FIELDS}) and a blank line after each sentence."
        )
    return sentences


def relations_of(sentences: Sequence[Sentence]) -> tuple[str, ...]:
    """The relations of the (non-root) arcs of ``sentences``, sorted."""
    return tuple(sorted({relation for sentence in sentences for _, _, relation in sentence.arcs()}))


# ------------------------------------------------------------------------------------------------
# token attention -> word attention -> predictions


def word_attention(
    pattern: Float[Tensor, "batch head pos pos"],
    word_ids: Int[Tensor, "batch pos"],
    n_words: int,
) -> Float[Tensor, "batch head word word"]:
    """Token attention as word attention (Clark et al. 2019, §4.1): the attention from word
    ``i`` to word ``j`` is the *sum* over ``j``'s sub-tokens (as keys) of the *mean* over
    ``i``'s sub-tokens (as queries), so rows still add up to the attention the words receive.

    ``word_ids``: the word of every position (``batch.extra["word_ids"]`` of a batch of
    :class:`attnlens.Words`), -1 for special tokens and padding, which are dropped. Words
    ``0 .. n_words-1``; a word without a sub-token gets a row and a column of zeros. Computed
    batched (two matrix products with the one-hot word membership) in the pattern's dtype
    promoted to at least float32.
    """
    dtype = torch.promote_types(pattern.dtype, torch.float32)
    words = torch.arange(n_words, device=word_ids.device)
    member = (word_ids[..., None] == words).to(dtype)  # [batch, pos, word]
    to_words = pattern.to(dtype) @ member[:, None]  # [batch, head, query, word]: sum over keys
    summed = member.transpose(1, 2)[:, None] @ to_words  # [batch, head, word, word]
    sizes = member.sum(1).clamp_min(1)  # sub-tokens per word
    return summed / sizes[:, None, :, None]


def word_presence(word_ids: Int[Tensor, "batch pos"], n_words: int) -> Bool[Tensor, "batch word"]:
    """Whether each word ``0 .. n_words-1`` has at least one sub-token in the batch."""
    words = torch.arange(n_words, device=word_ids.device)
    return (word_ids[..., None] == words).any(1)


def predicted_words(
    words: Float[Tensor, "batch head word word"], present: Bool[Tensor, "batch word"]
) -> Int[Tensor, "batch head word"]:
    """Each word's most-attended word (Clark et al. 2019, §4.2): the argmax of its
    word-attention row over the other words that have a sub-token. The word itself is excluded
    (as in Clark's code; no word is its own head). The argmax is over the values as they are:
    signed ones (effective attention) count their sign, so a large negative weight is never the
    prediction. Ties go to the leftmost word."""
    n_words = words.shape[-1]
    blocked = torch.eye(n_words, dtype=torch.bool, device=words.device) | ~present[:, None, None, :]
    return words.masked_fill(blocked, float("-inf")).argmax(-1)


# ------------------------------------------------------------------------------------------------
# the accumulator


class DependencyCounts(Accumulator):
    """Correct predictions of every (layer, head) for each relation and direction, streamed by
    :func:`attnlens.passes.run` over :class:`attnlens.Words` examples (Clark et al. 2019, §4.2).

    ``sentences``: the gold trees, in the order of the corpus given to the pass (example ``i``
    of the corpus is ``sentences[i]``; batches find theirs by :attr:`PassBatch.indices`).
    ``view``: the registered view whose maps are read (:attr:`attnlens.methods.views.View.maps`:
    ``"standard"`` the patterns, ``"effective"`` effective attention, a view given by constants
    the patterns under its hooks). ``relations``: the
    relations counted (default: those of ``sentences``, :func:`relations_of`); arcs of other
    relations are ignored.

    State (adds up over shards): ``correct`` ``[relation, direction, layer, head]``, ``arcs``
    ``[relation]`` (arcs counted), ``offsets`` ``[relation, direction, offset]`` (correct
    predictions of each baseline offset of :data:`OFFSETS`) and ``dropped`` (arcs not counted
    because one of their words got no sub-token). :meth:`table` gives the summary.
    """

    name = "syntax.dependency_heads"
    any_order = True  # counts over sentences, each found by its corpus index

    def __init__(
        self,
        sentences: Sequence[Sentence],
        n_layers: int,
        n_heads: int,
        *,
        view: Any = "standard",
        relations: Sequence[str] | None = None,
    ) -> None:
        self.sentences = list(sentences)
        self.relations = tuple(relations) if relations is not None else relations_of(self.sentences)
        self._view = view if isinstance(view, views.View) else views.get_view(
            view, among=views.names(constants=False), where=" for DependencyCounts")
        self.needs_effective = self._view.needs_effective
        index = {relation: i for i, relation in enumerate(self.relations)}
        self._arcs = [
            [(dependent, head, index[relation]) for dependent, head, relation in sentence.arcs()
             if relation in index]
            for sentence in self.sentences
        ]
        n_relations = len(self.relations)
        self.correct = torch.zeros(n_relations, len(DIRECTIONS), n_layers, n_heads, dtype=torch.int64)
        self.arcs = torch.zeros(n_relations, dtype=torch.int64)
        self.offsets = torch.zeros(n_relations, len(DIRECTIONS), len(OFFSETS), dtype=torch.int64)
        self.dropped = torch.zeros(1, dtype=torch.int64)
        self._gold: dict[str, Any] = {}

    def start_batch(self, batch: PassBatch) -> None:
        super().start_batch(batch)
        tokens = batch.batch
        word_ids = tokens.extra.get("word_ids")
        if word_ids is None:
            raise InputError(
                "DependencyCounts needs a corpus of attnlens.Words (one per sentence, in the "
                "order of its sentences), whose batches know each token's word."
            )
        if max(batch.indices) >= len(self.sentences):
            raise InputError(
                f"the corpus has more examples than the {len(self.sentences)} sentences given to "
                "DependencyCounts; give the pass one attnlens.Words per sentence."
            )
        sentences = [self.sentences[index] for index in batch.indices]
        if tokens.n_truncated:
            raise InputError(
                f"{tokens.n_truncated} sentences of the batch of example {batch.indices[0]} lost tokens "
                "to max_len, which would cut words off their heads; leave out sentences longer "
                "than max_len (dependency_heads does) or raise max_len."
            )
        last = word_ids.max(-1).values.tolist()
        for index, sentence, words in zip(batch.indices, sentences, last, strict=True):
            if words >= len(sentence):
                raise InputError(
                    f"example {index} has more words than sentence {index} "
                    f"({len(sentence)}): the corpus does not match the sentences given to DependencyCounts."
                )
        width = max(len(sentence) for sentence in sentences)
        present = word_presence(word_ids, width)
        flat = [(row, d, h, r) for row, index in enumerate(batch.indices) for d, h, r in self._arcs[index]]
        columns = torch.tensor(flat, dtype=torch.long, device=word_ids.device).reshape(-1, 4)
        rows, dependents, heads, relations = columns.unbind(1)
        kept = present[rows, dependents] & present[rows, heads]
        self._gold = {
            "word_ids": word_ids, "width": width, "present": present, "rows": rows[kept],
            "dependents": dependents[kept], "heads": heads[kept], "relations": relations[kept],
            "dropped": int((~kept).sum()),
        }

    def update(self, layer: LayerPatterns) -> None:
        gold = self._gold
        pattern = self._view.maps(layer)
        words = word_attention(pattern.detach(), gold["word_ids"], gold["width"])
        by_word = predicted_words(words, gold["present"]).transpose(1, 2)  # [batch, word, head]
        rows, dependents, heads = gold["rows"], gold["dependents"], gold["heads"]
        hits = (
            by_word[rows, dependents] == heads[:, None],  # the dependent's row: its head?
            by_word[rows, heads] == dependents[:, None],  # the head word's row: the dependent?
        )
        n_heads = by_word.shape[-1]
        for direction, hit in enumerate(hits):
            counts = torch.zeros(len(self.relations), n_heads, dtype=torch.int64, device=hit.device)
            counts.index_add_(0, gold["relations"], hit.long())
            self.correct[:, direction, layer.layer] += counts.to(self.correct.device)  # the pass's device

    def end_batch(self, batch: PassBatch) -> None:
        gold = self._gold
        relations = gold["relations"].to(self.arcs.device)  # where the state is (the pass's device)
        distance = (gold["heads"] - gold["dependents"]).to(self.arcs.device)  # the head is `distance` words away
        self.arcs += torch.bincount(relations, minlength=len(self.relations))
        for column, offset in enumerate(OFFSETS):
            for direction, correct in enumerate((distance == offset, distance == -offset)):
                self.offsets[:, direction, column] += torch.bincount(
                    relations[correct], minlength=len(self.relations)
                )
        self.dropped += gold["dropped"]
        self._gold = {}

    def state_dict(self) -> dict[str, Tensor]:
        return {"correct": self.correct, "arcs": self.arcs, "offsets": self.offsets, "dropped": self.dropped}

    def metadata(self) -> dict[str, Any]:
        return {"relations": list(self.relations)}

    def load_state_dict(self, state: Any, metadata: Any) -> None:
        if list(metadata.get("relations", self.relations)) != list(self.relations):
            raise InputError(
                f"{self.name}: the saved state counts other relations ({metadata['relations']}); "
                "resume with the same treebank."
            )
        super().load_state_dict(state, metadata)

    def accuracy(self) -> Float[Tensor, "relation direction layer head"]:
        """Accuracy of every head for every relation and direction (NaN without arcs)."""
        return self.correct.double() / self.arcs.double()[:, None, None, None]

    def result(self) -> pd.DataFrame:
        return self.table()

    def table(self) -> pd.DataFrame:
        """One row per relation and direction, plus the pooled :data:`ALL` row per direction:
        the best head and its accuracy, the best offset and its accuracy (see
        :func:`dependency_heads`); sorted by count, largest first."""
        n_layers, n_heads = self.correct.shape[-2:]
        parts = [(ALL, self.correct.sum(0), int(self.arcs.sum()), self.offsets.sum(0))]
        parts += [
            (relation, self.correct[r], int(self.arcs[r]), self.offsets[r])
            for r, relation in enumerate(self.relations)
        ]
        records = []
        for relation, correct, count, offsets in parts:
            if count == 0:
                continue
            for direction, name in enumerate(DIRECTIONS):
                best = int(correct[direction].flatten().argmax())
                accuracy = int(correct[direction].flatten()[best]) / count
                column = int(offsets[direction].argmax())
                baseline = int(offsets[direction, column]) / count
                records.append((
                    relation, name, count, best // n_heads, best % n_heads, accuracy,
                    OFFSETS[column], baseline, accuracy > baseline,
                ))
        table = pd.DataFrame.from_records(records, columns=list(COLUMNS))
        table = table.sort_values("count", ascending=False, kind="stable").reset_index(drop=True)
        return table


# ------------------------------------------------------------------------------------------------
# the analysis


def token_counts(model: Any, sentences: Sequence[Sentence], layout: str) -> list[int | None]:
    """How many positions each sentence takes in ``layout`` (its sub-tokens plus the special
    tokens), or None for one :func:`attnlens.tokenize` would refuse (a blank word, no token)."""
    tokenizer = getattr(model, "tokenizer", None) or model
    if layout == "papa":
        special = 2
    else:
        count = getattr(tokenizer, "num_special_tokens_to_add", None)
        special = count(pair=False) if count is not None else 0
    lengths: list[int | None] = [None] * len(sentences)
    usable = [i for i, s in enumerate(sentences) if s.words and all(w.strip() for w in s.words)]
    for first in range(0, len(usable), 1000):
        chunk = usable[first : first + 1000]
        encoded, _ = _word_ids(
            tokenizer, [Words(sentences[i].words) for i in chunk], add_special_tokens=False, truncation=False
        )
        for i, ids in zip(chunk, encoded["input_ids"], strict=True):
            lengths[i] = len(ids) + special if ids else None
    return lengths


def dependency_heads(
    model: Any,
    conllu: str | os.PathLike,
    *,
    view: Any = "standard",
    max_len: SupportsIndex | None = None,
    layout: str | None = None,
    batch_size: SupportsIndex = 32,
    limit: int | None = None,
    hooks: FwdHooks = (),
    progress: bool = True,
) -> pd.DataFrame:
    """How well single attention heads find syntactic dependencies, against a fixed-offset
    baseline (Clark et al. 2019, §4.2, Table 1).

    ``conllu``: a CoNLL-U treebank, a path or its text (:func:`read_conllu`: FORM, HEAD and
    DEPREL; multiword ranges and empty nodes skipped; relation subtypes dropped, ``nmod:poss``
    counts as ``nmod``). ``limit``: its first ``limit`` sentences only.

    ``view``: ``"standard"`` (the model's attention), ``"effective"`` (effective attention,
    signed: the prediction is the argmax of the signed word attention) or
    :class:`~attnlens.papa.PapaConstants` (every head replaced by its constant through
    :func:`attnlens.papa.hooks`; the inputs take the constants' layout and ``max_len``, and
    giving others is an error). ``hooks``: further interventions (``fwd_hooks``) during the pass.

    ``max_len`` (default 128, or the constants'): sentences that take more tokens are skipped,
    never truncated (that would cut words off their heads), and counted in
    ``table.attrs["skipped"]`` with one warning; sentences :func:`attnlens.tokenize` cannot take
    (a blank word) likewise in ``attrs["blank"]``. ``layout``: default the model's
    (:func:`attnlens.inputs.default_layout`).

    Token attention becomes word attention (:func:`word_attention`: sum over a word's
    sub-tokens as keys, mean as queries); a head predicts for each word the other word it
    attends to most (:func:`predicted_words`). For each relation (not ``root``) and direction,
    ``dependent->head`` (the dependent's prediction is its head) and ``head->dependent`` (the
    head word's prediction is the dependent, counted per arc), the table gives:

    ``relation``, ``direction``, ``count`` (arcs), ``best_layer``, ``best_head``, ``accuracy``
    (that head's), ``baseline_offset`` and ``baseline_accuracy`` (the best fixed offset of
    :data:`OFFSETS`: the word that many words away, to the right for a positive offset, from
    the dependent for ``dependent->head``, from the head word for ``head->dependent``),
    ``beats_baseline`` (``accuracy > baseline_accuracy``); plus one ``"all relations"`` row per
    direction (the one head best over all arcs pooled, and the best offset pooled). Sorted by
    count, largest first. ``attrs``: ``n_examples`` (sentences run; also ``sentences``, its older
    name), ``skipped``, ``blank``,
    ``dropped`` (arcs with a word that got no sub-token, not counted), ``view`` (``"standard"``,
    ``"effective"`` or ``"papa"``), ``layout`` and ``max_len``.
    """
    require_bridge(model, "dependency_heads")
    chosen = view_setup.setup(model, view, max_len=max_len, layout=layout, hooks=hooks)
    name, max_len, layout = chosen.name, chosen.max_len, chosen.layout
    sentences = read_conllu(conllu, limit=limit)

    lengths = token_counts(model, sentences, layout)
    kept = [s for s, n in zip(sentences, lengths, strict=True) if n is not None and n <= max_len]
    skipped = sum(n is not None and n > max_len for n in lengths)
    blank = sum(n is None for n in lengths)
    if skipped or blank:
        problems = []
        if skipped:
            problems.append(
                f"{skipped} longer than max_len={max_len} tokens (never truncated: that would "
                f"cut words off their heads; raise max_len to keep them)"
            )
        if blank:
            problems.append(f"{blank} with a blank word or no token")
        warnings.warn(
            f"dependency_heads skipped {skipped + blank} of {len(sentences)} sentences: "
            f"{'; '.join(problems)}.", stacklevel=2,
        )
    if not kept:
        raise InputError(
            f"no sentence of the {len(sentences)} read fits in max_len={max_len} tokens; raise max_len."
        )

    counts = DependencyCounts(
        kept, int(model.cfg.n_layers), int(model.cfg.n_heads), view=chosen.view
    )
    passes.run(
        model, [Words(s.words) for s in kept], [counts], max_len=max_len, layout=layout,
        batch_size=batch_size, hooks=chosen.hooks, progress=progress, description="dependency heads",
        settings={"view": name},
    )
    table = counts.table()
    table.attrs.update(
        n_examples=len(kept), sentences=len(kept), skipped=skipped, blank=blank, dropped=int(counts.dropped),
        view=name, layout=layout, max_len=max_len,
    )
    return table


# ------------------------------------------------------------------------------------------------
# the figure


def figure(table: pd.DataFrame, *, top: int = 12, title: str | None = None) -> Any:
    """The best head's accuracy beside the best fixed offset's, for the pooled row and the
    ``top`` most frequent relations of a :func:`dependency_heads` table, one panel per direction
    (Clark et al. 2019, Table 1 as bars). Hover: the head (``L{layer}H{head}``), the offset, the
    arc count."""
    top = whole_number(top, "top", " of relations to show", minimum=1)
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    missing = [column for column in COLUMNS if column not in table.columns]
    if missing:
        raise InputError(f"not a table of syntax.dependency_heads(...): it lacks columns {missing}.")
    relations = [ALL] + [r for r in table["relation"].drop_duplicates() if r != ALL][:top]
    fig = make_subplots(rows=1, cols=len(DIRECTIONS), shared_yaxes=True, subplot_titles=DIRECTIONS,
                        horizontal_spacing=0.05)
    for column, direction in enumerate(DIRECTIONS, start=1):
        rows = table[table["direction"] == direction].set_index("relation").reindex(relations).dropna(subset=["count"])
        heads = [f"L{int(r.best_layer)}H{int(r.best_head)}" for r in rows.itertuples()]
        fig.add_trace(go.Bar(
            y=rows.index, x=rows["accuracy"], orientation="h", name="best head", marker_color="#4c72b0",
            legendgroup="head", showlegend=column == 1, customdata=list(zip(heads, rows["count"].astype(int), strict=True)),
            hovertemplate="%{y}: %{customdata[0]} %{x:.3f} (%{customdata[1]} arcs)<extra></extra>",
        ), row=1, col=column)
        fig.add_trace(go.Bar(
            y=rows.index, x=rows["baseline_accuracy"], orientation="h", name="best fixed offset",
            marker_color="#b3b3b3", legendgroup="offset", showlegend=column == 1,
            customdata=rows["baseline_offset"].astype(int),
            hovertemplate="%{y}: offset %{customdata:+d} %{x:.3f}<extra></extra>",
        ), row=1, col=column)
        fig.update_xaxes(title_text="accuracy", range=[0, 1], row=1, col=column)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    view = table.attrs.get("view", "")
    fig.update_layout(
        barmode="group", height=max(320, 28 * len(relations) + 120), width=900,
        title=title or f"Syntactic heads (Clark et al. 2019, §4){f', {view} attention' if view else ''}",
        legend=dict(orientation="h", y=-0.12), margin=dict(l=90, r=20, t=70, b=60),
    )
    return fig
