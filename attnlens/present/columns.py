"""What a comparison is made of: the columns of its table, what each means, and whether a
view is signed (read from the views' registry when asked).

:func:`attnlens.compare` builds a :class:`attnlens.comparison.result.Comparison` with these
columns and writes their definitions into its JSON; the report (:mod:`attnlens.present.report`),
its explorer and its figures show them. They live here, below both, so that the presentation
layer never imports the comparison (which imports it). The columns of its scores are
:data:`attnlens.evaluation.view_scores.SCORE_COLUMNS`.
"""

from __future__ import annotations

from attnlens.methods import views
from attnlens.methods.patterns.templates import TYPES
from attnlens.methods.stats import STATISTICS

#: the columns of :attr:`Comparison.table` with the share of each pattern type
TYPE_COLUMNS: tuple[str, ...] = tuple(f"type_{name}" for name in TYPES)
#: columns of :attr:`Comparison.table`
COLUMNS: tuple[str, ...] = (
    "view", "layer", "head", *STATISTICS, "distance_from_standard", *TYPE_COLUMNS, "pattern_type",
)


def is_causal_on_decoders(view: str) -> bool:
    """Whether ``view``'s maps hold no weight after the query on a decoder:
    :attr:`attnlens.methods.views.View.causal` of the view registered under that name now (a name
    not registered, from a comparison read from JSON: True, as the registered views)."""
    view_value = views.REGISTRY.get(view)
    return view_value is None or view_value.causal


def is_signed(view: str) -> bool:
    """Whether ``view``'s maps can leave [0, 1] (drawn on a diverging colour scale, rows that
    need not sum to 1): :attr:`attnlens.methods.views.View.signed` of the view registered under
    that name now (the registry is read when asked, never copied at import); a name that is
    not registered (a comparison read from JSON in a session without its view) is unsigned."""
    view_value = views.REGISTRY.get(view)
    return view_value is not None and view_value.signed


#: one-line definitions of the table's columns (shown in the report and in ``to_json``)
COLUMN_DOCS: dict[str, str] = {
    "view": "which attention: a registered view (attnlens.methods.views.REGISTRY), e.g. standard "
            "(the model's), papa (constant), effective",
    "layer": "layer index, from 0",
    "head": "head index within the layer, from 0",
    "to_cls": "mean attention on the start token ([CLS] / <s>)",
    "to_sep": "mean attention on separator tokens ([SEP] / </s>)",
    "to_punct": "mean attention on punctuation tokens",
    "to_self": "mean attention on the query's own position (offset 0)",
    "to_prev": "mean attention on the previous position (offset -1)",
    "to_next": "mean attention on the next position (offset +1)",
    "entropy": "mean entropy (nats) of attention rows; signed rows are normalised by |a| first",
    "sink": "share of query rows giving the first token more than 0.3 of their mass (Gu et al. 2024's attention sink)",
    "distance_from_standard": (
        "mean over valid query rows of the total-variation distance "
        "1/2 * sum_k |a_view(q, k) - a_standard(q, k)| over valid keys; 0 for standard"
    ),
    **{
        f"type_{name}": f"share of the examples whose map of this head is of Kovaleva's {name} type "
        "(attnlens.methods.patterns.classify's template rules)"
        for name in TYPES
    },
    "pattern_type": "the head's most frequent Kovaleva pattern type",
}
DISTANCE_DEFINITION = COLUMN_DOCS["distance_from_standard"]

#: targets of the "dominant target" head grid: table column -> label
TARGETS: dict[str, str] = {
    "to_cls": "[CLS]",
    "to_sep": "[SEP]",
    "to_punct": "punctuation",
    "to_self": "self",
    "to_prev": "previous",
    "to_next": "next",
}
#: a head whose largest target share is below this is labelled "broad"
BROAD_BELOW = 0.25
