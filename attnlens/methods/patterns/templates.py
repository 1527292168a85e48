"""The template classifier of attention-map types (Kovaleva et al. 2019, §4.1, Fig. 1).

Kovaleva et al. sort BERT's self-attention maps into five types:

- **vertical**: most of every row on the same few columns, the special tokens ([CLS], [SEP]);
- **diagonal**: attention to the previous, the same or the next token;
- **vertical+diagonal**: both at once;
- **block**: for sentence pairs, each token attends within its own sentence;
- **heterogeneous**: anything else (input-dependent, no fixed template).

Their labels came from a CNN trained on about 400 maps they labelled by hand; those labels were
never published (:class:`attnlens.methods.patterns.PatternCNN` reproduces the CNN for maps you label,
:func:`attnlens.methods.patterns.export_for_labelling` writes maps to label). The default classifier here
is transparent instead: every row of a map is split into disjoint template regions of keys,

- ``special``: the special-token columns ([CLS]/[SEP], <s>/</s>, a decoder's BOS);
- ``diagonal``: the band of offsets −1, 0, +1 from the query, special columns excluded;
- ``block``: for a sentence pair, the rest of the query's own segment (neither special nor in the
  band); empty for a single sentence. Segments end at separators: an encoder's middle [SEP], a
  decoder pair's second start token (``<bos> A <bos> B``; :func:`attnlens.methods.stats.token_classes`);

and the map's share of attention in each region, averaged over its valid query rows, is
corrected for chance, the share uniform attention over the same visible keys would put there
(Cohen's κ form):

.. math:: \\hat s_R = \\frac{s_R - c_R}{1 - c_R},\\qquad
          s_R = \\frac{1}{|Q|}\\sum_{q\\in Q}\\sum_{k\\in R(q)} a_{qk},\\quad
          c_R = \\frac{1}{|Q|}\\sum_{q\\in Q}\\frac{|R(q)|}{n_q}

(``n_q``: the keys query ``q`` can see: the valid keys, those ``≤ q`` for a decoder). A uniform
map scores 0 in every region whatever its length, a map with all its mass in a region scores 1,
and a region that holds every visible key (``c_R = 1``, e.g. the specials of an empty text)
scores 0: nothing can be above chance there.
Signed maps (effective attention) are made distributions by ``|a| / Σ|a|`` per row first, as
:mod:`attnlens.methods.stats` does for entropy. The rules, in order (:data:`THRESHOLDS`):

1. **vertical+diagonal** if ``ŝ_special ≥ 0.2`` and ``ŝ_diagonal ≥ 0.2`` and their sum ``≥ 0.5``:
   both templates clearly present (0.2 each), and together they hold most of the mass
   above chance;
2. **vertical** if ``ŝ_special ≥ 0.5``; **diagonal** if ``ŝ_diagonal ≥ 0.5``: the region holds more
   than half of the mass above chance, more than all other keys together;
3. **block** if the example is a pair and ``ŝ_block ≥ 0.5``, for the same reason;
4. **heterogeneous** otherwise.

The regions are disjoint and the band is not part of ``block``, so on a short pair the band holds
much of each sentence: a map uniform within each sentence of a pair is *diagonal* with 3 words a
sentence, *heterogeneous* with 5, and *block* from about 8 words a sentence.

The scores of :class:`Classification` are these template features (``heterogeneous``: one minus
the largest of ``ŝ_special + ŝ_diagonal`` and ``ŝ_block``, clipped to [0, 1]); they are evidence
for each type, not probabilities.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from attnlens.core import devices, models
from attnlens.core.checks import describe, flag, whole_number
from attnlens.core.plots import CATEGORICAL_COLOURS
from attnlens.core.result import Result, frame
from attnlens.errors import InputError
from attnlens.methods import views
from attnlens.methods.patterns.maps_check import check_maps
from attnlens.methods.stats import batch_classes, later_starts, token_classes

#: Kovaleva et al.'s five types, in the order of :attr:`Classification.scores`' last axis
TYPES: tuple[str, ...] = ("vertical", "diagonal", "vertical+diagonal", "block", "heterogeneous")
#: the template regions of a row, in the order of :func:`features`' shares
REGIONS: tuple[str, ...] = ("special", "diagonal", "block")
#: the rules' thresholds on chance-corrected shares (see the module docstring for the reasons)
THRESHOLDS: dict[str, float] = {
    "both_each": 0.2,  # vertical+diagonal: each of the two at least this
    "both_sum": 0.5,  # vertical+diagonal: the two together at least this
    "single": 0.5,  # vertical, diagonal or block alone: more than half the mass above chance
}
#: offsets of the diagonal band
BAND: tuple[int, ...] = (-1, 0, 1)
#: token strings read as special by :meth:`Positions.from_tokens`
_SPECIAL = re.compile(r"^(\[[A-Z]+\]|</?s>|<\|[^|]*\|>|<bos>|<eos>)$")
_SEPARATORS = frozenset({"[SEP]", "</s>"})
#: token strings read as an example's start token by :meth:`Positions.from_tokens` when first
_STARTS = re.compile(r"^(\[CLS\]|<s>|<\|[^|]*\|>|<bos>)$")


@dataclass
class Positions:
    """What the classifier must know of each example's positions.

    ``key_mask``: ``[batch, key]``, True for real tokens; ``special``: ``[batch, key]``, True for
    special tokens ([CLS]/[SEP], <s>/</s>, BOS); ``segment``: ``[batch, key]``, the segment of
    each position (the number of separators before it, so a pair's second sentence has another
    segment than its first: after an encoder's middle [SEP], or after a decoder pair's second
    start token, ``<bos> A <bos> B``, a separator of :func:`attnlens.methods.stats.token_classes`);
    ``causal``: a decoder's map (query ``q`` sees keys ``≤ q``).
    """

    key_mask: Bool[Tensor, "batch key"]
    special: Bool[Tensor, "batch key"]
    segment: Int[Tensor, "batch key"]
    causal: bool = False
    _terms: dict = field(default_factory=dict, repr=False, compare=False)
    #: ``[batch, key]``: the layout position of every column of a compact batch
    #: (:attr:`attnlens.core.inputs.Batch.positions`); ``None``: the columns are the positions. The
    #: diagonal band is ``|position(key) − position(query)| ≤ 1``, so a compact batch is
    #: classified as its padded layout is.
    position: Int[Tensor, "batch key"] | None = None

    @classmethod
    def from_tokens(cls, tokens: Sequence[str] | Sequence[Sequence[str]], *, causal: bool = False,
                    length: int | None = None) -> Positions:
        """From token strings, one list per example (or one list for one example). Special:
        ``[CLS]``-like (``[A-Z]+`` in brackets), ``<s>``, ``</s>``, ``<|...|>``, ``<bos>``,
        ``<eos>``; separators: ``[SEP]``, ``</s>`` and, as in :func:`attnlens.methods.stats.token_classes`,
        a later occurrence of the example's start token (its first token, when ``[CLS]``, ``<s>``,
        ``<|...|>`` or ``<bos>``): a decoder pair's second start token (``<bos> A <bos> B``).
        Examples shorter than ``length`` (default: the longest) are padded."""
        if isinstance(tokens, str) or not isinstance(tokens, Sequence) or not tokens:
            raise InputError(
                f"tokens must be a list of token strings (one example) or a list of such lists, "
                f"got {describe(tokens)}."
            )
        causal = flag(causal, "causal (whether the maps are a decoder's)")
        examples = [tokens] if isinstance(tokens[0], str) else list(tokens)
        for i, example in enumerate(examples):
            if isinstance(example, str) or not all(isinstance(t, str) for t in example):
                raise InputError(f"tokens[{i}] must be a list of token strings, got {describe(example)}.")
        width = max(len(e) for e in examples) if length is None else whole_number(length, "length", " of positions", minimum=1)
        mask = torch.zeros(len(examples), width, dtype=torch.bool)
        special = torch.zeros_like(mask)
        separator = torch.zeros_like(mask)
        start = torch.zeros_like(mask)
        for i, example in enumerate(examples):
            if len(example) > width:
                raise InputError(f"example {i} has {len(example)} tokens, more than the map's {width} positions.")
            mask[i, : len(example)] = True
            special[i, : len(example)] = torch.tensor([bool(_SPECIAL.match(t)) for t in example])
            separator[i, : len(example)] = torch.tensor([t in _SEPARATORS for t in example])
            if example and _STARTS.match(example[0]):
                start[i, : len(example)] = torch.tensor([t == example[0] for t in example])
        _, later = later_starts(start, mask)  # a decoder pair's second start token
        return cls(mask, special, _segments(separator | later), causal)

    @classmethod
    def from_batch(cls, batch: Any, tokenizer: Any = None, *, causal: bool | None = None) -> Positions:
        """From a :class:`attnlens.core.inputs.Batch` and its tokenizer, or a
        :class:`attnlens.engine.accumulator.PassBatch` (which knows its model). Special: the start and
        separator tokens of :func:`attnlens.methods.stats.token_classes`, whose separators (a
        decoder pair's second start token among them) end the segments."""
        if causal is not None:
            flag(causal, "causal (whether the maps are a decoder's; None: from the model)")
        model = getattr(batch, "model", None)
        inputs = getattr(batch, "batch", batch)
        if tokenizer is None:
            tokenizer = getattr(model, "tokenizer", None)
        if tokenizer is None or not hasattr(inputs, "input_ids"):
            raise InputError(
                "classify(batch=...) needs an attnlens Batch with its tokenizer (tokenizer=...) "
                "or a PassBatch; or give tokens= (the token strings) instead."
            )
        key_mask = inputs.attention_mask.bool()
        if hasattr(batch, "shared"):
            classes = batch_classes(batch)
        else:
            classes = token_classes(tokenizer, inputs.input_ids, key_mask)
        if causal is None:
            causal = _causal(model)
        special = (classes["cls"] | classes["sep"]) & key_mask
        position = inputs.positions if getattr(inputs, "compact", False) else None
        return cls(key_mask, special, _segments(classes["sep"] & key_mask), bool(causal), position=position)


def batch_positions(batch: Any) -> Positions:
    """:meth:`Positions.from_batch` of a pass's batch (a
    :class:`attnlens.engine.accumulator.PassBatch`), computed once per batch; off the CPU on the
    host's copy of its tokens, with every term the template rules read of them
    (:func:`with_terms`), moved to the device in one copy
    (:meth:`~attnlens.engine.accumulator.PassBatch.from_host`)."""
    if devices.reads_are_free(batch.key_mask) or batch.on_host is None:
        return batch.shared("patterns.positions", lambda: Positions.from_batch(batch))
    tokenizer, causal = batch.model.tokenizer, _causal(batch.model)
    return batch.from_host("patterns.positions", lambda inputs: with_terms(
        Positions.from_batch(inputs, tokenizer, causal=causal)))


def with_terms(positions: Positions) -> Positions:
    """``positions`` with what :func:`features` reads of them made now (:func:`_terms`, and
    their float32 casts, :func:`_cast_terms`), in its ``_terms``: made on the host, they move to
    a device with the positions."""
    _cast_terms(_terms(positions), torch.float32)
    return positions


def _causal(model: Any) -> bool:
    if model is None:
        return False

    architecture = models.find(model)
    return bool(architecture.causal) if architecture is not None else False


def _segments(separator: Bool[Tensor, "batch key"]) -> Int[Tensor, "batch key"]:
    """Separators strictly before each position: a separator closes its own segment."""
    before = separator.long().cumsum(-1) - separator.long()
    return before


@dataclass
class Classification(Result):
    """Labels and template scores of maps (:func:`classify`).

    ``labels``: ``[batch, head]``, indices into :data:`TYPES`; ``scores``: ``[batch, head, type]``,
    the template features behind each type (see the module docstring); ``features``: the
    chance-corrected shares ``ŝ`` of each region of :data:`REGIONS` and the mean normalised
    entropy of the rows (``entropy``, in [0, 1]), each ``[batch, head]``; ``pairs``: ``[batch]``,
    whether the example is a sentence pair (block is possible).

    A :class:`~attnlens.core.result.Result`: :attr:`table` (a property; calling it as the method
    it was, ``table()``, still works and warns), :meth:`figure` (each head's share of each
    type), :meth:`to_json` / :meth:`from_json`."""

    COLUMNS: ClassVar[dict[str, str]] = {
        "example": "the map's example (first axis of the maps), from 0",
        "head": "the map's head (second axis), from 0",
        "type": "the map's type, one of TYPES",
        **{f"score_{name}": f"the template score behind {name}" for name in TYPES},
        "special": "chance-corrected share of attention on special tokens",
        "diagonal": "chance-corrected share of attention on the diagonal band (offsets -1, 0, 1)",
        "block": "chance-corrected share of attention on the query's own segment (pairs; 0 otherwise)",
        "entropy": "mean normalised entropy of the rows, in [0, 1] (NaN where not computed)",
    }
    FORMAT: ClassVar[str] = "attnlens.Classification/1"

    labels: Int[Tensor, "batch head"]
    scores: Float[Tensor, "batch head type"]
    features: dict[str, Float[Tensor, "batch head"]]
    pairs: Bool[Tensor, "batch"]

    @property
    def names(self) -> np.ndarray:
        """``[batch, head]`` array of type names."""
        return np.asarray(TYPES, dtype=object)[self.labels.cpu().numpy()]

    @property
    def table(self) -> Any:
        """One row per (example, head): :attr:`COLUMNS` (``example``, ``head``, ``type``, a score
        per type and the features)."""
        n_examples, n_heads = self.labels.shape
        example, head = np.divmod(np.arange(n_examples * n_heads), n_heads)
        columns: dict[str, Any] = {"example": example, "head": head, "type": self.names.reshape(-1)}
        for i, name in enumerate(TYPES):
            columns[f"score_{name}"] = self.scores[..., i].reshape(-1).cpu().numpy()
        for name, value in self.features.items():
            columns[name] = value.reshape(-1).cpu().numpy()
        return frame(columns, self.COLUMNS)

    def figure(self) -> Any:
        """Each head's share of maps of each type, as stacked bars (one colour per type)."""
        import plotly.graph_objects as go


        n_heads = self.labels.shape[1]
        counts = torch.nn.functional.one_hot(self.labels.cpu().long(), len(TYPES)).sum(0).double()
        shares = (counts / max(1, self.labels.shape[0])).numpy()
        fig = go.Figure([
            go.Bar(x=[f"H{head}" for head in range(n_heads)], y=shares[:, i], name=name,
                   marker_color=CATEGORICAL_COLOURS[i % len(CATEGORICAL_COLOURS)],
                   hovertemplate=f"%{{x}}: {name} %{{y:.2f}}<extra></extra>")
            for i, name in enumerate(TYPES)
        ])
        fig.update_layout(barmode="stack", title=f"Pattern types of {self.labels.shape[0]} maps per head",
                          xaxis_title="head", yaxis_title="share of maps", height=380, plot_bgcolor="white")
        return fig

    def to_dict(self) -> dict[str, Any]:
        return {"labels": self.labels.cpu().tolist(), "scores": self.scores.cpu().double().tolist(),
                "dtype": str(self.scores.dtype).removeprefix("torch."),
                "features": {name: value.cpu().double().tolist() for name, value in self.features.items()},
                "pairs": self.pairs.cpu().tolist()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Classification:
        dtype = {"float32": torch.float32, "float64": torch.float64}[data.get("dtype", "float32")]
        labels = torch.tensor(data["labels"], dtype=torch.long).reshape(len(data["labels"]), -1)
        scores = torch.tensor(data["scores"], dtype=torch.float64).to(dtype).reshape(*labels.shape, len(TYPES))
        features = {name: torch.tensor(value, dtype=torch.float64).to(dtype).reshape(labels.shape)
                    for name, value in data["features"].items()}
        if bool(((labels < 0) | (labels >= len(TYPES))).any()):
            raise ValueError(f"labels must be indices into the {len(TYPES)} TYPES")
        return cls(labels, scores, features, torch.tensor(data["pairs"], dtype=torch.bool).reshape(len(labels)))

    def __repr__(self) -> str:
        counts = np.bincount(self.labels.reshape(-1).cpu().numpy(), minlength=len(TYPES))
        shares = ", ".join(f"{name} {count}" for name, count in zip(TYPES, counts, strict=True) if count)
        return f"Classification({tuple(self.labels.shape)} maps: {shares})"


def _as_4d(pattern: Any) -> Tensor:
    if not isinstance(pattern, Tensor):
        try:
            pattern = torch.as_tensor(np.asarray(pattern))
        except (TypeError, ValueError) as error:
            raise InputError(f"pattern must be a tensor or an array, got {describe(pattern)}.") from error
    if pattern.ndim not in (2, 3, 4) or pattern.shape[-1] != pattern.shape[-2]:
        raise InputError(
            f"pattern must be [query, key], [head, query, key] or [batch, head, query, key] with "
            f"as many keys as queries, got shape {tuple(pattern.shape)}."
        )
    if not pattern.is_floating_point():
        raise InputError(f"pattern must hold floats (attention weights), got {pattern.dtype}.")
    while pattern.ndim < 4:
        pattern = pattern.unsqueeze(0)
    return pattern


def visible_keys(positions: Positions) -> Bool[Tensor, "batch query key"]:
    """Which keys each query can see: valid keys (and ``k ≤ q`` for a decoder), for valid
    queries; all False for padded queries."""
    mask = positions.key_mask
    visible = mask[:, None, :] & mask[:, :, None]
    if positions.causal:
        n = mask.shape[-1]
        visible = visible & torch.ones(n, n, dtype=torch.bool, device=mask.device).tril()
    return visible


def regions(positions: Positions) -> dict[str, Bool[Tensor, "batch query key"]]:
    """The disjoint template regions of :data:`REGIONS` for every (example, query, key), within
    the visible keys (:func:`visible_keys`)."""
    visible = visible_keys(positions)
    n = visible.shape[-1]
    index = torch.arange(n, device=visible.device)
    offset = index[None, :] - index[:, None]  # [query, key]: key - query
    if positions.position is not None:  # a compact batch: offsets between layout positions
        offset = positions.position[:, None, :] - positions.position[:, :, None]
    band = torch.zeros(offset.shape, dtype=torch.bool, device=visible.device)
    for step in BAND:
        band |= offset == step
    special = visible & positions.special[:, None, :]
    diagonal = visible & (band if band.dim() == 3 else band[None]) & ~special
    same = positions.segment[:, :, None] == positions.segment[:, None, :]
    block = visible & same & ~special & ~diagonal & is_pair(positions)[:, None, None]
    return {"special": special, "diagonal": diagonal, "block": block}


def is_pair(positions: Positions) -> Bool[Tensor, "batch"]:
    """Examples whose non-special tokens lie in two segments or more (sentence pairs)."""
    words = positions.key_mask & ~positions.special
    segment = positions.segment.masked_fill(~words, -1)
    first = segment.masked_fill(~words, torch.iinfo(segment.dtype).max).min(-1).values
    return (segment > first[:, None]).any(-1)


def _terms(positions: Positions) -> dict[str, Any]:
    """What :func:`features` needs of the positions alone, computed once per :class:`Positions`
    (a pass shares one per batch across layers and views): the keys each query cannot see
    (``hidden``, ``[batch, 1, query, key]``), each example's
    template regions (:func:`regions`, ``[batch, query, key, region]``), and each region's chance
    share."""
    if positions._terms:
        return positions._terms
    mask = positions.key_mask
    visible = visible_keys(positions)
    query = mask.double()
    n_queries = query.sum(-1).clamp_min(1.0)
    seen = visible.sum(-1).clamp_min(1).double()
    found = regions(positions)
    chance = torch.stack([(found[name].sum(-1) / seen * query).sum(-1) / n_queries for name in REGIONS],
                         dim=-1)  # [batch, region]
    positions._terms.update(
        regions=torch.stack([found[name] for name in REGIONS], dim=-1), chance=chance, pairs=is_pair(positions),
        hidden=~visible[:, None], seen=seen, key_mask=mask,
    )
    return positions._terms


def _shares(
    pattern: Float[Tensor, "*stack batch head query key"], positions: Positions, *, signed: bool = False,
) -> tuple[Float[Tensor, "*stack batch head region"], Float[Tensor, "*stack batch head query key"]]:
    """The chance-corrected shares ``ŝ_R`` of :func:`features`, the regions of :data:`REGIONS` on
    the last axis, and the rows they were read from (``|a| / Σ|a|`` when ``signed``).

    One contraction of the maps: ``s_R = Σ_{q,k} a_qk · w_qkR``, with ``w_qkR = [k ∈ R(q)] /
    |Q|`` for the valid queries (0 for the others), a batched matrix product over the examples
    of the maps' ``query · key`` entries with the regions' weights (:func:`_cast_terms`)."""
    terms = _terms(positions)
    rows = pattern.to(torch.promote_types(pattern.dtype, torch.float32))
    if signed:
        rows = rows.masked_fill(terms["hidden"], 0.0).abs()
        rows = rows / rows.sum(-1, keepdim=True).clamp_min(torch.finfo(rows.dtype).tiny)
    *stack, n_batch, n_heads, n, _ = rows.shape
    cast = _cast_terms(terms, rows.dtype)
    means = torch.matmul(rows.reshape(*stack, n_batch, n_heads, n * n), cast["weights"])  # [*stack, batch, head, region]
    chance, above = cast["chance"]
    return (means - chance) / above, rows


def features(
    pattern: Float[Tensor, "*stack batch head query key"],
    positions: Positions,
    *,
    signed: bool = False,
    entropy: bool = True,
) -> dict[str, Float[Tensor, "*stack batch head"]]:
    """Chance-corrected shares ``ŝ_R`` of each region of :data:`REGIONS` (module docstring) and
    (``entropy``) the mean normalised entropy of the rows that see more than one key (the entropy
    over ``log n_q``; a decoder's first row, which sees one, has none), per (example, head); axes: examples,
    heads, and ``stack``, any leading axes of maps of the same examples (e.g. the layers and
    views of one batch, classified in one call, each map on its own). ``signed``: rows are
    ``|a| / Σ|a|`` over the visible keys first (effective attention); else they are used as
    they are (keys a query cannot see must hold 0, as a masked softmax gives).

    One read of the maps for the three shares (:func:`_shares`)."""
    shares, rows = _shares(pattern, positions, signed=signed)
    out = dict(zip(REGIONS, shares.unbind(-1), strict=True))
    if not entropy:
        return out
    cast = _cast_terms(_terms(positions), rows.dtype)
    probs = rows.masked_fill(positions._terms["hidden"], 0.0).clamp_min(0)
    row_entropy = -(probs * probs.clamp_min(1e-30).log()).sum(-1)  # [*stack, batch, head, query]
    out["entropy"] = (row_entropy / cast["most"]).mul(cast["entropy_weights"]).sum(-1)
    return out


def _cast_terms(terms: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """:func:`_terms`' masks and counts in the maps' ``dtype``, shaped as :func:`features` reads
    them, made once per :class:`Positions` and dtype (the same values :func:`features` would
    convert at every call: on a device, each conversion is a kernel of every layer and view).
    ``weights``: ``[batch, query · key, region]``, ``[k ∈ R(q)] / |Q|`` for the valid queries."""
    key = ("cast", dtype)
    if key not in terms:
        seen = terms["seen"].to(dtype)
        query = terms["key_mask"].to(dtype)[:, None]  # [batch, 1, query]
        n_queries = query.sum(-1).clamp_min(1.0)  # [batch, 1]
        found = terms["regions"]  # [batch, query, key, region]
        n_batch, n = found.shape[:2]
        weights = found.to(dtype) * (query / n_queries[..., None]).reshape(n_batch, n, 1, 1)
        chance = terms["chance"].to(dtype)[:, None]  # [batch, 1, region]
        entropy_rows = query * (seen[:, None] > 1).to(dtype)  # [batch, 1, query]
        t, device = THRESHOLDS, found.device
        thresholds = torch.tensor([t["single"]] * 3 + [t["both_each"]] * 2 + [t["both_sum"]], dtype=dtype, device=device)
        thresholds = thresholds.repeat(n_batch, 1)  # the block test, for a pair only:
        thresholds[:, 2].masked_fill_(~terms["pairs"], torch.inf)
        terms[key] = {
            "thresholds": thresholds[:, None], "bits": 2 ** torch.arange(6, device=device),
            "rules": torch.tensor(_rule_table(), device=device),
            "weights": weights.reshape(n_batch, n * n, len(REGIONS)),
            # a region of every visible key (chance 1) leaves nothing above chance: its ŝ is 0
            "chance": (chance, torch.where(1.0 - chance > 1e-6, 1.0 - chance, torch.inf)),
            # the rows whose entropy is normalised: those that see more than one key (a
            # decoder's first row sees one, whose normalised entropy is 0 / 0)
            "entropy_weights": entropy_rows / entropy_rows.sum(-1, keepdim=True).clamp_min(1.0),
            "most": seen.log().clamp_min(1e-12)[:, None],
        }
    return terms[key]


def classify(
    pattern: Float[Tensor, "batch head query key"] | Float[Tensor, "head query key"] | Float[Tensor, "query key"],
    *,
    tokens: Sequence[str] | Sequence[Sequence[str]] | None = None,
    batch: Any = None,
    tokenizer: Any = None,
    positions: Positions | None = None,
    view: str = "standard",
    causal: bool | None = None,
) -> Classification:
    """Label each (example, head) map with one of Kovaleva et al.'s five types (:data:`TYPES`)
    by the template rules of this module's docstring.

    ``pattern``: ``[batch, head, query, key]`` (or ``[head, query, key]`` / ``[query, key]`` for
    one example); axes: examples, heads, query positions, key positions. Where the maps' tokens
    are, give one of: ``tokens`` (the token strings, :meth:`Positions.from_tokens`), ``batch``
    (an :class:`attnlens.core.inputs.Batch` with ``tokenizer=``, or a
    :class:`attnlens.engine.accumulator.PassBatch`), or ``positions``. ``view``: ``"standard"`` or ``"papa"``
    (each valid row must be a distribution over its visible keys: finite, non-negative, 0 on
    padding and, for a decoder, on later keys, summing to 1; else an ``InputError`` naming the
    first offending head and row, :func:`attnlens.methods.patterns.maps_check.check_maps`) or
    ``"effective"`` (signed, finite, normalised by ``|a|``). ``causal``: the maps are a
    decoder's (default: from the model of a PassBatch, else False).
    """
    if not isinstance(view, str):
        raise views.unknown_view(view)
    view = views.get_view(view).name
    if causal is not None:
        flag(causal, "causal (whether the maps are a decoder's; None: from the model of a PassBatch, else False)")
    pattern = _as_4d(pattern)
    given = [name for name, value in (("tokens", tokens), ("batch", batch), ("positions", positions))
             if value is not None]
    if len(given) != 1:
        raise InputError(
            "classify needs where the maps' tokens are: exactly one of tokens= (token strings), "
            f"batch= (a Batch with tokenizer=, or a PassBatch) or positions=; got {given or 'none'}."
        )
    if tokens is not None:
        positions = Positions.from_tokens(tokens, causal=bool(causal), length=pattern.shape[-1])
    elif batch is not None:
        positions = Positions.from_batch(batch, tokenizer, causal=causal)
    assert positions is not None
    if tuple(positions.key_mask.shape) != (pattern.shape[0], pattern.shape[-1]):
        raise InputError(
            f"the maps are {pattern.shape[0]} examples × {pattern.shape[-1]} positions but the "
            f"tokens / batch describe {tuple(positions.key_mask.shape)}; give one token list per example."
        )
    positions = Positions(
        positions.key_mask.to(pattern.device), positions.special.to(pattern.device),
        positions.segment.to(pattern.device), positions.causal,
        position=None if positions.position is None else positions.position.to(pattern.device),
    )
    signed = views.get_view(view).signed
    check_maps(pattern, positions.key_mask, view=view, signed=signed, causal=positions.causal)
    shares = features(pattern, positions, signed=signed)
    return label(shares, positions)


def template_labels(
    pattern: Float[Tensor, "*stack batch head query key"], positions: Positions, *, signed: bool = False
) -> Int[Tensor, "*stack batch head"]:
    """The type index (into :data:`TYPES`) of every (example, head) map by the template rules,
    without :func:`classify`'s checks (for maps a pass reads from the model); ``signed`` and
    ``stack`` as for :func:`features`."""
    shares, _ = _shares(pattern, positions, signed=signed)
    return _labels(shares, positions)


def _rule_table() -> list[int]:
    """The type index for every outcome of :func:`_labels`' six tests, bit ``i`` the outcome of
    test ``i``: ``ŝ_special``, ``ŝ_diagonal``, ``ŝ_block`` (a pair's) ``≥ single``;
    ``ŝ_special``, ``ŝ_diagonal ≥ both_each``; ``ŝ_special + ŝ_diagonal ≥ both_sum``. The rules
    of the module docstring, the first that holds."""
    table = []
    for code in range(64):
        special, diagonal, block, special_each, diagonal_each, both_sum = ((code >> bit) & 1 for bit in range(6))
        if special_each and diagonal_each and both_sum:
            table.append(TYPES.index("vertical+diagonal"))
        elif special or diagonal:
            table.append(TYPES.index("vertical" if special else "diagonal"))
        elif block:
            table.append(TYPES.index("block"))
        else:
            table.append(TYPES.index("heterogeneous"))
    return table


def _labels(shares: Float[Tensor, "*stack batch head region"], positions: Positions) -> Int[Tensor, "*stack batch head"]:
    """The type index of every (example, head) by the rules of the module docstring, from the
    shares of :data:`REGIONS` (last axis): six threshold tests at once (:func:`_rule_table`; the
    block test's threshold infinite for an example that is not a pair), their outcomes a 6-bit
    code, and the type of each code looked up."""
    cast = _cast_terms(_terms(positions), shares.dtype)
    tests = torch.cat([shares, shares[..., :2], shares[..., :2].sum(-1, keepdim=True)], dim=-1)
    passed = tests >= cast["thresholds"]  # [*stack, batch, head, test]
    return cast["rules"][(passed * cast["bits"]).sum(-1)]


def label(shares: dict[str, Float[Tensor, "batch head"]], positions: Positions) -> Classification:
    """Apply the rules of the module docstring to :func:`features`' shares of maps of
    ``positions``: the labels and each type's score."""
    special, diagonal, block = shares["special"], shares["diagonal"], shares["block"]
    labels = _labels(torch.stack([shares[name] for name in REGIONS], dim=-1), positions)
    pairs = _terms(positions)["pairs"]
    pair = pairs[:, None].expand_as(special)
    block_score = torch.where(pair, block, torch.zeros_like(block))
    scores = torch.stack(
        [
            special,
            diagonal,
            torch.minimum(special, diagonal),
            block_score,
            (1 - torch.maximum(special + diagonal, block_score)).clamp(0, 1),
        ],
        dim=-1,
    )
    return Classification(labels, scores, shares, pairs)
