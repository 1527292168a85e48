"""Compare views of attention head by head: ``attnlens.compare(model, "papa", "effective")``.

A *view* is a way to read a head's attention for an example:

- ``"standard"``: the model's own softmax pattern (always included);
- ``"papa"``: the head's PAPA constant matrix (Hassid et al. 2022), restricted to the example's
  valid tokens and renormalised (:func:`attnlens.papa.constant_pattern`);
- ``"effective"``: effective attention (Brunner et al. 2020), the part of the pattern that reaches
  the output; it can be negative or above 1.

:func:`compare` makes one streaming pass over a corpus (after fitting PAPA constants if the
``"papa"`` view needs them), updating for every view the statistics of :mod:`attnlens.stats` and
the distance from standard attention, and keeps the patterns of one example for the figures. It
never holds the attention maps of the corpus. The result is a :class:`Comparison` with a
``table`` (pandas), ``figures`` (plotly), an HTML report (``save_html``, also shown by Jupyter)
and ``to_json``.

This module is callable: ``attnlens.compare(...)`` is :func:`compare`.
"""

from __future__ import annotations

import bisect
import math
import operator
import os
import sys
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar, SupportsIndex

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from attnlens.core import devices
from attnlens.core.checks import describe, index, optional_count, whole_number
from attnlens.core.corpus import resolve_corpus
from attnlens.core.files import write_atomic
from attnlens.core.inputs import as_max_len, tokenize
from attnlens.core.loading import is_causal, load
from attnlens.core.modes import eval_mode
from attnlens.core.result import Result
from attnlens.engine import passes
from attnlens.engine.effective import warn_if_short
from attnlens.errors import InputError, InputTypeError
from attnlens.evaluation import lm, probing
from attnlens.methods import effective, papa
from attnlens.methods import views as registry
from attnlens.methods.papa import PapaConstants, fitting
from attnlens.methods.patterns.counts import PatternTypes, batch_positions
from attnlens.methods.patterns.templates import TYPES, template_labels, tiled
from attnlens.methods.stats import (
    STATISTICS,
    AttentionStatistics,
    Distance,
    Statistics,
    batch_classes,
    row_statistics,
    token_classes,
    token_texts,
    total_variation,
)
from attnlens.present.columns import (  # noqa: F401  (re-exported: attnlens.compare.COLUMNS, ...)
    BROAD_BELOW,
    COLUMN_DOCS,
    COLUMNS,
    DISTANCE_DEFINITION,
    SCORE_COLUMNS,
    SIGNED_VIEWS,
    TARGETS,
    TYPE_COLUMNS,
    VIEWS,
)
from attnlens.present.display import Figures, comparison_html
from attnlens.present.export import comparison_maps, to_circuitsvis
from attnlens.present.figures import MAX_TILED_TOKENS, blank_later_keys, build_figures  # noqa: F401
from attnlens.present.kept import KeptExample, KeptPatterns, encode, label_of, refused, segments_of

DEFAULT_MAX_LEN = 128

#: the report's explorer may show any of the first this many examples of the corpus
#: (``compare(report_examples=)``), as far as :data:`REPORT_BUDGET` allows
REPORT_EXAMPLES = 50
#: bytes of compressed 8-bit maps (:mod:`attnlens.kept`) the report may embed, before base64
#: (which adds a third): with plotly.js (4.8 MB) and the other figures, the default report of
#: ``attnlens compare`` (MiniLM, the embedded corpus) stays under 10 MB
REPORT_BUDGET = 1_500_000


def validate_views(views: Iterable[str]) -> tuple[str, ...]:
    """``("standard", *views)`` without duplicates; unknown names raise ``ValueError``."""
    names: list[str] = ["standard"]
    for view in views:
        if not isinstance(view, str):
            model_like = hasattr(view, "cfg") or hasattr(view, "config")
            hint = " (the model goes first: attnlens.compare(model, 'papa', ...))" if model_like else ""
            raise InputError(
                f"views are names, got {describe(view)}{hint}; valid views are "
                f"{', '.join(repr(v) for v in VIEWS)}"
            )
        if view not in VIEWS:
            raise registry.unknown_view(view, among=VIEWS)
        if view not in names:
            names.append(view)
    return tuple(names)


@dataclass
class Comparison(Result):
    """How views of attention differ, head by head, over a corpus (see :func:`compare`).

    A :class:`~attnlens.core.result.Result`:

    - ``table``: one row per (view, layer, head) with :data:`COLUMNS` (see :data:`COLUMN_DOCS`;
      both together: :attr:`Comparison.COLUMNS`);
    - ``figures``: plotly figures by name (head grids, tiled patterns, views side by side);
      :meth:`figure` is one of them;
    - ``example_patterns``: ``view -> [layer, head, query, key]`` for the shown example, valid
      tokens only (``example_tokens``);
    - ``scores``: with ``tasks=`` or ``lm_texts=``, what each view costs: one row per (view,
      task) with :data:`SCORE_COLUMNS`; ``None`` otherwise;
    - ``kept_patterns``: every head's map of several examples under each view, 8-bit and
      compressed (:class:`attnlens.kept.KeptPatterns`), for the report's explorer; read one with
      :meth:`patterns_of`; ``None`` with ``report_examples=0`` (and in older JSON);
    - ``save_html(path)``, ``to_json()`` / ``from_json()``, and Jupyter display via ``_repr_html_``.
    """

    COLUMNS: ClassVar[dict[str, str]] = {name: COLUMN_DOCS[name] for name in COLUMNS}
    FORMAT: ClassVar[str] = "attnlens.Comparison/1"
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
        """Per head, its most frequent Kovaleva pattern type (:data:`attnlens.patterns.TYPES`),
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
        a share per type of :data:`attnlens.patterns.TYPES` and ``type`` (the most frequent), as
        :func:`attnlens.patterns.types` gives them; None for a comparison without them."""
        if self.table["pattern_type"].isna().all():
            return None
        shares = self.table[["view", "layer", "head", *TYPE_COLUMNS, "pattern_type"]]
        return shares.rename(columns={**dict(zip(TYPE_COLUMNS, TYPES, strict=True)), "pattern_type": "type"})

    def patterns_of(self, example: int, view: str) -> Float[np.ndarray, "layer head query key"]:
        """Every head's map of corpus example ``example`` under ``view``, valid tokens only
        (their tokens: ``kept_patterns.example(example).tokens``). The shown example
        (``example_index``) is exact; the others are the 8-bit maps of :attr:`kept_patterns`
        (error at most 1/510 of each map's largest value, :mod:`attnlens.kept`). An example out
        of range or not kept raises ``ValueError``."""
        if view not in self.views:
            raise InputError(f"view {view!r} is not in this comparison ({', '.join(self.views)})")
        index = _check_example(example, self.n_examples)
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
        (:class:`attnlens.display.Figures`)."""
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
        :func:`attnlens.files.write_atomic`: never half a file, never through a symlink, a
        read-only file replaced only with ``overwrite_read_only``); returns the path."""
        html = self.to_html(full_html=True).encode("utf-8")
        return write_atomic(Path(path), html, overwrite_read_only=overwrite_read_only)

    def _repr_html_(self) -> str:
        """Jupyter's view: a small summary without plotly.js (:func:`attnlens.display.comparison_html`);
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
        ``None`` or :attr:`example_index`), offline (:func:`attnlens.export.to_circuitsvis`):
        every head of ``layer``, or of every layer (named ``L{layer}H{head}``). Keys after the
        query are blanked on a decoder, except for effective attention, which reaches them;
        signed views get a colour range symmetric about 0. Needs
        ``pip install "attnlens[circuitsvis]"``."""
        patterns, tokens = comparison_maps(self, example, view)

        layers = range(self.n_layers) if layer is None else [index(layer, "layer", self.n_layers, "layers")]
        return to_circuitsvis(
            patterns[list(layers)].reshape(-1, *patterns.shape[-2:]), tokens,
            causal=blank_later_keys(self, view), signed=view in SIGNED_VIEWS,
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
    def _from_dict(cls, data: dict[str, Any]) -> Comparison:
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


# ------------------------------------------------------------------------------------------------
# the pass over the corpus


def _as_model(model: Any) -> Any:
    if isinstance(model, str) and model in VIEWS:
        raise InputTypeError(
            f"compare's first argument is the model, got the view {model!r}: "
            f"call attnlens.compare(model, {model!r}, ...)"
        )
    if hasattr(model, "run_with_cache") and hasattr(model, "cfg"):
        return model

    return load(model)


def _default_example(
    model: Any, texts: Sequence, views: Sequence[str], max_len: int, layout: str
) -> int:
    """0, or with effective attention the first of the first 256 texts with more than ``d_head``
    real tokens once tokenized with ``max_len`` and ``layout`` (effective attention equals
    standard attention when there are at most ``d_head`` tokens: the values then span every
    direction). Real tokens are counted in the layout itself: in the PAPA layout each segment of
    a pair gets only half of ``max_len``."""
    if "effective" not in views:
        return 0
    batch = tokenize(model, list(texts[:256]), max_len=max_len, layout=layout)
    lengths = batch.attention_mask.sum(-1)
    longer = (lengths > int(model.cfg.d_head)).nonzero()
    return int(longer[0, 0]) if len(longer) else 0


#: the distance column's statistic lives with the others (:func:`attnlens.methods.stats.total_variation`)
_total_variation = total_variation


def compare(
    model: Any = None,
    *views: str,
    corpus: str | os.PathLike | Iterable[str] | Iterable[tuple[str, str]] | None = None,
    max_len: SupportsIndex | None = None,
    n_examples: SupportsIndex | None = None,
    batch_size: SupportsIndex = 32,
    constants: Any = None,
    example: SupportsIndex | None = None,
    focus: tuple[int, int] | None = None,
    tasks: Sequence[str] = (),
    lm_texts: Sequence[str] | None = None,
    data_dir: str | os.PathLike | None = None,
    train_limit: SupportsIndex | None = 4000,
    eval_limit: SupportsIndex | None = None,
    progress: bool = True,
    report_examples: SupportsIndex = REPORT_EXAMPLES,
    report_budget: SupportsIndex = REPORT_BUDGET,
) -> Comparison:
    """Compare views of attention head by head over a corpus; returns a :class:`Comparison`.

    ``model``: a bridge from :func:`attnlens.load` (or anything ``load`` accepts, loaded with it:
    a Hugging Face model is taken over as ``load`` says; ``None`` is the embedded default model). ``views``: any of ``"standard"``, ``"papa"``, ``"effective"``
    (:data:`VIEWS`); ``"standard"`` is always included; no views means all of them. An unknown
    view raises ``ValueError`` naming the valid ones.

    ``corpus``: a list of texts (or sentence pairs), a file (see
    :func:`attnlens.corpus.read_corpus`), or ``None`` / ``"default"`` for the embedded corpus
    (:func:`attnlens.corpus.default_corpus`); ``n_examples`` keeps the first ``n``. Texts are
    tokenized with ``max_len`` tokens (default 128, or the constants' ``max_len``) in the PAPA
    layout when the ``"papa"`` view is requested on an encoder (PAPA constants are positional),
    else with ordinary padding (decoders such as GPT-2 have no [CLS]/[SEP] to fix in place). ``constants``: precomputed :class:`attnlens.papa.PapaConstants`, which must
    match the model and the corpus (layout, ``max_len``, sentences or pairs), or a path to a file of
    them (loaded and checked); otherwise they are fitted on the same corpus first (a separate
    pass).

    For every view and head the table gives the statistics of :mod:`attnlens.stats` (mean over
    valid query tokens) and ``distance_from_standard``: the mean over valid query rows of the
    total-variation distance ``½ · Σ_k |a_view(q, k) − a_standard(q, k)|`` over valid keys (0 to
    1 for attention distributions; effective attention can exceed 1). The figures show example
    ``example`` (default: the first text, or with the ``"effective"`` view the first text with
    more than ``d_head`` real tokens once tokenized, since effective attention equals standard
    attention on shorter ones) and, side by side, head ``focus = (layer, head)`` (default: the
    head whose first non-standard view is farthest from standard; the lowest-entropy head for
    standard alone). ``progress`` shows tqdm bars for each pass over the corpus.

    ``tasks`` / ``lm_texts``: also measure what each view costs (:attr:`Comparison.scores`):
    a probe per task of :mod:`attnlens.tasks` (:func:`attnlens.probing.run` with ``data_dir``,
    ``train_limit``, ``eval_limit``) and the LM score of ``lm_texts`` (:func:`attnlens.lm.evaluate`:
    the model's own trained head, else the MLM probe), under standard attention, PAPA with every
    head replaced and with half of them (the least input-dependent), and effective attention.
    Effective attention leaves the output unchanged by construction (``A⊥V = AV``): its score is
    computed, as a check, not assumed.

    ``report_examples`` / ``report_budget``: the report lets a reader pick any head of any of the
    first ``report_examples`` texts (default :data:`REPORT_EXAMPLES`) whose maps, 8-bit and
    compressed (:mod:`attnlens.kept`), fit in ``report_budget`` bytes (default
    :data:`REPORT_BUDGET`; a text that does not fit in what is left is skipped), plus the shown
    example; they are :attr:`Comparison.kept_patterns`. ``report_examples=0`` keeps none.

    The model runs in eval mode (no dropout), as in :func:`attnlens.papa.fit`; its previous
    mode is restored afterwards, also when the comparison fails.
    """
    if len(views) == 1 and isinstance(views[0], list | tuple):
        views = tuple(views[0])
    if isinstance(model, str) and model in VIEWS:
        _as_model(model)  # the view given as the model: say the model goes first
    names = validate_views(views or VIEWS)
    if isinstance(constants, str | os.PathLike):  # a constants file: load it (checked below)

        constants = PapaConstants.load(constants)
    texts = resolve_corpus(corpus)
    if n_examples is not None:
        n_examples = _check_count(n_examples, "n_examples")
        if n_examples < 1:
            raise InputError(f"n_examples must be at least 1, got {n_examples}")
        texts = texts[:n_examples]
    if max_len is not None:
        max_len = as_max_len(max_len)
    if example is not None:
        example = _check_example(example, len(texts))
    batch_size = whole_number(batch_size, "batch_size", " of examples (e.g. 32)", minimum=1)

    train_limit = optional_count(train_limit, "train_limit", " of training examples (or None for all)")
    eval_limit = optional_count(eval_limit, "eval_limit", " of evaluated examples (or None for all)")
    report_examples = _check_count(report_examples, "report_examples")
    report_budget = _check_count(report_budget, "report_budget (bytes)")
    if report_examples < 0 or report_budget < 0:
        raise InputError(
            f"report_examples={report_examples} and report_budget={report_budget} must be at "
            "least 0 (0 keeps no examples for the report's explorer)"
        )
    model = _as_model(model)
    if focus is not None:
        focus = _check_focus(focus, model.cfg.n_layers, model.cfg.n_heads)
    with eval_mode(model):
        constants, max_len, layout = _papa_setup(
            model, names, texts, constants, max_len, batch_size, progress
        )
        if example is None:
            example = _default_example(model, texts, names, max_len, layout)
        comparison = _compare(
            model, names, texts, constants, max_len=max_len, layout=layout,
            batch_size=batch_size, example=example, focus=focus, progress=progress,
            report_examples=report_examples, report_budget=report_budget,
        )
        if tasks or lm_texts is not None:
            comparison.scores = view_scores(
                model, names, constants, tasks=tasks, lm_texts=lm_texts, data_dir=data_dir,
                train_limit=train_limit, eval_limit=eval_limit, max_len=max_len, layout=layout,
                batch_size=batch_size, progress=progress,
            )
        return comparison


def view_scores(
    model: Any, names: Sequence[str], constants: Any, *, tasks: Sequence[str],
    lm_texts: Sequence[str] | None, data_dir: Any, train_limit: Any, eval_limit: Any,
    max_len: int, layout: str, batch_size: int, progress: bool,
) -> pd.DataFrame:
    """Task and LM scores per view (:data:`SCORE_COLUMNS`); see :func:`compare`."""
    if isinstance(tasks, str):
        tasks = [tasks]
    views: dict[str, Any] = {"standard": ()}
    if "papa" in names:
        views["papa (all heads)"] = papa.hooks(constants)
        views["papa (half of the heads)"] = papa.hooks(constants, heads=0.5)
    if "effective" in names:
        views["effective"] = effective.hooks(model)
    rows = []
    for task in tasks:
        for view, hooks in views.items():
            result = probing.run(model, task, data_dir=data_dir, hooks=hooks, train_limit=train_limit,
                                 eval_limit=eval_limit, max_len=max_len, layout=layout,
                                 batch_size=batch_size, progress=progress)
            rows.append(dict(view=view, task=result.task, metric=result.metric, score=result.score,
                             majority=result.majority))
    if lm_texts is not None:
        for view, hooks in views.items():
            result = lm.evaluate(model, list(lm_texts), hooks=hooks, max_len=max_len, layout=layout,
                                 batch_size=batch_size, progress=progress)
            rows.append(dict(view=view, task="lm", metric=result.name, score=result.value,
                             majority=float("nan")))
    table = pd.DataFrame(rows, columns=[c for c in SCORE_COLUMNS if c != "relative"])
    standard = table[table["view"] == "standard"].set_index("task")["score"]
    table["relative"] = [row.score / standard[row.task] if standard[row.task] else float("nan")
                         for row in table.itertuples()]
    return table


def _check_count(value: Any, name: str) -> int:
    """``value`` as an int (:func:`attnlens.checks.whole_number`); a ``ValueError`` like the
    other argument checks of :func:`compare`."""
    try:
        return whole_number(value, name)
    except TypeError:
        raise InputError(f"{name}={value!r} should be a whole number") from None


def _check_example(example: Any, n_texts: int) -> int:
    """``example`` as an int; ``ValueError`` unless it indexes one of the ``n_texts`` texts."""
    index = _check_count(example, "example (an index into the corpus)")
    if not 0 <= index < n_texts:
        raise InputError(f"example={index} is outside the corpus of {n_texts} texts")
    return index


def _check_focus(focus: Any, n_layers: int, n_heads: int) -> tuple[int, int]:
    """``focus`` as ``(layer, head)`` ints; ``ValueError`` unless it names one of the model's heads."""
    try:
        layer, head = (operator.index(part) for part in focus)
        if any(isinstance(part, bool) for part in focus):
            raise TypeError
    except (TypeError, ValueError):
        raise InputError(
            f"focus={focus!r} should be a (layer, head) pair of integers, e.g. focus=(0, 0)"
        ) from None
    if not (0 <= layer < n_layers and 0 <= head < n_heads):
        raise InputError(
            f"focus={tuple(focus)} is outside the model's {n_layers} x {n_heads} heads; use "
            f"0 <= layer < {n_layers} and 0 <= head < {n_heads}"
        )
    return layer, head


def _papa_setup(
    model: Any,
    names: Sequence[str],
    texts: Sequence,
    constants: Any,
    max_len: int | None,
    batch_size: int,
    progress: bool,
) -> tuple[Any, int, str]:
    """``(constants, max_len, layout)`` of the pass: without the ``"papa"`` view no constants and
    the padded layout; with it the given constants (checked against the model) or ones fitted on
    ``texts``, and their ``max_len`` and layout."""
    if "papa" not in names:
        return None, DEFAULT_MAX_LEN if max_len is None else max_len, "padded"
    if constants is None:
        max_len = DEFAULT_MAX_LEN if max_len is None else max_len
        constants = fitting.fit(
            model, texts, max_len=max_len, layout=fitting.default_layout(model),
            batch_size=batch_size, progress=progress,
        )
    if max_len is not None and constants.max_len != max_len:
        raise InputError(
            f"the PAPA constants were fitted with max_len={constants.max_len}, not {max_len}; "
            f"pass max_len={constants.max_len} (on the command line --max-len {constants.max_len}) "
            "or leave it out"
        )
    constants.check_compatible(model)
    return constants, constants.max_len, constants.layout


class ViewsAccumulator(passes.Accumulator):
    """The pass of :func:`compare` as an accumulator of :func:`attnlens.passes.run`.

    A composition of the methods' own accumulators, one of each per view, run in this one pass:
    :class:`attnlens.methods.stats.Statistics`, :class:`attnlens.methods.patterns.counts.PatternTypes`
    and (views other than standard) :class:`attnlens.methods.stats.Distance`; each reads its
    view's maps as the :class:`attnlens.methods.views.View` says (PAPA: the constants restricted
    to the batch's valid tokens, :meth:`View.read`). It computes no statistic itself: it only
    keeps the valid block of example ``example``'s maps for the figures.
    With ``report_examples`` it also keeps, 8-bit and compressed (:mod:`attnlens.kept`), the maps
    of the first ``report_examples`` examples and of ``example`` (``kept_patterns``; the
    report's budget is applied afterwards, :meth:`attnlens.kept.KeptPatterns.select`).
    """

    name = "compare"
    #: runs compact PAPA batches (no compute on padding): every part reads positions, not
    #: columns, and the kept maps are each example's valid block
    compact = True
    #: and the corpus by length: its parts add up over examples, and the kept examples are
    #: found by their corpus index (PassBatch.indices)
    any_order = True

    def __init__(
        self, model: Any, names: tuple[str, ...], constants: Any, *, example: int, causal: bool,
        report_examples: int = 0,
    ) -> None:
        n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
        self.model, self.names, self.constants = model, names, constants
        self.example, self.causal, self.n_layers, self.n_heads = example, causal, n_layers, n_heads
        self.views = {view: registry.get_view(view) for view in names}
        self.needs_effective = any(value.needs_effective for value in self.views.values())
        # the methods' own accumulators, one of each per view, updated in this one pass: the head
        # statistics (attnlens.methods.stats.Statistics) and the pattern types
        # (attnlens.methods.patterns.counts.PatternTypes); PAPA maps are the constants restricted
        # to each batch (View.read), beside the model's own patterns
        self.parts = {
            view: (Statistics(n_layers, n_heads, view, constants=constants, causal=causal),
                   PatternTypes(n_layers, n_heads, view=view, constants=constants, causal=causal))
            for view in names
        }
        self.statistics = {view: parts[0].statistics for view, parts in self.parts.items()}
        # and each view's distance from standard (attnlens.methods.stats.Distance)
        self.distances = {view: Distance(n_layers, n_heads, view, constants=constants, causal=causal)
                          for view in names if view != "standard"}
        self.kept: dict[str, np.ndarray] = {}
        self.kept_tokens: list[str] = []
        self.row: int | None = None
        self.d_head = int(model.cfg.d_head)
        self.longer = torch.zeros((), dtype=torch.int64)  # texts with more than d_head tokens
        self.report_examples = report_examples
        signed = tuple(view for view in names if view in SIGNED_VIEWS)
        self.kept_patterns = KeptPatterns(names, signed, n_layers, n_heads, limit=report_examples)
        self.report_rows: _ReportRows | None = None
        # off the CPU the kept maps wait on the device until the pass ends (to("cpu")), and so
        # does whether any of them was one encode refuses: nothing is read per batch
        self.pending: list[_ReportRows] = []
        self.staged_kept: dict[str, Tensor] = {}
        self.refused = torch.zeros((), dtype=torch.bool)

    def start_batch(self, batch: passes.PassBatch) -> None:
        if self.constants is not None:
            _check_constants(self.constants, batch.batch)
        indices = batch.indices
        self.row = indices.index(self.example) if self.example in indices else None
        if self.row is not None:
            keep, self.staged_tokens, _ = _row_tokens(batch, self.row)
            self.keep = keep.to(batch.key_mask.device, non_blocking=True)
            self.layers: list[Any] = [None] * self.n_layers
            self.staged = {view: [None] * self.n_layers for view in self.names}
        self.report_rows = None
        if self.report_examples:
            rows = [row for row, index in enumerate(indices) if index < self.report_examples or index == self.example]
            if rows:
                self.report_rows = _ReportRows.of(batch, rows, self.n_layers, self.names)

    @property
    def types(self) -> dict[str, Tensor]:
        """``view -> [layer, head, type]`` counts of each pattern type (its PatternTypes)."""
        return {view: parts[1].counts for view, parts in self.parts.items()}

    def update(self, layer: passes.LayerPatterns) -> None:
        index = layer.layer
        classifiers = any(type_counter.classifier is not None for _, type_counter in self.parts.values())
        if devices.reads_are_free(layer.pattern) or classifiers:  # the CPU: each view's accumulators in turn
            for statistics, type_counter in self.parts.values():
                statistics.update(layer)
                type_counter.update(layer)
        else:  # a device: every view's maps in one call of each (a third of the kernel launches)
            self._update_together(layer)
        for distance in self.distances.values():
            distance.update(layer)
        if self.row is None and self.report_rows is None:
            return
        per_view = {view: value.read(layer, self.constants, causal=self.causal).float()
                    for view, value in self.views.items()}
        for view, pattern in per_view.items():
            if self.row is not None:
                keep = self.keep
                self.staged[view][index] = pattern[self.row][:, keep][:, :, keep]
            kept = self.report_rows
            if kept is not None:  # the kept rows' maps, coded together (one call per view and layer)
                signed = self.views[view].signed
                blocks = kept.blocks(pattern)
                check = devices.reads_are_free(blocks)
                codes, scales = encode(blocks, signed=signed, check=check)
                if not check:
                    self.refused = self.refused.to(blocks.device) | refused(blocks, signed=signed)
                kept.codes[view][index], kept.scales[view][index] = codes, scales

    def _update_together(self, layer: passes.LayerPatterns) -> None:
        """What each view's :class:`Statistics` and :class:`PatternTypes` add for ``layer``,
        computed for the views' maps stacked along the batch axis: the same per-example
        arithmetic (every statistic and template share is a function of one map), split back by
        view before it is summed."""
        batch = layer.batch
        maps = {view: value.read(layer, self.constants, causal=self.causal).detach()
                for view, value in self.views.items()}
        n, times = len(batch), len(maps)
        classes = {name: mask.repeat(times, 1) for name, mask in batch_classes(batch).items()}
        positions = None if batch.compact_positions is None else batch.compact_positions.repeat(times, 1)
        rows = row_statistics(torch.cat([pattern.float() for pattern in maps.values()]), classes,
                              layer.key_mask.repeat(times, 1), positions)
        for i, (statistics, _) in enumerate(self.parts.values()):
            statistics.statistics.add_rows(layer.layer, {name: values[i * n : (i + 1) * n]
                                                         for name, values in rows.items()}, layer.key_mask)
        for signed in (False, True):  # the template rules read signed maps their own way
            group = [view for view in maps if self.views[view].signed == signed]
            if not group:
                continue
            times = len(group)
            positions = batch.shared(f"patterns.positions.tiled.{times}",  # once per batch
                                     lambda times=times: tiled(batch_positions(batch), times))
            labels = template_labels(torch.cat([maps[view] for view in group]), positions, signed=signed)
            for i, view in enumerate(group):
                self.parts[view][1].add_labels(layer.layer, labels[i * n : (i + 1) * n])

    def end_batch(self, batch: passes.PassBatch) -> None:
        for _, type_counter in self.parts.values():
            type_counter.end_batch(batch)
        self.longer += (batch.key_mask.sum(-1) > self.d_head).sum().to(self.longer.device)
        on_host = devices.reads_are_free(batch.key_mask)
        if self.row is not None:
            self.staged_kept = {view: torch.stack(layers) for view, layers in self.staged.items()}
            self.kept_tokens = self.staged_tokens
            self.row = None
            if on_host:
                self._read_kept()
        if self.report_rows is not None:
            if on_host:
                for example in self.report_rows.examples():
                    self._insert(example)
            else:
                self.pending.append(self.report_rows)
        self.report_rows = None

    def _insert(self, example: KeptExample) -> None:
        """Keep ``example`` in corpus order, whatever order the pass runs."""
        bisect.insort(self.kept_patterns.examples, example, key=lambda kept: kept.index)

    def _read_kept(self) -> None:
        """The maps kept on the device, read: the figures' example and the report's examples."""
        if bool(self.refused):
            raise InputError("attention maps to keep hold NaN or infinite values (or an unsigned view "
                             "negative ones): the model's patterns are not distributions")
        if self.staged_kept:
            self.kept = {view: maps.cpu().numpy() for view, maps in self.staged_kept.items()}
            self.staged_kept = {}
        for kept in self.pending:
            for example in kept.examples():
                self._insert(example)
        self.pending = []

    def to(self, device: str | torch.device) -> ViewsAccumulator:
        """Move the state; to the CPU (the end of a pass) the kept maps are read too, once."""
        super().to(device)
        if torch.device(device).type == "cpu":
            self._read_kept()
        return self

    def state_dict(self) -> dict[str, Tensor]:
        state: dict[str, Tensor] = {}
        for view in self.names:
            statistics, type_counter = self.parts[view]
            state.update({f"{view}.{name}": total for name, total in statistics.state_dict().items()})
            state.update({f"{view}.types.{name}": total for name, total in type_counter.state_dict().items()})
            if view in self.distances:
                state[f"{view}.distance"] = self.distances[view].total
        state["longer_than_d_head"] = self.longer
        return state

    def merge(self, other: passes.Accumulator) -> ViewsAccumulator:
        super().merge(other)
        if not self.kept and isinstance(other, ViewsAccumulator):
            self.kept, self.kept_tokens = other.kept, other.kept_tokens
        if isinstance(other, ViewsAccumulator):
            self.kept_patterns = self.kept_patterns.merged([other.kept_patterns])
        return self

    def all_reduce(self, group: Any = None) -> None:
        import torch.distributed as dist

        super().all_reduce(group)
        parts: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(parts, (self.kept, self.kept_tokens) if self.kept else None, group=group)
        found = next((part for part in parts if part is not None), None)
        if found is not None:
            self.kept, self.kept_tokens = found
        if self.report_examples:
            shards: list[Any] = [None] * dist.get_world_size(group)
            dist.all_gather_object(shards, self.kept_patterns, group=group)
            self.kept_patterns = self.kept_patterns.merged(
                [shard for rank, shard in enumerate(shards) if rank != dist.get_rank(group)]
            )

    def result(self) -> tuple[dict[str, AttentionStatistics], dict[str, Tensor]]:
        zeros = torch.zeros(self.n_layers, self.n_heads, dtype=torch.float64)  # standard from itself
        distance = {view: self.distances[view].result() if view in self.distances else zeros
                    for view in self.names}
        return self.statistics, distance


@dataclass
class _ReportRows:
    """The rows of the batch being run whose maps :class:`ViewsAccumulator` keeps for the report,
    coded together: their corpus ``indices``, ``rows`` in the batch, each row's real columns
    (``columns`` ``[row, most]``, padded with column 0, and ``valid`` where they are real; found
    on the host), tokens and segments, and per view and layer the codes and scales of
    :func:`attnlens.kept.encode` of all of them at once (``[row, head, most, most]`` and
    ``[row, head]``; a row's own map is its first ``n × n`` block, zero beyond it, which changes
    no scale)."""

    indices: list[int]
    rows: Tensor
    columns: Tensor
    valid: Tensor
    tokens: list[list[str]]
    segments: list[list[int]]
    codes: dict[str, list[Any]]
    scales: dict[str, list[Any]]

    @classmethod
    def of(cls, batch: passes.PassBatch, rows: list[int], n_layers: int, views: Sequence[str]) -> _ReportRows:
        found = [_row_tokens(batch, row) for row in rows]
        most = max(len(keep) for keep, _, _ in found)
        columns = torch.zeros(len(rows), most, dtype=torch.long)
        valid = torch.zeros(len(rows), most, dtype=torch.bool)
        for i, (keep, _, _) in enumerate(found):
            columns[i, : len(keep)], valid[i, : len(keep)] = keep, True
        device = batch.key_mask.device
        return cls(
            [batch.indices[row] for row in rows], torch.tensor(rows).to(device, non_blocking=True),
            columns.to(device, non_blocking=True), valid.to(device, non_blocking=True),
            [tokens for _, tokens, _ in found],
            [segments_of(separators, bool(batch.batch.is_pair)) for _, _, separators in found],
            {view: [None] * n_layers for view in views}, {view: [None] * n_layers for view in views},
        )

    def blocks(self, pattern: Float[Tensor, "batch head query key"]) -> Float[Tensor, "row head most most"]:
        """Each kept row's map on its real tokens, in the top-left corner, zero elsewhere."""
        chosen = pattern.index_select(0, self.rows)
        n_rows, n_heads, width, _ = chosen.shape
        most = self.columns.shape[1]
        queries = chosen.gather(2, self.columns[:, None, :, None].expand(n_rows, n_heads, most, width))
        block = queries.gather(3, self.columns[:, None, None, :].expand(n_rows, n_heads, most, most))
        return block * (self.valid[:, None, :, None] & self.valid[:, None, None, :])

    def examples(self) -> list[KeptExample]:
        """The kept examples (their codes read from the device, one copy per view)."""
        codes = {view: torch.stack(layers, 1).cpu().numpy() for view, layers in self.codes.items()}
        scales = {view: torch.stack(layers, 1).cpu().numpy() for view, layers in self.scales.items()}
        return [
            KeptExample.from_codes(
                index, "", tokens, segments,
                {view: every[i, :, :, : len(tokens), : len(tokens)] for view, every in codes.items()},
                {view: every[i] for view, every in scales.items()},
            )
            for i, (index, tokens, segments) in enumerate(zip(self.indices, self.tokens, self.segments, strict=True))
        ]


def _row_tokens(batch: passes.PassBatch, row: int) -> tuple[Tensor, list[str], list[int]]:
    """``(keep, tokens, separators)`` of one row of a pass's batch, read on the host (the pass's
    copy of the inputs there, :attr:`PassBatch.on_host`): the columns of its real tokens, their
    texts, and which of them are separators."""
    host = batch.on_host if batch.on_host is not None else batch.batch.to("cpu")
    mask = host.attention_mask.bool()
    keep = mask[row].nonzero().squeeze(-1)
    tokenizer = batch.model.tokenizer
    ids = host.input_ids[row, keep]
    tokens = token_texts(tokenizer, tokenizer.convert_ids_to_tokens(ids.tolist()))
    separators = batch.shared("compare.host_classes", lambda: token_classes(tokenizer, host.input_ids, mask))["sep"]
    return keep, tokens, separators[row, keep].tolist()


def _compare(
    model: Any,
    names: tuple[str, ...],
    texts: Sequence,
    constants: Any,
    *,
    max_len: int,
    layout: str,
    batch_size: int,
    example: int,
    focus: tuple[int, int] | None,
    progress: bool,
    report_examples: int = 0,
    report_budget: int = 0,
) -> Comparison:
    """The pass over the corpus of :func:`compare`, its arguments checked and resolved."""
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    causal = is_causal(model)
    views = ViewsAccumulator(
        model, names, constants, example=example, causal=causal, report_examples=report_examples
    )
    summary = passes.run(
        model, texts, [views], max_len=max_len, layout=layout, batch_size=batch_size,
        progress=progress, description=f"compare ({', '.join(names)})",
    )
    statistics, distance = views.result()
    n_tokens = summary.n_tokens
    meta: dict[str, Any] = {}
    if "effective" in names:
        d_head = int(model.cfg.d_head)
        meta.update(d_head=d_head, longer_than_d_head=int(views.longer))
        warn_if_short(int(views.longer), d_head)

    records = []
    for view in names:
        means = statistics[view].means()
        for layer in range(n_layers):
            for head in range(n_heads):
                record = {"view": view, "layer": layer, "head": head}
                record.update({name: float(means[name][layer, head]) for name in STATISTICS})
                record["distance_from_standard"] = float(distance[view][layer, head] / n_tokens)
                counts = views.types[view][layer, head]
                record.update({
                    column: float(count) / summary.n_examples
                    for column, count in zip(TYPE_COLUMNS, counts.tolist(), strict=True)
                })
                record["pattern_type"] = TYPES[int(counts.argmax())]
                records.append(record)
    table = pd.DataFrame.from_records(records, columns=list(COLUMNS))
    table.attrs["columns"] = dict(COLUMN_DOCS)
    if focus is None:
        focus = _default_focus(names, distance, statistics, n_tokens)
    layer, head = focus
    kept = None
    if report_examples:
        kept = views.kept_patterns.select(limit=report_examples, budget=report_budget, always=example)
        kept.n_considered = min(report_examples, len(texts))
        for item in kept.examples:
            item.label = label_of(texts[item.index])

    return Comparison(
        table=table,
        views=names,
        model_name=str(getattr(model.cfg, "model_name", "model")),
        n_layers=n_layers,
        n_heads=n_heads,
        n_examples=len(texts),
        n_tokens=n_tokens,
        max_len=int(max_len),
        layout=layout,
        causal=causal,
        example_index=example,
        example_tokens=list(views.kept_tokens),
        example_patterns=views.kept,
        focus=(int(layer), int(head)),
        n_truncated=summary.n_truncated,
        meta=meta,
        kept_patterns=kept,
    )


def _check_constants(constants: Any, batch: Any) -> None:
    """Refuse constants that do not fit ``batch`` (layout, ``max_len``, sentences or pairs; the
    model was checked once, by :func:`_papa_setup`)."""
    try:
        constants.check_compatible(batch=batch)
    except ValueError as error:
        raise InputError(
            f"the PAPA constants do not fit this corpus: {error} Pass constants fitted on a corpus "
            "of the same kind (single sentences or pairs), or leave constants out to fit them on "
            "this one."
        ) from error


def _default_focus(
    names: Sequence[str],
    distance: dict[str, Float[Tensor, "layer head"]],
    statistics: dict[str, AttentionStatistics],
    n_tokens: int,
) -> tuple[int, int]:
    """``(layer, head)`` whose first non-standard view is farthest from standard; the
    lowest-entropy head when standard is the only view."""
    others = [view for view in names if view != "standard"]
    if others:
        grid = (distance[others[0]] / n_tokens).numpy()
        layer, head = np.unravel_index(np.argmax(grid), grid.shape)
    else:
        grid = statistics["standard"].means()["entropy"].numpy()
        layer, head = np.unravel_index(np.argmin(grid), grid.shape)
    return int(layer), int(head)


class _CallableModule(types.ModuleType):
    """``attnlens.compare`` is a module that can be called like :func:`compare`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Comparison:
        return compare(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
