"""Per-head attention statistics (Clark et al. 2019), streamed over a corpus.

For every valid query token of every example, a head's attention row is summarised by:

- ``to_cls``, ``to_sep``, ``to_punct``: attention mass on the start token, on separator tokens,
  and on punctuation tokens (tokens made only of punctuation characters);
- ``to_self``: attention on the query's own position (offset 0);
- ``to_prev`` / ``to_next``: attention on the position at offset -1 / +1 (0 for the first /
  last position, where that neighbour does not exist or is padding);
- ``entropy``: Shannon entropy in nats of the row over the valid keys. Signed attention
  (effective attention can be negative) is made a distribution by ``|a| / sum |a|`` first.
- ``sink``: 1 when the row gives its example's first real token more than
  :data:`SINK_THRESHOLD` (0.3) of its mass, else 0; its mean is the share of the valid query
  rows that sink into the first token. The threshold ε = 0.3 is Gu et al.'s (2024, "When
  Attention Sink Emerges in Language Models: An Empirical View", arXiv:2410.10781), who apply it
  to a head's attention to the first token averaged over queries; here it is applied per row.

Each statistic is the mean over all valid query tokens seen, per (layer, head): every token
weighs the same, so a long text counts for more than a short one. Clark et al.'s notebooks
average each text's token mean, then the texts (a short text weighs as much as a long one), and
smooth the rows before the entropy (``0.9999·a + 0.0001/n``); their punctuation is only "." and
","; on 13 SST-2 sentences, averaging per text instead moves MiniLM's ``to_cls`` by up to
0.07 and its entropy by up to 0.25 nats, Clark et al.'s punctuation its ``to_punct`` by up to
0.06.
"""

from __future__ import annotations

import string
import unicodedata
import weakref
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from attnlens.core import devices
from attnlens.core.heads import checked_sizes
from attnlens.core.plots import head_grid
from attnlens.core.result import Result, frame
from attnlens.engine.accumulator import Accumulator, add_at
from attnlens.errors import InputError
from attnlens.methods import views

STATISTICS: tuple[str, ...] = (
    "to_cls",
    "to_sep",
    "to_punct",
    "to_self",
    "to_prev",
    "to_next",
    "entropy",
    "sink",
)
#: offset of the key from the query for each positional statistic
OFFSETS: dict[str, int] = {"to_self": 0, "to_prev": -1, "to_next": +1}
#: ``sink``: a row gives the first token more than this share of its mass (Gu et al. 2024's ε)
SINK_THRESHOLD = 0.3

#: dtype of one batch's sums (see :class:`AttentionStatistics`)
BATCH_DTYPE = torch.float32
#: dtype of the running totals over a corpus (float32 on devices without float64: Apple's MPS)
TOTAL_DTYPE = torch.float64

#: one table per tokenizer, dropped with it (an ``id()`` key could be reused by a new tokenizer)
_PUNCT_TABLES: weakref.WeakKeyDictionary[Any, dict[torch.device, Tensor]] = weakref.WeakKeyDictionary()


def _punctuation_flags(texts: Sequence[str]) -> list[bool]:
    """For each text: is it made only of punctuation characters (ASCII punctuation or Unicode
    category P*), once the WordPiece (``##``) or SentencePiece (``▁``) prefix is removed?

    One call, and no function called per text, for a whole vocabulary: the test suite's
    run-time type checks (an import hook that decorates every function, nested ones included)
    would otherwise run 30,000 times per tokenizer."""
    flags = []
    for text in texts:
        text = text.strip().removeprefix("##").removeprefix("▁")
        flags.append(bool(text) and all(
            ch in string.punctuation or unicodedata.category(ch).startswith("P") for ch in text
        ))
    return flags


def token_texts(tokenizer: Any, tokens: Sequence[str | None]) -> list[str]:
    """The text each vocabulary entry stands for: byte-level BPE entries (RoBERTa, GPT-2:
    ``'ĠâĢĶ'`` is ``' —'``, a lone piece of a character ``'�'``) decoded, as TransformerLens'
    ``to_str_tokens`` shows them; WordPiece entries as they are (``'##s'``); ``None`` (an id the
    tokenizer has no entry for) as ``''``. No function is called per entry (see
    :func:`_punctuation_flags`)."""
    texts = []
    for token in tokens:
        if token is None:
            texts.append("")
            continue
        try:
            texts.append(tokenizer.convert_tokens_to_string([token]))
        except Exception:  # a tokenizer that cannot decode a lone entry: its raw form
            texts.append(token.replace("Ġ", " "))
    return texts


def punctuation_table(tokenizer: Any, device: str | torch.device = "cpu") -> Bool[Tensor, "vocab"]:
    """Boolean over the vocabulary: is token id ``i`` a punctuation-only token? Cached, on each
    ``device`` it is asked for (a copy to a GPU per batch would make the host wait)."""
    if tokenizer not in _PUNCT_TABLES:
        texts = token_texts(tokenizer, tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))))
        special = set(tokenizer.all_special_ids)
        flags = _punctuation_flags(texts)
        _PUNCT_TABLES[tokenizer] = {torch.device("cpu"): torch.tensor(
            [flag and i not in special for i, flag in enumerate(flags)], dtype=torch.bool
        )}
    tables = _PUNCT_TABLES[tokenizer]
    device = torch.device(device)
    if device not in tables:
        tables[device] = tables[torch.device("cpu")].to(device)
    return tables[device]


def token_classes(
    tokenizer: Any, input_ids: Int[Tensor, "batch pos"], valid: Bool[Tensor, "batch pos"] | None = None
) -> dict[str, Bool[Tensor, "batch pos"]]:
    """Masks of the start ([CLS] / <s>), separator ([SEP] / </s>) and punctuation positions.

    A tokenizer without [CLS]/[SEP] (a decoder: GPT-2, the Llama family) has bos and eos
    instead: only the first bos among each example's real tokens (``valid``; by default position
    0) is the start, and any later one is a separator (:func:`later_starts`): the boundary of a
    sentence pair, which a decoder's tokenizer formats as ``<bos> A <bos> B``, as [SEP] is an
    encoder's; and GPT-2's ``<|endoftext|>``, its bos and its eos in one, away from position 0.
    A decoder whose tokenizer adds no start token (Qwen2's) has no start position: its
    ``to_cls`` is 0, and the attention sink on its first token is measured by the ``sink``
    statistic instead.
    """
    start = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    sep = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    table = punctuation_table(tokenizer, input_ids.device)
    clipped = input_ids.clamp(max=table.shape[0] - 1)
    none = torch.zeros_like(input_ids, dtype=torch.bool)
    cls = input_ids == start if start is not None else none
    later = none
    if start is not None and (tokenizer.cls_token_id is None or start == sep):
        cls, later = later_starts(cls, valid)
    return {
        "cls": cls,
        "sep": ((input_ids == sep) | later) & ~cls if sep is not None else later,
        "punct": table[clipped],
    }


def later_starts(
    start: Bool[Tensor, "batch pos"], valid: Bool[Tensor, "batch pos"] | None = None
) -> tuple[Bool[Tensor, "batch pos"], Bool[Tensor, "batch pos"]]:
    """``(first, later)``: the start tokens (``start``) that are each example's first real token
    (``valid``; by default position 0), and the others, which a decoder's start token is only
    as the boundary of a sentence pair (its second sentence's start token) or as GPT-2's shared
    bos/eos: :func:`token_classes` counts them as separators, and
    :meth:`attnlens.methods.patterns.Positions.from_tokens` alike."""
    if valid is None:
        valid = torch.ones_like(start)
    first = start & valid & (valid.long().cumsum(-1) == 1)
    return first, start & ~first


#: the statistics that sum a row's attention over a set of keys, in :data:`STATISTICS`' order:
#: a token class's keys (``to_cls``, ``to_sep``, ``to_punct``: the keys of :func:`token_classes`)
#: or the key at an offset of :data:`OFFSETS`
LINEAR: tuple[str, ...] = ("to_cls", "to_sep", "to_punct", "to_self", "to_prev", "to_next")


def statistic_terms(
    classes: dict[str, Bool[Tensor, "batch key"]],
    valid: Bool[Tensor, "batch pos"],
    positions: Int[Tensor, "batch pos"] | None = None,
) -> dict[str, Any]:
    """What :func:`statistic_sums` reads of a batch's tokens alone (made once per batch; in a
    pass on the host's copy of its tokens, :func:`batch_statistic_terms`):

    - ``weights``: ``[batch, query · key, statistic]`` (bool), for each of :data:`LINEAR`
      whether key ``k`` counts for query ``q``: both valid, and ``k`` of the class
      (``classes["cls"]``, ``["sep"]``, ``["punct"]``), or at the statistic's offset from ``q``
      (counted in layout positions in a compact batch, ``positions``, so that it gives what its
      padded layout gives: where neighbouring columns are not neighbouring positions, e.g. the
      last word and the final [SEP] of the PAPA layout, the neighbour is padding there);
    - ``keys``: ``[batch, 1, 1, key]``, the valid keys; ``rows``: ``[batch, 1, query, 1]``, the
      valid queries (floats); ``first``: ``[batch, 1, 1, 1]``, the column of each example's first
      real token, and ``column``, that column when every example has the same one (found where
      reading it costs nothing: on the host) else ``None``."""
    n_batch, n = valid.shape
    both = valid[:, :, None] & valid[:, None, :]  # [batch, query, key]
    columns = [both & classes[name.removeprefix("to_")][:, None, :] for name in LINEAR[:3]]
    layout = positions if positions is not None else torch.arange(n, device=valid.device).expand(n_batch, n)
    offsets = layout[:, None, :] - layout[:, :, None]  # [batch, query, key]: the key's position minus the query's
    columns += [both & (offsets == OFFSETS[name]) for name in LINEAR[3:]]
    first = (valid.long().cumsum(-1) == 0).sum(-1).clamp_max(n - 1)  # the column of each example's first real token
    same = devices.reads_are_free(first) and bool((first == first[0]).all())  # read on the host only
    return {
        "column": int(first[0]) if same else None,
        "weights": torch.stack(columns, dim=-1).reshape(n_batch, n * n, len(LINEAR)),
        "keys": valid[:, None, None, :].to(BATCH_DTYPE), "rows": valid[:, None, :, None].to(BATCH_DTYPE),
        "first": first[:, None, None, None],
    }


def statistic_sums(
    pattern: Float[Tensor, "*stack batch head query key"], terms: dict[str, Any],
) -> Float[Tensor, "*stack head statistic"]:
    """Each statistic of :data:`STATISTICS` summed over the batch's valid query rows, per head;
    ``stack``: any leading axes of maps of the same examples (the layers and views of a batch,
    in one call, each map on its own); ``terms``: :func:`statistic_terms` of the batch.

    The six of :data:`LINEAR` in one contraction: ``Σ_{b,q,k} a_bqk · w_bqk`` (a batched matrix
    product of every example's ``query · key`` entries with its ``weights``); the entropy of
    each valid row, with ``w = |a|`` over the valid keys and ``S = Σ w``, is
    ``H = log S − (Σ w log w) / S`` (0 if ``S = 0``: ``-Σ p log p`` of ``p = w / S``); the sink
    is 1 where a row's attention on its example's first real token (one gathered column)
    exceeds :data:`SINK_THRESHOLD`. All in float32 (:data:`BATCH_DTYPE`)."""
    pattern = pattern.to(BATCH_DTYPE)
    *stack, n_batch, n_heads, n, _ = pattern.shape
    weights = terms["weights"].to(BATCH_DTYPE)
    linear = torch.matmul(pattern.reshape(*stack, n_batch, n_heads, n * n), weights).sum(-3)  # [*stack, head, linear]
    magnitude = (pattern * terms["keys"]).abs()
    total = magnitude.sum(-1)
    tiny = torch.finfo(BATCH_DTYPE).tiny  # 0 · log(tiny) = 0, as 0 · log 0 is taken to be
    w_log_w = magnitude.clamp_min(tiny).log_().mul_(magnitude).sum(-1)  # (xlogy: 3x slower on a CPU)
    safe = total.clamp_min(tiny)
    entropy = (safe.log() - w_log_w / safe) * (total > 0)
    if terms["column"] is not None:  # every example's first real token in the same column: a view
        to_first = pattern[..., terms["column"]]
    else:
        to_first = pattern.gather(-1, terms["first"].expand(*stack, n_batch, n_heads, n, 1)).squeeze(-1)
    sink = to_first > SINK_THRESHOLD  # [*stack, batch, head, query]
    rows = (torch.stack([entropy, sink.to(BATCH_DTYPE)], dim=-1) * terms["rows"]).sum(dim=(-4, -2))
    return torch.cat([linear, rows], dim=-1)


class AttentionStatistics(Result):
    """Streaming means of :data:`STATISTICS` per (layer, head); holds no attention maps.

    Call :meth:`update` with each layer's pattern for a batch, then read :meth:`means`, or
    :attr:`table` and :meth:`figure` (a :class:`~attnlens.core.result.Result`; :meth:`to_json`
    keeps the running totals, so :meth:`from_json` can go on updating).

    Precision: a batch's rows are summed in float32 (:data:`BATCH_DTYPE`, on the pattern's
    device, with no copy to the CPU), and those per-batch sums are added into float64 running
    totals (:data:`TOTAL_DTYPE`, ``[layer, head]``, on the same device), so the error does not
    grow with the corpus: only with the ``n`` terms of one batch sum (``query · key + batch``
    for the statistics of :data:`LINEAR`, ``key + batch · query`` for entropy and sink,
    :func:`statistic_sums`), at most ``n · 2⁻²⁴`` relative (about ``√n · 2⁻²⁴`` typically;
    ``tests/unit/test_stats.py`` derives the test's tolerance from it). The totals move to the pattern's device on the first update.
    """

    COLUMNS: ClassVar[dict[str, str]] = {
        "statistic": "a name of STATISTICS (to_cls, to_sep, to_punct, to_self, to_prev, to_next, entropy)",
        "layer": "layer index, from 0",
        "head": "head index within the layer, from 0",
        "value": "the statistic's mean over every valid query token seen",
        "n_tokens": "valid query tokens seen in the layer (the mean's count)",
    }
    FORMAT: ClassVar[str] = "attnlens.AttentionStatistics/1"

    def __init__(self, n_layers: int, n_heads: int) -> None:
        self.n_layers, self.n_heads = n_layers, n_heads = checked_sizes(n_layers, n_heads)
        #: ``[statistic, layer, head]``: the running sums of :data:`STATISTICS`, in one tensor so
        #: that a batch adds all of them at once (:attr:`sums` names them)
        self.totals = torch.zeros(len(STATISTICS), n_layers, n_heads, dtype=TOTAL_DTYPE)
        self.counts = torch.zeros(n_layers, dtype=TOTAL_DTYPE)

    @property
    def sums(self) -> dict[str, Float[Tensor, "layer head"]]:
        """The running sum of each statistic, ``[layer, head]`` (views of :attr:`totals`)."""
        return {name: self.totals[index] for index, name in enumerate(STATISTICS)}

    def update(
        self,
        layer: int | Sequence[int],
        pattern: Float[Tensor, "*layer batch head query key"],
        classes: dict[str, Bool[Tensor, "batch key"]],
        valid: Bool[Tensor, "batch pos"],
        positions: Int[Tensor, "batch pos"] | None = None,
    ) -> None:
        """Add one layer's batch (``pattern`` ``[batch, head, query, key]``), or several layers'
        (``layer`` a sequence, ``pattern`` ``[layer, batch, head, query, key]``: each one's maps
        of the same batch)."""
        layers = [layer] if isinstance(layer, int) else list(layer)
        maps = pattern[None] if isinstance(layer, int) else pattern
        sums = statistic_sums(maps.detach(), statistic_terms(classes, valid, positions))  # [layer, head, statistic]
        self.add_sums(layers, sums.movedim(-1, 0), valid.sum())

    def add_sums(self, layers: Sequence[int], sums: Float[Tensor, "statistic layer head"],
                 count: Int[Tensor, ""] | Float[Tensor, ""]) -> None:
        """Add a batch's sums over its valid query rows, ``sums[:, i]`` those of layer
        ``layers[i]`` (statistics in :data:`STATISTICS`' order), and its ``count`` (a whole number, in any dtype) of valid
        query rows per head to each of those layers (several layers in one addition: what a
        pass that computes them together hands over)."""
        device = sums.device
        if self.counts.device != device:
            self.totals = self.totals.to(device, total_dtype(device))
            self.counts = self.counts.to(device, total_dtype(device))
        add_at(self.totals, 1, layers, sums)
        add_at(self.counts, 0, layers, count.expand(len(layers)))

    def means(self) -> dict[str, Float[Tensor, "layer head"]]:
        """Mean of each statistic over every valid query token seen, ``[layer, head]`` (float32,
        on the CPU)."""
        counts = self.counts.cpu()
        if not bool((counts > 0).all()):
            raise InputError("No tokens were seen for some layer; update() with at least one batch.")
        return {name: (total.cpu() / counts[:, None]).float() for name, total in self.sums.items()}

    @property
    def table(self) -> Any:
        """One row per statistic, layer and head: :attr:`COLUMNS` (the :meth:`means`)."""
        counts = [int(count) for count in self.counts.cpu().tolist()]
        return frame([
            {"statistic": name, "layer": layer, "head": head, "value": value, "n_tokens": counts[layer]}
            for name, means in self.means().items()
            for layer, row in enumerate(means.tolist()) for head, value in enumerate(row)
        ], self.COLUMNS)

    def figure(self, statistic: str = "to_cls") -> Any:
        """One statistic's ``[layer, head]`` grid (:func:`attnlens.core.plots.head_grid`)."""

        if statistic not in STATISTICS:
            raise InputError(f"unknown statistic {statistic!r}; use one of {', '.join(STATISTICS)}.")
        return head_grid(self.means()[statistic], name=statistic, title=f"{statistic} per head")

    def to_dict(self) -> dict[str, Any]:
        return {"n_layers": self.n_layers, "n_heads": self.n_heads,
                "sums": {name: total.cpu().double().tolist() for name, total in self.sums.items()},
                "counts": self.counts.cpu().double().tolist()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AttentionStatistics:
        made = cls(int(data["n_layers"]), int(data["n_heads"]))
        sums = {name: torch.tensor(data["sums"][name], dtype=TOTAL_DTYPE) for name in STATISTICS}
        counts = torch.tensor(data["counts"], dtype=TOTAL_DTYPE)
        if any(total.shape != made.sums[name].shape for name, total in sums.items()) or counts.shape != made.counts.shape:
            raise ValueError(f"sums must be [{made.n_layers}, {made.n_heads}] and counts [{made.n_layers}]")
        made.totals, made.counts = torch.stack([sums[name] for name in STATISTICS]), counts
        return made


def total_dtype(device: torch.device) -> torch.dtype:
    """The running totals' dtype on ``device``: :data:`TOTAL_DTYPE`, or float32 on Apple's MPS
    (no float64)."""
    return torch.float32 if device.type == "mps" else TOTAL_DTYPE


def batch_classes(batch: Any) -> dict[str, Bool[Tensor, "batch pos"]]:
    """:func:`token_classes` of a :class:`attnlens.engine.accumulator.PassBatch`, computed once per batch
    for every accumulator that asks (off the CPU on the host's copy of its tokens,
    :meth:`~attnlens.engine.accumulator.PassBatch.from_host`)."""
    tokenizer = batch.model.tokenizer
    return batch.from_host("token_classes", lambda inputs: token_classes(
        tokenizer, inputs.input_ids, inputs.attention_mask.bool()))


def batch_statistic_terms(batch: Any) -> dict[str, Any]:
    """:func:`statistic_terms` of a :class:`attnlens.engine.accumulator.PassBatch`, once per batch
    for every accumulator that asks (off the CPU on the host's copy of its tokens, moved in one
    copy, :meth:`~attnlens.engine.accumulator.PassBatch.from_host`)."""
    tokenizer = batch.model.tokenizer

    def made(inputs: Any) -> dict[str, Any]:
        valid = inputs.attention_mask.bool()
        return statistic_terms(token_classes(tokenizer, inputs.input_ids, valid), valid,
                               inputs.positions if inputs.compact else None)

    return batch.from_host("statistics.terms", made)


class Statistics(Accumulator):
    """:class:`AttentionStatistics` as an accumulator of :func:`attnlens.engine.passes.run`.

    ``view="standard"`` reads each layer's pattern, ``"effective"`` its effective attention
    (computed once per layer by the engine). ``result()`` is :meth:`AttentionStatistics.means`:
    ``{statistic: [layer, head]}``.
    """

    compact = True  # offsets read from the batch's positions (PassBatch.compact_positions), never its columns
    any_order = True  # sums over examples

    def __init__(self, n_layers: int, n_heads: int, view: str = "standard", *, constants: Any = None,
                 causal: bool | None = None) -> None:
        self.constants, self.causal = constants, causal
        self._view = views.get_view(view, among=None if constants is not None else views.names(constants=False))
        view = self.view = self._view.name
        self.name = f"statistics.{view}"
        self.needs_values = self._view.needs_values
        self.stacks = self._view.stacks  # a stack of layers in one call, off the CPU (Accumulator.stacks)
        self.statistics = AttentionStatistics(n_layers, n_heads)

    def update(self, layer: Any) -> None:
        layers = layer.layers or (layer.layer,)  # a stack of layers (LayerPatterns.stack): [layer · batch, ...]
        pattern = self._view.read(layer, self.constants, causal=self.causal).unflatten(0, (len(layers), -1))
        sums = statistic_sums(pattern.detach(), batch_statistic_terms(layer.batch))  # [layer, head, statistic]
        self.statistics.add_sums(layers, sums.movedim(-1, 0), layer.batch.key_mask.sum())

    def state_dict(self) -> dict[str, Tensor]:
        return {"sums": self.statistics.totals, "counts": self.statistics.counts}

    def settings(self) -> dict[str, Any]:
        return views.value_settings(self.constants)

    def result(self) -> dict[str, Float[Tensor, "layer head"]]:
        return self.statistics.means()


def total_variation(
    pattern: Float[Tensor, "*stack batch head query key"],
    standard: Float[Tensor, "*standard batch head query key"],
    valid: Bool[Tensor, "batch pos"],
) -> Float[Tensor, "*stack head"]:
    """Sum over valid query rows of ½·Σ_k |pattern − standard| over valid keys, per head: the
    ``distance_from_standard`` of :func:`attnlens.compare` (divided by the tokens seen).
    ``stack``: any leading axes (e.g. the layers of a batch, each ``[batch, head, query, key]``
    with the same ``valid`` tokens), each summed on its own; ``standard``'s leading axes
    broadcast against them (e.g. the layers, for a stack of views and layers).

    In float32 (the patterns' precision): a sum of ``n`` terms (``key``, then ``batch · query``)
    is within ``n · 2⁻²⁴`` of the exact one relatively (all terms are non-negative); the caller
    adds these batch sums into float64 totals, so the error does not grow with the corpus.
    """
    keys = valid[:, None, None, :].to(torch.float32)
    rows = ((pattern.float() - standard.float()).abs() * keys).sum(-1)
    return 0.5 * (rows * valid[:, None, :].to(torch.float32)).sum(dim=(-3, -1))


class Distance(Accumulator):
    """The summed :func:`total_variation` of ``view``'s maps from the standard pattern, per
    ``[layer, head]``, as an accumulator of :func:`attnlens.engine.passes.run` (``distance_from_standard``
    of :func:`attnlens.compare` is ``result() / n_tokens``). ``constants``/``causal``: as in
    :class:`Statistics` (PAPA maps from the constants, in the same pass). Totals stay beside the
    patterns (float64; float32 on MPS, which has no float64)."""

    compact = True  # a sum over valid (query, key) pairs; PAPA maps are gathered by position (View.read)
    any_order = True

    def __init__(self, n_layers: int, n_heads: int, view: str = "effective", *, constants: Any = None,
                 causal: bool | None = None) -> None:
        self.constants, self.causal = constants, causal
        self._view = views.get_view(view, among=None if constants is not None else views.names(constants=False))
        self.view = self._view.name
        self.name = f"distance.{self.view}"
        self.needs_values = self._view.needs_values
        self.stacks = self._view.stacks  # a stack of layers in one call, off the CPU (Accumulator.stacks)
        self.total = torch.zeros(n_layers, n_heads, dtype=torch.float64)

    def update(self, layer: Any) -> None:
        layers = layer.layers or (layer.layer,)
        pattern = self._view.read(layer, self.constants, causal=self.causal).float().unflatten(0, (len(layers), -1))
        standard = layer.pattern.float().unflatten(0, (len(layers), -1))
        self.add_totals(layers, total_variation(pattern, standard, layer.batch.key_mask))

    def add_totals(self, layers: Sequence[int], totals: Float[Tensor, "layer head"]) -> None:
        """Add ``totals[i]`` (:func:`total_variation` of a batch) to layer ``layers[i]``: several
        layers in one addition, as a pass that computes them together hands them over."""
        if self.total.device != totals.device:
            self.total = self.total.to(totals.device, total_dtype(totals.device))
        add_at(self.total, 0, layers, totals)

    def state_dict(self) -> dict[str, Tensor]:
        return {"total": self.total}

    def settings(self) -> dict[str, Any]:
        return views.value_settings(self.constants)

    def result(self) -> Float[Tensor, "layer head"]:
        return self.total.cpu().double()
