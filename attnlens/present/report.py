"""The HTML report of a :class:`attnlens.comparison.result.Comparison`: self-contained and offline.

plotly.js is embedded once (inline, no CDN) with the first figure; the other figures reuse it.
In place of the static side-by-side figure the report has an explorer (:mod:`attnlens.present.explorer`):
a reader picks any kept example and any head (or clicks a head-grid cell) and sees that head
under every view. The scores (when computed), the pattern types (when computed,
:func:`pattern_types_html`) and the table of statistics follow the figures. The same HTML
(without ``<html>``) is what Jupyter shows for a comparison.
"""

from __future__ import annotations

import html
import uuid
from collections.abc import Mapping
from typing import Any

import pandas as pd
import plotly.io as pio
from plotly.offline import get_plotlyjs

from attnlens.engine.effective import short_text_note
from attnlens.evaluation.view_scores import SCORE_COLUMNS
from attnlens.present import explorer
from attnlens.present.columns import COLUMN_DOCS, is_signed

# a comparison (attnlens.comparison.result.Comparison) arrives as an argument: the comparison imports the
# presentation layer, never the other way round
Comparison = Any

#: figure captions by figure name (prefix match for ``patterns_*``)
CAPTIONS: dict[str, str] = {
    "distance_from_standard": (
        "How far each view is from the model's own attention, head by head: the mean over query "
        "tokens of the total-variation distance ½·Σ|a_view − a_standard| (0: identical; 1: disjoint)."
    ),
    "dominant_target": (
        "Which target gets the largest share of each head's attention, on average over the corpus."
    ),
    "patterns_": (
        "Every head for one example, layers as rows of tiles and heads as columns; within a tile, "
        "queries run down and keys across. Hover a cell for its layer, head, tokens and value."
    ),
}

_CSS = """
.attnlens-report { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: #1f2933; background: #ffffff; max-width: 1280px; margin: 0 auto;
       padding: 16px 24px 48px; }
.attnlens-report h1 { font-size: 1.5rem; margin: 8px 0 4px; }
.attnlens-report h2 { font-size: 1.15rem; margin: 28px 0 4px; border-bottom: 1px solid #d9e2ec; }
.attnlens-report p.caption { margin: 2px 0 8px; color: #52606d; font-size: 0.9rem; }
.attnlens-report dl.summary { display: grid; grid-template-columns: max-content auto;
       gap: 2px 16px; margin: 8px 0; }
.attnlens-report dl.summary dt { font-weight: 600; }
.attnlens-report dl.summary dd { margin: 0; }
.attnlens-report .figure { margin: 4px 0 12px; }
.attnlens-report .table-wrap { max-height: 520px; overflow: auto; border: 1px solid #d9e2ec; }
.attnlens-report table.attnlens { border-collapse: collapse; font-size: 0.8rem;
       font-variant-numeric: tabular-nums; }
.attnlens-report table.attnlens th, .attnlens-report table.attnlens td { padding: 2px 8px;
       border-bottom: 1px solid #eef2f6; text-align: right; }
.attnlens-report table.attnlens thead th { position: sticky; top: 0; background: #f5f7fa; }
.attnlens-report ul.columns { font-size: 0.85rem; color: #52606d; }
""" + explorer.CSS


def _caption(name: str, c: Comparison) -> str:
    if name == "side_by_side":
        return _side_by_side_caption(c)
    for key, text in CAPTIONS.items():
        if name == key or (key.endswith("_") and name.startswith(key)):
            return text
    return ""


def _side_by_side_caption(c: Comparison, *, explorer_first: bool = False) -> str:
    """What the side-by-side figure shows (``explorer_first``: what the explorer shows first),
    for the views and the kind of model of ``c``."""
    opening = "First shown: one head" if explorer_first else "One head"
    if len(c.views) == 1:
        text = f"{opening} and one example (the head with the lowest entropy, unless chosen)."
    else:
        text = (
            f"{opening} and one example under each view (the head whose first non-standard view "
            "is farthest from standard, unless chosen)."
        )
    signed = [view for view in c.views if is_signed(view)]
    if signed:
        text += (f" Signed views ({', '.join(signed)}, e.g. effective attention) can be negative or "
                 "above 1 and use a diverging colour scale centred on 0.")
        if c.causal:
            text += " On this decoder they also reach keys after the query, which the other views blank."
    return text


def _explorer_caption(c: Comparison) -> str:
    return explorer.caption(c) + " " + _side_by_side_caption(c, explorer_first=True)


def figure_html(fig: Any, *, include_plotlyjs: bool, div_id: str) -> str:
    """One figure as an HTML fragment; ``include_plotlyjs=True`` embeds plotly.js inline."""
    return pio.to_html(
        fig,
        include_plotlyjs=include_plotlyjs,
        full_html=False,
        div_id=div_id,
        config={"displaylogo": False, "responsive": True},
        default_height=f"{int(fig.layout.height or 450)}px",
    )


def _summary(c: Comparison) -> str:
    items = {
        "model": c.model_name,
        "heads": f"{c.n_layers} layers × {c.n_heads} heads ({'decoder' if c.causal else 'encoder'})",
        "views": ", ".join(c.views),
        "corpus": f"{c.n_examples} texts, {c.n_tokens} tokens ({c.n_truncated} truncated)",
        "tokenization": f"max_len {c.max_len}, {c.layout} layout",
        "example": f"text {c.example_index}: " + " ".join(c.example_tokens),
        "focus head": f"layer {c.focus[0]}, head {c.focus[1]}",
    }
    if "d_head" in c.meta:  # a view read effective attention (compare's meta says so)
        longer = c.meta.get("longer_than_d_head")
        items["effective attention"] = short_text_note(int(c.meta["d_head"])).capitalize() + (
            f"; {longer} of {c.n_examples} texts here are" if longer is not None else ""
        )
    rows = "".join(
        f"<dt>{html.escape(key)}</dt><dd>{html.escape(str(value))}</dd>" for key, value in items.items()
    )
    return f'<dl class="summary">{rows}</dl>'


def _table(c: Comparison) -> str:
    docs = "".join(
        f"<li><code>{html.escape(name)}</code>: {html.escape(text)}</li>"
        for name, text in COLUMN_DOCS.items()
    )
    table = c.table.to_html(
        index=False, float_format=lambda value: f"{value:.4f}", classes="attnlens", border=0
    )
    return f'<ul class="columns">{docs}</ul><div class="table-wrap">{table}</div>'


def _scores(c: Comparison) -> str:
    """The task and LM scores per view (``compare(..., tasks=..., lm_texts=...)``)."""
    docs = "".join(
        f"<li><code>{html.escape(name)}</code>: {html.escape(text)}</li>"
        for name, text in SCORE_COLUMNS.items()
    )
    table = c.scores.to_html(
        index=False, float_format=lambda value: f"{value:.4f}", classes="attnlens scores", border=0,
        na_rep="",
    )
    note = (
        "What each view costs: a probe trained on the frozen model under the view's attention "
        "(PAPA, Hassid et al. 2022), and the LM score named in the metric column. Effective "
        "attention changes no output (A⊥V = AV), so its scores equal the standard ones: they are "
        "computed as a check."
    )
    return f'<p class="caption">{html.escape(note)}</p><ul class="columns">{docs}</ul><div class="table-wrap">{table}</div>'


# -- pattern types ---------------------------------------------------------------------------------
# Where the pattern types of a comparison (issue 8: ``Comparison.pattern_types``, added by the
# pattern-types work) are rendered. Until a comparison has them this renders nothing.

#: columns of ``Comparison.pattern_types`` that are not shares of a type
PATTERN_TYPE_KEYS = ("view", "layer", "head", "type")


def pattern_types_html(c: Comparison) -> str:
    """The pattern types of ``c`` per view, or ``""`` when it has none.

    ``getattr(c, "pattern_types", None)`` is a DataFrame with a row per (view, layer, head):
    its ``type`` (the head's pattern type) and, in the other numeric columns, its share of each
    type. Rendered: per view, the fraction of heads of each type and the mean share of each type.
    """
    types = getattr(c, "pattern_types", None)
    if not isinstance(types, pd.DataFrame) or types.empty or not {"view", "type"} <= set(types.columns):
        return ""
    counts = pd.crosstab(types["view"], types["type"], normalize="index")
    counts.columns = [f"heads: {name}" for name in counts.columns]
    shares = [
        name for name in types.columns
        if name not in PATTERN_TYPE_KEYS and pd.api.types.is_numeric_dtype(types[name])
    ]
    table = counts
    if shares:
        means = types.groupby("view")[shares].mean()
        means.columns = [f"mean share: {name}" for name in shares]
        table = counts.join(means)
    order = [view for view in c.views if view in table.index]
    table = table.loc[order + [view for view in table.index if view not in order]]
    note = (
        "Per view, the fraction of heads of each pattern type and each type's mean share over "
        "the heads."
    )
    rendered = table.reset_index().to_html(
        index=False, float_format=lambda value: f"{value:.3f}", classes="attnlens pattern-types",
        border=0, na_rep="",
    )
    return (
        f'<h2 id="pattern_types">pattern types</h2><p class="caption">{html.escape(note)}</p>'
        f'<div class="table-wrap">{rendered}</div>'
    )


def head_grid_names(figures: Mapping[str, Any]) -> list[str]:
    """Names of the figures that are head grids (:func:`attnlens.core.plots.head_grid`: every trace
    a heatmap of cells ``(x, y) = (head, layer)``); a click on one of their cells selects the
    head in the explorer."""
    names = []
    for name, fig in figures.items():
        traces = list(fig.data)
        if traces and all(
            trace.type == "heatmap" and "L%{y}H%{x}" in (trace.hovertemplate or "") for trace in traces
        ):
            names.append(name)
    return names


def render(c: Comparison, *, full_html: bool = True) -> str:
    """The report of ``c`` as HTML: a summary, every figure (plotly.js inline once) with the
    explorer in place of the side-by-side figure, the scores, pattern types, the table."""
    parts = [f"<h1>attnlens: {html.escape(' vs '.join(c.views))} attention</h1>", _summary(c)]
    prefix = f"attnlens-{uuid.uuid4().hex[:8]}"
    figures = c.figures
    plotly_included = False
    for name, fig in figures.items():
        title = name.replace("_", " ")
        caption = _explorer_caption(c) if name == "side_by_side" else _caption(name, c)
        parts.append(f'<h2 id="{html.escape(name)}">{html.escape(title)}</h2>')
        if caption:
            parts.append(f'<p class="caption">{html.escape(caption)}</p>')
        if name == "side_by_side":
            if not plotly_included:
                parts.append(f'<script type="text/javascript">{get_plotlyjs()}</script>')
                plotly_included = True
            parts.append(explorer.section(c, prefix))
            continue
        fragment = figure_html(fig, include_plotlyjs=not plotly_included, div_id=f"{prefix}-{name}")
        plotly_included = True
        parts.append(f'<div class="figure">{fragment}</div>')
    if "side_by_side" not in figures:  # figures without it: the explorer after them
        parts.append('<h2 id="side_by_side">side by side</h2>')
        parts.append(f'<p class="caption">{html.escape(_explorer_caption(c))}</p>')
        if not plotly_included:
            parts.append(f'<script type="text/javascript">{get_plotlyjs()}</script>')
        parts.append(explorer.section(c, prefix))
    grids = [f"{prefix}-{name}" for name in head_grid_names(figures)]
    parts.append(explorer.script(c, prefix, grids))
    if c.scores is not None:
        parts.append('<h2 id="scores">task and LM scores</h2>')
        parts.append(_scores(c))
    parts.append(pattern_types_html(c))
    parts.append('<h2 id="table">table</h2>')
    parts.append(_table(c))
    body = f'<main class="attnlens-report">{"".join(parts)}</main>'
    if not full_html:
        return f"<style>{_CSS}</style>{body}"
    title = html.escape(f"attnlens report: {c.model_name}")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>{title}</title>\n"
        f"<style>body {{ margin: 0; background: #ffffff; }}{_CSS}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )
