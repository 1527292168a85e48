"""Jupyter, below the presentation layer: whether this is a kernel, a quiet ``tqdm.auto``, and the
compact HTML views of :class:`attnlens.core.heads.HeadSet`, PAPA constants and a PAPA curve.

A notebook cell that ends with one of them shows a few lines: what was computed, its size, the
first rows of its table (no ``<script>``, no plotly.js). The engine asks :func:`in_notebook`
which progress bar to draw. A comparison's view and its figures are
:mod:`attnlens.present.display`'s.
"""

from __future__ import annotations

import html
import importlib.util
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

#: rows of a table shown in a summary (a Curve's, the scores)
SHOWN_ROWS = 12


STYLE = (
    "font-family: system-ui, sans-serif; font-size: 0.85rem; line-height: 1.35; "
    "border-collapse: collapse"
)


def escape(value: Any) -> str:
    """``value`` as text safe inside HTML."""
    return html.escape(str(value))


def items_table(rows: Sequence[tuple[str, Any]]) -> str:
    """``<table>`` of ``(name, value)`` rows: the metadata block of every summary."""
    cells = "".join(
        f'<tr><th style="text-align: left; padding: 1px 12px 1px 0">{escape(name)}</th>'
        f'<td style="text-align: left; padding: 1px 0">{escape(value)}</td></tr>'
        for name, value in rows
    )
    return f'<table style="{STYLE}">{cells}</table>'


def frame_html(frame: Any, rows: int = SHOWN_ROWS) -> str:
    """The first ``rows`` rows of a DataFrame as HTML (4 decimals), and how many were left."""
    shown = frame.head(rows).to_html(
        index=False, border=0, float_format=lambda value: f"{value:.4f}", na_rep=""
    )
    more = len(frame) - rows
    note = f"<div><i>… {more} more rows</i></div>" if more > 0 else ""
    return f'<div style="font-size: 0.8rem">{shown}</div>{note}'


def summary_box(title: str, body: str) -> str:
    """A summary's HTML: its ``title`` above its ``body`` (already HTML), in the summaries' style."""
    return (
        f'<div class="attnlens-summary" style="{STYLE}"><div style="font-weight: 600">'
        f"{escape(title)}</div>{body}</div>"
    )


def in_notebook() -> bool:
    """Whether this is a Jupyter kernel (notebook, JupyterLab, VS Code), not a terminal or an
    IPython console (the test of ``tqdm.autonotebook``)."""
    if "ipykernel.zmqshell" in sys.modules:
        if any(name == "QT_API" or name.startswith("SPYDER") for name in os.environ):
            return False
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
        name = type(shell).__name__.lower()
        return shell is not None and "qt" not in name and "spyder" not in name
    return "IPython.utils._process_emscripten" in sys.modules


def quiet_tqdm_auto() -> None:
    """In a Jupyter kernel without ``ipywidgets``, import ``tqdm.auto`` with its "IProgress not
    found" ``TqdmWarning`` silenced, so that it quietly settles on text bars for everyone who
    uses it later (transformers' weight loading, the Hugging Face hub); called when attnlens is
    imported in a kernel. Nothing happens elsewhere, with ``ipywidgets``, or once ``tqdm.auto``
    was imported (its choice is made then)."""
    if not in_notebook() or "tqdm.autonotebook" in sys.modules:
        return
    try:
        if importlib.util.find_spec("ipywidgets") is not None:
            return
    except (ImportError, ValueError):  # a broken or blocked ipywidgets: treat as missing
        pass
    from tqdm.std import TqdmWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TqdmWarning)
        import tqdm.auto  # noqa: F401


def constants_html(constants: Any) -> str:
    """PAPA constants (:class:`attnlens.papa.PapaConstants` or ``TrainableConstants``): where
    they come from and their shape, not their values."""
    shape = f"{constants.n_layers} layers × {constants.n_heads} heads × {constants.max_len} × {constants.max_len}"
    rows = [("model", constants.model_id), ("shape", shape), ("layout", constants.layout)]
    if hasattr(constants, "n_examples"):  # fitted / data-free PapaConstants
        rows.insert(0, ("kind", constants.kind))
        rows.append(("fitted on", f"{constants.n_examples} examples, {constants.n_tokens} tokens "
                                  f"({constants.n_truncated} truncated)"))
        title = "PAPA constants"
    else:
        rows.insert(0, ("init", constants.init))
        title = "trainable PAPA constants"
    pairs = {None: "unknown", True: "sentence pairs", False: "single sentences"}[constants.pairs]
    causal = {None: "unknown", True: "decoder", False: "encoder"}[constants.causal]
    rows += [("inputs", pairs), ("model kind", causal)]
    return summary_box(title, items_table(rows))


def headset_html(heads: Any) -> str:
    """A :class:`attnlens.core.heads.HeadSet`: a ``layer × head`` grid of marks and its first heads."""
    n_layers, n_heads = heads.shape
    rows = [("selected", f"{len(heads)} of {n_layers * n_heads} heads ({n_layers} layers × {n_heads})")]
    if heads.strategy:
        rows.append(("strategy", heads.strategy))
    order = list(heads.order or [])
    if order:
        listed = ", ".join(f"L{layer}H{head}" for layer, head in order[:SHOWN_ROWS])
        rows.append(("order", listed + (f" … (+{len(order) - SHOWN_ROWS})" if len(order) > SHOWN_ROWS else "")))
    mask = heads.mask.tolist()
    grid = "\n".join(
        f"L{layer:<3}" + "".join("■" if selected else "·" for selected in mask[layer])
        for layer in range(n_layers)
    )
    return summary_box("HeadSet", items_table(rows) + f'<pre style="margin: 4px 0; line-height: 1.1">{escape(grid)}</pre>')


def curve_html(curve: Any) -> str:
    """A PAPA :class:`attnlens.papa.Curve`: its tasks, the first rows of its table, the time."""
    tasks = ", ".join(dict.fromkeys(curve.table["task"]))
    rows = [("tasks", tasks), ("points", len(curve.table)),
            ("time", f"{curve.seconds:.0f} s ({curve.forward_seconds:.0f} s extracting features)")]
    body = items_table(rows) + frame_html(curve.table) + "<div>figure: <code>curve.figure()</code></div>"
    return summary_box("PAPA curve", body)
