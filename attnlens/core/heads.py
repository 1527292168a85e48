"""Sets of attention heads: one :class:`HeadSet`, shared by PAPA, ablation and importance.

A :class:`HeadSet` is a boolean ``[layer, head]`` mask with the order its heads were chosen in
(and, when a strategy ranked them, its scores). Fractions and counts are spelled apart
everywhere: a fraction is a ``float`` in ``[0, 1]`` (``0.5``: half of the heads;
:func:`n_selected` rounds it), a count is ``n=`` (an ``int``); ``heads=1`` alone is refused as
ambiguous.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from attnlens.core.checks import describe, finite, whole_number
from attnlens.core.notebook import headset_html
from attnlens.errors import InputError, InputTypeError


@dataclass(eq=False)
class HeadSet:
    """A set of attention heads: ``mask`` is boolean ``[layer, head]``.

    ``order`` lists the selected heads as ``(layer, head)`` in replacement order (row-major when
    built from a mask); ``scores`` is the ``[layer, head]`` score a strategy ranked by (``λ``,
    input dependence), when it has one; ``strategy`` names it.
    """

    mask: Bool[Tensor, "layer head"]
    order: list[tuple[int, int]] | None = None
    scores: Float[Tensor, "layer head"] | None = None
    strategy: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.mask, Tensor) and self.mask.dtype.is_floating_point:
            raise InputTypeError(f"HeadSet mask must be a bool [layer, head] tensor, got {describe(self.mask)}; "
                                 "use mask > 0 or HeadSet.from_heads([(layer, head), ...]).")
        self.mask = torch.as_tensor(self.mask, dtype=torch.bool).cpu()
        if self.mask.ndim != 2:
            raise InputError(f"HeadSet mask must be [layer, head], got {tuple(self.mask.shape)}.")
        listed = [tuple(map(int, pair)) for pair in self.mask.nonzero().tolist()]
        if self.order is None:
            self.order = listed
        else:
            self.order = [(int(layer), int(head)) for layer, head in self.order]
            if sorted(self.order) != listed:
                raise InputError("HeadSet order must list exactly the heads in its mask.")

    @classmethod
    def all(cls, n_layers: int, n_heads: int) -> HeadSet:
        return cls(torch.ones(*checked_sizes(n_layers, n_heads), dtype=torch.bool), strategy="all")

    @classmethod
    def none(cls, n_layers: int, n_heads: int) -> HeadSet:
        return cls(torch.zeros(*checked_sizes(n_layers, n_heads), dtype=torch.bool), strategy="none")

    @classmethod
    def from_heads(cls, heads: Iterable[tuple[int, int]], n_layers: int, n_heads: int) -> HeadSet:
        """From ``(layer, head)`` pairs, kept in the given order."""
        n_layers, n_heads = checked_sizes(n_layers, n_heads)
        pairs = "heads must be (layer, head) pairs of whole numbers, e.g. [(0, 3), (5, 11)]"
        if isinstance(heads, str | bytes | Tensor) or not isinstance(heads, Iterable):
            raise InputTypeError(f"{pairs}; got {describe(heads)}.")
        order = []
        for i, pair in enumerate(heads):
            if isinstance(pair, str | bytes) or not isinstance(pair, Sequence | Tensor) or len(pair) != 2:
                raise InputError(f"{pairs}; heads[{i}] is {describe(pair)}.")
            order.append((whole_number(pair[0], f"heads[{i}]'s layer"), whole_number(pair[1], f"heads[{i}]'s head")))
        mask = torch.zeros(n_layers, n_heads, dtype=torch.bool)
        for layer, head in order:
            if not (0 <= layer < n_layers and 0 <= head < n_heads):
                raise InputError(
                    f"head {(layer, head)} is outside the model's {n_layers} layers x {n_heads} heads; "
                    f"layers are 0..{n_layers - 1} and heads 0..{n_heads - 1}."
                )
            if mask[layer, head]:
                raise InputError(f"head {(layer, head)} is listed twice.")
            mask[layer, head] = True
        return cls(mask, order=order)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.mask.shape)

    def __len__(self) -> int:
        return int(self.mask.sum())

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self.order)

    def __contains__(self, head: object) -> bool:
        return isinstance(head, tuple) and len(head) == 2 and bool(self.mask[head])

    def __invert__(self) -> HeadSet:
        return HeadSet(~self.mask)

    def __repr__(self) -> str:
        label = f", strategy={self.strategy!r}" if self.strategy else ""
        return f"HeadSet({len(self)} of {self.mask.numel()} heads{label})"

    def _repr_html_(self) -> str:
        """Jupyter's view: a ``layer × head`` grid of marks (:func:`attnlens.present.display.headset_html`)."""
        return headset_html(self)


def as_headset(heads: object, shape: tuple[int, int] | None) -> HeadSet | None:
    """``heads`` as a :class:`HeadSet` when it is one of the forms every intervention takes: a
    :class:`HeadSet`, a boolean ``[layer, head]`` tensor, or ``(layer, head)`` pairs (a list or
    tuple; :meth:`HeadSet.from_heads` with ``shape``, the model's ``(n_layers, n_heads)``, which
    the caller must know for them). ``None`` for any other form: the caller names the forms it
    takes besides these (PAPA: ``"all"`` and fractions)."""
    if isinstance(heads, HeadSet):
        return heads
    if isinstance(heads, Tensor) and heads.dtype == torch.bool:
        return HeadSet(heads)
    if isinstance(heads, list | tuple) and shape is not None:
        return HeadSet.from_heads(heads, *shape)
    return None


def n_selected(fraction: float, n_layers: int, n_heads: int) -> int:
    """``round(fraction · n_layers · n_heads)``, halves rounded up.

    ``fraction`` is taken as the decimal it prints as (``0.145`` is ``145/1000``, not the binary
    float just below it), and the product is rounded exactly: ``0.145`` of 100 heads is 15.
    """
    fraction = finite(fraction, "fraction", low=0.0, high=1.0)
    n_layers, n_heads = checked_sizes(n_layers, n_heads)
    exact = Fraction(repr(float(fraction))) * n_layers * n_heads
    return math.floor(exact + Fraction(1, 2))




def checked_sizes(n_layers: int, n_heads: int) -> tuple[int, int]:
    """``n_layers`` and ``n_heads`` as whole numbers of at least 1 (:mod:`attnlens.core.checks`)."""
    return (whole_number(n_layers, "n_layers", " of layers", minimum=1),
            whole_number(n_heads, "n_heads", " of heads per layer", minimum=1))
