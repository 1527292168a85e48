"""Effective attention A⊥ (Brunner et al. 2020; Sun & Marasović 2021), batched in torch.

A head's output is ``A V``. Any component of a row of ``A`` that lies in the left null space of
``V`` (the vectors ``x`` with ``x V = 0``) never reaches the output. Effective attention removes
it: ``A⊥ = A P`` where ``P`` is the orthogonal projector onto the column space of ``V``, so that
``A⊥ V = A V`` and ``A⊥`` is the part of ``A`` that matters.

This module holds the one place where effective attention is computed,
:func:`effective_attention`. Everything is batched over examples and heads, stays on the
tensors' device, and never goes through NumPy.

Computation
-----------
For each (example, head), with ``V_valid`` the value matrix restricted to the valid keys
(padded keys' rows set to 0), an orthonormal basis ``U`` (``[key, r]``) of its column space is
built, and ``A⊥ = (A U) Uᵀ``; the ``key x key`` projector is never materialised. Three routes
build ``U``; every head gets the cheapest one that is certified for it:

- Refined route (float32 / float16 / bfloat16 inputs; the fast path): Cholesky QR in float32,
  ``G = V_validᵀ V_valid = L Lᵀ`` and ``U₁ = V_valid L⁻ᵀ``, then one refinement step
  ``U = U₁ (I − E/2 + 3E²/8)`` with ``E = U₁ᵀU₁ − I``, the second-order expansion of
  ``(I + E)^(-1/2)``, which leaves an orthogonality defect of order ``E³``. ``E`` is about
  ``eps · κ(V)²``; the head is accepted when ``max |E| ≤`` :data:`~attnlens.engine.bases.REFINE_MAX_DEFECT` (``κ`` up to
  about 200) and a cheap certificate proves every singular value above the tolerance
  (``σ_min² ≥ 1 / ‖L⁻¹‖_F²`` and ``σ_max² ≤ trace G``). The remaining error is that of the
  subspace, about ``eps · κ``: on MiniLM activations (``κ < 60`` for sequences of 40 keys or more)
  it agrees with the float64 reference to about 1e-6 absolute at worst, most heads within 3e-7
  (tests allow 1e-5). Only float32
  matrix products and two batched LAPACK calls on ``d_head x d_head`` matrices are involved.
- Exact route (float64, for the heads the refined route does not certify: nearly square or badly
  conditioned ``V_valid``, e.g. a sequence of ``d_head + 1`` keys, or rank-deficient ones): the
  rule from the float64 Gram matrix's eigendecomposition, ``U = V_valid Q_r Σ_r⁻¹`` over the
  eigenpairs kept by the tolerance. Forming ``G`` squares the condition number, but in float64
  singular values are still resolved down to about ``1e-7 · σ_max``, well below the default
  tolerance for these dtypes (at least ``33 · 1.19e-7 = 3.9e-6``). Off the CPU one read per
  call says which heads need it (a pass makes every layer's maps of a batch in one call:
  one read a batch), and only those heads get it, the same arithmetic per head as on the CPU;
  heads up to :data:`NO_READ_WIDTH` wide (none by default) instead get every head's exact
  basis, taken where the refined one is not certified (``torch.where``: no read).
- QR route (float64 inputs, or any ``rtol`` below :data:`~attnlens.engine.bases.GRAM_MIN_RTOL`): ``V_valid = Q R``,
  ``R = U_R Σ W_Rᵀ`` (SVD of the small ``R``), ``U = Q U_R[:, kept]``, accurate to float64
  working precision but slower.

The two products ``(A U) Uᵀ`` run in the pattern's dtype promoted to at least float32 (float32
for float32 / half inputs, float64 for float64 inputs); the result is cast back to the pattern's
dtype. For float64 inputs the result agrees with the reference to about 1e-14. float64 is not
available on Apple's MPS backend: there the small decomposition runs on the CPU.

Rank tolerance
--------------
A direction is kept when its singular value exceeds ``rtol · σ_max``, with ``σ_max`` the largest
singular value of *that* (example, head)'s ``V_valid``. The default ``rtol`` is NumPy's
``matrix_rank`` default, ``max(n, d_head) · eps``, with ``n`` the sequence's number of valid keys
(``key`` when ``padded=True``) and ``eps`` the machine epsilon of ``v``'s dtype promoted to at
least float32: 1.19e-7 for float32, float16 and bfloat16 values, 2.2e-16 for float64. (Half
precision values are exact float32 numbers; their own epsilon, times ``n``, would be 0.05 to 0.5
and would discard well-determined directions, breaking ``A⊥ V = A V``.)

Short sequences
---------------
When a sequence has at most ``d_head`` valid keys, ``V_valid`` has at least as many columns as
rows, and when those rows, the value vectors, are linearly independent the left null space is
trivial and ``A⊥ = A``: with the default tolerance that sequence's rows are returned exactly (bit
for bit on its valid keys; padded keys' columns are 0 as everywhere) and no decomposition is
computed for it, once every head's values are certified independent
(:func:`_independent_values`: a float64 Cholesky factorisation of the ``key x key`` Gram matrix
``V_valid V_validᵀ``). They need not be: a model without positions in its residual stream (RoPE:
Llama, Qwen2, Mistral) gives a repeated token the same values at its first layer, and a sequence
not certified is decomposed like a long one. With an explicit ``rtol`` every sequence is
decomposed, since a large tolerance can drop directions of a short one too.

Causal models
-------------
On a decoder (``causal=True``) each row is projected onto the values of the keys its query reads:
:mod:`attnlens.engine.effective_causal`.
"""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from attnlens.core import devices
from attnlens.core.checks import describe, finite, finite_tensor, flag
from attnlens.core.seam import key_mask as infer_key_mask
from attnlens.engine import bases
from attnlens.engine.bases import GRAM_MIN_RTOL, cholesky_inverse_factor
from attnlens.engine.effective_causal import causal_effective_attention
from attnlens.errors import InputError, InputTypeError

#: widest head whose exact basis the device route computes for every head, with no read of the
#: device (taken where the refined one is not certified); wider heads take one read of whether
#: any head needs it, and only those heads get it. 0: every head reads. The exact basis of every
#: head is a float64 eigendecomposition of each head of each batch, where the read is one wait
#: per call and the heads the float32 route does not certify are almost never there on real
#: activations: on the H200 (2026-11-28, 4c2cc51) it took 32 ms of the 169 ms ``compare`` kept
#: the GPU busy at batch 128, and ``effective.run`` went from 2.09x to 2.60x a forward when it
#: began to take it. Above 32 x 32 PyTorch's CUDA eigendecomposition of a batch is a loop over
#: the matrices (one batched Jacobi kernel, ``syevjBatched``, up to 32): for BERT-base's 64-wide
#: heads, thousands of calls a batch. ``benchmarks/effective.py --device cuda`` times
#: ``effective.run`` both ways (this at 0 and at ``d_head``), ``compare_cost.py`` ``compare``, for a GPU to choose
NO_READ_WIDTH = 0


#: d_head values already warned about by :func:`warn_if_short` (once per process each)
_WARNED: set[int] = set()


def short_text_note(d_head: int) -> str:
    """The sentence reports and warnings use for texts of at most ``d_head`` tokens."""
    return (
        f"effective attention differs from standard attention only for texts longer than "
        f"d_head = {d_head} tokens (with at most d_head tokens the values span every direction, "
        "so A⊥ = A), or whose value vectors are linearly dependent (a repeated token at the first "
        "layer of a model without position embeddings, e.g. RoPE)"
    )


def warn_if_short(n_longer: int, d_head: int) -> None:
    """Warn once per process when no text was longer than ``d_head`` tokens: effective
    attention then equals standard attention by construction."""
    if n_longer == 0 and d_head not in _WARNED:
        _WARNED.add(d_head)
        warnings.warn(
            f"No text has more than d_head = {d_head} tokens: {short_text_note(d_head)}. "
            "Use longer texts (or a larger max_len) to see a difference.",
            UserWarning,
            stacklevel=_caller_level(),
        )


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside attnlens (and run-time type checkers), so
    a warning points at the user's line."""
    package = str(Path(__file__).resolve().parents[1])
    frame, level = sys._getframe(1), 1
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith(package) or "jaxtyping" in name or "beartype" in name or name.startswith("<@beartype")):
            return level
        frame, level = frame.f_back, level + 1
    return 2


def check_rtol(rtol: Any) -> float | None:
    """``rtol`` of :func:`effective_attention`: None (the default tolerance) or a finite number in
    ``(0, 1)``, else refused by name (it is relative to each head's largest singular value of
    ``V``: at 1 or more every direction is dropped)."""
    if rtol is None:
        return None
    if isinstance(rtol, str):
        raise InputTypeError(f"rtol must be a number (e.g. 1e-6), got the string {rtol!r}.")
    rtol = finite(rtol, "rtol")
    if not 0.0 < rtol < 1.0:
        raise InputError(
            f"rtol must lie in (0, 1), got {rtol}: it is relative to each head's largest singular value "
            "of V, and directions at or below rtol·σ_max are dropped (rtol >= 1 drops them all). "
            "Pass e.g. rtol=1e-6, or None for the default."
        )
    return rtol


def effective_attention(
    pattern: Float[Tensor, "batch head query key"],
    v: Float[Tensor, "batch kv_head key d_head"],
    *,
    key_mask: Bool[Tensor, "batch key"] | None = None,
    rtol: float | None = None,
    padded: bool = False,
    check: bool = True,
    shortest: int | None = None,
    causal: bool = False,
) -> Float[Tensor, "batch head query key"]:
    """Effective attention ``A⊥ = A P``: the part of each attention row that reaches the output.

    Axes: ``batch`` examples, ``head`` attention heads, ``query`` / ``key`` token positions,
    ``d_head`` the value dimension of a head. ``pattern`` is the attention ``A`` (rows over keys),
    ``v`` the per-head value vectors in the same layout as the pattern's heads (TransformerLens'
    ``hook_v`` is ``[batch, key, head, d_head]``: pass ``einops.rearrange(v, "b k h d -> b h k d")``),
    or with grouped key-value heads ``[batch, kv_head, key, d_head]``: query head ``h`` reads
    key-value head ``h // (head / kv_head)``, as Hugging Face's ``repeat_kv`` (a decoder's causal
    rule then certifies each key-value head's values once for the query heads that share them).

    ``P`` projects onto the column space of ``V`` restricted to the valid keys (``key_mask``;
    by default read with :func:`attnlens.core.seam.key_mask`, i.e. from the model inside a
    ``hook_pattern`` hook and otherwise from the keys that receive non-zero attention). Padded
    keys are thus excluded and the result does not depend on padding: columns of padded keys are
    0, and attention that ``pattern`` may put on padded keys is dropped. ``A⊥ V_valid = A V_valid``
    for every row, padded query rows included.

    ``rtol``: rank tolerance relative to each (example, head)'s largest singular value of
    ``V_valid``, in ``(0, 1)``; default ``max(n_valid, d_head) · eps`` (NumPy's ``matrix_rank`` rule), ``eps``
    that of ``v``'s dtype promoted to at least float32.

    ``padded=True`` reproduces the padded-length semantics of Sun & Marasović's code: ``V`` is
    taken over *all* ``key`` positions, including padding, whatever ``key_mask`` says. What
    changes: ``P`` then also spans the padded tokens' value vectors (which are real vectors: the
    [PAD] embedding passed through the layers), so its rank grows with padding and ``A⊥`` changes
    with the amount of padding in the batch; ``A⊥`` can put mass on padded keys; the default
    tolerance uses the padded length; and the exact ``A⊥ = A`` shortcut applies only when the
    padded length is at most ``d_head``. ``A⊥ V = A V`` still holds, since ``A`` is 0 on padded
    keys. Only the padded-length ``V`` is reproduced; the original code also used an absolute rank
    bound (a multiple of eps, not scaled by ``σ_max``), one rank for the whole batch (the maximum
    over examples and heads), and zeroed the padded keys' columns afterwards (which breaks
    ``A⊥ V = A V``); attnlens keeps its per-head relative tolerance and leaves those columns as
    computed (multiply by the key mask to zero them).

    With the default ``rtol``, sequences with at most ``d_head`` valid keys whose value vectors
    are certified linearly independent are returned exactly (no decomposition; an explicit
    ``rtol`` decomposes them too); a short sequence with dependent values (a repeated token at the
    first layer of a RoPE model) is decomposed. The
    basis is built in float32 with one refinement step, falling back to float64 for heads whose
    values are badly conditioned; the products run in float32 (float64 for float64 inputs); see
    :mod:`attnlens.engine.effective` for the routes and their accuracy. Returns a new tensor of
    ``pattern``'s shape, dtype and device.

    ``causal``: a decoder's pattern (square, query ``q`` at key position ``q``): each row is
    projected onto the values of the valid keys ``k ≤ q`` only, ``A⊥[q, :q+1] = V_≤q G_q⁺ o_q``
    with ``G_q = V_≤qᵀ V_≤q`` and ``o_q = (A V)_q``, and ``A⊥[q, k > q] = 0``: lower-triangular,
    with ``A⊥ V = A V`` row by row from the keys each query reads (see "Causal models" in
    :mod:`attnlens.engine.effective`). ``rtol`` then applies to each row's ``V_≤q`` (default
    ``max(n_q, d_head) · eps``); padded keys' columns are 0, and a row's weight on keys after it
    (a left-padded run's padded query rows, which see no key) is dropped; ``padded=True`` takes
    every position up to ``q``. :func:`attnlens.methods.effective.run`, ``hooks``, ``statistics``
    and the passes set it from :func:`attnlens.core.loading.is_causal`. Default False (an
    encoder: the whole sequence's values, unchanged).

    ``shortest``: the fewest valid keys of a sequence of the batch, where the caller knows it
    without reading the device (a pass, from the host's copy of its inputs); above ``d_head`` no
    sequence is short, and off the CPU their certificate is not computed. None: not known.

    ``check``: refuse a pattern or values with NaN or infinite entries (one read of the device
    per call). A pass leaves it off: its patterns and values come from the model, and a read per
    layer would make the host wait for the device at every layer.

    On a device other than the CPU one value is read back to the host, which heads need the
    float64 fallback (only those heads get it): every sequence is decomposed and the short ones
    certified independent keep ``A`` (``torch.where``). The result is the CPU route's, computed
    with the same routes.
    """
    for name, value in (("pattern", pattern), ("v", v), ("key_mask", key_mask)):
        if value is not None and not isinstance(value, Tensor):
            raise InputTypeError(
                f"{name} must be a torch tensor, got {describe(value)}; convert it with "
                f"torch.as_tensor({name})."
            )
    for name, value in (("pattern", pattern), ("v", v)):
        if value is not None and not value.is_floating_point():
            raise InputTypeError(
                f"{name} must be a floating-point tensor (float32, float64, float16 or bfloat16), got "
                f"{describe(value)}; an integer {name} would give a truncated result: convert it with {name}.float()."
            )
    flag(padded, "padded")
    flag(check, "check")
    flag(causal, "causal")
    rtol = check_rtol(rtol)
    if check:
        finite_tensor(v, "v (the values)")
        finite_tensor(pattern, "pattern (the attention)")
    if pattern.ndim != 4:
        raise InputError(
            f"pattern must be [batch, head, query, key], got shape {tuple(pattern.shape)}; "
            "for a single example add the batch axis with pattern[None] (and v[None])."
        )
    batch, n_heads, _, n_keys = pattern.shape
    if v.ndim != 4 or v.shape[0] != batch or v.shape[2] != n_keys or v.shape[1] < 1 or n_heads % v.shape[1]:
        raise InputError(
            f"v must be [batch, head, key, d_head] = [{batch}, {n_heads}, {n_keys}, d_head] to match "
            f"pattern {tuple(pattern.shape)} (or [batch, kv_head, key, d_head] with {n_heads} query heads "
            f"sharing kv_head key-value heads evenly), got {tuple(v.shape)}. TransformerLens' hook_v is "
            "[batch, key, head, d_head]: pass einops.rearrange(v, 'b k h d -> b h k d')."
        )
    d_head = v.shape[-1]
    if key_mask is not None and tuple(key_mask.shape) != (batch, n_keys):
        raise InputError(f"key_mask must be [batch, key] = [{batch}, {n_keys}], got {tuple(key_mask.shape)}")
    if padded:
        valid = torch.ones(batch, n_keys, dtype=torch.bool, device=pattern.device)
    elif key_mask is None:
        valid = infer_key_mask(pattern, causal=causal) if causal else infer_key_mask(pattern)
    else:
        valid = key_mask.to(device=pattern.device, dtype=torch.bool)
    lengths = valid.sum(-1)
    if rtol is not None and not (math.isfinite(rtol) and rtol >= 0):
        raise InputError(f"rtol must be a finite number >= 0, got {rtol}")
    # The QR route for float64 values or a tolerance the refined and exact routes cannot resolve. The default
    # tolerance of a decomposed sequence, n · eps with n > d_head, is at least (d_head + 1) · eps
    # (decided on the host, from the shapes: no read of the device)
    eps = torch.finfo(torch.promote_types(v.dtype, torch.float32)).eps
    smallest = rtol if rtol is not None else (d_head + 1) * eps
    use_qr = v.dtype == torch.float64 or smallest < GRAM_MIN_RTOL
    if causal and pattern.shape[2] != n_keys:
        raise InputError(
            f"causal=True needs a square pattern (query i is key position i), got {pattern.shape[2]} "
            f"queries and {n_keys} keys; pass causal=False for a pattern of other queries."
        )
    if causal:
        step = max(1, bases.CAUSAL_CPU_BYTES // (n_heads * n_keys * n_keys * 8))
        if devices.reads_are_free(pattern) and batch > step:  # a few sequences at a time (the same numbers)
            return torch.cat([
                effective_attention(pattern[first:first + step], v[first:first + step], key_mask=valid[first:first + step],
                                    rtol=rtol, padded=padded, check=False, causal=True)
                for first in range(0, batch, step)
            ])
        return causal_effective_attention(pattern, v, valid, rtol, use_qr,
                                          every=not devices.reads_are_free(pattern) and v.shape[-1] <= NO_READ_WIDTH)
    v = v.repeat_interleave(n_heads // v.shape[1], dim=1) if v.shape[1] != n_heads else v  # each query head's
    if not devices.reads_are_free(pattern):
        return _on_device(pattern, v, valid, lengths, rtol, use_qr, shortest)
    if rtol is None:
        eps = torch.finfo(torch.promote_types(v.dtype, torch.float32)).eps
        tolerance = lengths.cpu().clamp_min(d_head).to(torch.float64) * eps
    else:
        tolerance = torch.full((batch,), float(rtol), dtype=torch.float64)

    # sequences to decompose: with the default tolerance those with a non-trivial left null space,
    # the longer than d_head and the short ones whose values are not certified independent; a
    # given rtol may also cut the rank of a short one, so then every non-empty sequence
    decomposed = lengths > (d_head if rtol is None else 0)
    short = ~decomposed & (lengths > 0)
    if rtol is None and bool(short.any()):
        rows = short.nonzero().squeeze(-1)
        decomposed[rows] = ~_independent_values(v[rows], valid[rows], tolerance[rows])
    if not bool(decomposed.all()):  # the others keep A on their valid keys
        kept = pattern if bool(valid.all()) else pattern.masked_fill(~valid[:, None, None, :], 0)
        if not bool(decomposed.any()):
            return kept.clone() if kept is pattern else kept
    rows = None if bool(decomposed.all()) else decomposed.nonzero().squeeze(-1)
    take = (lambda x: x) if rows is None else (lambda x: x[rows])
    compute = torch.promote_types(pattern.dtype, torch.float32)
    tolerance = tolerance[decomposed.cpu()]  # one per sequence decomposed
    basis = _column_space_basis(take(v), take(valid), tolerance, use_qr=use_qr)
    basis = basis.to(compute)
    effective = (take(pattern).to(compute) @ basis) @ basis.mT
    if rows is None:
        return effective.to(pattern.dtype)
    out = kept.clone() if kept is pattern else kept
    out[rows] = effective.to(pattern.dtype)
    return out


def _on_device(
    pattern: Float[Tensor, "batch head query key"],
    v: Float[Tensor, "batch head key d_head"],
    valid: Bool[Tensor, "batch key"],
    lengths: Tensor,
    rtol: float | None,
    use_qr: bool,
    shortest: int | None = None,
) -> Float[Tensor, "batch head query key"]:
    """:func:`effective_attention` with at most one read of the device (which heads need
    the exact basis, :func:`_column_space_basis`; none for heads up to :data:`NO_READ_WIDTH`
    wide): every sequence decomposed, the short ones (at most ``d_head`` keys, default tolerance)
    whose values are certified independent (:func:`_independent_values`) keeping ``A`` on their
    valid keys."""
    d_head = v.shape[-1]
    if rtol is None:
        eps = torch.finfo(torch.promote_types(v.dtype, torch.float32)).eps
        tolerance = lengths.clamp_min(d_head).to(torch.float64) * eps
    else:
        tolerance = torch.full(lengths.shape, float(rtol), dtype=torch.float64, device=v.device)
    compute = torch.promote_types(pattern.dtype, torch.float32)
    decomposed = lengths > (d_head if rtol is None else 0)
    # a short sequence whose values are not certified independent is decomposed too (none is
    # short when the host knows the shortest is longer than d_head)
    if rtol is None and (shortest is None or shortest <= d_head):
        decomposed = decomposed | ~_independent_values(v, valid, tolerance)
    # every sequence at most d_head long (the shapes say so): the refined basis certifies none of
    # those decomposed (fewer keys than d_head: a singular Gram matrix; d_head keys not certified
    # independent: beyond its conditioning), so only the exact route runs, for them
    refined = rtol is not None or v.shape[2] > d_head
    basis = _column_space_basis(v, valid, tolerance, use_qr=use_qr, reads=False, needed=decomposed, refined=refined)
    basis = basis.to(compute)
    effective = ((pattern.to(compute) @ basis) @ basis.mT).to(pattern.dtype)
    kept = pattern.masked_fill(~valid[:, None, None, :], 0)
    return torch.where(decomposed[:, None, None, None], effective, kept)


def _independent_values(
    v: Float[Tensor, "batch head key d_head"], valid: Bool[Tensor, "batch key"], tolerance: Float[Tensor, "batch"]
) -> Bool[Tensor, "batch"]:
    """Whether each sequence's value vectors, the rows of every head's ``V_valid``, are certified
    linearly independent: then the left null space is trivial and ``A⊥ = A``. Not so for every
    short sequence: a model without positions in its residual stream (RoPE: Llama, Qwen2,
    Mistral) gives a repeated token the same values at its first layer.

    The ``key x key`` Gram matrix ``H = V_valid V_validᵀ`` in float64 (a padded key gets a unit
    row of its own at the scale of the largest valid one, so that it decouples) is factored
    ``H = L Lᵀ``, and every singular value must pass ``tolerance`` (the certificate of
    :func:`~attnlens.engine.bases.full_rank_certified`), but never less than
    :data:`~attnlens.engine.bases.GRAM_MIN_RTOL`: float64 resolves ``H``'s eigenvalues to about
    ``1e-15 ‖H‖``, so singular values of ``V`` down to about
    ``3e-8 σ_max``, and a factorisation that succeeds on rounding alone passes no smaller
    tolerance. A sequence not certified is decomposed, which finds its rank either way.

    Only sequences of at most ``d_head`` keys are asked about (a longer one's answer is not
    used): with more keys than that in the batch, each sequence's valid keys are brought first
    and its first ``d_head`` taken, so that a matrix is never larger than ``d_head x d_head``."""
    batch, n_heads, n_keys, d_head = v.shape
    device = v.device
    if device.type == "mps":  # no float64 on MPS: on the CPU
        v, valid, tolerance = v.cpu(), valid.cpu(), tolerance.cpu()
    if n_keys > d_head:
        first = torch.sort(valid.to(torch.uint8), dim=-1, descending=True, stable=True).indices[:, :d_head]
        v = v.gather(2, first[:, None, :, None].expand(batch, n_heads, d_head, d_head))
        valid, n_keys = valid.gather(1, first), d_head
    flat = (v.double() * valid[:, None, :, None]).reshape(batch * n_heads, n_keys, d_head)
    gram = flat @ flat.mT
    diagonal = gram.diagonal(dim1=-2, dim2=-1)
    largest = diagonal.amax(-1, keepdim=True)
    diagonal.add_((~valid).repeat_interleave(n_heads, dim=0) * torch.where(largest > 0, largest, 1.0))
    factor_inv, info = cholesky_inverse_factor(gram)
    floor = tolerance.to(device=gram.device, dtype=torch.float64).clamp_min(GRAM_MIN_RTOL)
    certified = (info == 0) & bases.full_rank_certified(gram, factor_inv, floor.repeat_interleave(n_heads))
    return certified.view(batch, n_heads).all(-1).to(device)


def _column_space_basis(
    v: Float[Tensor, "batch head key d_head"],
    valid: Bool[Tensor, "batch key"],
    tolerance: Float[Tensor, "batch"],
    *,
    use_qr: bool,
    reads: bool = True,
    needed: Bool[Tensor, "batch"] | None = None,
    refined: bool = True,
) -> Float[Tensor, "batch head key d_head"]:
    """Orthonormal basis of the column space of each head's ``V_valid``.

    ``tolerance`` (float64, any device) is each example's ``rtol``. Columns for directions below
    the tolerance are 0, so ``basis @ basis.mT`` is the projector. float32 from the refined route,
    float64 from the QR route (see the module docstring). ``needed``: the examples whose bases
    are used (default all); the others' (the device route's short sequences certified
    independent, which keep ``A``) never get the exact route, whatever their refined basis (a sequence of fewer than ``d_head``
    keys is never certified: its Gram matrix is singular). ``refined=False``: no refined basis
    (none would be certified), every needed head takes the exact route.
    """
    batch, n_heads, n_keys, d_head = v.shape
    device = v.device
    if device.type == "mps":  # no float64 on MPS: decompose on the CPU
        v, valid = v.cpu(), valid.cpu()
    values = v.to(torch.float64 if use_qr else torch.float32)
    padded = not reads or not bool(valid.all())
    if padded:
        values = values * valid[:, None, :, None].to(values.dtype)
    flat = values.reshape(batch * n_heads, n_keys, d_head)
    tolerance = tolerance.to(device=flat.device).repeat_interleave(n_heads)  # one per matrix
    if use_qr:
        basis = bases.basis_qr(flat, tolerance)
        if padded:  # Householder vectors may leave rounding on the zeroed rows
            basis = basis * valid.repeat_interleave(n_heads, dim=0)[:, :, None].to(basis.dtype)
    else:
        if refined:
            basis, certified = bases.basis_refined(flat, tolerance)
        else:
            basis = torch.zeros_like(flat)
            certified = torch.zeros(flat.shape[0], dtype=torch.bool, device=flat.device)
        if needed is not None:
            certified = (certified.view(batch, n_heads) | ~needed.to(certified.device)[:, None]).view(-1)
        if not reads and d_head <= NO_READ_WIDTH:  # the exact basis of every head, taken where the fast one fails
            fallback = bases.basis_exact(flat.double(), tolerance).to(basis.dtype)
            basis = torch.where(certified[:, None, None], basis, fallback)
        else:  # (off the CPU too: one read, which heads need it; the exact basis of those alone)
            heads = (~certified).nonzero().squeeze(-1)
            if heads.numel():
                basis[heads] = bases.basis_exact(flat[heads].double(), tolerance[heads]).to(basis.dtype)
    basis = basis.reshape(batch, n_heads, n_keys, d_head)
    return basis if device.type != "mps" else basis.to(device=device, dtype=torch.float32)
