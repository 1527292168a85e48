"""Plotly figures of attention: head grids, all heads tiled in one heatmap, and views side by side.

Conventions shared by every figure:

- layers are rows (layer 0 at the top) and heads are columns, labelled ``L0, L1, ...`` and
  ``H0, H1, ...``;
- hover text names the layer, the head, the query and key tokens (with their positions) and the
  value;
- attention of a decoder (``causal=True``) is masked above the diagonal (keys after the query are
  left blank); encoders are shown in full;
- attention that can be negative or above 1 (effective attention) gets a diverging colour scale
  centred on 0 (:data:`DIVERGING`); ordinary attention a sequential one (:data:`SEQUENTIAL`)
  from 0.

Padding never reaches a figure: pass only the valid positions (``valid=`` does the selection).
:func:`patterns` draws every head in **one** heatmap trace (tiles separated by blank gaps), so it
stays fast with hundreds of heads; hover labels are per row and per column of the tiled image,
not per cell.
"""

from __future__ import annotations

import copy
import functools
import html
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from einops import rearrange
from jaxtyping import Bool, Float, Int, Shaped
from torch import Tensor

from attnlens.errors import InputError

if TYPE_CHECKING:
    import plotly.graph_objects as go


def _plotly() -> tuple[Any, Any]:
    """plotly's ``graph_objects`` and ``make_subplots``, imported at the first figure: every layer
    imports this module at its top, and importing it stays light (no plotly) until a figure is
    drawn."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    return go, make_subplots

#: colour scale for attention in [0, 1]
SEQUENTIAL = "Viridis"
#: colour scale, centred on 0, for signed attention (effective attention)
DIVERGING = "RdBu_r"
#: colours of a categorical head grid
CATEGORICAL_COLOURS: tuple[str, ...] = (
    "#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2",
    "#eeca3b", "#b279a2", "#ff9da6", "#9d755d", "#bab0ac",
)

#: at most this many token labels on an axis of :func:`side_by_side` (hover names every token)
MAX_TICK_LABELS = 32

_TOLERANCE = 1e-6

#: every figure takes NumPy arrays or torch tensors (see :func:`as_array`)
Array = np.ndarray | Tensor
#: a mask over positions: True (or 1, as in ``attention_mask``) for real tokens
PositionMask = Bool[Array, "pos"] | Int[Array, "pos"]


def as_array(values: Any) -> np.ndarray:
    """A NumPy copy of a tensor, array or nested sequence (tensors are detached, moved to CPU)."""
    if hasattr(values, "detach"):
        values = values.detach().float().cpu().numpy()
    return np.asarray(values)


def is_signed(values: Any) -> bool:
    """True when some finite value lies outside [0, 1], so a diverging scale is needed."""
    array = as_array(values).astype(np.float64)
    finite = array[np.isfinite(array)]
    return bool(finite.size) and bool((finite.min() < -_TOLERANCE) or (finite.max() > 1 + _TOLERANCE))


def _colour_range(array: np.ndarray, diverging: bool, zmin: float | None, zmax: float | None):
    finite = array[np.isfinite(array)]
    if diverging:
        bound = float(np.abs(finite).max()) if finite.size else 1.0
        bound = bound or 1.0
        return dict(
            colorscale=DIVERGING,
            zmid=0.0,
            zmin=-bound if zmin is None else zmin,
            zmax=bound if zmax is None else zmax,
        )
    top = float(finite.max()) if finite.size else 1.0
    return dict(
        colorscale=SEQUENTIAL,
        zmin=0.0 if zmin is None else zmin,
        zmax=(top if top > 0 else 1.0) if zmax is None else zmax,
    )


def _causal_mask(array: np.ndarray) -> np.ndarray:
    n_query, n_key = array.shape[-2:]
    above = np.triu(np.ones((n_query, n_key), dtype=bool), k=1 + max(n_key - n_query, 0))
    array = array.astype(np.float32, copy=True)
    array[..., above] = np.nan
    return array


def _token_label(token: str) -> str:
    return html.escape(str(token), quote=False)


def select_valid(
    pattern: Float[Array, "*heads query key"],
    tokens: Sequence[str],
    valid: PositionMask,
) -> tuple[np.ndarray, list[str]]:
    """Keep only valid positions (drop padding) on the query and key axes, and their tokens."""
    keep = np.flatnonzero(as_array(valid).astype(bool))
    array = as_array(pattern)[..., keep, :][..., keep]
    return array, [tokens[i] for i in keep]


@functools.lru_cache(maxsize=32)
def _made_subplots_layout(n_panels: int, titles: tuple[str, ...] | None, spacing: float,
                          shared_yaxes: bool) -> dict[str, Any]:
    _, make_subplots = _plotly()
    layout = make_subplots(rows=1, cols=n_panels, subplot_titles=titles, horizontal_spacing=spacing,
                           shared_yaxes=shared_yaxes).layout
    return {key: value for key, value in layout.to_plotly_json().items() if key != "template"}


def subplots_layout(n_panels: int, titles: Sequence[str] | None, spacing: float, *,
                    shared_yaxes: bool = False) -> dict[str, Any]:
    """The layout plotly's ``make_subplots`` gives one row of ``n_panels`` panels (their axes'
    domains and anchors; ``titles`` as annotations), as a new dict whose axes (``xaxis``,
    ``xaxis2``, ...) a figure then fills in: made by plotly once per shape, then copied, so that
    a figure of several panels is built as one dict and validated once, as a whole, by
    ``go.Figure(data=..., layout=...)`` (through ``make_subplots`` and the figure's update
    methods, each checked as it is set, a head grid of four panels took 29 ms, now 3 ms)."""
    return copy.deepcopy(_made_subplots_layout(n_panels, None if titles is None else tuple(titles), spacing,
                                               shared_yaxes))

# --------------------------------------------------------------------------------------------
# head grid


def head_grid(
    values: Shaped[Array, "layer head"] | Mapping[str, Shaped[Array, "layer head"]],
    *,
    title: str | None = None,
    name: str = "value",
    categorical: bool | None = None,
    categories: Sequence[str] | None = None,
    diverging: bool | None = None,
    colorscale: str | None = None,
    zmin: float | None = None,
    zmax: float | None = None,
    fmt: str = ".3f",
) -> go.Figure:
    """One scalar per head, as a ``[layer, head]`` grid (layer 0 on top).

    ``values`` is a ``[layer, head]`` array/tensor, or a mapping ``panel name -> [layer, head]``
    drawn as panels side by side on one shared colour scale (e.g. one panel per view).
    Values may be numbers (continuous colour scale; ``diverging=True`` centres it on 0 for every
    panel; ``diverging=None`` does so for the panels with a negative value only: they share a
    diverging scale, the non-negative panels a sequential one from 0, each with its colour bar,
    so a non-negative quantity is never drawn on a diverging scale; a grid may exceed 1) or labels
    (``categorical=True``, the default for strings): each category gets its own colour and the
    colour bar names the categories. Hover: ``L{layer}H{head}``, the panel and the value.
    """
    go = _plotly()[0]
    panels = dict(values) if isinstance(values, Mapping) else {"": values}
    arrays = {key: as_array(value) for key, value in panels.items()}
    shapes = {array.shape for array in arrays.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise InputError(f"head_grid needs [layer, head] arrays of one shape, got {sorted(shapes)}.")
    n_layers, n_heads = next(iter(shapes))
    if categorical is None:
        categorical = any(array.dtype.kind in "OUSb" for array in arrays.values())

    if categorical:
        if categories is None:
            unique = {v for array in arrays.values() for v in array.ravel().tolist()}
            try:
                categories = sorted(unique)  # numbers in numeric order
            except TypeError:
                categories = sorted(unique, key=str)
        categories = [str(c) for c in categories]
        index = {c: i for i, c in enumerate(categories)}
        unknown = {str(v) for a in arrays.values() for v in a.ravel()} - set(index)
        if unknown:
            raise InputError(f"values {sorted(unknown)} are not among categories {categories}.")
        k = len(categories)
        scale = []
        for i in range(k):
            colour = CATEGORICAL_COLOURS[i % len(CATEGORICAL_COLOURS)]
            scale += [[i / k, colour], [(i + 1) / k, colour]]
        colour_axis = dict(
            colorscale=scale, cmin=-0.5, cmax=k - 0.5,
            colorbar=dict(title=dict(text=name), tickvals=list(range(k)), ticktext=categories),
        )
    else:
        floats = {key: array.astype(np.float64) for key, array in arrays.items()}
        signed = {
            key: bool((array[np.isfinite(array)] < -_TOLERANCE).any()) if diverging is None
            else bool(diverging)
            for key, array in floats.items()
        }
        groups = [flag for flag in (False, True) if flag in signed.values()]  # sequential first
        colour_axes: dict[bool, tuple[str, dict[str, Any]]] = {}
        for number, flag in enumerate(groups, start=1):
            stacked = np.stack([array for key, array in floats.items() if signed[key] == flag])
            scale = _colour_range(stacked, flag, zmin, zmax)
            if colorscale is not None:
                scale["colorscale"] = colorscale
            axis = dict(
                colorscale=scale["colorscale"], cmin=scale["zmin"], cmax=scale["zmax"],
                colorbar=dict(title=dict(text=name)),
            )
            if "zmid" in scale:
                axis["cmid"] = scale["zmid"]
            if len(groups) > 1:  # two colour bars side by side
                axis["colorbar"] = dict(
                    title=dict(text=f"{name} ({'signed' if flag else '≥ 0'})", side="right"),
                    x=1.01 + 0.09 * (number - 1), xanchor="left", thickness=12,
                )
            colour_axes[flag] = ("coloraxis" if number == 1 else f"coloraxis{number}", axis)

    n_panels = len(arrays)
    layout = subplots_layout(n_panels, list(arrays) if n_panels > 1 else None, 0.04 if n_panels > 1 else 0.2)
    traces = []
    for column, (panel, array) in enumerate(arrays.items(), start=1):
        if categorical:
            labels = np.vectorize(str, otypes=[object])(array)
            z = np.vectorize(index.__getitem__, otypes=[np.float32])(labels)
            value = "%{customdata}"
        else:
            labels, z = None, array.astype(np.float32)
            value = f"%{{z:{fmt}}}"
        suffix = "" if column == 1 else str(column)
        where = f"{panel}<br>" if panel else ""
        trace = dict(
            type="heatmap", z=z, x=list(range(n_heads)), y=list(range(n_layers)),
            coloraxis="coloraxis" if categorical else colour_axes[signed[panel]][0], xgap=1, ygap=1,
            hovertemplate=f"{where}L%{{y}}H%{{x}}<br>{name}: {value}<extra></extra>", name=panel or name,
            xaxis=f"x{suffix}", yaxis=f"y{suffix}",
        )
        traces.append(trace if labels is None else {**trace, "customdata": labels})
        layout[f"xaxis{suffix}"].update(
            title=dict(text="head"), tickmode="array", tickvals=list(range(n_heads)),
            ticktext=[f"H{h}" for h in range(n_heads)],
        )
        layout[f"yaxis{suffix}"].update(
            tickmode="array", tickvals=list(range(n_layers)), ticktext=[f"L{layer}" for layer in range(n_layers)],
            autorange="reversed", showticklabels=column == 1, **({"title": dict(text="layer")} if column == 1 else {}),
        )
    axes = {"coloraxis": colour_axis} if categorical else dict(colour_axes.values())
    layout.update(
        height=140 + 26 * n_layers, margin=dict(l=60, r=20 if len(axes) == 1 else 110, t=70, b=50),
        plot_bgcolor="white", title={} if title is None else dict(text=title), **axes,
    )
    return go.Figure(data=traces, layout=layout)


# --------------------------------------------------------------------------------------------
# all heads tiled


def tile(
    pattern: Float[Array, "layer head query key"], gap: int = 1
) -> Float[np.ndarray, "rows columns"]:
    """Tile ``[layer, head, query, key]`` into one image: layers are rows of tiles, heads columns.

    Tiles are separated by ``gap`` rows/columns of NaN; the result has
    ``layer * (query + gap) - gap`` rows and ``head * (key + gap) - gap`` columns.
    """
    array = as_array(pattern).astype(np.float32)
    padded = np.pad(array, ((0, 0), (0, 0), (0, gap), (0, gap)), constant_values=np.nan)
    tiled = rearrange(padded, "layer head query key -> (layer query) (head key)")
    return tiled[: tiled.shape[0] - gap, : tiled.shape[1] - gap] if gap else tiled


def patterns(
    pattern: Float[Array, "layer head query key"] | Float[Array, "head query key"],
    tokens: Sequence[str],
    *,
    valid: PositionMask | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    causal: bool = False,
    diverging: bool | None = None,
    title: str | None = None,
    name: str = "attention",
    zmin: float | None = None,
    zmax: float | None = None,
    width_px: int = 1000,
) -> go.Figure:
    """Every head's pattern for one example, tiled in a single heatmap trace with token labels.

    ``pattern`` is ``[layer, head, query, key]`` (or ``[head, query, key]`` for one layer) for one
    example; ``tokens`` are its tokens (one per position). ``valid`` (a mask over positions) drops
    padding first. ``layers`` / ``heads`` are the indices to label the tiles with when ``pattern``
    holds a subset. Tiles are labelled ``L{layer}`` (rows) and ``H{head}`` (columns); hovering a
    cell names its layer, query position and token, head, key position and token, and the value.

    ``causal=True`` (decoders) blanks keys after the query. ``diverging=None`` picks a diverging
    scale centred on 0 when values leave [0, 1] (effective attention), a sequential one otherwise.
    One trace, whatever the number of heads: 384 heads of 32 tokens are 400k cells. The height
    is chosen for square cells at about ``width_px`` pixels of plot width.
    """
    go = _plotly()[0]
    array = as_array(pattern)
    if array.ndim == 3:
        array = array[None]
    if array.ndim != 4:
        raise InputError(f"patterns needs [layer, head, query, key], got shape {array.shape}.")
    tokens = list(tokens)
    if valid is not None:
        array, tokens = select_valid(array, tokens, valid)
    n_layers, n_heads, n_query, n_key = array.shape
    if len(tokens) != n_key or n_query > n_key:
        raise InputError(
            f"{len(tokens)} tokens for a pattern with {n_query} queries and {n_key} keys."
        )
    layers = list(range(n_layers)) if layers is None else list(layers)
    heads = list(range(n_heads)) if heads is None else list(heads)
    if len(layers) != n_layers or len(heads) != n_heads:
        raise InputError("layers/heads labels do not match the pattern's layer/head axes.")
    if causal:
        array = _causal_mask(array)
    if diverging is None:
        diverging = is_signed(array)
    z = tile(array)

    labels = [_token_label(t) for t in tokens]
    y_labels: list[str] = []
    for i, layer in enumerate(layers):
        y_labels += [f"L{layer} query {q} '{labels[n_key - n_query + q]}'" for q in range(n_query)]
        if i < n_layers - 1:
            y_labels.append(f"L{layer}|L{layers[i + 1]}")
    x_labels: list[str] = []
    for i, head in enumerate(heads):
        x_labels += [f"H{head} key {k} '{labels[k]}'" for k in range(n_key)]
        if i < n_heads - 1:
            x_labels.append(f"H{head}|H{heads[i + 1]}")

    step_q, step_k = n_query + 1, n_key + 1
    rows, columns = z.shape
    trace = dict(
        type="heatmap", z=z, x=x_labels, y=y_labels, hoverongaps=False,
        hovertemplate="%{y}<br>%{x}<br>" + name + ": %{z:.3f}<extra></extra>",
        colorbar=dict(title=dict(text=name)), name=name, **_colour_range(z, diverging, zmin, zmax),
    )
    layout = dict(
        xaxis=dict(
            type="category", title=dict(text="head (key tokens within each tile; hover for tokens)"),
            tickmode="array", tickvals=[x_labels[i * step_k + n_key // 2] for i in range(n_heads)],
            ticktext=[f"H{h}" for h in heads], showgrid=False, side="top", constrain="domain",
        ),
        yaxis=dict(
            type="category", title=dict(text="layer (query tokens within each tile)"),
            tickmode="array", tickvals=[y_labels[i * step_q + n_query // 2] for i in range(n_layers)],
            ticktext=[f"L{layer}" for layer in layers], autorange="reversed", showgrid=False,
            scaleanchor="x", scaleratio=1, constrain="domain",
        ),
        title={} if title is None else dict(text=title),
        height=int(min(2400, max(320, width_px * rows / columns + 150))),
        margin=dict(l=60, r=20, t=90, b=20),
        plot_bgcolor="white",
        meta=dict(kind="patterns", tokens=list(map(str, tokens)), n_layers=n_layers, n_heads=n_heads),
    )
    return go.Figure(data=[trace], layout=layout)


# --------------------------------------------------------------------------------------------
# views side by side


def side_by_side(
    views: Mapping[str, Float[Array, "query key"]],
    tokens: Sequence[str],
    *,
    layer: int,
    head: int,
    valid: PositionMask | None = None,
    causal: bool | Mapping[str, bool] = False,
    diverging: Mapping[str, bool] | None = None,
    title: str | None = None,
) -> go.Figure:
    """One head's pattern under several views, side by side (e.g. standard, PAPA, effective).

    ``views`` maps a view name to that head's ``[query, key]`` pattern for one example;
    ``tokens`` label the axes (queries down, keys across). Each view has its own colour bar:
    diverging and centred on 0 for views whose values leave [0, 1] (or as ``diverging`` says,
    e.g. ``{"effective": True}``), sequential otherwise. Hover names the layer, head, view, query
    and key tokens and the value. ``causal=True`` blanks keys after the query (a mapping says it
    per view, e.g. ``{"standard": True, "mine": False}`` for a signed map of your own that reaches
    later keys; a decoder's effective attention is causal).
    """
    go = _plotly()[0]
    if not views:
        raise InputError("side_by_side needs at least one view.")
    tokens = list(tokens)
    arrays = {}
    for view, value in views.items():
        array = as_array(value)
        if array.ndim != 2:
            raise InputError(f"view {view!r}: side_by_side needs [query, key], got {array.shape}.")
        if valid is not None:
            array, _ = select_valid(array, tokens, valid)
        blank = causal.get(view, False) if isinstance(causal, Mapping) else causal
        arrays[view] = _causal_mask(array) if blank else array.astype(np.float32)
    if valid is not None:
        tokens = [t for t, keep in zip(tokens, as_array(valid).astype(bool), strict=True) if keep]
    n = len(tokens)
    for view, array in arrays.items():
        if array.shape != (n, n):
            raise InputError(f"view {view!r} has shape {array.shape}, expected ({n}, {n}).")
    labels = [_token_label(t) for t in tokens]
    text = [
        [f"L{layer}H{head} query {q} '{labels[q]}' → key {k} '{labels[k]}'" for k in range(n)]
        for q in range(n)
    ]
    n_views = len(arrays)
    spacing = 0.09
    step = max(1, math.ceil(n / MAX_TICK_LABELS))
    ticks = list(range(0, n, step))
    tick_size = 11 if n <= 20 else 9
    layout = subplots_layout(n_views, list(arrays), spacing)
    width = (1 - spacing * (n_views - 1)) / n_views
    traces = []
    for column, (view, array) in enumerate(arrays.items(), start=1):
        signed = (diverging or {}).get(view)
        signed = is_signed(array) if signed is None else signed
        right = (column - 1) * (width + spacing) + width
        suffix = "" if column == 1 else str(column)
        traces.append(dict(
            type="heatmap", z=array, x=list(range(n)), y=list(range(n)), text=text, hoverongaps=False,
            hovertemplate="%{text}<br>" + view + ": %{z:.3f}<extra></extra>",
            colorbar=dict(x=right + 0.005, thickness=10, len=0.8, title=dict(text=view, side="right")),
            name=view, xaxis=f"x{suffix}", yaxis=f"y{suffix}", **_colour_range(array, signed, None, None),
        ))
        layout[f"xaxis{suffix}"].update(
            tickmode="array", tickvals=ticks, ticktext=[labels[i] for i in ticks], tickangle=-90,
            tickfont=dict(size=tick_size), title=dict(text="key"), showgrid=False, constrain="domain",
        )
        layout[f"yaxis{suffix}"].update(
            tickmode="array", tickvals=ticks, ticktext=[labels[i] for i in ticks], tickfont=dict(size=tick_size),
            autorange="reversed", showticklabels=column == 1, showgrid=False,
            scaleanchor="x" if column == 1 else f"x{column}", constrain="domain", constraintoward="top",
            **({"title": dict(text="query")} if column == 1 else {}),
        )
    layout.update(
        title=dict(text=title or f"Layer {layer}, head {head}"), height=int(190 + min(540, 900 / n_views)),
        margin=dict(l=90, r=40, t=80, b=100), plot_bgcolor="white",
        meta=dict(kind="side_by_side", layer=layer, head=head, views=list(arrays)),
    )
    return go.Figure(data=traces, layout=layout)


def _interval_bars(points: Any) -> dict | None:
    """Plotly error bars from a table's ``low`` / ``high`` columns (none where they are absent)."""
    if "low" not in points or points["low"].isna().all():
        return None
    return {"type": "data", "symmetric": False, "array": (points["high"] - points["score"]).tolist(),
            "arrayminus": (points["score"] - points["low"]).tolist(), "thickness": 1}


def score_bars(
    names: Sequence[str], scores: Sequence[float], lows: Sequence[float] | None = None,
    highs: Sequence[float] | None = None, *, title: str | None = None, yaxis: str = "score",
) -> go.Figure:
    """One bar per name with its interval (``lows`` / ``highs``; NaN: no error bar) as an
    asymmetric error bar, e.g. a probe beside its linear and majority baselines."""
    go = _plotly()[0]
    import pandas as pd

    points = pd.DataFrame({"score": list(map(float, scores)),
                           "low": [math.nan] * len(scores) if lows is None else list(map(float, lows)),
                           "high": [math.nan] * len(scores) if highs is None else list(map(float, highs))})
    figure = go.Figure(go.Bar(
        x=list(names), y=points["score"], error_y=_interval_bars(points),
        marker_color=[CATEGORICAL_COLOURS[i % len(CATEGORICAL_COLOURS)] for i in range(len(points))],
        hovertemplate="%{x}<br>" + yaxis + " %{y:.4f}<extra></extra>",
    ))
    figure.update_layout(title=title, yaxis_title=yaxis, height=360, width=max(320, 110 * len(points) + 160),
                         margin={"t": 50, "b": 40}, plot_bgcolor="white")
    return figure


def papa_table(long: Any) -> go.Figure:
    """PAPA's Table 1 (:func:`attnlens.papa.table`): one panel per task, a bar per row
    (original, average constants, data-free matrices) with its 95% bootstrap interval, the
    majority-class score as a dotted line."""
    go, make_subplots = _plotly()
    tasks = list(dict.fromkeys(long["task"]))
    titles = [f"{task} ({long.loc[long['task'] == task, 'metric'].iloc[0]})" for task in tasks]
    figure = make_subplots(rows=1, cols=len(tasks), subplot_titles=titles, horizontal_spacing=0.05)
    for column, task in enumerate(tasks, start=1):
        rows = long[long["task"] == task]
        figure.add_trace(
            go.Bar(x=rows["row"], y=rows["score"], error_y=_interval_bars(rows), showlegend=False,
                   marker_color=["#1f77b4" if row == "original" else "#ff7f0e" if row == "average"
                                 else "#7f7f7f" for row in rows["row"]],
                   hovertemplate=f"{task} · %{{x}}<br>score %{{y:.4f}}<extra></extra>"),
            row=1, col=column,
        )
        majority = rows["majority"].dropna()
        if not majority.empty:
            figure.add_hline(y=float(majority.iloc[0]), line_dash="dot", line_color="grey",
                             annotation_text="majority", row=1, col=column)
    figure.update_yaxes(title_text="score", row=1, col=1)
    figure.update_layout(height=360, width=max(420, 300 * len(tasks)), margin={"t": 40, "b": 40})
    return figure


def papa_curve(table: Any) -> go.Figure:
    """The PAPA curve (:func:`attnlens.papa.curve`): score against the share of input-dependent
    heads kept, one line per task and strategy, each point with its 95% bootstrap interval, the
    data-free baselines as marks at 0 kept; one panel per task (their metrics differ), the
    majority-class score as a dotted line."""
    go, make_subplots = _plotly()
    tasks = list(dict.fromkeys(table["task"]))
    titles = [f"{task} ({table.loc[table['task'] == task, 'metric'].iloc[0]})" for task in tasks]
    figure = make_subplots(rows=1, cols=len(tasks), subplot_titles=titles, horizontal_spacing=0.06)
    symbols = {"identity": "x", "toeplitz": "diamond", "zeros": "square", "uniform": "triangle-up"}
    for column, task in enumerate(tasks, start=1):
        rows = table[table["task"] == task]
        for strategy in dict.fromkeys(rows["strategy"]):
            points = rows[rows["strategy"] == strategy].sort_values("fraction_kept")
            baseline = strategy in symbols
            figure.add_trace(
                go.Scatter(
                    x=points["fraction_kept"], y=points["score"], name=strategy,
                    error_y=_interval_bars(points),
                    legendgroup=strategy, showlegend=column == 1,
                    mode="markers" if baseline else "lines+markers",
                    marker={"symbol": symbols.get(strategy, "circle"), "size": 10 if baseline else 7},
                    hovertemplate=f"{task} · {strategy}<br>kept %{{x:.4g}}<br>score %{{y:.4f}}<extra></extra>",
                ),
                row=1, col=column,
            )
        majority = rows["majority"].dropna()
        if not majority.empty:
            figure.add_hline(y=float(majority.iloc[0]), line_dash="dot", line_color="grey",
                             annotation_text="majority", row=1, col=column)
        figure.update_xaxes(title_text="input-dependent heads kept", range=[-0.05, 1.05], row=1, col=column)
    figure.update_yaxes(title_text="score", row=1, col=1)
    figure.update_layout(height=360, width=max(420, 330 * len(tasks)), margin={"t": 40, "b": 40})
    return figure
