"""``attnlens.compare(model, "papa", "effective")``: compare views of attention head by head.

A *view* is a way to read a head's attention for an example, one value of the registry
:data:`attnlens.methods.views.REGISTRY`, e.g.:

- ``"standard"``: the model's own softmax pattern (always included);
- ``"papa"``: the head's PAPA constant matrix (Hassid et al. 2022), restricted to the example's
  valid tokens and renormalised (:func:`attnlens.papa.constant_pattern`);
- ``"effective"``: effective attention (Brunner et al. 2020), the part of the pattern that reaches
  the output; it can be negative or above 1.

:func:`compare` checks its arguments, makes one streaming pass over a corpus (after fitting the
constants of a view given by constants, if they are not given) with
:class:`attnlens.comparison.accumulator.ViewsAccumulator`, and builds a
:class:`attnlens.comparison.result.Comparison`. It never holds the attention maps of the corpus.
"""
from __future__ import annotations

import operator
import os
from collections.abc import Iterable, Sequence
from typing import Any, SupportsIndex

import numpy as np
import pandas as pd
from jaxtyping import Float, Int
from torch import Tensor

from attnlens.comparison.accumulator import ViewsAccumulator
from attnlens.comparison.result import Comparison, check_count, check_example
from attnlens.core.checks import describe, optional_count, whole_number
from attnlens.core.corpus import corpus_iterator, resolve_corpus
from attnlens.core.fingerprints import fingerprints_kept
from attnlens.core.inputs import as_max_len, tokenize
from attnlens.core.loading import is_causal, load
from attnlens.core.modes import eval_mode
from attnlens.engine import passes
from attnlens.engine.effective import warn_if_short
from attnlens.engine.recording import Recording
from attnlens.errors import InputError, InputTypeError
from attnlens.evaluation.view_scores import view_scores
from attnlens.methods import views as registry
from attnlens.methods.papa import PapaConstants, fitting
from attnlens.methods.patterns.templates import TYPES
from attnlens.methods.stats import STATISTICS, AttentionStatistics
from attnlens.present.columns import COLUMN_DOCS, COLUMNS, TYPE_COLUMNS
from attnlens.present.kept import label_of

DEFAULT_MAX_LEN = 128

#: the report's explorer may show any of the first this many examples of the corpus
#: (``compare(report_examples=)``), as far as :data:`REPORT_BUDGET` allows
REPORT_EXAMPLES = 50
#: bytes of compressed 8-bit maps (:mod:`attnlens.present.kept`) the report may embed, before base64
#: (which adds a third): with plotly.js (4.8 MB), the tiled maps of the example under each of the
#: four default views (0.75 MB each) and the other figures, the default report of ``attnlens
#: compare`` (MiniLM, the embedded corpus) stays under 10 MB (``benchmarks/report_size.py``; it
#: was 1.5 MB, and 10.14 MB, once the norm view had joined the defaults)
REPORT_BUDGET = 1_250_000


def validate_views(views: Iterable[str]) -> tuple[str, ...]:
    """``("standard", *views)`` without duplicates; unknown names raise ``InputError``."""
    known = registry.names()  # the registry as it is now: a view registered after import counts
    names: list[str] = ["standard"]
    for view in views:
        if not isinstance(view, str):
            model_like = hasattr(view, "cfg") or hasattr(view, "config")
            hint = " (the model goes first: attnlens.compare(model, 'papa', ...))" if model_like else ""
            raise InputError(
                f"views are names, got {describe(view)}{hint}; valid views are "
                f"{', '.join(repr(v) for v in known)}"
            )
        if view not in known:
            raise registry.unknown_view(view, among=known)
        if view not in names:
            names.append(view)
    return tuple(names)


def _as_model(model: Any) -> Any:
    if isinstance(model, str) and model in registry.REGISTRY:
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
    """0, or with a view blind on short texts (:attr:`View.blind_below_d_head`: effective
    attention) the first of the first 256 texts with more than ``d_head``
    real tokens once tokenized with ``max_len`` and ``layout`` (effective attention equals
    standard attention when there are at most ``d_head`` tokens: the values then span every
    direction). Real tokens are counted in the layout itself: in the PAPA layout each segment of
    a pair gets only half of ``max_len``."""
    if not _blind_on_short_texts(views):
        return 0
    batch = tokenize(model, list(texts[:256]), max_len=max_len, layout=layout)
    lengths = batch.attention_mask.sum(-1)
    longer = (lengths > int(model.cfg.d_head)).nonzero()
    return int(longer[0, 0]) if len(longer) else 0


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
    (every view of :data:`attnlens.methods.views.REGISTRY` when it is called, a view registered
    outside attnlens included); ``"standard"`` is always included; no views means all of them.
    An unknown view raises ``InputError`` naming the valid ones.

    ``corpus``: a list of texts (or sentence pairs), a file (see
    :func:`attnlens.core.corpus.read_corpus`), or ``None`` / ``"default"`` for the embedded corpus
    (:func:`attnlens.core.corpus.default_corpus`); ``n_examples`` keeps the first ``n``. Texts are
    tokenized with ``max_len`` tokens (default 128, or the constants' ``max_len``) in the PAPA
    layout when the ``"papa"`` view is requested on an encoder (PAPA constants are positional),
    else with ordinary padding (decoders such as GPT-2 have no [CLS]/[SEP] to fix in place). ``constants``: precomputed :class:`attnlens.papa.PapaConstants`, which must
    match the model and the corpus (layout, ``max_len``, sentences or pairs), or a path to a file of
    them (loaded and checked); otherwise they are fitted on the same corpus first, in a pass
    whose patterns the comparison replays (:mod:`attnlens.engine.recording`: one forward over the
    corpus in all, as long as a quarter of the device's free memory holds them; the batches
    beyond it run their forward again).

    For every view and head the table gives the statistics of :mod:`attnlens.methods.stats` (mean over
    valid query tokens) and ``distance_from_standard``: the mean over valid query rows of the
    total-variation distance ``½ · Σ_k |a_view(q, k) − a_standard(q, k)|`` over valid keys (0 to
    1 for attention distributions; effective attention can exceed 1). The figures show example
    ``example`` (default: the first text, or with the ``"effective"`` view the first text with
    more than ``d_head`` real tokens once tokenized, since effective attention equals standard
    attention on shorter ones) and, side by side, head ``focus = (layer, head)`` (default: the
    head whose first non-standard view is farthest from standard; the lowest-entropy head for
    standard alone). ``progress`` shows tqdm bars for each pass over the corpus.

    ``tasks`` / ``lm_texts``: also measure what each view costs (:attr:`Comparison.scores`):
    a probe per task of :mod:`attnlens.evaluation.tasks` (:func:`attnlens.evaluation.probing.run` with ``data_dir``,
    ``train_limit``, ``eval_limit``) and the LM score of ``lm_texts`` (:func:`attnlens.evaluation.lm.scorer.evaluate`:
    the model's own trained head, else the MLM probe), under standard attention, PAPA with every
    head replaced and with half of them (the least input-dependent), and effective attention.
    Effective attention leaves the output unchanged by construction (``A⊥V = AV``): its score is
    computed, as a check, not assumed.

    ``report_examples`` / ``report_budget``: the report lets a reader pick any head of any of the
    first ``report_examples`` texts (default :data:`REPORT_EXAMPLES`) whose maps, 8-bit and
    compressed (:mod:`attnlens.present.kept`), fit in ``report_budget`` bytes (default
    :data:`REPORT_BUDGET`; a text that does not fit in what is left is skipped), plus the shown
    example; they are :attr:`Comparison.kept_patterns`. ``report_examples=0`` keeps none.

    The model runs in eval mode (no dropout), as in :func:`attnlens.papa.fit`; its previous
    mode is restored afterwards, also when the comparison fails.
    """
    if len(views) == 1 and isinstance(views[0], list | tuple):
        views = tuple(views[0])
    if isinstance(model, str) and model in registry.REGISTRY:
        _as_model(model)  # the view given as the model: say the model goes first
    names = validate_views(views or registry.names())
    if isinstance(constants, str | os.PathLike):  # a constants file: load it (checked below)
        constants = PapaConstants.load(constants)
    texts = resolve_corpus(corpus)
    if lm_texts is not None:  # checked before the pass (one string would be read as its characters)
        lm_texts = list(corpus_iterator(lm_texts, name="lm_texts"))
    if n_examples is not None:
        n_examples = check_count(n_examples, "n_examples")
        if n_examples < 1:
            raise InputError(f"n_examples must be at least 1, got {n_examples}")
        texts = texts[:n_examples]
    if max_len is not None:
        max_len = as_max_len(max_len)
    if example is not None:
        example = check_example(example, len(texts))
    batch_size = whole_number(batch_size, "batch_size", " of examples (e.g. 32)", minimum=1)

    train_limit = optional_count(train_limit, "train_limit", " of training examples (or None for all)")
    eval_limit = optional_count(eval_limit, "eval_limit", " of evaluated examples (or None for all)")
    report_examples = check_count(report_examples, "report_examples")
    report_budget = check_count(report_budget, "report_budget (bytes)")
    if report_examples < 0 or report_budget < 0:
        raise InputError(
            f"report_examples={report_examples} and report_budget={report_budget} must be at "
            "least 0 (0 keeps no examples for the report's explorer)"
        )
    model = _as_model(model)
    if focus is not None:
        focus = check_focus(focus, model.cfg.n_layers, model.cfg.n_heads)
    # fitting the constants, the pass keeps its patterns for the comparison's pass over the same
    # batches (engine.recording: the comparison then runs no forward of its own for them)
    recording = Recording(values=any(registry.get_view(name).needs_values for name in names))
    with eval_mode(model), fingerprints_kept():  # the weights do not change during the job
        try:  # the recording freed even on an error (a traceback kept in a notebook would hold it)
            constants, max_len, layout = _constants_setup(
                model, names, texts, constants, max_len, batch_size, progress, record=recording
            )
            if example is None:
                example = _default_example(model, texts, names, max_len, layout)
            comparison = _compare(
                model, names, texts, constants, max_len=max_len, layout=layout,
                batch_size=batch_size, example=example, focus=focus, progress=progress,
                report_examples=report_examples, report_budget=report_budget, replay=recording,
            )
        finally:
            recording.clear()
        if tasks or lm_texts is not None:
            comparison.scores = view_scores(
                model, names, constants, tasks=tasks, lm_texts=lm_texts, data_dir=data_dir,
                train_limit=train_limit, eval_limit=eval_limit, max_len=max_len, layout=layout,
                batch_size=batch_size, progress=progress,
            )
        return comparison


def check_focus(focus: Any, n_layers: int, n_heads: int) -> tuple[int, int]:
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


def _constants_setup(
    model: Any,
    names: Sequence[str],
    texts: Sequence,
    constants: Any,
    max_len: int | None,
    batch_size: int,
    progress: bool,
    record: Recording | None = None,
) -> tuple[Any, int, str]:
    """``(constants, max_len, layout)`` of the pass: without a view given by PAPA constants
    (:attr:`View.takes_constants`) no constants and the padded layout; with one the given
    constants (checked against the model) or ones fitted on ``texts`` (their pass kept in
    ``record``), and their ``max_len`` and layout."""
    if not any(registry.get_view(name).takes_constants for name in names):
        return None, DEFAULT_MAX_LEN if max_len is None else max_len, "padded"
    if constants is None:
        max_len = DEFAULT_MAX_LEN if max_len is None else max_len
        constants = fitting.fit(
            model, texts, max_len=max_len, layout=fitting.default_layout(model),
            batch_size=batch_size, progress=progress, record=record,
        )
    if max_len is not None and constants.max_len != max_len:
        raise InputError(
            f"the PAPA constants were fitted with max_len={constants.max_len}, not {max_len}; "
            f"pass max_len={constants.max_len} (on the command line --max-len {constants.max_len}) "
            "or leave it out"
        )
    constants.check_compatible(model)
    return constants, constants.max_len, constants.layout


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
    replay: Recording | None = None,
) -> Comparison:
    """The pass over the corpus of :func:`compare`, its arguments checked and resolved
    (``replay``: the fit's recording of the same batches, :mod:`attnlens.engine.recording`)."""
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    causal = is_causal(model)
    views = ViewsAccumulator(
        model, names, constants, example=example, causal=causal, report_examples=report_examples
    )
    summary = passes.run(
        model, texts, [views], max_len=max_len, layout=layout, batch_size=batch_size,
        progress=progress, description=f"compare ({', '.join(names)})", replay=replay,
    )
    statistics, distance = views.result()
    n_tokens = summary.n_tokens
    meta: dict[str, Any] = {}
    if _blind_on_short_texts(names):
        d_head = int(model.cfg.d_head)
        meta.update(d_head=d_head, longer_than_d_head=int(views.longer_than_d_head))
        warn_if_short(int(views.longer_than_d_head), d_head)

    table = pd.concat([_view_rows(view, statistics[view].means(), distance[view] / n_tokens,
                                  views.types[view], summary.n_examples) for view in names],
                      ignore_index=True)
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


def _view_rows(
    view: str,
    means: dict[str, Float[Tensor, "layer head"]],
    distance: Float[Tensor, "layer head"],
    types: Int[Tensor, "layer head type"],
    n_examples: int,
) -> pd.DataFrame:
    """The table's rows of one view, layer after layer, head after head (:data:`COLUMNS`): each
    statistic's mean, the mean distance from standard attention per token, the share of the
    examples of each pattern type (its count over ``n_examples``) and the most frequent type
    (the first of the most frequent)."""
    n_layers, n_heads = distance.shape
    counts = types.reshape(n_layers * n_heads, -1).cpu()  # (a pass reads its state back: a no-op)
    shares = counts.numpy().astype(np.float64) / n_examples
    columns: dict[str, Any] = {
        "view": [view] * (n_layers * n_heads),
        "layer": np.repeat(np.arange(n_layers), n_heads),
        "head": np.tile(np.arange(n_heads), n_layers),
        **{name: means[name].reshape(-1).numpy().astype(np.float64) for name in STATISTICS},
        "distance_from_standard": distance.reshape(-1).cpu().numpy().astype(np.float64),
        **{column: shares[:, index] for index, column in enumerate(TYPE_COLUMNS)},
        "pattern_type": [TYPES[index] for index in counts.argmax(-1).tolist()],
    }
    return pd.DataFrame(columns, columns=list(COLUMNS))


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


def _blind_on_short_texts(names: Sequence[str]) -> bool:
    """Whether a view of ``names`` equals standard attention on texts of at most ``d_head``
    tokens (:attr:`View.blind_below_d_head`: effective attention)."""
    return any(registry.get_view(name).blind_below_d_head for name in names)
