"""The one check of attention maps given to a public function with a view (issue 61).

:func:`check_maps` is what :func:`attnlens.methods.patterns.classify` and
:meth:`attnlens.methods.patterns.PatternCNN.classify_batch` call on the maps they are given:

- every view: every entry is finite;
- a view whose maps are distributions (``"standard"`` and ``"papa"``: not
  :attr:`attnlens.methods.views.View.signed`): in every valid query row (a real token), every entry is
  non-negative, the keys the query cannot see (padding, positions beyond the example's length,
  and for a decoder (``causal``) the keys after the query) hold exactly 0, as a masked softmax
  gives (``exp(-inf) = 0``), and the visible keys sum to 1 within :func:`row_tolerance`;
- signed views (``"effective"``): finite only (their rows are signed and need not sum to 1).

Negative entries are refused in every row, padded query rows included (a softmax or a PAPA
constant is never negative). The refusal is one :class:`~attnlens.errors.InputError` naming the
rule broken, the first offending (example, head, row, key) in that order, its value, how many
entries (or rows) break the rule, and the fix.

The check reads the device once (one small tensor of four flags) when the maps are valid;
only a refusal reads more, to say where.
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from attnlens.errors import InputError

__all__ = ["check_maps", "row_tolerance"]

#: what a refusal of a distribution view suggests
_FIX = ("For signed maps (effective attention) pass view='effective'; check that tokens / key_mask "
        "match the map (padding, causal).")


def row_tolerance(dtype: torch.dtype, n_keys: int) -> float:
    """How far from 1 a valid row of ``n_keys`` keys may sum, for maps of ``dtype``.

    Derived from float32, the precision attention is computed in (a half-precision model's softmax
    accumulates in float32 and rounds its outputs): a softmax row is ``p_k = e_k / ŝ``, with ``ŝ``
    the float32 sum of the ``n_keys`` exponentials, whose relative error is at most
    ``(n_keys - 1)·u`` (``u = eps/2``, the unit roundoff of float32); rounding each ``p_k`` adds at
    most ``u`` relative to the row's mass, and a map stored in a narrower ``dtype`` adds its own
    rounding (``eps(dtype)/2`` of the mass). The row is summed here in float64 (exact enough), so
    ``|Σ p_k − 1| ≤ (n_keys + 1)·u + eps(dtype)/2``; the tolerance is twice that bound,
    ``(n_keys + 1)·eps32 + eps(dtype)``, for float64 maps too (they are most often float32 maps
    made wider). 512 keys: 6.1e-5 in float32, 1.0e-3 in float16, 7.9e-3 in bfloat16."""
    eps32 = torch.finfo(torch.float32).eps
    own = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    return (n_keys + 1) * eps32 + max(own, eps32)


def check_maps(
    pattern: Float[Tensor, "batch head query key"],
    key_mask: Bool[Tensor, "batch key"],
    *,
    view: str,
    signed: bool,
    causal: bool = False,
    what: str = "pattern",
) -> None:
    """Refuse ``pattern`` unless it is a map of the ``view`` named (see the module docstring).

    ``pattern``: ``[batch, head, query, key]``; ``key_mask``: ``[batch, key]``, True for real
    tokens (on ``pattern``'s device); ``signed``: the view's maps may be signed (only finiteness
    is checked); ``causal``: a decoder's maps (a query sees no later key); ``what``: the
    argument's name in messages."""
    finite = torch.isfinite(pattern)
    if signed:
        if not bool(finite.all()):
            raise _non_finite(pattern, finite, view, what)
        return
    valid = key_mask[:, None, :, None]  # [batch, 1, query, 1]: real query rows
    visible = key_mask[:, None, None, :] & valid  # [batch, 1, query, key]
    if causal:
        n = pattern.shape[-1]
        visible = visible & torch.ones(n, n, dtype=torch.bool, device=pattern.device).tril()
    masked = (pattern != 0) & ~visible & valid  # a valid row's weight on a key it cannot see
    # summed in float64 without a float64 copy; a valid row holds 0 on the keys it cannot see
    # (else ``masked`` refuses it first), so its whole sum is the sum over its visible keys
    sums = pattern.sum(-1, dtype=torch.float64)  # [batch, head, query]
    tolerance = row_tolerance(pattern.dtype, pattern.shape[-1])
    off = ((sums - 1.0).abs() > tolerance) & key_mask[:, None, :]
    flags = torch.stack([~finite.all(), (pattern < 0).any(), masked.any(), off.any(), ~key_mask.any()])
    bad_finite, negative, hidden, off_sum, no_row = flags.tolist()  # the one read of the device
    if bad_finite:
        raise _non_finite(pattern, finite, view, what)
    if no_row:
        raise InputError(f"{what}: the maps have no valid query row (key_mask / tokens are all padding).")
    if negative:
        where = (pattern < 0).nonzero()
        b, h, q, k = where[0].tolist()
        raise InputError(
            f"{what}: example {b}, head {h}, row {q} has weight {float(pattern[b, h, q, k]):.6g} on key "
            f"{k}, below 0 ({_many(len(where), 'negative entry', 'negative entries')}): a {view} map's rows are distributions "
            f"over their visible keys, never negative. {_FIX}")
    if hidden:
        where = masked.nonzero()
        b, h, q, k = where[0].tolist()
        why = ("after the query (causal)" if causal and k > q and bool(key_mask[b, k])
               else "a padding position (beyond the example's tokens)")
        raise InputError(
            f"{what}: example {b}, head {h}, row {q} has weight {float(pattern[b, h, q, k]):.6g} on key "
            f"{k}, which it cannot see ({why}; {_many(len(where), 'such entry', 'such entries')}): a {view} map is 0 on "
            f"masked keys, as a masked softmax gives. {_FIX}")
    if off_sum:
        where = off.nonzero()
        b, h, q = where[0].tolist()
        raise InputError(
            f"{what}: row {q} of head {h} of example {b} sums to {float(sums[b, h, q]):.7g} over its "
            f"visible keys, not 1 (tolerance {tolerance:.2g}, from float32 rounding; "
            f"{_many(len(where), 'such row', 'such rows')}): a {view} attention map's rows are distributions. {_FIX}")


def _non_finite(pattern: Tensor, finite: Tensor, view: str, what: str) -> InputError:
    where = (~finite).nonzero()
    b, h, q, k = where[0].tolist()
    return InputError(
        f"{what}: the maps hold NaN or infinite values ({_many(len(where), 'entry', 'entries')}; the first at example "
        f"{b}, head {h}, row {q}, key {k}: {float(pattern[b, h, q, k])}); a {view} map must be finite.")


def _many(count: int, one: str, many: str) -> str:
    return f"{count:,} {one if count == 1 else many}"
