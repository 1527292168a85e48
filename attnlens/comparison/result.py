"""The result of :func:`attnlens.compare`: a :class:`Comparison`, how views of attention differ
head by head over a corpus, with its table, figures, HTML report and JSON.

What its columns mean lives below, in :mod:`attnlens.present.columns` (the report reads them
too); the pass that makes a comparison is :mod:`attnlens.comparison.run`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from jaxtyping import Float

from attnlens.core.checks import index, whole_number
from attnlens.core.files import write_atomic
from attnlens.core.result import Result
from attnlens.errors import InputError
from attnlens.evaluation.view_scores import SCORE_COLUMNS
from attnlens.methods.patterns.templates import TYPES
from attnlens.present.columns import (
    BROAD_BELOW,
    COLUMN_DOCS,
    COLUMNS,
    TARGETS,
    TYPE_COLUMNS,
    is_signed,
)
from attnlens.present.display import Figures, comparison_html
from attnlens.present.export import comparison_maps, to_circuitsvis
from attnlens.present.figures import blank_later_keys, build_figures
from attnlens.present.kept import KeptPatterns


def check_count(value: Any, name: str) -> int:
    """``value`` as an int (:func:`attnlens.core.checks.whole_number`); an ``InputError`` like
    the other argument checks of :func:`attnlens.compare`."""
    try:
        return whole_number(value, name)
    except TypeError:
        raise InputError(f"{name}={value!r} should be a whole number") from None


def check_example(example: Any, n_texts: int) -> int:
    """``example`` as an int; ``InputError`` unless it indexes one of the ``n_texts`` texts."""
    index = check_count(example, "example (an index into the corpus)")
    if not 0 <= index < n_texts:
        raise InputError(f"example={index} is outside the corpus of {n_texts} texts")
    return index


@dataclass
class Comparison(Result):
    """How views of attention differ, head by head, over a corpus (see :func:`compare`).

    A :class:`~attnlens.core.result.Result` (:func:`attnlens.compare` makes one):

    - ``table``: one row per (view, layer, head) with :data:`COLUMNS` (see :data:`COLUMN_DOCS`;
      both together: :attr:`Comparison.COLUMNS`);
    - ``figures``: plotly figures by name (head grids, tiled patterns, views side by side);
      :meth:`figure` is one of them;
    - ``example_patterns``: ``view -> [layer, head, query, key]`` for the shown example, valid
      tokens only (``example_tokens``);
    - ``scores``: with ``tasks=`` or ``lm_texts=``, what each view costs: one row per (view,
      task) with :data:`SCORE_COLUMNS`; ``None`` otherwise;
    - ``kept_patterns``: every head's map of several examples under each view, 8-bit and
      compressed (:class:`attnlens.present.kept.KeptPatterns`), for the report's explorer; read one with
      :meth:`patterns_of`; ``None`` with ``report_examples=0`` (and in older JSON);
    - ``save_html(path)``, ``to_json()`` / ``from_json()``, and Jupyter display via ``_repr_html_``.
    """

    COLUMNS: ClassVar[dict[str, str]] = {name: COLUMN_DOCS[name] for name in COLUMNS}
    #: /2 since 2026-12-01: a decoder's effective maps are causal (a /1 file of a decoder holds
    #: maps with weight after the query, which the figures would now blank: refused, not misread)
    FORMAT: ClassVar[str] = "attnlens.Comparison/2"
    WRITTEN_BY: ClassVar[str] = "attnlens compare --json (or Comparison.to_json)"

    table: pd.DataFrame
    views: tuple[str, ...]
    model_name: str
    n_layers: int
    n_heads: int
    n_examples: int
    n_tokens: int
    max_len: int
    layout: str
    causal: bool
    example_index: int
    example_tokens: list[str]
    example_patterns: dict[str, np.ndarray]
    focus: tuple[int, int]
    n_truncated: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    scores: pd.DataFrame | None = None
    kept_patterns: KeptPatterns | None = None

    # -- values -----------------------------------------------------------------------------

    def grid(self, column: str, view: str = "standard") -> Float[np.ndarray, "layer head"]:
        """One column of :attr:`table` for one view as a ``[layer, head]`` array."""
        if column not in self.table.columns or column in ("view", "layer", "head", "pattern_type"):
            numeric = [name for name in COLUMNS[3:] if name != "pattern_type"]
            raise InputError(f"unknown column {column!r}; use one of {', '.join(numeric)}")
        return self._per_head(column, view, np.nan)

    def pattern_type(self, view: str = "standard") -> np.ndarray:
        """Per head, its most frequent Kovaleva pattern type (:data:`attnlens.methods.patterns.TYPES`),
        as a ``[layer, head]`` array of names ("" where unknown: a comparison read from an
        older JSON)."""
        return self._per_head("pattern_type", view, "")

    def _per_head(self, column: str, view: str, missing: Any) -> np.ndarray:
        """``column`` of ``view``'s rows as a ``[layer, head]`` array (``missing`` where empty)."""
        if view not in self.views:
            raise InputError(f"view {view!r} is not in this comparison ({', '.join(self.views)})")
        rows = self.table[self.table["view"] == view]
        grid = np.full((self.n_layers, self.n_heads), missing, dtype=object if isinstance(missing, str) else float)
        grid[rows["layer"].to_numpy(), rows["head"].to_numpy()] = rows[column].fillna(missing).to_numpy()
        return grid

    @property
    def pattern_types(self) -> pd.DataFrame | None:
        """The pattern-type shares of every (view, layer, head): ``view``, ``layer``, ``head``,
        a share per type of :data:`attnlens.methods.patterns.TYPES` and ``type`` (the most frequent), as
        :func:`attnlens.methods.patterns.types` gives them; None for a comparison without them."""
        if self.table["pattern_type"].isna().all():
            return None
        shares = self.table[["view", "layer", "head", *TYPE_COLUMNS, "pattern_type"]]
        return shares.rename(columns={**dict(zip(TYPE_COLUMNS, TYPES, strict=True)), "pattern_type": "type"})

    def patterns_of(self, example: int, view: str) -> Float[np.ndarray, "layer head query key"]:
        """Every head's map of corpus example ``example`` under ``view``, valid tokens only
        (their tokens: ``kept_patterns.example(example).tokens``). The shown example
        (``example_index``) is exact; the others are the 8-bit maps of :attr:`kept_patterns`
        (error at most 1/510 of each map's largest value, :mod:`attnlens.present.kept`). An example out
        of range or not kept raises ``ValueError``."""
        if view not in self.views:
            raise InputError(f"view {view!r} is not in this comparison ({', '.join(self.views)})")
        index = check_example(example, self.n_examples)
        if index == self.example_index and view in self.example_patterns:
            return self.example_patterns[view]
        if self.kept_patterns is None:
            raise InputError(
                f"example {index} was not kept: this comparison kept only example "
                f"{self.example_index}; compare(..., report_examples=N) keeps the first N"
            )
        return self.kept_patterns.pattern(index, view)

    def dominant_target(self, view: str = "standard") -> np.ndarray:
        """Per head, the target with the largest mean share (:data:`TARGETS`), or ``"broad"``."""
        shares = np.stack([self.grid(column, view) for column in TARGETS])
        labels = np.array(list(TARGETS.values()), dtype=object)[shares.argmax(0)]
        labels[shares.max(0) < BROAD_BELOW] = "broad"
        return labels

    # -- figures ----------------------------------------------------------------------------

    @cached_property
    def figures(self) -> Figures:
        """Plotly figures by name, in report order (built on first access): a read-only mapping,
        ``c.figures["side_by_side"]``, shown in Jupyter as a table of names and titles
        (:class:`attnlens.present.display.Figures`)."""
        return Figures(build_figures(self))

    def figure(self, name: str | None = None) -> Any:
        """The figure ``name`` of :attr:`figures` (default: the first, in report order)."""
        if name is None:
            return self.figures[next(iter(self.figures))]
        if name not in self.figures:
            raise InputError(f"no figure {name!r}; the figures are {', '.join(map(repr, self.figures))}")
        return self.figures[name]

    # -- output -----------------------------------------------------------------------------

    def to_html(self, *, full_html: bool = True) -> str:
        """The report as HTML (plotly.js embedded once; works offline)."""
        from attnlens.present.report import render

        return render(self, full_html=full_html)

    def save_html(self, path: str | os.PathLike, *, overwrite_read_only: bool = False) -> Path:
        """Write the self-contained, offline HTML report to ``path`` atomically (through
        :func:`attnlens.core.files.write_atomic`: never half a file, never through a symlink, a
        read-only file replaced only with ``overwrite_read_only``); returns the path."""
        html = self.to_html(full_html=True).encode("utf-8")
        return write_atomic(Path(path), html, overwrite_read_only=overwrite_read_only)

    def _repr_html_(self) -> str:
        """Jupyter's view: a small summary without plotly.js (:func:`attnlens.present.display.comparison_html`);
        show a figure with ``c.figures[name]``, the whole report with :meth:`save_html`."""
        return comparison_html(self)

    def __repr__(self) -> str:
        return (
            f"Comparison(model={self.model_name!r}, views={self.views}, "
            f"{self.n_layers}x{self.n_heads} heads, {self.n_examples} examples, "
            f"{self.n_tokens} tokens, table {self.table.shape[0]}x{self.table.shape[1]})"
        )

    def to_circuitsvis(
        self, example: int | None = None, view: str = "standard", *, layer: int | None = None
    ) -> Any:
        """CircuitsVis's ``attention_heads`` view of ``view`` for the kept example (``example``:
        ``None`` or :attr:`example_index`), offline (:func:`attnlens.present.export.to_circuitsvis`):
        every head of ``layer``, or of every layer (named ``L{layer}H{head}``). Keys after the
        query are blanked on a decoder, effective attention's too (causal there);
        signed views get a colour range symmetric about 0. Needs
        ``pip install "attnlens[circuitsvis]"``."""
        patterns, tokens = comparison_maps(self, example, view)

        layers = range(self.n_layers) if layer is None else [index(layer, "layer", self.n_layers, "layers")]
        return to_circuitsvis(
            patterns[list(layers)].reshape(-1, *patterns.shape[-2:]), tokens,
            causal=blank_later_keys(self, view), signed=is_signed(view),
            head_names=[f"L{index}H{head}" for index in layers for head in range(self.n_heads)],
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: metadata, column definitions, table records (exact: every float as
        Python writes it, NaN as ``None``) and the example (patterns rounded to 6 decimals)."""
        return {
            "format": self.FORMAT,
            "model": self.model_name,
            "views": list(self.views),
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_examples": self.n_examples,
            "n_tokens": self.n_tokens,
            "n_truncated": self.n_truncated,
            "max_len": self.max_len,
            "layout": self.layout,
            "causal": self.causal,
            "columns": {name: COLUMN_DOCS[name] for name in COLUMNS},
            "table": [
                {name: None if isinstance(value, float) and math.isnan(value) else value for name, value in row.items()}
                for row in self.table.to_dict("records")
            ],
            "example": {
                "index": self.example_index,
                "tokens": self.example_tokens,
                "patterns": {
                    view: np.round(array.astype(np.float64), 6).tolist()
                    for view, array in self.example_patterns.items()
                },
            },
            "focus": {"layer": self.focus[0], "head": self.focus[1]},
            "meta": self.meta,
            "scores": None if self.scores is None else [
                {name: None if isinstance(value, float) and math.isnan(value) else value
                 for name, value in row.items()}
                for row in self.scores.to_dict("records")
            ],
            "kept_patterns": None if self.kept_patterns is None else self.kept_patterns.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Comparison:
        table = pd.DataFrame.from_records(data["table"], columns=list(COLUMNS))
        return cls(
            table=table,
            views=tuple(data["views"]),
            model_name=data["model"],
            n_layers=data["n_layers"],
            n_heads=data["n_heads"],
            n_examples=data["n_examples"],
            n_tokens=data["n_tokens"],
            max_len=data["max_len"],
            layout=data["layout"],
            causal=data["causal"],
            example_index=data["example"]["index"],
            example_tokens=list(data["example"]["tokens"]),
            example_patterns={
                view: np.asarray(value, dtype=np.float32)
                for view, value in data["example"]["patterns"].items()
            },
            focus=(data["focus"]["layer"], data["focus"]["head"]),
            n_truncated=data.get("n_truncated", 0),
            meta=data.get("meta", {}),
            scores=None if data.get("scores") is None else pd.DataFrame.from_records(
                data["scores"], columns=list(SCORE_COLUMNS)),
            kept_patterns=None if data.get("kept_patterns") is None
            else KeptPatterns.from_dict(data["kept_patterns"]),
        )


