"""Effective attention on a whole model, through TransformerLens hooks.

Every layer's value vectors are read at ``blocks.{l}.attn.hook_v`` (``[batch, key, head,
d_head]``), which fires just before ``blocks.{l}.attn.hook_pattern`` in the same layer; the pattern
hook then computes :func:`~attnlens.effective.core.effective_attention` on the valid keys given by
:func:`attnlens.seam.key_mask`.

- :func:`run`: one forward pass; standard and effective patterns of every layer.
- :func:`hooks` / :func:`hooked`: replace each pattern at run time by its effective attention
  (``mode="effective"``, as Sun & Marasović do; the output is unchanged since ``A⊥ V = A V``) or
  by its null-space part ``A - A⊥`` (``mode="null"``; the heads' outputs ``z`` become ~0).
- :func:`statistics`: per-head mean attention to [CLS], [SEP] and punctuation (and the other
  :data:`attnlens.stats.STATISTICS`) for standard and effective attention, streamed over a corpus.

Works on every model :func:`attnlens.load` supports (BERT, RoBERTa, GPT-2). On a causal decoder
the projector spans all of a sequence's value vectors, so ``A⊥`` is in general not causal: it can
put (positive or negative) weight on later tokens, while ``A⊥ V = A V`` still holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import einops
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from attnlens import seam
from attnlens.effective.core import effective_attention
from attnlens.inputs import Batch, as_max_len, tokenize
from attnlens.loading import is_causal, require_bridge
from attnlens.stats import AttentionStatistics, token_classes
from attnlens.streaming import chunks, device_of, progress_bar, run_patterns

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
    def null(self) -> Float[Tensor, "layer batch head query key"]:
        """The part of each pattern that never reaches the output, ``standard - effective``."""
        return self.standard - self.effective


@dataclass
class EffectiveStatistics:
    """Per-head corpus means for standard and effective attention.

    ``standard[name]`` / ``effective[name]`` are ``[layer, head]`` for each name in
    :data:`attnlens.stats.STATISTICS` (``to_cls``, ``to_sep``, ``to_punct``, ...): the mean over
    every valid query token of the corpus.
    """

    standard: dict[str, Float[Tensor, "layer head"]]
    effective: dict[str, Float[Tensor, "layer head"]]
    n_sequences: int
    n_tokens: int
    n_truncated: int

    def __repr__(self) -> str:
        shape = list(next(iter(self.standard.values())).shape) if self.standard else []
        return (
            f"EffectiveStatistics({self.n_sequences} sequences, {self.n_tokens} tokens, "
            f"{self.n_truncated} truncated; {', '.join(self.standard)} per [layer, head] = {shape} "
            "for standard and effective; .to_frame() for a table)"
        )

    def to_frame(self) -> Any:
        """Long ``pandas.DataFrame``: columns attention, statistic, layer, head, value."""
        import pandas as pd

        records = []
        for attention, means in (("standard", self.standard), ("effective", self.effective)):
            for name, values in means.items():
                for layer, row in enumerate(values.tolist()):
                    for head, value in enumerate(row):
                        records.append((attention, name, layer, head, value))
        return pd.DataFrame(records, columns=["attention", "statistic", "layer", "head", "value"])


def kv_heads(model: Any) -> int:
    """Key-value heads per layer of a bridge (its architecture's fact; ``n_heads`` without one)."""
    from attnlens import models

    architecture = models.find(model)
    if architecture is None:
        return int(model.cfg.n_heads)
    return architecture.kv_heads(model.original_model.config)


def v_hook_name(model: Any, layer: int) -> str:
    """Name of the hook point carrying layer ``layer``'s value vectors."""
    from attnlens import models

    architecture = models.find(model)
    preferred = architecture.value_hook.format(layer=layer) if architecture else f"blocks.{layer}.attn.hook_v"
    for name in (preferred, f"blocks.{layer}.attn.hook_v", f"blocks.{layer}.attn.v.hook_out"):
        if name in model.hook_dict:
            return name
    raise ValueError(f"The model has no value hook for layer {layer} (blocks.{layer}.attn.hook_v).")


def _values(v: Tensor, n_heads: int, n_kv_heads: int | None = None) -> Float[Tensor, "batch head key d_head"]:
    """``hook_v``'s values (``[batch, key, kv_head, d_head]``, or ``[batch, key, kv_head*d_head]``)
    as one ``[key, d_head]`` matrix per *query* head: with grouped key-value heads, query head
    ``h`` reads key-value head ``h // (n_heads / n_kv_heads)``, as Hugging Face's ``repeat_kv``."""
    n_kv_heads = n_kv_heads or n_heads
    if v.ndim == 3:
        v = einops.rearrange(v, "b k (h d) -> b h k d", h=n_kv_heads)
    else:
        v = einops.rearrange(v, "b k h d -> b h k d")
    if v.shape[1] != n_heads:
        if n_heads % v.shape[1]:
            raise ValueError(f"{n_heads} query heads cannot share {v.shape[1]} key-value heads evenly.")
        v = v.repeat_interleave(n_heads // v.shape[1], dim=1)
    return v


def _layers(model: Any, layers: Iterable[int] | None) -> list[int]:
    n_layers = model.cfg.n_layers
    chosen = list(range(n_layers)) if layers is None else sorted({int(layer) for layer in layers})
    if any(not 0 <= layer < n_layers for layer in chosen):
        raise ValueError(f"layers must be in 0..{n_layers - 1}, got {chosen}")
    return chosen


def _require_bridge(model: Any) -> None:
    require_bridge(model, "attnlens.effective")


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
    stash: dict[int, Tensor] = {}
    n_heads = model.cfg.n_heads
    n_kv_heads = kv_heads(model)
    causal = is_causal(model)
    fwd_hooks: list[tuple[str, Callable]] = []
    for layer in _layers(model, layers):

        def keep_v(v: Tensor, hook: Any, layer: int = layer) -> None:
            stash[layer] = v

        def on_hook(pattern: Tensor, hook: Any, layer: int = layer) -> Tensor | None:
            if layer not in stash:
                raise RuntimeError(f"hook_v of layer {layer} did not fire before its hook_pattern.")
            v = _values(stash.pop(layer), n_heads, n_kv_heads)
            valid = seam.key_mask(pattern, causal=causal)
            effective = effective_attention(pattern, v, key_mask=valid, rtol=rtol, padded=padded)
            return on_pattern(layer, pattern, effective, valid)

        fwd_hooks.append((v_hook_name(model, layer), keep_v))
        fwd_hooks.append((f"blocks.{layer}.attn.hook_pattern", on_hook))
    return fwd_hooks


def hooks(
    model: Any,
    mode: Mode = "effective",
    *,
    layers: Iterable[int] | None = None,
    rtol: float | None = None,
    padded: bool = False,
) -> list[tuple[str, Callable]]:
    """``fwd_hooks`` that replace each pattern ``A`` ``[batch, head, query, key]`` at run time.

    ``mode="effective"``: ``A`` becomes its effective attention ``A⊥`` (Sun & Marasović's test-time
    replacement). Since ``A⊥ V = A V`` the model's output does not change (up to float error).
    ``mode="null"``: ``A`` becomes ``A - A⊥``, its component in the left null space of ``V``;
    every head's output ``z = (A - A⊥) V`` is then ~0.

    ``layers``: which layers to hook (default all). ``rtol``/``padded``: as in
    :func:`~attnlens.effective.core.effective_attention`. Use with
    ``model.run_with_hooks(..., fwd_hooks=hooks(model))`` or the :func:`hooked` context manager.
    """
    if mode not in MODES:
        raise ValueError(f"Unknown mode {mode!r}; use one of {', '.join(MODES)}.")
    _require_bridge(model)
    if not seam.is_installed(model):
        raise ValueError(
            "hook_pattern edits do not reach this model's output, so replacing patterns would "
            "change nothing; load the model with attnlens.load()."
        )

    def replace(layer: int, pattern: Tensor, effective: Tensor, valid: Tensor) -> Tensor:
        return effective if mode == "effective" else pattern - effective

    return pattern_hooks(model, replace, layers=layers, rtol=rtol, padded=padded)


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
    max_len: int = 128,
    layout: str = "padded",
    rtol: float | None = None,
    padded: bool = False,
) -> EffectiveRun:
    """One forward pass; returns the standard and effective patterns of every layer.

    ``tokens``: a :class:`attnlens.Batch`, an ``input_ids`` tensor ``[batch, pos]`` (no padding),
    or text(s) tokenized with ``max_len``/``layout``. The forward itself is unchanged (hooks only
    read). Patterns are ``[layer, batch, head, query, key]``; effective attention as in
    :func:`~attnlens.effective.core.effective_attention` (``rtol``, ``padded``).
    """
    _require_bridge(model)
    batch = _as_batch(model, tokens, max_len, layout).to(device_of(model))
    n_layers = model.cfg.n_layers
    maps: dict[str, Tensor] = {}

    def record(layer: int, pattern: Tensor, eff: Tensor, valid: Tensor) -> None:
        # written into [layer, ...] buffers as the forward goes, so each layer's effective map is
        # freed (and its memory reused) at once instead of all of them waiting for a final stack
        if not maps:
            maps["standard"] = pattern.new_empty((n_layers, *pattern.shape))
            maps["effective"] = eff.new_empty((n_layers, *eff.shape))
        maps["standard"][layer].copy_(pattern)
        maps["effective"][layer].copy_(eff)

    fwd_hooks = pattern_hooks(model, record, rtol=rtol, padded=padded)
    with torch.no_grad(), seam.batch_key_mask(batch.attention_mask.bool()):
        logits = model.run_with_hooks(batch.input_ids, **batch.model_kwargs(), fwd_hooks=fwd_hooks)
    return EffectiveRun(
        standard=maps["standard"],
        effective=maps["effective"],
        valid=batch.attention_mask.bool(),
        logits=logits,
        batch=batch,
    )


def statistics(
    model: Any,
    corpus: Iterable[str] | Iterable[tuple[str, str]],
    *,
    max_len: int = 128,
    layout: str = "padded",
    batch_size: int = 32,
    progress: bool = True,
    rtol: float | None = None,
    padded: bool = False,
) -> EffectiveStatistics:
    """Stream ``corpus`` through ``model``; per-head means for standard and effective attention.

    Texts (or pairs) are tokenized ``batch_size`` at a time with ``max_len``/``layout``. For every
    layer the standard pattern and its effective attention update two
    :class:`attnlens.stats.AttentionStatistics` accumulators, so no attention map outlives its
    batch. Means are over every valid query token; attention to [CLS] / [SEP] / punctuation is
    the mass on those key positions (:func:`attnlens.stats.token_classes`). The forward stops
    after the last layer's pattern hook (the rest of the model is not needed).
    """
    _require_bridge(model)
    max_len = as_max_len(max_len)
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    standard = AttentionStatistics(n_layers, n_heads)
    effective = AttentionStatistics(n_layers, n_heads)
    device = device_of(model)
    current: dict[str, Any] = {}
    counts = {"sequences": 0, "tokens": 0, "truncated": 0}

    def update(layer: int, pattern: Tensor, eff: Tensor, valid: Tensor) -> None:
        standard.update(layer, pattern, current["classes"], current["valid"])
        effective.update(layer, eff, current["classes"], current["valid"])

    fwd_hooks = pattern_hooks(model, update, rtol=rtol, padded=padded)
    with progress_bar(corpus, "effective attention statistics", progress) as bar:
        for chunk in chunks(corpus, batch_size):
            batch = tokenize(model, chunk, max_len=max_len, layout=layout).to(device)  # type: ignore[arg-type]
            current["valid"] = batch.attention_mask.bool()
            current["classes"] = token_classes(model.tokenizer, batch.input_ids, current["valid"])
            run_patterns(model, batch, fwd_hooks)
            counts["sequences"] += len(batch)
            counts["tokens"] += int(batch.attention_mask.sum())
            counts["truncated"] += batch.n_truncated
            bar.update(len(chunk))
    if counts["sequences"] == 0:
        raise ValueError("The corpus is empty.")
    return EffectiveStatistics(
        standard=standard.means(),
        effective=effective.means(),
        n_sequences=counts["sequences"],
        n_tokens=counts["tokens"],
        n_truncated=counts["truncated"],
    )
