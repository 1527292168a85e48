"""What a comparison is made of: its views, the columns of its table and of its scores, and
what each means.

:mod:`attnlens.compare` builds a :class:`attnlens.compare.Comparison` with these columns and
writes their definitions into its JSON; the report (:mod:`attnlens.present.report`), its
explorer and its figures show them. They live here, below both, so that the presentation layer
never imports the comparison (which imports it); :mod:`attnlens.compare` re-exports every name.
"""

from __future__ import annotations

from attnlens.methods import views
from attnlens.methods.patterns.templates import TYPES
from attnlens.methods.stats import STATISTICS

#: the views compare knows, in report order
VIEWS: tuple[str, ...] = views.names()
#: views whose values can leave [0, 1] (drawn on a diverging colour scale): :attr:`View.signed`
SIGNED_VIEWS: frozenset[str] = views.signed_names()
#: the columns of :attr:`Comparison.table` with the share of each pattern type
TYPE_COLUMNS: tuple[str, ...] = tuple(f"type_{name}" for name in TYPES)
#: columns of :attr:`Comparison.table`
COLUMNS: tuple[str, ...] = (
    "view", "layer", "head", *STATISTICS, "distance_from_standard", *TYPE_COLUMNS, "pattern_type",
)
#: one-line definitions of the table's columns (shown in the report and in ``to_json``)
COLUMN_DOCS: dict[str, str] = {
    "view": "which attention: standard (the model's), papa (constant), effective",
    "layer": "layer index, from 0",
    "head": "head index within the layer, from 0",
    "to_cls": "mean attention on the start token ([CLS] / <s>)",
    "to_sep": "mean attention on separator tokens ([SEP] / </s>)",
    "to_punct": "mean attention on punctuation tokens",
    "to_self": "mean attention on the query's own position (offset 0)",
    "to_prev": "mean attention on the previous position (offset -1)",
    "to_next": "mean attention on the next position (offset +1)",
    "entropy": "mean entropy (nats) of attention rows; signed rows are normalised by |a| first",
    "distance_from_standard": (
        "mean over valid query rows of the total-variation distance "
        "1/2 * sum_k |a_view(q, k) - a_standard(q, k)| over valid keys; 0 for standard"
    ),
    **{
        f"type_{name}": f"share of the examples whose map of this head is of Kovaleva's {name} type "
        "(attnlens.patterns.classify's template rules)"
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

#: Columns of :attr:`Comparison.scores`.
SCORE_COLUMNS = {
    "view": "standard, papa (all heads), papa (half of the heads), effective",
    "task": "task name, or 'lm' for the language-model score",
    "metric": "the task's metric, or the LM score's kind (own head or MLM probe)",
    "score": "on the evaluation split (LM: negative log-perplexity, nats per token)",
    "majority": "score of always predicting the most frequent training label",
    "relative": "score / the standard view's score",
}
