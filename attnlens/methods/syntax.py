"""Which attention heads find syntactic dependencies (Clark et al. 2019, §4)?

Clark, Khandelwal, Levy and Manning (2019), "What does BERT look at? An analysis of BERT's
attention", §4.2: a head *predicts* a word's syntactic head as the word it attends to most. For
every dependency relation and direction, the best single head's accuracy is compared with the
best fixed-offset baseline (always predicting the word ``k`` positions away)::

    import attnlens
    from attnlens.methods import syntax

    model = attnlens.load()
    table = syntax.dependency_heads(model, "en_ewt-ud-dev.conllu", limit=300)
    table[table.beats_baseline]

How it is computed:

- sentences come from a CoNLL-U treebank (:func:`attnlens.methods.conllu.read_conllu`): the
  FORM, HEAD and DEPREL of every word; multiword-token ranges (``3-4``) and empty nodes
  (``5.1``) are skipped, and a relation's subtype is dropped (``nmod:poss`` counts as ``nmod``);
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
- the counting is an :class:`attnlens.engine.accumulator.Accumulator` (:class:`DependencyCounts`) whose
  state is count tensors that add up, so it checkpoints, merges and runs under ``torchrun``.

Views: ``"standard"`` (the model's attention), ``"effective"`` (effective attention,
:mod:`attnlens.methods.effective`; it is signed, and the argmax is taken over the signed word attention,
so a strongly negative weight never counts as "attended to"), or fitted
:class:`~attnlens.papa.PapaConstants` (every head replaced by its constant, read back from the
patterns; the inputs then take the constants' layout and ``max_len``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Any, SupportsIndex

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from attnlens.core.checks import flag, whole_number
from attnlens.core.inputs import Words
from attnlens.core.layouts import word_ids_of
from attnlens.core.loading import is_causal, require_bridge
from attnlens.engine import passes
from attnlens.engine.accumulator import Accumulator, LayerPatterns, PassBatch
from attnlens.engine.forward import FwdHooks
from attnlens.errors import InputError
from attnlens.methods import view_setup, views
from attnlens.methods.conllu import Sentence, read_conllu, relations_of

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
    words: Float[Tensor, "batch head word word"], present: Bool[Tensor, "batch word"], *, causal: bool = False
) -> Int[Tensor, "batch head word"]:
    """Each word's most-attended word (Clark et al. 2019, §4.2): the argmax of its
    word-attention row over the other words that have a sub-token. The word itself is excluded
    (as in Clark's code; no word is its own head). The argmax is over the values as they are:
    signed ones (effective attention) count their sign, so a large negative weight is never the
    prediction. Ties go to the leftmost word.

    ``causal`` (a decoder): a word's candidates are the words before it, the only ones its
    tokens attend to (a later word's 0 would otherwise win the argmax of a row whose earlier
    words are all 0: the first word always "predicted" the second). A word with no candidate
    (the first word of a decoder's sentence, or the only word of a sentence) predicts nothing:
    -1, never a hit."""
    n_words = words.shape[-1]
    blocked = torch.eye(n_words, dtype=torch.bool, device=words.device) | ~present[:, None, None, :]
    if causal:
        blocked = blocked | torch.ones(n_words, n_words, dtype=torch.bool, device=words.device).triu(1)
    predicted = words.masked_fill(blocked, float("-inf")).argmax(-1)
    return predicted.masked_fill(blocked.all(-1), -1)


# ------------------------------------------------------------------------------------------------
# the accumulator


class DependencyCounts(Accumulator):
    """Correct predictions of every (layer, head) for each relation and direction, streamed by
    :func:`attnlens.engine.passes.run` over :class:`attnlens.Words` examples (Clark et al. 2019, §4.2).

    ``sentences``: the gold trees, in the order of the corpus given to the pass (example ``i``
    of the corpus is ``sentences[i]``; batches find theirs by :attr:`PassBatch.indices`).
    ``view``: the registered view whose maps are read (:attr:`attnlens.methods.views.View.maps`:
    ``"standard"`` the patterns, ``"effective"`` effective attention, a view given by constants
    the patterns under its hooks). ``relations``: the
    relations counted (default: those of ``sentences``,
    :func:`attnlens.methods.conllu.relations_of`); arcs of other
    relations are ignored. ``causal``: the model is a decoder, whose words attend only to earlier
    words (:func:`predicted_words`; :func:`dependency_heads` passes the model's).

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
        causal: bool = False,
    ) -> None:
        self.sentences = list(sentences)
        self.causal = flag(causal, "causal")
        self.relations = tuple(relations) if relations is not None else relations_of(self.sentences)
        self._view = view if isinstance(view, views.View) else views.get_view(
            view, among=views.names(constants=False), where=" for DependencyCounts")
        self.needs_values = self._view.needs_values
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
        width = max(len(sentence) for sentence in sentences)
        # the gold arcs of the batch, and their counts, found on the host's copy of its tokens and
        # moved in one copy (PassBatch.from_host): nothing read from the device
        self._gold = dict(batch.from_host("syntax.gold", lambda inputs: self._gold_of(inputs, batch.indices, width)))
        self._gold.update(word_ids=word_ids, width=width)

    def _gold_of(self, inputs: Any, indices: Sequence[int], width: int) -> dict[str, Tensor]:
        """The batch's gold arcs whose two words have a sub-token (``rows``, ``dependents``,
        ``heads``, ``relations``), which words have one (``present``), and the counts the state
        adds: arcs per relation, arcs at each baseline offset, arcs dropped."""
        word_ids = inputs.extra["word_ids"]
        last = word_ids.max(-1).values.tolist()
        for index, words in zip(indices, last, strict=True):
            if words >= len(self.sentences[index]):
                raise InputError(
                    f"example {index} has more words than sentence {index} "
                    f"({len(self.sentences[index])}): the corpus does not match the sentences given to DependencyCounts."
                )
        present = word_presence(word_ids, width)
        flat = [(row, d, h, r) for row, index in enumerate(indices) for d, h, r in self._arcs[index]]
        columns = torch.tensor(flat, dtype=torch.long).reshape(-1, 4)
        kept = present[columns[:, 0], columns[:, 1]] & present[columns[:, 0], columns[:, 2]]
        rows, dependents, heads, relations = columns[kept].unbind(1)
        n_relations = len(self.relations)
        distance = heads - dependents  # the head is `distance` words away
        offsets = torch.stack([
            torch.stack([torch.bincount(relations[distance == offset], minlength=n_relations),
                         torch.bincount(relations[distance == -offset], minlength=n_relations)], dim=-1)
            for offset in OFFSETS
        ], dim=-1)  # [relation, direction, offset]
        return {
            "present": present, "rows": rows, "dependents": dependents, "heads": heads, "relations": relations,
            "arcs": torch.bincount(relations, minlength=n_relations), "offsets": offsets,
            "dropped": (~kept).sum().reshape(1),
        }

    def update(self, layer: LayerPatterns) -> None:
        gold = self._gold
        pattern = self._view.maps(layer)
        words = word_attention(pattern.detach(), gold["word_ids"], gold["width"])
        by_word = predicted_words(words, gold["present"], causal=self.causal).transpose(1, 2)  # [batch, word, head]
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
        gold = self._gold  # on the pass's device, where the state is
        self.arcs += gold["arcs"].to(self.arcs.device)
        self.offsets += gold["offsets"].to(self.offsets.device)
        self.dropped += gold["dropped"].to(self.dropped.device)
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
        # the counts read once, as NumPy arrays (on whatever device the state is)
        every, arcs, shifted = (value.cpu().numpy() for value in (self.correct, self.arcs, self.offsets))
        parts = [(ALL, every.sum(0), int(arcs.sum()), shifted.sum(0))]
        parts += [(relation, every[r], int(arcs[r]), shifted[r]) for r, relation in enumerate(self.relations)]
        records = []
        for relation, correct, count, offsets in parts:
            if count == 0:
                continue
            for direction, name in enumerate(DIRECTIONS):
                best = int(correct[direction].argmax())  # flat over [layer, head]: the first best
                accuracy = int(correct[direction].reshape(-1)[best]) / count
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
        encoded, _ = word_ids_of(
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

    ``conllu``: a CoNLL-U treebank, a path or its text
    (:func:`attnlens.methods.conllu.read_conllu`: FORM, HEAD and
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
    (a blank word) likewise in ``attrs["blank"]``. ``layout``: default ``"padded"``,
    the model's ordinary input, as Clark et al. ran BERT (or the constants':
    :func:`attnlens.methods.view_setup.setup`).

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
        kept, int(model.cfg.n_layers), int(model.cfg.n_heads), view=chosen.view, causal=is_causal(model)
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
