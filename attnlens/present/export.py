"""Attention maps for other viewers: CircuitsVis's ``attention_heads`` and bertviz's ``head_view``.

- :func:`to_circuitsvis` turns any ``[head, query, key]`` map and its tokens into CircuitsVis's
  ``attention_heads`` view (Cooney & Nanda, CircuitsVis), :meth:`attnlens.Comparison.to_circuitsvis`
  one view of a comparison's example. CircuitsVis is the optional extra
  ``pip install "attnlens[circuitsvis]"``.
- :func:`bertviz_attention` / :func:`to_bertviz` give the inputs of bertviz's ``head_view``
  (Vig 2019): a tuple with one ``[1, head, query, key]`` tensor per layer, and the tokens.
  bertviz itself is not needed to make them (``pip install bertviz`` to view them; its view loads
  its scripts from a CDN).

CircuitsVis, as verified with 1.43.3: its ``mask_upper_tri`` defaults to True, which blanks the
keys after each query: right for a decoder, but half of an encoder's map would be hidden, so it
is always set here from ``causal``; only its ``local_src`` HTML is self-contained (about 1.35 MB
of JavaScript per view), ``str()`` of its result loads the JavaScript from a CDN, and showing its
result in Jupyter first tries to reach an outside host (to choose between the two). So the view
is exported offline: :class:`OfflineHTML` shows ``local_src`` and makes no request. Signed maps
(effective attention, differences) get a colour range symmetric about 0 (``min_value = −m``,
``max_value = m``, ``m`` the largest ``|a|``), so that 0 is white and the sign is the hue.
"""

from __future__ import annotations

import html
import operator
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from attnlens.core.files import write_atomic
from attnlens.errors import InputError, InputTypeError

#: how to install the optional CircuitsVis extra
CIRCUITSVIS_INSTALL = 'pip install "attnlens[circuitsvis]"'
#: decimals kept of each attention value in an exported view (keeps the HTML small)
DECIMALS = 4


class OfflineHTML:
    """Self-contained HTML (its JavaScript inline: no request, works offline) that Jupyter shows
    as it is. ``html`` is the fragment; :meth:`save` writes it as a page; ``rendered`` is the
    viewer's own object (for CircuitsVis, its ``RenderedHTML``, whose ``cdn_src`` loads from a
    CDN)."""

    def __init__(self, fragment: str, *, description: str, rendered: Any = None) -> None:
        self.html = fragment
        self.description = description
        self.rendered = rendered

    def _repr_html_(self) -> str:
        return self.html

    def __html__(self) -> str:
        return self.html

    def __str__(self) -> str:
        return self.html

    def __repr__(self) -> str:
        size = len(self.html.encode("utf-8")) / 1e6
        return f"<{self.description}: {size:.2f} MB of offline HTML; .save(path) writes a page>"

    def to_page(self, title: str = "attnlens") -> str:
        """The fragment as a whole HTML page."""
        return (
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n</head>\n<body>\n{self.html}\n</body>\n</html>\n"
        )

    def save(self, path: str | os.PathLike, *, overwrite_read_only: bool = False) -> Path:
        """Write :meth:`to_page` to ``path`` atomically (:func:`attnlens.core.files.write_atomic`)."""
        page = self.to_page(self.description).encode("utf-8")
        return write_atomic(Path(path), page, overwrite_read_only=overwrite_read_only)


def _circuitsvis_attention() -> Any:
    try:
        from circuitsvis import attention
    except ImportError as error:
        raise ImportError(
            f"to_circuitsvis needs the optional CircuitsVis package: {CIRCUITSVIS_INSTALL}"
        ) from error
    return attention


def _as_array(pattern: Any, name: str = "pattern") -> np.ndarray:
    if isinstance(pattern, Tensor):
        pattern = pattern.detach().to("cpu", torch.float64).numpy()
    array = np.asarray(pattern, dtype=np.float64)
    if not np.isfinite(array).all():
        raise InputError(f"{name} has NaN or infinite values; export finite attention maps only")
    return array


def _check_tokens(tokens: Sequence[str], n: int, shape: tuple[int, ...]) -> list[str]:
    if isinstance(tokens, str) or not all(isinstance(token, str) for token in tokens):
        raise InputTypeError("tokens must be a list of strings, one per position of the map")
    if len(tokens) != n:
        raise InputError(
            f"{len(tokens)} tokens for a map of shape {list(shape)}: give one token per query "
            f"and key position ({n})"
        )
    return list(tokens)


def to_circuitsvis(
    pattern: Float[np.ndarray, "*head query key"] | Float[Tensor, "*head query key"],
    tokens: Sequence[str],
    *,
    causal: bool,
    signed: bool | None = None,
    head_names: Sequence[str] | None = None,
) -> OfflineHTML:
    """CircuitsVis's ``attention_heads`` view of ``pattern``, offline (see the module docstring).

    ``pattern``: ``[head, query, key]`` (or one ``[query, key]`` map): row ``q`` is what query
    position ``q`` gives each key position; ``tokens``: one per position. ``causal``: whether
    keys after the query are blanked (CircuitsVis's ``mask_upper_tri``): True for a decoder's maps
    (its effective attention included, which is causal: :mod:`attnlens.engine.effective_causal`),
    False for an encoder's. ``signed``: whether values can be negative (default: whether some
    are); a signed map gets the colour range ``[−m, m]``, ``m = max |a|``, an unsigned one
    ``[0, max(1, max a)]``. ``head_names`` label the heads (default ``Head 0`` ...).

    Returns an :class:`OfflineHTML` (Jupyter shows it; ``.save(path)`` writes a page). Needs
    ``pip install "attnlens[circuitsvis]"`` (an ``ImportError`` says so otherwise).
    """
    attention = _circuitsvis_attention()
    array = _as_array(pattern)
    if array.ndim == 2:
        array = array[None]
    if array.ndim != 3 or array.shape[1] != array.shape[2]:
        raise InputError(
            f"pattern must be [head, query, key] or [query, key] with as many keys as queries, "
            f"got shape {list(np.shape(pattern))}"
        )
    names = _check_tokens(tokens, array.shape[-1], array.shape)
    if head_names is not None:
        head_names = [str(name) for name in head_names]
        if len(head_names) != array.shape[0]:
            raise InputError(f"{len(head_names)} head_names for {array.shape[0]} heads")
    if signed is None:
        signed = bool((array < 0).any())
    largest = float(np.abs(array).max()) if array.size else 0.0
    if signed:
        low, high = -max(largest, 1e-12), max(largest, 1e-12)
    else:
        low, high = 0.0, max(1.0, largest)
    rendered = attention.attention_heads(
        np.round(array, DECIMALS).tolist(), names, attention_head_names=head_names,
        min_value=low, max_value=high, mask_upper_tri=bool(causal),
    )
    description = (
        f"CircuitsVis attention_heads: {array.shape[0]} heads x {len(names)} tokens"
        f"{', signed' if signed else ''}{', causal' if causal else ''}"
    )
    return OfflineHTML(rendered.local_src, description=description, rendered=rendered)


def bertviz_attention(
    patterns: Float[np.ndarray, "layer head query key"] | Float[Tensor, "layer head query key"],
    tokens: Sequence[str],
) -> tuple[tuple[Tensor, ...], list[str]]:
    """``(attention, tokens)`` for bertviz's ``head_view(attention, tokens)`` (Vig 2019):
    ``attention`` holds one float32 ``[1, head, query, key]`` tensor per layer (batch of one),
    as a Hugging Face model's ``output_attentions`` would. bertviz draws each weight as a line's
    opacity, so the maps must not be negative (for effective attention use :func:`to_circuitsvis`)."""
    array = _as_array(patterns, "patterns")
    if array.ndim != 4 or array.shape[-1] != array.shape[-2]:
        raise InputError(
            f"patterns must be [layer, head, query, key], got shape {list(np.shape(patterns))}"
        )
    if (array < 0).any():
        raise InputError(
            "bertviz draws attention weights as line opacities and cannot show negative values "
            f"(the smallest here is {array.min():.4g}); show signed maps such as effective "
            "attention with attnlens.present.export.to_circuitsvis"
        )
    names = _check_tokens(tokens, array.shape[-1], array.shape)
    layers = tuple(torch.from_numpy(layer.astype(np.float32))[None] for layer in array)
    return layers, names


def comparison_maps(
    comparison: Any, example: int | None = None, view: str = "standard"
) -> tuple[np.ndarray, list[str]]:
    """``(patterns [layer, head, query, key], tokens)`` of ``view`` for the example a
    :class:`attnlens.Comparison` kept; a clear ``ValueError`` for another example or view."""
    c = comparison
    if view not in c.views:
        raise InputError(f"view {view!r} is not in this comparison; use one of {', '.join(map(repr, c.views))}")
    if example is not None:
        try:
            index = operator.index(example)
        except TypeError:
            raise InputTypeError(f"example must be the index of a corpus text, got {example!r}") from None
        if not 0 <= index < c.n_examples:
            raise InputError(
                f"example={index} is outside the corpus of {c.n_examples} texts; use an index "
                f"from 0 to {c.n_examples - 1}"
            )
        if index != c.example_index:
            raise InputError(
                f"this comparison keeps the maps of example {c.example_index} only, not {index}: "
                f"run attnlens.compare(..., example={index}) (command line: --example {index}) "
                "to export that one"
            )
    return np.asarray(c.example_patterns[view]), list(c.example_tokens)


def to_bertviz(
    comparison: Any, *, example: int | None = None, view: str = "standard"
) -> tuple[tuple[Tensor, ...], list[str]]:
    """bertviz ``head_view`` inputs (:func:`bertviz_attention`) of one view of a comparison's
    example: ``from bertviz import head_view; head_view(*to_bertviz(c))``."""
    patterns, tokens = comparison_maps(comparison, example, view)
    return bertviz_attention(patterns, tokens)
