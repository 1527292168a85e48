"""How often each head's map is of each of Kovaleva et al.'s types, over a corpus.

:func:`types` streams a corpus through :func:`attnlens.engine.passes.run` with a :class:`PatternTypes`
accumulator: every (example, layer, head) map is classified (by the template rules of
:mod:`attnlens.methods.patterns.templates`, or by a fitted :class:`~attnlens.methods.patterns.PatternCNN`) and
counted; the result is the share of each type per (layer, head). Views: standard, effective
(Sun & Marasović 2021 find it has fewer vertical maps: less mass on [SEP] and punctuation) or
PAPA constants (:mod:`attnlens.methods.views`). :func:`figure` draws the shares per layer, one panel
per view.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, SupportsIndex

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from attnlens.core import plots
from attnlens.core.corpus import resolve_corpus
from attnlens.core.files import tensor_checksum
from attnlens.core.heads import checked_sizes
from attnlens.core.loading import require_bridge
from attnlens.engine import passes
from attnlens.engine.accumulator import Accumulator, LayerPatterns, PassBatch, add_at
from attnlens.engine.forward import FwdHooks
from attnlens.errors import InputError, InputTypeError
from attnlens.methods import view_setup, views
from attnlens.methods.patterns.templates import TYPES, batch_positions, template_labels

#: colours of the types in figures (one per :data:`TYPES`, Plotly's qualitative "Set2")
COLOURS: dict[str, str] = dict(zip(TYPES, ("#66c2a5", "#fc8d62", "#8da0cb", "#e78ac3", "#b3b3b3"), strict=True))
#: columns of :func:`types`' table
COLUMNS: tuple[str, ...] = ("view", "layer", "head", *TYPES, "type", "maps")


def type_counts(labels: Int[Tensor, "*layer batch head"]) -> Int[Tensor, "*layer head type"]:
    """How many maps of each head have each type (labels: indices into :data:`TYPES`; ``layer``:
    any leading axes, e.g. the layers of a stack, counted each on its own). A comparison with
    each type's index (``one_hot`` checks the labels' range first: on a GPU six kernels more)."""
    return (labels[..., None] == torch.arange(len(TYPES), device=labels.device)).sum(-3)


class PatternTypes(Accumulator):
    """Counts of each type per (layer, head) (:func:`types`), streamed by
    :func:`attnlens.engine.passes.run`.

    ``view``: ``"standard"`` or ``"papa"`` (read the patterns, after the pass's hooks) or
    ``"effective"`` (read effective attention); ``classifier``: None for the template rules, or
    an object with ``classify_batch(pattern, key_mask, view) -> [batch, head]`` type indices
    (a fitted :class:`~attnlens.methods.patterns.PatternCNN`). State (adds up over shards): ``counts``
    ``[layer, head, type]`` and ``maps`` (examples seen).
    """

    compact = True  # the band is read from the batch's positions (Positions.position), never its columns
    any_order = True  # counts over examples

    def __init__(self, n_layers: int, n_heads: int, *, view: str = "standard", classifier: Any = None,
                 constants: Any = None, causal: bool | None = None) -> None:
        n_layers, n_heads = checked_sizes(n_layers, n_heads)

        if not isinstance(view, str):
            raise views.unknown_view(view)
        self._view = views.get_view(view)
        view = self._view.name
        self.view = view
        self.name = f"patterns.types.{view}"
        self.needs_values = self._view.needs_values
        self.classifier, self.constants, self.causal = classifier, constants, causal
        # the template rules label a stack of layers at once (a classifier, one layer at a time)
        self.stacks = classifier is None and self._view.stacks
        self.counts = torch.zeros(n_layers, n_heads, len(TYPES), dtype=torch.int64)
        self.maps = torch.zeros(1, dtype=torch.int64)

    def labels(self, layer: LayerPatterns) -> Int[Tensor, "*layer batch head"]:
        """The type index of every (example, head) map of one layer; of a stack of layers
        (:meth:`LayerPatterns.stack`, with the template rules), ``[layer, batch, head]``."""
        pattern = self._view.read(layer, self.constants, causal=self.causal).detach()
        if self.classifier is not None:
            return self.classifier.classify_batch(pattern, layer.key_mask, self.view, causal=bool(self.causal))
        if layer.layers:
            pattern = pattern.unflatten(0, (len(layer.layers), -1))
        return template_labels(pattern, batch_positions(layer.batch), signed=self._view.signed)

    def update(self, layer: LayerPatterns) -> None:
        counts = type_counts(self.labels(layer))
        self.add_counts(layer.layers, counts) if layer.layers else self.add_counts([layer.layer], counts[None])

    def add_counts(self, layers: Sequence[int], counts: Int[Tensor, "layer head type"]) -> None:
        """Add ``counts[i]`` (:func:`type_counts` of a batch's labels) to layer ``layers[i]``:
        several layers in one addition, as a pass that labels them together hands them over."""
        add_at(self.counts, 0, layers, counts)

    def end_batch(self, batch: PassBatch) -> None:
        self.maps += len(batch)

    def state_dict(self) -> dict[str, Tensor]:
        return {"counts": self.counts, "maps": self.maps}

    def shares(self) -> Float[Tensor, "layer head type"]:
        """The share of each type per (layer, head)."""
        if int(self.maps) == 0:
            raise InputError("PatternTypes saw no example; run it over a non-empty corpus.")
        return self.counts.double() / float(self.maps)

    def settings(self) -> dict[str, Any]:
        """The constants' checksum (:func:`attnlens.methods.views.value_settings`) and the
        classifier's: its class and the checksum of its network's weights (None: the template
        rules; a classifier without a ``network``: its class alone)."""
        network = getattr(self.classifier, "network", None)
        classifier = None if self.classifier is None else {
            "class": type(self.classifier).__name__,
            "weights": None if network is None else tensor_checksum(dict(network.state_dict())),
        }
        return {**views.value_settings(self.constants), "classifier": classifier}

    def result(self) -> pd.DataFrame:
        return table(self.shares(), self.view, int(self.maps))


def table(shares: Float[Tensor, "layer head type"], view: str, maps: int) -> pd.DataFrame:
    """One row per (layer, head): :data:`COLUMNS` (``type``: the most frequent type)."""
    n_layers, n_heads, _ = shares.shape
    layer, head = np.divmod(np.arange(n_layers * n_heads), n_heads)
    flat = shares.reshape(n_layers * n_heads, len(TYPES)).numpy()
    columns: dict[str, Any] = {"view": view, "layer": layer, "head": head}
    columns.update({name: flat[:, i] for i, name in enumerate(TYPES)})
    columns["type"] = np.asarray(TYPES, dtype=object)[flat.argmax(1)]
    columns["maps"] = maps
    return pd.DataFrame(columns, columns=list(COLUMNS))


def types(
    model: Any,
    corpus: Any = None,
    *,
    view: Any = "standard",
    classifier: Any = None,
    max_len: SupportsIndex | None = None,
    layout: str | None = None,
    batch_size: SupportsIndex = 32,
    hooks: FwdHooks = (),
    progress: bool = True,
    checkpoint: Any = None,
) -> pd.DataFrame:
    """The share of each of Kovaleva et al.'s pattern types (:data:`TYPES`) per (layer, head),
    over the maps of a corpus (one map per example, layer and head).

    ``corpus``: texts or sentence pairs, or a file of them (as :func:`attnlens.compare` takes
    it; default: its default corpus). ``view``: ``"standard"``, ``"effective"`` or PAPA
    constants (:mod:`attnlens.methods.views`), or a list of them: standard and effective attention are
    then classified in one pass (PAPA constants, which change the forward, in one pass each)
    and the table has rows for every view. ``max_len`` and ``layout``: default 128 and
    ``"padded"``, the model's ordinary input (:func:`attnlens.methods.view_setup.setup`); with
    PAPA constants among the views, the constants' for every view, as :func:`attnlens.compare`
    does, so that all of them read the same inputs. ``classifier``: None for the template rules
    (:func:`attnlens.methods.patterns.classify`), or a fitted :class:`~attnlens.methods.patterns.PatternCNN`.
    ``hooks``: further interventions during the pass. ``checkpoint``: a file to resume from
    (:func:`attnlens.engine.passes.run`).

    Returns a DataFrame with :data:`COLUMNS`: ``view``, ``layer``, ``head``, one share column
    per type (they sum to 1 per head), ``type`` (the most frequent) and ``maps`` (examples
    classified); ``attrs``: ``view`` (a tuple for several views), ``n_examples``, ``n_tokens``, ``max_len``, ``layout``,
    ``n_truncated``.
    """
    require_bridge(model, "patterns.types")
    if classifier is not None and not callable(getattr(classifier, "classify_batch", None)):
        raise InputTypeError(
            f"classifier must be None (the template rules) or a fitted PatternCNN, got "
            f"{classifier!r}; fit one with PatternCNN().fit(maps, labels) or load it with "
            "PatternCNN.load(path)." if isinstance(classifier, str) else
            f"classifier must be None (the template rules) or a fitted PatternCNN, got a "
            f"{type(classifier).__name__}."
        )
    asked = list(view) if isinstance(view, list | tuple) else [view]
    if not asked:
        raise InputError("view= is an empty list; give 'standard', 'effective' or PAPA constants.")
    chosen = [view_setup.setup(model, one, max_len=max_len, layout=layout, hooks=hooks) for one in asked]
    given = next((c for c in chosen if c.constants is not None), None)
    if given is not None and layout is None:  # as compare: the named views read the constants' inputs too
        chosen = [view_setup.setup(model, one, max_len=given.max_len, layout=given.layout, hooks=hooks)
                  for one in asked]
    # the named views read the same forward: one pass for them, one per set of PAPA constants
    groups = [[c for c in chosen if c.constants is None]] + [[c] for c in chosen if c.constants is not None]
    groups = [group for group in groups if group]
    if checkpoint is not None and len(groups) > 1:
        raise InputError(
            "checkpoint= resumes one pass, but these views need several (PAPA constants run "
            "apart from standard and effective attention); call types once per pass."
        )
    texts = resolve_corpus(corpus)
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    tables, summaries = {}, []
    for group in groups:
        counters = [PatternTypes(n_layers, n_heads, view=c.name, classifier=classifier) for c in group]
        names = [c.name for c in group]
        summaries.append(passes.run(
            model, texts, counters, max_len=group[0].max_len, layout=group[0].layout,
            batch_size=batch_size, hooks=group[0].hooks, progress=progress,
            description=f"pattern types ({', '.join(names)})", checkpoint=checkpoint,
            settings={"views": names, "classifier": type(classifier).__name__},
        ))
        for c, counter in zip(group, counters, strict=True):
            tables[id(c)] = counter.result()
    result = pd.concat([tables[id(c)] for c in chosen], ignore_index=True)
    summary = summaries[0]
    names = [c.name for c in chosen]
    result.attrs.update(
        view=names[0] if len(names) == 1 else tuple(names), n_examples=summary.n_examples,
        n_tokens=summary.n_tokens, max_len=summary.max_len, layout=summary.layout,
        n_truncated=summary.n_truncated,
    )
    return result


def layer_shares(table_: pd.DataFrame) -> pd.DataFrame:
    """Mean share of each type over the heads of each layer: one row per layer."""
    return table_.groupby("layer")[list(TYPES)].mean()


def figure(*tables: pd.DataFrame | Iterable[pd.DataFrame], title: str | None = None) -> Any:
    """Type shares per layer (stacked bars, mean over the layer's heads), one panel per view,
    side by side (e.g. ``figure(types(m, texts, view=["standard", "effective"]))``, or several
    tables)."""
    import plotly.graph_objects as go

    given: list[pd.DataFrame] = []
    for item in tables:
        given.extend([item] if isinstance(item, pd.DataFrame) else list(item))
    if not given:
        raise InputError("figure needs at least one table of patterns.types(...).")
    flat: list[pd.DataFrame] = []
    for item in given:
        missing = [c for c in ("layer", "view", *TYPES) if c not in item.columns]
        if missing:
            raise InputError(f"not a table of patterns.types(...): it lacks columns {missing}.")
        flat.extend(rows for _, rows in item.groupby("view", sort=False))  # a panel per view
    names = [str(item["view"].iloc[0]) for item in flat]
    layout = plots.subplots_layout(len(flat), names, 0.04, shared_yaxes=True)
    traces = []
    for column, (item, view) in enumerate(zip(flat, names, strict=True), start=1):
        shares = layer_shares(item)
        suffix = "" if column == 1 else str(column)
        for name in TYPES:
            traces.append(dict(
                type="bar", x=shares.index.to_numpy(), y=shares[name].to_numpy(), name=name,
                marker=dict(color=COLOURS[name]), legendgroup=name, showlegend=column == 1,
                hovertemplate=f"{view}<br>layer %{{x}}<br>{name}: %{{y:.1%}}<extra></extra>",
                xaxis=f"x{suffix}", yaxis=f"y{suffix}",
            ))
        layout[f"xaxis{suffix}"].update(title=dict(text="layer"), dtick=1)
    layout["yaxis"].update(title=dict(text="share of maps"), tickformat=".0%", range=[0, 1])
    layout.update(
        barmode="stack", title=dict(text=title or "Kovaleva pattern types per layer"),
        legend=dict(title=dict(text="type")), height=380, width=max(420, 360 * len(flat)),
        margin=dict(l=60, r=20, t=70, b=50),
    )
    return go.Figure(data=traces, layout=layout)
