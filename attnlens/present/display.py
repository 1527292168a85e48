"""Compact displays for Jupyter: small HTML summaries (no ``<script>``, no plotly.js) and the
:class:`Figures` mapping of a comparison.

A notebook cell that ends with a :class:`attnlens.comparison.result.Comparison`, PAPA constants, a
:class:`attnlens.core.heads.HeadSet` or a PAPA :class:`attnlens.papa.Curve` shows a few lines: what
was computed, its size, the first rows of its table (the views of the last three, and the test
for a kernel, are :mod:`attnlens.core.notebook`'s, below the layers that define them; they are
re-exported here). Figures are shown one at a time, by name
(``c.figures["side_by_side"]``), by plotly's own notebook renderer; :func:`notebook_figures`
makes it include plotly.js once per notebook so that figures also survive nbconvert to HTML.
The whole report, with every figure, is ``c.save_html("report.html")``.
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from attnlens.core.notebook import STYLE, escape, frame_html, in_notebook, items_table, summary_box

#: at most this many tokens of the example are listed in a comparison's summary
SHOWN_TOKENS = 24
#: farthest heads listed per view in a comparison's summary
SHOWN_HEADS = 3


def _plain(title: str) -> str:
    """A plotly title as plain text: its tags (``<b>``, ``<br>``) dropped, entities decoded."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", title)).split())


def _title(figure: Any) -> str:
    try:
        return _plain(str(figure.layout.title.text or ""))
    except AttributeError:
        return ""


# -- figures ----------------------------------------------------------------------------------


class Figures(Mapping):
    """Plotly figures by name, in report order: ``figures["side_by_side"]`` is one figure.

    A read-only mapping (``for name in figures``, ``figures.items()``, ``len``, ``in``); shown
    in Jupyter as a table of names and titles, not as the figures' JSON. Fetching a figure in a
    Jupyter kernel calls :func:`notebook_figures` once.
    """

    def __init__(self, figures: Mapping[str, Any]) -> None:
        self._figures = dict(figures)

    def __getitem__(self, name: str) -> Any:
        try:
            figure = self._figures[name]
        except KeyError:
            raise KeyError(
                f"no figure {name!r}; the figures are {', '.join(map(repr, self._figures))}"
            ) from None
        notebook_figures()
        return figure

    def __iter__(self) -> Iterator[str]:
        return iter(self._figures)

    def __len__(self) -> int:
        return len(self._figures)

    def items(self) -> Any:  # the dict's own views: no notebook_figures() for a report
        return self._figures.items()

    def values(self) -> Any:
        return self._figures.values()

    def titles(self) -> dict[str, str]:
        """Each figure's title as plain text, by name."""
        return {name: _title(figure) for name, figure in self._figures.items()}

    def __repr__(self) -> str:
        titles = self.titles()
        width = max(map(len, titles), default=0)
        lines = [f"Figures({len(self)}): show one with figures[name]"]
        lines += [f"  {name:<{width}}  {_short(title)}" for name, title in titles.items()]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = "".join(
            f'<tr><td style="text-align: left; padding: 1px 12px 1px 0"><code>{escape(name)}'
            f'</code></td><td style="text-align: left">{escape(_short(title))}</td></tr>'
            for name, title in self.titles().items()
        )
        head = '<tr><th style="text-align: left">name</th><th style="text-align: left">title</th></tr>'
        return summary_box(
            f"{len(self)} figures: show one with figures[name]",
            f'<table style="{STYLE}">{head}{rows}</table>',
        )


def _short(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


#: whether :func:`notebook_figures` has looked at plotly's renderer in this process
_RENDERER_CHECKED = False


def notebook_figures() -> str | None:
    """In a Jupyter kernel where plotly chose its renderer itself, make figures carry HTML too.

    In a kernel plotly's automatic renderer is ``"plotly_mimetype"``: JSON that JupyterLab draws
    with its plotly extension, but that ``nbconvert --to html`` (and a docs build) drops, leaving
    an empty output. ``"plotly_mimetype+notebook"`` adds an HTML view of each figure and puts
    plotly.js (inline, offline, about 4.8 MB) into the notebook once, with the first figure
    shown. A renderer chosen by the user (``plotly.io.renderers.default``, ``PLOTLY_RENDERER``)
    is kept. Returns the renderer in use in a kernel, ``None`` elsewhere; called by
    :class:`Figures` when a figure is fetched.
    """
    global _RENDERER_CHECKED
    if not in_notebook():
        return None
    import plotly.io as pio

    if not _RENDERER_CHECKED:
        _RENDERER_CHECKED = True
        if pio.renderers.default == "plotly_mimetype" and not os.environ.get("PLOTLY_RENDERER"):
            pio.renderers.default = "plotly_mimetype+notebook"
    return pio.renderers.default


# -- summaries --------------------------------------------------------------------------------


def comparison_html(c: Any) -> str:
    """A comparison's summary: model, views, counts, the example, each view's mean statistics,
    the heads farthest from standard, the scores, and the names of its figures."""
    tokens = c.example_tokens[:SHOWN_TOKENS]
    more = len(c.example_tokens) - len(tokens)
    rows = [
        ("model", c.model_name),
        ("heads", f"{c.n_layers} layers × {c.n_heads} heads ({'decoder' if c.causal else 'encoder'})"),
        ("views", ", ".join(c.views)),
        ("corpus", f"{c.n_examples} texts, {c.n_tokens} tokens ({c.n_truncated} truncated)"),
        ("tokenization", f"max_len {c.max_len}, {c.layout} layout"),
        ("example", f"text {c.example_index}: " + " ".join(tokens) + (f" … (+{more})" if more > 0 else "")),
        ("focus head", f"layer {c.focus[0]}, head {c.focus[1]}"),
    ]
    parts = [items_table(rows)]
    table = c.table
    columns = [
        name for name in table.columns
        if name not in ("view", "layer", "head", "pattern_type") and not name.startswith("type_")
    ]
    means = table.groupby("view", sort=False)[columns].mean().reset_index()
    parts.append("<div>mean over heads, per view (<code>c.table</code> has every head):</div>")
    parts.append(frame_html(means))
    if getattr(c, "pattern_types", None) is not None:
        counts = (
            table.groupby("view", sort=False)["pattern_type"].value_counts().unstack(fill_value=0).reset_index()
        )
        parts.append("<div>heads by most frequent pattern type (<code>c.pattern_types</code>):</div>")
        parts.append(frame_html(counts))
    farthest = []
    for view in c.views:
        if view == "standard":
            continue
        top = table[table["view"] == view].nlargest(SHOWN_HEADS, "distance_from_standard")
        heads = ", ".join(
            f"L{row.layer}H{row.head} ({row.distance_from_standard:.3f})" for row in top.itertuples()
        )
        farthest.append((f"farthest from standard ({view})", heads))
    if farthest:
        parts.append(items_table(farthest))
    if getattr(c, "scores", None) is not None:
        parts.append("<div>scores (<code>c.scores</code>):</div>")
        parts.append(frame_html(c.scores))
    names = ", ".join(f"<code>{escape(name)}</code>" for name in c.figures)
    parts.append(
        f'<div>figures: {names}. Show one with <code>c.figures["name"]</code>; the whole report '
        'with <code>c.save_html("report.html")</code>.</div>'
    )
    return summary_box(f"attnlens comparison: {' vs '.join(c.views)} attention", "".join(parts))


