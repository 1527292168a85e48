"""Checked arguments, in one place: whole numbers, finite numbers in a range, tensor shapes.

Every public function validates its numbers through these, so a bad value gets one error that
names the argument and the accepted forms, never a NaN that slips past a range check (``nan < 0``
and ``nan > 1`` are both false) and never a message that embeds a model's or a tensor's repr
(:func:`describe` names a value by its type and shape instead).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from attnlens.errors import InputError, InputTypeError


def describe(value: Any) -> str:
    """A short description of ``value`` for messages: a tensor by its shape and dtype, a short
    number or string by its repr, anything else by its type."""
    if isinstance(value, Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    if isinstance(value, bool | int | float | complex) or (isinstance(value, str) and len(value) <= 60):
        return repr(value)
    return f"a {type(value).__name__}"


def whole_number(value: Any, name: str, unit: str = "", *, minimum: int | None = None) -> int:
    """``value`` as an ``int`` (a NumPy integer is fine); ``TypeError`` naming ``name`` for
    anything else (a float, a string, ``None``, a bool); ``ValueError`` below ``minimum``."""
    number: int | None = None
    if not isinstance(value, bool):
        try:
            number = operator.index(value)
        except TypeError:
            number = None
    if number is None:
        raise InputTypeError(f"{name} must be a whole number{unit}, got {describe(value)}")
    if minimum is not None and number < minimum:
        raise InputError(f"{name} must be at least {minimum}, got {number}")
    return number


def finite(
    value: Any, name: str, *, low: float | int | None = None, high: float | int | None = None
) -> float:
    """``value`` as a finite ``float`` in ``[low, high]``; ``ValueError`` naming ``name`` for
    NaN, infinities and values out of range, ``TypeError`` for non-numbers."""
    if isinstance(value, bool) or not isinstance(value, int | float) and not (
        isinstance(value, Tensor) and value.numel() == 1
    ):
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise InputTypeError(f"{name} must be a number, got {describe(value)}") from None
    number = float(value)
    if not math.isfinite(number):
        raise InputError(f"{name} must be a finite number, got {number}")
    if (low is not None and number < low) or (high is not None and number > high):
        raise InputError(f"{name} must lie in [{low}, {high}], got {number}")
    return number


def finite_tensor(
    value: Tensor, name: str, *, low: float | int | None = None, high: float | int | None = None
) -> Tensor:
    """``value`` unchanged if every element is finite and in ``[low, high]``; else one
    ``ValueError`` saying how many elements are not, and the first such index."""
    bad = ~torch.isfinite(value)
    what = "not finite (NaN or inf)"
    if not bool(bad.any()):
        if low is not None:
            bad = value < low
            what = f"below {low}"
        if high is not None and not bool(bad.any()):
            bad = value > high
            what = f"above {high}"
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0].tolist())
        raise InputError(f"{name}: {int(bad.sum())} of {value.numel()} values are {what} (first at index {first})")
    return value


def shape(value: Any, name: str, expected: Sequence[int | None], what: str = "") -> Tensor:
    """``value`` as a tensor of shape ``expected`` (``None`` matches any size); ``ValueError``
    naming ``name``, the shape found and the one expected (``what`` names its axes)."""
    if not isinstance(value, Tensor):
        try:
            value = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError):
            raise InputTypeError(f"{name} must be a tensor or a number, got {describe(value)}") from None
    found = list(value.shape)
    ok = len(found) == len(expected) and all(e is None or e == f for e, f in zip(expected, found, strict=True))
    if not ok:
        axes = f" ({what})" if what else ""
        wanted = [e if e is not None else "any" for e in expected]
        raise InputError(f"{name} has shape {found}; expected {wanted}{axes}")
    return value
