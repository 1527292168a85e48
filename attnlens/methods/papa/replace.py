"""Turn a head's constant matrix into the attention pattern it gives one batch.

The constant ``C[query, key]`` was averaged over many examples; a given example only has some
real tokens. Following the paper (Hassid et al. 2022, footnote 8), the pattern an example gets is
``C`` restricted to that example's valid ``(query, key)`` pairs, each row renormalized over the
valid keys. **A row with no mass left** (a padded query, a query position never seen in the fit,
or a row whose mass was all on padded keys) **falls back to uniform attention over the valid
keys**, so every row of the result is a distribution over the example's real tokens and padded
keys always get exactly 0.

On a **causal** model (a decoder such as GPT-2, ``causal=True``) a query may only attend to keys
at or before it: the allowed keys of query ``q`` are the valid keys ``k <= q``. Keys ``k > q``
get exactly 0, rows are renormalized over the allowed keys, and the uniform fallback is uniform
over the allowed keys too, so that replacing heads never lets a token see the future. (A row
with no allowed key at all, such as a left-padded query, is 0.)

A **compact batch** (:func:`attnlens.core.inputs.compact_batch`) gives ``positions`` ``[batch, key]``,
the layout position of each column: the pattern of column pair ``(i, j)`` of an example is then
``C[positions[i], positions[j]]``, gathered per example, before the same restriction and
renormalisation. Since a compact row keeps the real tokens in order, "at or before the query"
is the same in columns as in positions.

Trainable constants are logits instead: their pattern is a softmax over the allowed keys, with
the same uniform rows for padded queries, i.e. exactly what renormalizing ``softmax(logits)``
gives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from attnlens.core import devices
from attnlens.core.checks import describe, finite_tensor
from attnlens.core.files import tensor_checksum
from attnlens.errors import InputError, InputTypeError


def gather(
    constant: Float[Tensor, "head max_len max_len"], positions: Int[Tensor, "batch key"]
) -> Float[Tensor, "batch head key key"]:
    """``C[positions[b, i], positions[b, j]]`` for every example ``b`` and column pair ``(i, j)``:
    a constant (or logits) indexed by the layout positions of a compact batch.

    Positions on the host are checked to lie in ``0 .. max_len - 1``; on a device that check
    would wait for the device, so it is the caller's there (a compact batch tokenized with the
    constants' ``max_len``, which :meth:`PapaConstants.check_compatible` checks, is in range)."""
    size = constant.shape[-1]
    if devices.reads_are_free(positions) and (bool((positions < 0).any()) or bool((positions >= size).any())):
        raise InputError(
            f"the constant covers positions 0 .. {size - 1} but the batch has positions up to "
            f"{int(positions.max())}; tokenize with the max_len the constants were fitted with."
        )
    index = positions.to(constant.device)
    if constant.requires_grad:  # trainable logits: an indexing autograd can follow
        return constant[:, index[:, :, None], index[:, None, :]].transpose(0, 1)
    n_batch, n = index.shape
    flat = (index[:, :, None] * size + index[:, None, :]).reshape(n_batch, n * n)  # (query, key) pairs
    source = constant.reshape(constant.shape[0], size * size)
    if not devices.reads_are_free(constant):  # one kernel for the batch (a launch per example costs more there)
        return torch.index_select(source, 1, flat.reshape(-1)).view(-1, n_batch, n, n).transpose(0, 1)
    out = constant.new_empty(n_batch, constant.shape[0], n, n)
    for example in range(n_batch):  # one index_select per example: out stays [batch, head, ...]
        torch.index_select(source, 1, flat[example], out=out[example].view(-1, n * n))
    return out


def by_layer(
    pattern: Float[Tensor, "batch layer_head query key"], n_layers: int
) -> Float[Tensor, "layer_batch head query key"]:
    """Patterns made for several layers at once, their heads side by side (``layer_head``: the
    first layer's heads, then the next layer's), as a stack of layers along the batch axis
    (``layer_batch``: the batch's maps of the first layer, then of the next;
    :meth:`attnlens.engine.accumulator.LayerPatterns.stack`)."""
    return pattern.unflatten(1, (n_layers, -1)).transpose(0, 1).flatten(0, 1)


def _fit_to(constant: Tensor, n_keys: int) -> Tensor:
    """Keep the first ``n_keys`` query and key positions (right-padded inputs may be shorter)."""
    n_query, n_key = constant.shape[-2:]
    if n_query < n_keys or n_key < n_keys:
        raise InputError(
            f"the constant covers {n_key} positions but the inputs have {n_keys}; "
            "tokenize with the max_len the constants were fitted with."
        )
    return constant[..., :n_keys, :n_keys]


def _uniform(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """Rows uniform over the allowed keys (0 where a row allows none)."""
    weights = allowed.to(dtype)
    return weights / weights.sum(-1, keepdim=True).clamp_min(1)


def allowed_keys(
    key_mask: Bool[Tensor, "batch key"], *, causal: bool = False
) -> Bool[Tensor, "batch 1 query key"]:
    """Which keys each query may attend to: the valid keys, and with ``causal`` only those at or
    before the query (``k <= q``). ``key_mask`` is ``[batch, key]``, True for real tokens; the
    result is ``[batch, 1, query, key]`` with ``query`` the same positions as ``key``."""
    n = key_mask.shape[-1]
    allowed = key_mask[:, None, None, :].expand(-1, 1, n, -1)
    if causal:
        before = torch.ones(n, n, dtype=torch.bool, device=key_mask.device).tril()
        allowed = allowed & before
    return allowed


def constant_pattern(
    constant: Float[Tensor, "head max_len max_len"],
    key_mask: Bool[Tensor, "batch key"],
    *,
    renormalize: bool = True,
    dtype: torch.dtype | None = None,
    causal: bool = False,
    positions: Int[Tensor, "batch key"] | None = None,
    check: bool = True,
) -> Float[Tensor, "batch head query key"]:
    """The attention pattern that constant matrices give each example of a batch.

    ``constant`` is ``[head, max_len, max_len]`` (one layer of :attr:`PapaConstants.mean`;
    positions beyond the batch's length are dropped, as for right-padded inputs). ``key_mask`` is
    ``[batch, key]``, True for real tokens (see :func:`attnlens.core.seam.key_mask`). ``causal``: the
    model is a decoder, so query ``q`` may only attend to keys ``k <= q``. ``positions``: the
    layout position of each column of a compact batch (:func:`gather`); ``None``: column ``i``
    is position ``i``.

    Returns ``[batch, head, query, key]``: ``constant`` times ``valid(query) × allowed(query,
    key)`` (:func:`allowed_keys`), each row divided by its sum; rows with no mass left are uniform
    over the allowed keys. With ``renormalize=False`` (the ``zeros`` baseline) the restricted
    matrix is returned as it is. The result has ``dtype`` (default: the constant's) and the
    constant's device. ``check=False`` skips the check of the constant's values (:func:`_prepare`):
    for constants checked when they were made (:class:`PapaConstants`), at every batch's forward.
    """
    gathered = positions is not None
    constant, key_mask, dtype = _prepare(constant, key_mask, dtype, "constant", positions, check)
    allowed = allowed_keys(key_mask, causal=causal)
    valid_pair = key_mask[:, None, :, None] & allowed
    # the gathered copy is this call's own; a cut of the constant is not: multiply into a new one
    masked = constant.mul_(valid_pair) if gathered else constant * valid_pair
    if not renormalize:
        return masked
    total = masked.sum(-1, keepdim=True)
    has_mass = total > 0
    masked.div_(torch.where(has_mass, total, 1.0))
    if not devices.reads_are_free(masked):  # rows with no mass left: the uniform rows there, with
        # no read of which rows they are (that read would wait for the device)
        return torch.where(has_mass, masked, _uniform(allowed, masked.dtype))
    example, _, query = (~has_mass[:, :, :, 0]).nonzero(as_tuple=True)  # rows with no mass left
    if example.numel():
        masked[example, _, query] = _uniform(allowed[example, 0, query], dtype)
    return masked


def softmax_pattern(
    logits: Float[Tensor, "head max_len max_len"],
    key_mask: Bool[Tensor, "batch key"],
    *,
    dtype: torch.dtype | None = None,
    causal: bool = False,
    positions: Int[Tensor, "batch key"] | None = None,
    check: bool = True,
) -> Float[Tensor, "batch head query key"]:
    """Pattern of trainable constants: a softmax of ``logits`` over each example's allowed keys
    (the valid keys; with ``causal`` only those at or before the query).

    Axes as in :func:`constant_pattern`. Padded query rows are uniform over the allowed keys.
    Differentiable in ``logits``. ``check=False``: as for :func:`constant_pattern` (the logits of
    :class:`TrainableConstants`, which its training refuses to make NaN).
    """
    logits, key_mask, dtype = _prepare(logits, key_mask, dtype, "logits", positions, check)
    allowed = allowed_keys(key_mask, causal=causal)
    scores = logits.masked_fill(~allowed, torch.finfo(dtype).min)
    pattern = torch.softmax(scores, dim=-1) * allowed.to(dtype)
    valid_query = key_mask[:, None, :, None]
    return torch.where(valid_query, pattern, _uniform(allowed, dtype))


def _prepare(
    matrix: Tensor, key_mask: Tensor, dtype: torch.dtype | None, name: str, positions: Tensor | None,
    check: bool = True,
) -> tuple[Tensor, Tensor, torch.dtype]:
    """Check ``matrix`` is ``[head, query, key]``, cut it to the batch's length (or gather it at a
    compact batch's ``positions``), cast it and put it on ``key_mask``'s device (the pattern's: a
    model on a GPU gets a GPU pattern), with a leading batch axis; the mask as bool.

    Refused by name: a ``matrix`` or ``key_mask`` that is not a torch tensor, a ``matrix`` that
    is not floating-point, a ``dtype`` that is not a floating torch dtype; where reading the
    matrix is free (the CPU, :func:`attnlens.core.devices.reads_are_free`) also a NaN or an
    infinity in it and, for a ``"constant"``, a negative weight (each would come back as NaN or
    silently uniform rows). On a device only the dtypes and shapes are checked; with ``check``
    false (constants checked when they were made) not the values either."""
    for label, value in ((name, matrix), ("key_mask", key_mask)):
        if not isinstance(value, Tensor):
            raise InputTypeError(
                f"{label} must be a torch tensor, got {describe(value)}; convert it with torch.as_tensor({label})."
            )
    if not matrix.is_floating_point():
        raise InputTypeError(
            f"{name} must be a floating-point tensor, got {describe(matrix)}; convert it with {name}.double() "
            "(or .float())."
        )
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise InputTypeError(
            f"dtype must be a floating torch dtype (e.g. torch.float32) or None (that of {name}), "
            f"got {dtype if isinstance(dtype, torch.dtype) else describe(dtype)}."
        )
    if check and devices.reads_are_free(matrix):
        if name == "constant":
            finite_tensor(matrix.detach(), "constant (attention weights: finite and >= 0, e.g. a layer of "
                          "PapaConstants.mean)", low=0.0)
        else:
            finite_tensor(matrix.detach(), f"{name} (finite numbers; NaN or inf would give NaN patterns)")
    if matrix.ndim != 3:
        raise InputError(f"{name} must be [head, query, key], got {tuple(matrix.shape)}.")
    dtype = dtype or matrix.dtype
    if positions is None:
        matrix = _fit_to(matrix, key_mask.shape[-1])[None]
    else:
        if positions.shape != key_mask.shape:
            raise InputError(
                f"positions {tuple(positions.shape)} must have the key mask's shape {tuple(key_mask.shape)}."
            )
        matrix = gather(matrix, positions)
    return matrix.to(device=key_mask.device, dtype=dtype), key_mask.to(dtype=torch.bool), dtype


class ConstantPatterns:
    """The patterns a batch gets from constants, for :class:`~attnlens.methods.papa.PapaConstants`
    (fitted or data-free averages, :func:`constant_pattern`) and
    :class:`~attnlens.methods.papa.TrainableConstants` (logits, :func:`softmax_pattern`) alike:
    a class supplies :meth:`_matrices` (some heads' ``[head, max_len, max_len]`` matrices of a
    layer) and :meth:`_pattern` (its rule from matrices to a batch's patterns), and gets a
    layer's pattern, several layers' stacked along the batch axis (:meth:`layer_pattern`), and
    several layers' chosen heads side by side (:meth:`heads_pattern`), each made in one call.
    Every row is restricted and renormalised on its own, so a head's pattern is the same bits
    whichever heads share the call."""

    causal: bool | None

    def tensors(self) -> dict[str, Tensor]:
        """The tensors these patterns are made from, by name."""
        raise NotImplementedError

    def checksum(self) -> str:
        """A stable hash of :meth:`tensors`: equal checksums, equal patterns (what a checkpoint
        of a pass that reads these constants records, :meth:`attnlens.engine.accumulator.Accumulator.settings`)."""
        return tensor_checksum({name: value.detach() for name, value in self.tensors().items()})

    def _matrices(self, layer: int, heads: Int[Tensor, "selected"] | Sequence[int] | None, dtype: torch.dtype,
                  device: torch.device) -> Float[Tensor, "head max_len max_len"]:
        raise NotImplementedError

    def _pattern(self, matrices: Float[Tensor, "head max_len max_len"], key_mask: Bool[Tensor, "batch key"], *,
                 dtype: torch.dtype, causal: bool, positions: Int[Tensor, "batch key"] | None,
                 ) -> Float[Tensor, "batch head query key"]:
        raise NotImplementedError

    def layer_pattern(
        self,
        layer: int | Sequence[int],
        key_mask: Bool[Tensor, "batch key"],
        *,
        dtype: torch.dtype,
        causal: bool | None = None,
        positions: Int[Tensor, "batch key"] | None = None,
        heads: Int[Tensor, "selected"] | Sequence[int] | None = None,
    ) -> Float[Tensor, "layer_batch head query key"]:
        """The pattern the constants of ``layer`` give a batch with this key mask
        (``[batch, key]``, True for real tokens).

        ``layer``: one layer (``layer_batch`` is then ``batch``), or a sequence of layers: their
        patterns stacked along the batch axis, layer after layer (the batch's patterns of
        ``layer[0]``, then of ``layer[1]``, ...; :meth:`attnlens.engine.accumulator.LayerPatterns.stack`),
        made in one call with every layer's heads side by side. ``causal`` defaults to the
        constants' own (False when that is unknown). ``positions``: the layout positions of a
        compact batch's columns (``None``: the columns are the positions). ``heads``: head
        indices (a tensor or a sequence of ints); only those heads' patterns are made (``head``
        is then ``len(heads)``), equal bit for bit to the same heads of the whole layer's.
        """
        causal = bool(self.causal) if causal is None else causal
        several = isinstance(layer, Sequence)
        matrices = [self._matrices(index, heads, dtype, key_mask.device) for index in (layer if several else [layer])]
        pattern = self._pattern(torch.cat(matrices) if several else matrices[0], key_mask, dtype=dtype,
                                causal=causal, positions=positions)
        return by_layer(pattern, len(matrices)) if several else pattern

    def heads_pattern(
        self,
        selected: Mapping[int, Sequence[int]],
        key_mask: Bool[Tensor, "batch key"],
        *,
        dtype: torch.dtype,
        causal: bool | None = None,
        positions: Int[Tensor, "batch key"] | None = None,
    ) -> Float[Tensor, "batch selected query key"]:
        """The patterns of the heads ``selected[layer]`` of each layer of ``selected``, side by
        side along the head axis in its order (``selected``: the heads of every layer, in turn),
        made in one call; each equal bit for bit to :meth:`layer_pattern` of its layer and heads.
        What the fast constant heads of a forward take, every patched layer's at once
        (:func:`attnlens.methods.papa.intervention` with ``fast=True``)."""
        causal = bool(self.causal) if causal is None else causal
        matrices = [self._matrices(layer, heads, dtype, key_mask.device) for layer, heads in selected.items()]
        return self._pattern(torch.cat(matrices), key_mask, dtype=dtype, causal=causal, positions=positions)
