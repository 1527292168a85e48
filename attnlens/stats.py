"""Per-head attention statistics (Clark et al. 2019), streamed over a corpus.

For every valid query token of every example, a head's attention row is summarised by:

- ``to_cls``, ``to_sep``, ``to_punct``: attention mass on the start token, on separator tokens,
  and on punctuation tokens (tokens made only of punctuation characters);
- ``to_self``: attention on the query's own position (offset 0);
- ``to_prev`` / ``to_next``: attention on the position at offset -1 / +1 (0 for the first /
  last position, where that neighbour does not exist or is padding);
- ``entropy``: Shannon entropy in nats of the row over the valid keys. Signed attention
  (effective attention can be negative) is made a distribution by ``|a| / sum |a|`` first.

Each statistic is the mean over all valid query tokens seen, per (layer, head).
"""

from __future__ import annotations

import string
import unicodedata
import weakref
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from attnlens.errors import InputError
from attnlens.passes import Accumulator

STATISTICS: tuple[str, ...] = (
    "to_cls",
    "to_sep",
    "to_punct",
    "to_self",
    "to_prev",
    "to_next",
    "entropy",
)
#: offset of the key from the query for each positional statistic
OFFSETS: dict[str, int] = {"to_self": 0, "to_prev": -1, "to_next": +1}

#: one table per tokenizer, dropped with it (an ``id()`` key could be reused by a new tokenizer)
_PUNCT_TABLES: weakref.WeakKeyDictionary[Any, Tensor] = weakref.WeakKeyDictionary()


def _is_punctuation(text: str) -> bool:
    text = text.strip().removeprefix("##").removeprefix("▁")
    return bool(text) and all(
        ch in string.punctuation or unicodedata.category(ch).startswith("P") for ch in text
    )


def token_text(tokenizer: Any, token: str | None) -> str:
    """The text a vocabulary entry stands for: byte-level BPE entries (RoBERTa, GPT-2: ``'ĠâĢĶ'``
    is ``' —'``, a lone piece of a character ``'�'``) decoded, as TransformerLens'
    ``to_str_tokens`` shows them; WordPiece entries as they are (``'##s'``)."""
    if token is None:
        return ""
    try:
        return tokenizer.convert_tokens_to_string([token])
    except Exception:  # a tokenizer that cannot decode a lone entry: its raw form
        return token.replace("Ġ", " ")


def punctuation_table(tokenizer: Any) -> Bool[Tensor, "vocab"]:
    """Boolean over the vocabulary: is token id ``i`` a punctuation-only token? Cached."""
    if tokenizer not in _PUNCT_TABLES:
        tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        special = set(tokenizer.all_special_ids)
        _PUNCT_TABLES[tokenizer] = torch.tensor(
            [i not in special and _is_punctuation(token_text(tokenizer, t)) for i, t in enumerate(tokens)],
            dtype=torch.bool,
        )
    return _PUNCT_TABLES[tokenizer]


def token_classes(
    tokenizer: Any, input_ids: Int[Tensor, "batch pos"], valid: Bool[Tensor, "batch pos"] | None = None
) -> dict[str, Bool[Tensor, "batch pos"]]:
    """Masks of the start ([CLS] / <s>), separator ([SEP] / </s>) and punctuation positions.

    A tokenizer without [CLS]/[SEP] (GPT-2) has bos and eos instead, often one token
    (``<|endoftext|>``): then only its first occurrence among each example's real tokens
    (``valid``; by default position 0) is the start, and the others are separators.
    """
    start = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    sep = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    table = punctuation_table(tokenizer).to(input_ids.device)
    clipped = input_ids.clamp(max=table.shape[0] - 1)
    none = torch.zeros_like(input_ids, dtype=torch.bool)
    cls = input_ids == start if start is not None else none
    if start is not None and start == sep:
        if valid is None:
            valid = torch.ones_like(input_ids, dtype=torch.bool)
        first_real = valid & (valid.long().cumsum(-1) == 1)
        cls = cls & first_real
    return {
        "cls": cls,
        "sep": (input_ids == sep) & ~cls if sep is not None else none,
        "punct": table[clipped],
    }


def row_statistics(
    pattern: Float[Tensor, "batch head query key"],
    classes: dict[str, Bool[Tensor, "batch key"]],
    valid: Bool[Tensor, "batch pos"],
) -> dict[str, Float[Tensor, "batch head query"]]:
    """Each statistic of :data:`STATISTICS` for every (example, head, query) row."""
    pattern = pattern.float() * valid[:, None, None, :]
    out = {
        f"to_{name}": torch.einsum("bhqk,bk->bhq", pattern, mask.to(pattern.dtype))
        for name, mask in classes.items()
    }
    for name, offset in OFFSETS.items():
        out[name] = _diagonal(pattern, offset)
    weights = pattern.abs()
    probs = weights / weights.sum(-1, keepdim=True).clamp_min(torch.finfo(weights.dtype).tiny)
    out["entropy"] = -(probs * probs.clamp_min(1e-30).log()).sum(-1)
    return out


def _diagonal(pattern: Tensor, offset: int) -> Tensor:
    """``pattern[b, h, i, i + offset]``, 0 where ``i + offset`` is outside the sequence."""
    diagonal = torch.diagonal(pattern, offset=offset, dim1=-2, dim2=-1)
    out = pattern.new_zeros(pattern.shape[:-1])
    if offset >= 0:
        out[..., : diagonal.shape[-1]] = diagonal
    else:
        out[..., -offset : -offset + diagonal.shape[-1]] = diagonal
    return out


class AttentionStatistics:
    """Streaming means of :data:`STATISTICS` per (layer, head); holds no attention maps.

    Call :meth:`update` with each layer's pattern for a batch, then read :meth:`means`.
    """

    def __init__(self, n_layers: int, n_heads: int) -> None:
        self.n_layers, self.n_heads = n_layers, n_heads
        self.sums = {name: torch.zeros(n_layers, n_heads, dtype=torch.float64) for name in STATISTICS}
        self.counts = torch.zeros(n_layers, dtype=torch.float64)

    def update(
        self,
        layer: int,
        pattern: Float[Tensor, "batch head query key"],
        classes: dict[str, Bool[Tensor, "batch key"]],
        valid: Bool[Tensor, "batch pos"],
    ) -> None:
        rows = row_statistics(pattern.detach(), classes, valid)
        query_valid = valid[:, None, :].to(torch.float64)
        for name, values in rows.items():
            self.sums[name][layer] += (values.double() * query_valid).sum(dim=(0, 2)).cpu()
        self.counts[layer] += float(valid.sum())

    def means(self) -> dict[str, Float[Tensor, "layer head"]]:
        """Mean of each statistic over every valid query token seen, ``[layer, head]``."""
        if not bool((self.counts > 0).all()):
            raise InputError("No tokens were seen for some layer; update() with at least one batch.")
        return {name: (total / self.counts[:, None]).float() for name, total in self.sums.items()}


def batch_classes(batch: Any) -> dict[str, Bool[Tensor, "batch pos"]]:
    """:func:`token_classes` of a :class:`attnlens.passes.PassBatch`, computed once per batch
    for every accumulator that asks."""
    return batch.shared(
        "token_classes",
        lambda: token_classes(batch.model.tokenizer, batch.batch.input_ids, batch.key_mask),
    )


class Statistics(Accumulator):
    """:class:`AttentionStatistics` as an accumulator of :func:`attnlens.passes.run`.

    ``view="standard"`` reads each layer's pattern, ``"effective"`` its effective attention
    (computed once per layer by the engine). ``result()`` is :meth:`AttentionStatistics.means`:
    ``{statistic: [layer, head]}``.
    """

    def __init__(self, n_layers: int, n_heads: int, view: str = "standard") -> None:
        if view not in ("standard", "effective"):
            raise InputError(f"Unknown view {view!r}; use 'standard' or 'effective'.")
        self.view = view
        self.name = f"statistics.{view}"
        self.needs_effective = view == "effective"
        self.statistics = AttentionStatistics(n_layers, n_heads)

    def update(self, layer: Any) -> None:
        pattern = layer.effective if self.view == "effective" else layer.pattern
        self.statistics.update(layer.layer, pattern, batch_classes(layer.batch), layer.key_mask)

    def state_dict(self) -> dict[str, Tensor]:
        return {**{f"sums.{k}": v for k, v in self.statistics.sums.items()}, "counts": self.statistics.counts}

    def result(self) -> dict[str, Float[Tensor, "layer head"]]:
        return self.statistics.means()
