"""Norm-based attention (Kobayashi et al. 2020, "Attention is Not Only a Weight: Analyzing
Transformers with Vector Norms", EMNLP 2020, arXiv:2004.10102).

A head ``h`` adds ``Σ_j α_h[i, j] f_h(x_j)`` to query ``i``'s residual stream, with the
transformed input ``f_h(x) = (x W_V,h + b_V,h) W_O,h`` (the output bias ``b_O`` is added once
for all heads and belongs to none of them). A weight ``α`` says how much of ``f_h(x_j)`` is
taken, not how large what is taken is: a key with a large weight but a small ``f_h(x_j)``
(Kobayashi et al. find it for BERT's special tokens, [CLS] and [SEP]) contributes little. The
norm-based map is what each key contributes, in the model's units::

    raw_h[i, j] = α_h[i, j] · ‖f_h(x_j)‖        (Euclidean norm over d_model)

and the view ``"norm"`` (:data:`attnlens.methods.views.REGISTRY`) is each row of it made a
distribution over the valid keys, ``raw_h[i, j] / Σ_j' raw_h[i, j']``, so that it is drawn and
summarised beside the model's attention; ``attnlens.maps(model, batch, "norm", raw=True)``
gives the raw norms.

- :func:`value_norms`: ``‖f_h(x_j)‖`` for every example, query head and key;
- :func:`norm_attention`: the raw and the row-normalised maps of one layer;
- :func:`layer_maps` / :func:`layer_raw`: the same read from the pass engine's
  :class:`attnlens.engine.accumulator.LayerPatterns` (what the registered view calls).

Computation: TransformerLens' ``hook_v`` already holds ``x W_V,h + b_V,h`` (``[batch, key,
kv_head, d_head]``), so ``f_h(x_j) = v_j W_O,h``. With grouped key-value heads (Llama, Qwen2,
Mistral) query head ``h`` reads key-value head ``h // (head / kv_head)``, as Hugging Face's
``repeat_kv``; each query head still has its own ``W_O,h``. The ``[batch, head, key, d_model]``
vectors are never made: with the QR factorisation ``W_O,hᵀ = Q_h R_h`` (``Q_h`` orthonormal
columns, ``R_h`` ``d_head x d_head``), ``‖W_O,hᵀ v‖ = ‖R_h v‖``, so one small batched QR per
layer and ``d_head x d_head`` products replace a ``d_model``-wide one, and the result is as
accurate as the direct product (a backward-stable factorisation, float32 or wider).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import einops
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from attnlens.engine.accumulator import LayerPatterns
from attnlens.errors import InputError, ModelBehaviourError

#: what the view reads of a layer (:attr:`attnlens.methods.views.View.reads`)
READS: frozenset[str] = frozenset({"pattern", "values", "output_weights"})


class NormMaps(NamedTuple):
    """One layer's norm-based attention, both ``[batch, head, query, key]``: ``raw``,
    ``α · ‖f(x)‖`` on the valid keys (0 on padding keys); ``normalised``, each row of ``raw``
    divided by its sum (rows whose sum is 0, e.g. a row with no valid key, stay 0)."""

    raw: Float[Tensor, "batch head query key"]
    normalised: Float[Tensor, "batch head query key"]


def _working_dtype(*tensors: Tensor) -> torch.dtype:
    """float32 for float32 and half inputs, float64 when any input is float64."""
    dtype = torch.float32
    for tensor in tensors:
        dtype = torch.promote_types(dtype, tensor.dtype)
    return dtype


def value_norms(
    values: Float[Tensor, "batch key kv_head d_head"],
    output_weights: Float[Tensor, "head d_head d_model"],
) -> Float[Tensor, "batch head key"]:
    """``‖f_h(x_j)‖ = ‖v_j,g(h) W_O,h‖`` for every example, query head ``h`` and key ``j``.

    ``values``: the layer's value vectors ``x W_V + b_V`` as ``hook_v`` holds them (axes:
    examples, keys, key-value heads, head dimension); ``output_weights``: ``W_O``, one
    ``[d_head, d_model]`` matrix per query head (``model.blocks[layer].attn.W_O``). With
    ``kv_head < head`` (grouped key-value heads) query head ``h`` reads key-value head
    ``h // (head / kv_head)``. Computed in float32 (float64 for float64 inputs) through the QR
    factor of ``W_O,hᵀ`` (see the module's docstring), on the inputs' device, with no host read.
    """
    n_heads, n_kv = output_weights.shape[0], values.shape[2]
    if n_heads % n_kv:
        raise InputError(f"{n_heads} query heads cannot share {n_kv} key-value heads evenly.")
    dtype = _working_dtype(values, output_weights)
    # W_O,hᵀ = Q_h R_h: ‖W_O,hᵀ v‖ = ‖R_h v‖ (R_h: [d_head, d_head] when d_model >= d_head)
    factor = torch.linalg.qr(output_weights.to(dtype).transpose(-1, -2), mode="r").R
    grouped = einops.rearrange(factor, "(kv group) e d -> kv group e d", kv=n_kv)
    projected = torch.einsum("kged,bjkd->bkgje", grouped, values.to(dtype))
    return einops.rearrange(torch.linalg.vector_norm(projected, dim=-1), "b kv g key -> b (kv g) key")


def norm_attention(
    pattern: Float[Tensor, "batch head query key"],
    values: Float[Tensor, "batch key kv_head d_head"],
    output_weights: Float[Tensor, "head d_head d_model"],
    key_mask: Bool[Tensor, "batch key"],
) -> NormMaps:
    """One layer's norm-based attention (Kobayashi et al. 2020): ``raw[b, h, i, j] =
    pattern[b, h, i, j] · ‖f_h(x_j)‖`` on the valid keys, and its rows normalised to sum to 1.

    ``pattern``: the attention weights ``α`` (axes: examples, query heads, queries, keys);
    ``values``, ``output_weights``: as in :func:`value_norms`; ``key_mask``: True for the real
    tokens of each example (keys outside it get 0 in both maps). Both maps are float32 (float64
    for float64 inputs) on the pattern's device; no host read.
    """
    dtype = _working_dtype(pattern, values, output_weights)
    norms = value_norms(values, output_weights)
    keys = key_mask[:, None, None, :]
    raw = (pattern.to(dtype) * norms[:, :, None, :]).masked_fill(~keys, 0.0)
    total = raw.sum(-1, keepdim=True)
    normalised = torch.where(total > 0, raw / total.clamp_min(torch.finfo(dtype).tiny), torch.zeros_like(raw))
    return NormMaps(raw, normalised)


def layer_norm_maps(layer: LayerPatterns) -> NormMaps:
    """:func:`norm_attention` of one layer of the pass (its pattern, value vectors and ``W_O``),
    made once per layer of a batch for every reader (:meth:`LayerPatterns.shared`)."""
    return layer.shared("norm", lambda: _compute(layer))


def _compute(layer: LayerPatterns) -> NormMaps:
    if layer.values is None:
        raise ModelBehaviourError(
            "norm-based attention needs the layer's value vectors: the accumulator that reads the "
            "'norm' view must copy View.needs_values (the engine then captures them)."
        )
    # the engine hands the values per key-value head ([batch, kv_head, key, d_head])
    values = layer.values.transpose(1, 2)
    return norm_attention(layer.pattern, values, layer.output_weights, layer.key_mask)


def layer_maps(layer: Any) -> Float[Tensor, "batch head query key"]:
    """The ``"norm"`` view's maps of one :class:`~attnlens.engine.accumulator.LayerPatterns`: each
    valid row of ``α · ‖f(x)‖`` normalised to sum to 1."""
    return layer_norm_maps(layer).normalised


def layer_raw(layer: Any) -> Float[Tensor, "batch head query key"]:
    """The ``"norm"`` view's raw maps of one layer, ``α · ‖f(x)‖`` (0 on padding keys)."""
    return layer_norm_maps(layer).raw
