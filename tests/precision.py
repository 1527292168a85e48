"""Float32 error bounds for tests that compare float32 results with exact (float64) references.

A tolerance here is derived, not observed: it must hold for any summation order, so for any BLAS
blocking and any number of threads. ``u`` is the float32 unit roundoff (half of machine epsilon);
first-order bounds (Higham, *Accuracy and Stability of Numerical Algorithms*, ch. 3-4).
"""

from __future__ import annotations

#: float32 unit roundoff: a float32 operation is exact times (1 + d), |d| <= U32
U32 = 2.0**-24


def gamma(n: int) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: ``n`` float32 roundings compounded."""
    return n * U32 / (1 - n * U32)


def float32_sum_error(terms: int) -> float:
    """A float32 sum of ``terms`` numbers, added in ANY order, is off from the exact sum by at
    most ``float32_sum_error(terms) * sum(|x_i|)`` (``gamma_{terms - 1}``)."""
    return gamma(max(terms - 1, 0))


def renormalized_row_error(keys: int, logit_spread: float = 0.0) -> float:
    """Relative error of one entry of a float32 attention row renormalized over ``keys`` keys,
    against the same row computed exactly from the same inputs:

    - a float32 constant (cast from float64: 1 rounding), divided by the float32 sum of the
      row (``gamma_{keys - 1}``) with one rounding for the division, or
    - a float32 softmax: the shift by the row maximum rounds ``l - max`` (``logit_spread * u``
      relative, once exponentiated), exp is within 1 ulp (2u), the sum ``gamma_{keys - 1}``,
      the normalization 2 roundings (reciprocal, product).

    Both are below ``(keys + 4 + logit_spread) * u``. Entries are at most 1, so this is also an
    absolute bound per entry, and ``|row sum - 1|`` is bounded by it too (the relative errors
    weigh entries that sum to 1).
    """
    return gamma(keys + 4) + logit_spread * U32
