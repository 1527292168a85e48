"""The figures of a comparison (:attr:`attnlens.comparison.result.Comparison.figures`): head grids of its
statistics, the example's patterns tiled, and the views side by side, by name in report order.

A comparison arrives as an argument (read through its ``table``, ``grid``, ``pattern_type``,
``dominant_target``, ``pattern_types``, ``example_patterns``...): this module never imports
:mod:`attnlens.comparison`, which imports it.
"""

from __future__ import annotations

import html
import math
from typing import Any

from attnlens.core import plots
from attnlens.methods import patterns
from attnlens.methods.patterns.templates import TYPES
from attnlens.methods.stats import STATISTICS
from attnlens.present.columns import (
    BROAD_BELOW,
    COLUMN_DOCS,
    TARGETS,
    is_causal_on_decoders,
    is_signed,
)

#: the tiled-patterns figures show at most this many tokens of the example (keeps reports small)
MAX_TILED_TOKENS = 64
#: bytes the tiled-patterns figures of every view may take together in a report: each cell is a
#: float32 in base64 (16/3 bytes) and a tile of n tokens ``(n + 1)²`` cells with its gap. The
#: default example's four views take 2.97 MB (the default report: 9.75 MB); a long example's are
#: cropped to fit (a 157-token example of MiniLM: 43 tokens shown, its report 11.1 MB, 14.8 MB
#: with 64 tokens shown; the shown example's kept maps are the rest of the excess: they are kept
#: whatever the kept maps' budget)
TILED_BUDGET = 3_000_000


def tiled_tokens(n_tokens: int, n_views: int, n_layers: int, n_heads: int) -> int:
    """How many of the example's ``n_tokens`` tokens the tiled figures show: at most
    :data:`MAX_TILED_TOKENS`, and as many as :data:`TILED_BUDGET` allows ``n_views`` figures of
    ``n_layers x n_heads`` tiles (at least one)."""
    per_cell = 16 / 3 * n_views * n_layers * n_heads
    fits = math.isqrt(int(TILED_BUDGET / per_cell)) - 1
    return max(1, min(n_tokens, MAX_TILED_TOKENS, fits))


def build_figures(comparison: Any) -> dict[str, Any]:
    """The figures of a comparison, by name, in report order."""
    c = comparison
    others = [view for view in c.views if view != "standard"]
    figures: dict[str, Any] = {}
    if others:
        figures["distance_from_standard"] = plots.head_grid(
            {view: c.grid("distance_from_standard", view) for view in others},
            title="Distance from standard attention (mean total variation per query row)",
            name="distance",
        )
    layer, head = c.focus
    figures["side_by_side"] = plots.side_by_side(
        {view: array[layer, head] for view, array in c.example_patterns.items()},
        c.example_tokens,
        layer=layer,
        head=head,
        causal={view: blank_later_keys(c, view) for view in c.views},
        diverging={view: is_signed(view) for view in c.views},
        title=f"Layer {layer}, head {head}: " + " vs ".join(c.views) + f" (example {c.example_index})",
    )
    figures["dominant_target"] = plots.head_grid(
        {view: c.dominant_target(view) for view in c.views},
        title=f"What each head attends to most (\"broad\": every target below {BROAD_BELOW:g})",
        name="target",
        categories=[*TARGETS.values(), "broad"],
    )
    if c.pattern_types is not None:
        figures["pattern_type"] = plots.head_grid(
            {view: c.pattern_type(view) for view in c.views},
            title="Each head's most frequent pattern type (Kovaleva et al. 2019)",
            name="pattern type",
            categories=list(TYPES),
        )
        shares = c.pattern_types
        figures["pattern_types"] = patterns.figure(
            [shares[shares["view"] == view] for view in c.views],
            title="Pattern types per layer (share of maps, mean over the layer's heads)",
        )
    for column in STATISTICS:
        figures[column] = plots.head_grid(
            {view: c.grid(column, view) for view in c.views},
            title=f"{column}: {html.escape(COLUMN_DOCS[column])}",
            name=column,
        )
    n_tokens = len(c.example_tokens)
    shown = tiled_tokens(n_tokens, len(c.example_patterns), c.n_layers, c.n_heads)
    crop = "" if shown == n_tokens else f" (first {shown} of {n_tokens} tokens)"
    for view, array in c.example_patterns.items():
        figures[f"patterns_{view}"] = plots.patterns(
            array[..., :shown, :shown],
            c.example_tokens[:shown],
            causal=blank_later_keys(c, view),
            diverging=is_signed(view),
            title=f"{view} attention of every head, example {c.example_index}{crop}",
            name=view,
        )
    return figures


def blank_later_keys(comparison: Any, view: str) -> bool:
    """Whether a figure of ``view`` blanks keys after the query: on decoders, for every view whose
    maps hold nothing there (:func:`attnlens.present.columns.is_causal_on_decoders`: every
    registered one, effective attention included, which is causal on a decoder)."""
    return bool(comparison.causal) and is_causal_on_decoders(view)
