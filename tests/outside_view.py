"""A view defined outside attnlens, in one file: the *transposed* view, each head's pattern read
the other way round (row ``q`` is column ``q`` of the pattern: who attends to ``q``), restricted to
the example's valid keys (on a decoder, to the keys at or before the query) and each row
normalised to sum to 1.

Everything it needs is public: a :class:`attnlens.methods.views.View` with a ``maps`` function of
:class:`attnlens.engine.accumulator.LayerPatterns`, registered with
:func:`attnlens.methods.views.register_view`. :func:`registered` adds it for the length of a
``with`` block and takes it out again (a view registered for good would be one
``register_view(VIEW)`` line at import). ``tests/contract/test_outside_view.py`` shows that
``attnlens.compare``, pattern types and head clustering take it with no edit to attnlens.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from attnlens.core.loading import is_causal
from attnlens.methods import views

NAME = "transposed"


def transposed(pattern: Float[Tensor, "batch head query key"], key_mask: Bool[Tensor, "batch key"],
               causal: bool) -> Float[Tensor, "batch head query key"]:
    """``pattern`` read the other way round: ``out[b, h, q, k] ∝ pattern[b, h, k, q]`` over the
    valid keys ``k`` (``key_mask[b, k]``; on a decoder ``k <= q`` too), each row normalised to
    sum to 1 (a row with nothing to normalise, a padding query's, stays 0). Axes: examples, heads,
    query positions, key positions."""
    flipped = pattern.transpose(-1, -2) * key_mask[:, None, None, :].to(pattern.dtype)
    if causal:
        flipped = flipped.tril()
    return flipped / flipped.sum(-1, keepdim=True).clamp_min(torch.finfo(pattern.dtype).tiny)


def _maps(layer: Any) -> Float[Tensor, "batch head query key"]:
    """The view's maps of one layer of a pass (a :class:`LayerPatterns`)."""
    causal = is_causal(layer.batch.model)
    return layer.shared(("outside", NAME), lambda: transposed(layer.pattern, layer.key_mask, causal))


VIEW = views.View(NAME, "each head's pattern transposed (who attends to the query), rows normalised",
                  signed=False, maps=_maps)


@contextlib.contextmanager
def registered() -> Iterator[views.View]:
    """:data:`VIEW` in :data:`attnlens.methods.views.REGISTRY` inside the block, gone after it."""
    views.register_view(VIEW)
    try:
        yield VIEW
    finally:
        del views.REGISTRY[NAME]
