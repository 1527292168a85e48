"""Effective attention on a whole model, through TransformerLens hooks.

Every layer's value vectors are read at ``blocks.{l}.attn.hook_v`` (``[batch, key, head,
d_head]``), which fires just before ``blocks.{l}.attn.hook_pattern`` in the same layer; the pattern
hook then computes :func:`~attnlens.engine.effective.effective_attention` on the valid keys given by
:func:`attnlens.core.seam.key_mask`.

- :func:`run`: one forward pass; standard and effective patterns of every layer.
- :func:`hooks` / :func:`hooked`: replace each pattern at run time by its effective attention
  (``mode="effective"``, as Sun & Marasović do; the output is unchanged since ``A⊥ V = A V``) or
  by its null-space part ``A - A⊥`` (``mode="null"``; the heads' outputs ``z`` become ~0).
- :func:`statistics`: per-head mean attention to [CLS], [SEP] and punctuation (and the other
  :data:`attnlens.methods.stats.STATISTICS`) for standard and effective attention, streamed over a corpus.

Works on every model :func:`attnlens.load` supports (BERT, RoBERTa, GPT-2, the Llama family). On a
causal decoder (:func:`attnlens.core.loading.is_causal`) every function here computes the causal
form (``effective_attention(..., causal=True)``): row ``q`` is projected onto the values of the
keys ``k ≤ q`` it reads, the causal extension of Brunner et al. 2020 / Sun & Marasović 2021's
projection, so ``A⊥`` is lower-triangular like the pattern and ``A⊥ V = A V`` row by row.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, SupportsIndex

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from attnlens.core import devices, models, seam
from attnlens.core.checks import describe, finite_tensor, flag, index, items, whole_number
from attnlens.core.inputs import Batch, as_max_len, tokenize
from attnlens.core.loading import is_causal, require_bridge
from attnlens.core.modes import own_arithmetic
from attnlens.core.plots import head_grid
from attnlens.core.result import Result, frame
from attnlens.engine import forward, passes
from attnlens.engine.effective import check_rtol, effective_attention, warn_if_short
from attnlens.engine.forward import device_of, run_with_hooks
from attnlens.engine.hooks import Hooks
from attnlens.errors import InputError, InputTypeError
from attnlens.methods.stats import Statistics

Mode = Literal["effective", "null"]
MODES: tuple[str, ...] = ("effective", "null")
Tokens = Batch | Int[Tensor, "batch pos"] | str | Sequence[str] | Sequence[tuple[str, str]]


@dataclass
class EffectiveRun:
    """Standard and effective attention of every layer for one batch.

    ``standard`` and ``effective`` are ``[layer, batch, head, query, key]``; ``valid`` is
    ``[batch, key]`` (True for real tokens); ``logits`` are the model's unchanged output.
    """

    standard: Float[Tensor, "layer batch head query key"]
    effective: Float[Tensor, "layer batch head query key"]
    valid: Bool[Tensor, "batch key"]
    logits: Tensor
    batch: Batch | None = None

    def __repr__(self) -> str:
        return (
            f"EffectiveRun(standard, effective: [layer, batch, head, query, key] = "
            f"{list(self.standard.shape)}, {self.standard.dtype}, {self.standard.device}; "
            f"{int(self.valid.sum())} real tokens)"
        )

    @property
    def key_mask(self) -> Bool[Tensor, "batch key"]:
        """``[batch, key]``, True for real tokens (the one name; ``valid`` is kept as a field)."""
        return self.valid

    @property
    def null(self) -> Float[Tensor, "layer batch head query key"]:
        """The part of each pattern that never reaches the output, ``standard - effective``."""
        return self.standard - self.effective


@dataclass
class EffectiveStatistics(Result):
    """Per-head corpus means for standard and effective attention.

    ``standard[name]`` / ``effective[name]`` are ``[layer, head]`` for each name in
    :data:`attnlens.methods.stats.STATISTICS` (``to_cls``, ``to_sep``, ``to_punct``, ...): the mean over
    every valid query token of the corpus; ``n_examples``, ``n_tokens``, ``n_truncated``: the
    corpus read. A :class:`~attnlens.core.result.Result`: :attr:`table` (long, one row per
    attention, statistic and head; ``to_frame()`` is its deprecated older name),
    :meth:`figure` (one statistic's head grids), :meth:`to_json` / :meth:`from_json`.
    """

    COLUMNS: ClassVar[dict[str, str]] = {
        "attention": "standard (the model's pattern) or effective (effective attention)",
        "statistic": "a name of attnlens.methods.stats.STATISTICS (to_cls, to_sep, ..., entropy)",
        "layer": "layer index, from 0",
        "head": "head index within the layer, from 0",
        "value": "the statistic's mean over every valid query token of the corpus",
    }
    FORMAT: ClassVar[str] = "attnlens.EffectiveStatistics/1"

    standard: dict[str, Float[Tensor, "layer head"]]
    effective: dict[str, Float[Tensor, "layer head"]]
    n_examples: int
    n_tokens: int
    n_truncated: int

    def __repr__(self) -> str:
        shape = list(next(iter(self.standard.values())).shape) if self.standard else []
        return (
            f"EffectiveStatistics({self.n_examples} examples, {self.n_tokens} tokens, "
            f"{self.n_truncated} truncated; {', '.join(self.standard)} per [layer, head] = {shape} "
            "for standard and effective; .table for a table)"
        )

    @property
    def table(self) -> Any:
        """Long ``pandas.DataFrame``: :attr:`COLUMNS` (attention, statistic, layer, head, value)."""
        records = []
        for attention, means in (("standard", self.standard), ("effective", self.effective)):
            for name, values in means.items():
                for layer, row in enumerate(values.tolist()):
                    for head, value in enumerate(row):
                        records.append((attention, name, layer, head, value))
        return frame([dict(zip(self.COLUMNS, record, strict=True)) for record in records], self.COLUMNS)

    def figure(self, statistic: str = "to_cls") -> Any:
        """One statistic's ``[layer, head]`` grids, standard beside effective
        (:func:`attnlens.core.plots.head_grid`)."""

        if statistic not in self.standard:
            raise InputError(f"unknown statistic {statistic!r}; use one of {', '.join(self.standard)}.")
        panels = dict(standard=self.standard[statistic], effective=self.effective[statistic])  # the fields
        return head_grid(panels, name=statistic, title=f"{statistic}: standard and effective attention "
                         f"({self.n_examples} examples)")

    def to_dict(self) -> dict[str, Any]:
        return {"standard": {name: value.double().tolist() for name, value in self.standard.items()},
                "effective": {name: value.double().tolist() for name, value in self.effective.items()},
                "n_examples": self.n_examples, "n_tokens": self.n_tokens, "n_truncated": self.n_truncated}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EffectiveStatistics:
        """The statistics of a :meth:`to_dict` object; means that are not finite (a NaN, an
        infinity) and counts that are not whole numbers at least 0 are refused by name."""

        def means(attention: str) -> dict[str, Tensor]:
            values = data[attention]
            if not isinstance(values, dict):
                raise InputTypeError(f"{attention} must be an object of statistics, got {describe(values)}")
            out = {}
            for name, value in values.items():
                tensor = torch.tensor(value, dtype=torch.float64).float().reshape(len(value), -1)
                out[name] = finite_tensor(tensor, f"{attention}[{name!r}] (means per [layer, head])")
            return out

        counts = {name: whole_number(data[name], name, minimum=0) for name in ("n_examples", "n_tokens", "n_truncated")}
        return cls(standard=means("standard"), effective=means("effective"), **counts)


def kv_heads(model: Any) -> int:
    """Key-value heads per layer of a bridge (its architecture's fact; ``n_heads`` without one)."""
    architecture = models.find(model)
    if architecture is None:
        return int(model.cfg.n_heads)
    return architecture.kv_heads(model.original_model.config)


def _layers(model: Any, layers: Iterable[int] | None) -> list[int]:
    n_layers = model.cfg.n_layers
    if layers is None:
        return list(range(n_layers))
    listed = items(layers, "layers", "[0, 1]")
    return sorted({index(layer, f"layers[{i}]", n_layers, "layers") for i, layer in enumerate(listed)})


def _require_bridge(model: Any) -> None:
    require_bridge(model, "attnlens.methods.effective")


def pattern_hooks(
    model: Any,
    on_pattern: Callable[[int, Tensor, Tensor, Tensor], Tensor | None],
    *,
    layers: Iterable[int] | None = None,
    rtol: float | None = None,
    padded: bool = False,
) -> list[tuple[str, Callable]]:
    """``fwd_hooks`` calling ``on_pattern(layer, A, A⊥, valid)`` at each layer's ``hook_pattern``.

    ``A`` and ``A⊥`` are ``[batch, head, query, key]``, ``valid`` the ``[batch, key]`` mask of real
    tokens. V is stashed at the layer's ``hook_v``, which fires first. Whatever ``on_pattern``
    returns replaces the pattern (``None`` leaves it unchanged): :func:`hooks`, :func:`run`,
    :func:`statistics` and :func:`attnlens.compare` are all built on this.
    """
    _require_bridge(model)
    rtol = check_rtol(rtol)
    flag(padded, "padded")
    causal = is_causal(model)

    def on_hook(layer: int, pattern: Tensor, v: Tensor | None, valid: Tensor) -> Tensor | None:
        effective = effective_attention(pattern, v, key_mask=valid, rtol=rtol, padded=padded, causal=causal)
        return on_pattern(layer, pattern, effective, valid)

    return forward.pattern_hooks(model, on_hook, layers=_layers(model, layers))


class EffectiveHooks(Hooks):
    """The ``(hook_name, hook_fn)`` pairs of :func:`hooks`, with :meth:`key`: what they do, as a
    stable string (caches of what a model computes under hooks, e.g. probe features, use it)."""

    def __init__(self, items: list, description: str) -> None:
        super().__init__(items)
        self.description = description

    def key(self) -> str:
        return self.description


def hooks(
    model: Any,
    mode: Mode = "effective",
    *,
    layers: Iterable[int] | None = None,
    rtol: float | None = None,
    padded: bool = False,
) -> EffectiveHooks:
    """``fwd_hooks`` that replace each pattern ``A`` ``[batch, head, query, key]`` at run time.

    ``mode="effective"``: ``A`` becomes its effective attention ``A⊥`` (Sun & Marasović's test-time
    replacement). Since ``A⊥ V = A V`` the model's output does not change (up to float error).
    ``mode="null"``: ``A`` becomes ``A - A⊥``, its component in the left null space of ``V``;
    every head's output ``z = (A - A⊥) V`` is then ~0.

    ``layers``: which layers to hook (default all). ``rtol``/``padded``: as in
    :func:`~attnlens.engine.effective.effective_attention`; on a decoder ``causal=True`` (its
    :meth:`~EffectiveHooks.key` then ends in ``:causal``). Use with
    ``model.run_with_hooks(..., fwd_hooks=hooks(model))`` or the :func:`hooked` context manager.
    """
    if mode not in MODES:
        raise InputError(f"Unknown mode {mode!r}; use one of {', '.join(MODES)}.")
    _require_bridge(model)
    flag(padded, "padded")
    rtol = check_rtol(rtol)
    if not seam.is_installed(model):
        raise InputError(
            "hook_pattern edits do not reach this model's output, so replacing patterns would "
            "change nothing; load the model with attnlens.load()."
        )

    def replace(layer: int, pattern: Tensor, effective: Tensor, valid: Tensor) -> Tensor:
        return effective if mode == "effective" else pattern - effective

    chosen = "all" if layers is None else _layers(model, layers)
    return EffectiveHooks(
        pattern_hooks(model, replace, layers=layers, rtol=rtol, padded=padded),
        f"effective:{mode}:layers={chosen}:rtol={rtol}:padded={padded}" + (":causal" if is_causal(model) else ""),
    )


@contextlib.contextmanager
def hooked(
    model: Any,
    mode: Mode = "effective",
    *,
    layers: Iterable[int] | None = None,
    rtol: float | None = None,
    padded: bool = False,
) -> Iterator[Any]:
    """Context manager: inside it, every forward of ``model`` runs with :func:`hooks` added."""
    _require_bridge(model)
    with model.hooks(fwd_hooks=hooks(model, mode, layers=layers, rtol=rtol, padded=padded)):
        yield model


def _as_batch(model: Any, tokens: Tokens, max_len: int, layout: str) -> Batch:
    if isinstance(tokens, Batch):
        return tokens
    if isinstance(tokens, Tensor):
        ids = tokens if tokens.ndim == 2 else tokens[None]
        ones = torch.ones_like(ids)
        # no padding: the model's default token types and positions are the right ones
        return Batch(ids, ones, torch.zeros_like(ids), 0, "ids", ids.shape[1], token_types=False)
    return tokenize(model, tokens, max_len=max_len, layout=layout)  # type: ignore[arg-type]


def run(
    model: Any,
    tokens: Tokens,
    *,
    max_len: SupportsIndex = 128,
    layout: str = "padded",
    rtol: float | None = None,
    padded: bool = False,
) -> EffectiveRun:
    """One forward pass; returns the standard and effective patterns of every layer.

    ``tokens``: a :class:`attnlens.Batch`, an ``input_ids`` tensor ``[batch, pos]`` (no padding),
    or text(s) tokenized with ``max_len``/``layout``. The forward itself is unchanged (hooks only
    read). Patterns are ``[layer, batch, head, query, key]``; effective attention as in
    :func:`~attnlens.engine.effective.effective_attention` (``rtol``, ``padded``; ``causal`` on a
    decoder).
    """
    _require_bridge(model)
    flag(padded, "padded")
    rtol = check_rtol(rtol)
    given = _as_batch(model, tokens, max_len, layout)
    shortest = None  # the fewest real tokens of a text, known on the host (a batch given on a device: not read)
    if devices.reads_are_free(given.attention_mask):
        d_head, lengths = int(model.cfg.d_head), given.attention_mask.sum(-1)
        warn_if_short(int((lengths > d_head).sum()), d_head)
        shortest = None if padded else int(lengths.min())
    batch = given.to(device_of(model))
    n_layers = int(model.cfg.n_layers)
    standard: list[Tensor] = []  # one [layer, batch, head, query, key] buffer, written as the forward goes
    values: list[Tensor] = []
    masks: list[Tensor] = []

    def record(layer: int, pattern: Tensor, v: Tensor | None, valid: Tensor) -> None:
        if not standard:
            standard.append(pattern.new_empty((n_layers, *pattern.shape)))
            masks.append(valid)
        standard[0][layer].copy_(pattern)
        values.append(v)

    with torch.no_grad(), own_arithmetic():
        logits = run_with_hooks(model, batch, forward.pattern_hooks(model, record))
        # every layer's effective attention in one call, the layers along the batch axis (each
        # example's own arithmetic: on a GPU one launch per operator instead of one per layer);
        # the model's own patterns and values, not checked (as in a pass: a check reads the device)
        effective = effective_attention(
            standard[0].flatten(0, 1), torch.cat(values), key_mask=masks[0].repeat(n_layers, 1), rtol=rtol,
            padded=padded, check=False, shortest=shortest, causal=is_causal(model),
        ).unflatten(0, (n_layers, -1))
    return EffectiveRun(
        standard=standard[0],
        effective=effective,
        valid=batch.attention_mask.bool(),
        logits=logits,
        batch=batch,
    )


def statistics(
    model: Any,
    corpus: Iterable[str] | Iterable[tuple[str, str]],
    *,
    max_len: SupportsIndex = 128,
    layout: str = "padded",
    batch_size: SupportsIndex = 32,
    progress: bool = True,
    rtol: float | None = None,
    padded: bool = False,
) -> EffectiveStatistics:
    """Stream ``corpus`` through ``model``; per-head means for standard and effective attention.

    Texts (or pairs) are tokenized ``batch_size`` at a time with ``max_len``/``layout``. For every
    layer the standard pattern and its effective attention update two
    :class:`attnlens.methods.stats.AttentionStatistics` accumulators, so no attention map outlives its
    batch. Means are over every valid query token; attention to [CLS] / [SEP] / punctuation is
    the mass on those key positions (:func:`attnlens.methods.stats.token_classes`). The forward stops
    after the last layer's pattern hook (the rest of the model is not needed).
    """
    _require_bridge(model)
    max_len = as_max_len(max_len)
    flag(padded, "padded")
    rtol = check_rtol(rtol)
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    standard = Statistics(n_layers, n_heads, "standard")
    effective = Statistics(n_layers, n_heads, "effective")
    summary = passes.run(
        model, corpus, [standard, effective], max_len=max_len, layout=layout,
        batch_size=batch_size, progress=progress, description="effective attention statistics",
        effective={"rtol": rtol, "padded": padded},
    )
    warn_if_short(int(summary.longest > model.cfg.d_head), int(model.cfg.d_head))
    return EffectiveStatistics(
        standard=standard.result(),
        effective=effective.result(),
        n_examples=summary.n_examples,
        n_tokens=summary.n_tokens,
        n_truncated=summary.n_truncated,
    )
