"""The one test convention of attnlens's tables (the PAPA curve, Table 1): each row that changes
something is tested against its task's reference row, no head replaced, on the same examples
(:func:`attnlens.evaluation.probing.intervals.paired`), and the rows of one table are one family.

- ``p_value``: two-sided; ``p_adjusted``: Holm's adjustment across the table
  (:func:`attnlens.evaluation.probing.intervals.holm`); ``significant``: ``p_adjusted < 0.05``;
- ``detectable``: the difference the dev set detects with 80% power at the observed spread;
- ``equivalent``: a paired TOST against the margin :data:`EQUIVALENCE_MARGIN`, fixed before any
  result was read;
- ``relative``: a ratio to the reference score, only where the metric cannot be negative
  (:data:`SIGNED_METRICS`); read ``difference`` elsewhere.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from attnlens.evaluation.lm.result import NAMES
from attnlens.evaluation.probing.intervals import ALPHA, holm

#: The equivalence margin of every point, fixed before any result was read: 2% of the absolute
#: score with no head replaced (about 1.6 points of SST-2 accuracy or MRPC F1).
EQUIVALENCE_MARGIN = 0.02
#: Metrics that can be negative, for which ``relative`` is not defined.
SIGNED_METRICS: frozenset[str] = frozenset({"matthews_corrcoef", *NAMES.values()})  # the LM: log-likelihoods


def paired_columns(versus: Any, reference: float) -> dict:
    """The columns of a paired test against the reference point (score ``reference``)."""
    margin = EQUIVALENCE_MARGIN * abs(reference)
    return dict(difference=versus.difference, difference_low=versus.low, difference_high=versus.high,
                p_value=versus.p_value, detectable=versus.detectable, margin=margin,
                equivalent=versus.equivalent(margin))


def apply(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with the columns that follow from its tests as one family (the module's test
    convention, :mod:`attnlens.evaluation.probing.intervals`): ``p_adjusted`` (Holm across its
    rows with a test), ``significant`` (``p_adjusted < 0.05``), ``relative`` (empty where the
    metric can be negative) and, where the baselines were tested against the average constants,
    ``versus_average_p_adjusted`` (Holm across those tests: a second family)."""
    table = table.copy()
    table["p_adjusted"] = holm(table["p_value"].astype(float).to_numpy())
    if "versus_average_p" in table:
        table["versus_average_p_adjusted"] = holm(table["versus_average_p"].astype(float).to_numpy())
    table["significant"] = [None if pd.isna(p) else bool(p < ALPHA) for p in table["p_adjusted"]]
    table["relative"] = [float("nan") if metric in SIGNED_METRICS else relative(table, row)
                         for metric, (_, row) in zip(table["metric"], table.iterrows(), strict=True)]
    return table


def relative(table: pd.DataFrame, row: Any) -> float:
    """``row``'s score over its task's score with no head replaced (NaN where that is 0)."""
    base = table[(table["task"] == row["task"]) & (table["fraction_replaced"] == 0.0)]
    if base.empty or base["score"].iloc[0] == 0:
        return float("nan")
    return float(row["score"] / base["score"].iloc[0])
