"""Bootstrap intervals and paired bootstrap tests of task scores (Efron & Tibshirani 1993).

A score on a dev set of ``n`` examples is one draw; PAPA (Hassid et al. 2022, §4.1) reports 95%
intervals. Here every metric of :mod:`attnlens.evaluation.tasks` is written as a function of *sums of
per-example counts*, so one resample is a weighted sum, and 1,000 resamples are one matrix
product:

- ``accuracy``: per example ``[correct, total]`` (token tasks: over its words), score ``c / t``;
- ``f1`` (the positive class): ``[tp, fp, fn]``, score ``2·tp / (2·tp + fp + fn)`` (0 when
  undefined, as scikit-learn's ``zero_division``);
- ``matthews_corrcoef``: ``[tp, tn, fp, fn]``, score
  ``(tp·tn − fp·fn) / √((tp+fp)(tp+fn)(tn+fp)(tn+fn))`` (0 when undefined, as scikit-learn);
- ``seqeval_f1`` (micro, seqeval's default mode): ``[correct entities, predicted, gold]``,
  score ``2·c / (p + g)``; entities never cross sentences, so the per-sentence counts add up to
  seqeval's.

A resample draws ``n`` examples with replacement: multinomial weights ``w`` ``[resample, example]``,
totals ``w @ counts``. The percentile interval is the ``(1 − level) / 2`` and ``(1 + level) / 2``
quantiles of the resampled scores. The paired test (:func:`paired`) resamples two systems'
predictions with the same weights (Koehn 2004, Berg-Kirkpatrick et al. 2012). One test
convention holds everywhere:

- ``p_value`` is **two-sided**: ``2 · min(P*(d ≤ 0), P*(d ≥ 0))`` over the resampled differences
  ``d``, capped at 1, the percentile interval inverted: ``p_value < 1 − level`` when the
  ``level`` interval excludes 0, but for ties at 0 and the quantiles' interpolation between
  resamples at the boundary; ``significant`` is ``p < α`` with α exactly 0.05 (:data:`ALPHA`);
- across the tests of one table, :func:`holm` adjusts the p-values (Holm 1979), and a table's
  ``significant`` is ``p_adjusted < ALPHA``;
- ``detectable`` (:attr:`Paired.detectable`) is the difference this test detects with 80% power
  at the observed spread: ``(z₀.₉₇₅ + z₀.₈) · sd*(d)`` (a normal approximation of the
  resampled differences, two-sided α = 0.05);
- ``equivalent`` (:meth:`Paired.equivalent`) is a paired TOST (Schuirmann 1987) against a margin
  ``δ`` fixed before looking: both one-sided tests at α = 0.05 reject, i.e. the 90% percentile
  interval of ``d`` lies inside ``(−δ, δ)``.

**Runs (probe seeds) are a second source of noise.** Several runs of the same examples (``runs=
True``: one per probe seed) score their mean, and a resample also draws ``k`` of the ``k`` runs
with replacement, independently of the examples: seeds and examples are crossed (every seed
scores every example), and resampling both factors independently is Owen's (2007) "pigeonhole"
bootstrap, whose variance errs on the large side. So the interval holds the seeds' spread as
well as the examples'. The drawn runs' mean ``m*`` is taken about the mean of all runs ``m`` on
the same resample as ``m + √(k / (k − 1)) · (m* − m)``: a plain draw of ``k`` from ``k`` has
variance ``(k − 1)/k · s²/k``, and the factor makes it ``s²/k``, the seed mean's variance with
the spread ``s`` (ddof 1). A paired test with the same number of runs on both sides pairs them
by position (the same probe seed: the same initial weights and order) and draws the
differences; with one run there is no seed spread to draw, and the interval is the examples'
alone. Measured on MiniLM's SST-2 curve (``docs/probing.md``): with 3 seeds, the seeds are a
quarter to a third of the variance of a point's drop. ``resample_runs=False`` draws the
examples only, as attnlens did before (the tables of ``docs/`` made before it say so).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
from jaxtyping import Float, Int

from attnlens.core.checks import finite, flag, whole_number
from attnlens.errors import InputError

#: Resamples per interval by default (the percentile's Monte-Carlo error at 95%: about ±0.2
#: percentile points, well inside the interval's own width).
RESAMPLES = 1000
LEVEL = 0.95
#: the significance threshold of every test: ``p < ALPHA`` (``1 − LEVEL``, without the rounding of
#: ``1 - 0.95``, which is 0.050000000000000044 and would count p = 0.05 in)
ALPHA = 0.05


def alpha_of(level: float) -> float:
    """``1 − level`` as the decimal it means (``alpha_of(0.95) == 0.05``), not its float rounding."""
    return round(1.0 - level, 12)


@dataclass(frozen=True)
class Interval:
    """A ``level`` bootstrap percentile interval ``[low, high]`` around ``score``."""

    score: float
    low: float
    high: float
    level: float = LEVEL

    def __contains__(self, value: float) -> bool:
        return self.low <= value <= self.high

    @property
    def width(self) -> float:
        return self.high - self.low

    def __repr__(self) -> str:
        return f"{self.score:.4f} [{self.low:.4f}, {self.high:.4f}]"


@dataclass(frozen=True)
class Paired:
    """A paired bootstrap comparison of ``score − base`` on the same examples: the
    ``difference`` of the point scores, its ``level`` interval ``[low, high]``, the two-sided
    ``p_value`` of "no difference" (the module docstring), ``spread``: the standard deviation of
    the resampled differences, and ``tost_low`` / ``tost_high``: their ``(1 − 2α)`` interval
    (90% at ``level`` 0.95), what :meth:`equivalent` reads."""

    difference: float
    low: float
    high: float
    p_value: float
    level: float = LEVEL
    spread: float = float("nan")
    tost_low: float = float("nan")
    tost_high: float = float("nan")

    @property
    def significant(self) -> bool:
        """Whether the two-sided ``p_value`` is below ``1 − level`` (unadjusted: a table of
        several tests adjusts them with :func:`holm` first)."""
        return self.p_value < alpha_of(self.level)

    @property
    def detectable(self) -> float:
        """The smallest difference this comparison detects with 80% power at two-sided
        ``α = 1 − level``, at the observed spread: ``(z₁₋α/₂ + z₀.₈) · spread``."""
        return (_z(1 - (1 - self.level) / 2) + _z(POWER)) * self.spread

    def equivalent(self, margin: float) -> bool:
        """A paired TOST at ``α = (1 − level) / 2`` per side: whether the ``(1 − 2α)`` interval of
        the difference lies inside ``(−margin, margin)`` (``margin`` in the score's units, fixed
        before looking at the results)."""
        margin = finite(margin, "margin", low=0.0)
        return -margin < self.tost_low and self.tost_high < margin


#: the power at which :attr:`Paired.detectable` is given
POWER = 0.8


def _z(probability: float) -> float:
    """The standard normal quantile (:class:`statistics.NormalDist`)."""
    return NormalDist().inv_cdf(probability)


def two_sided_p(differences: Float[np.ndarray, " resample"]) -> float:
    """The two-sided bootstrap p-value of "no difference": ``2 · min(P*(d ≤ 0), P*(d ≥ 0))``,
    capped at 1 (the percentile interval inverted; the module docstring)."""
    return float(min(1.0, 2 * min(np.mean(differences <= 0), np.mean(differences >= 0))))


def holm(p_values: Sequence[float] | np.ndarray) -> Float[np.ndarray, " test"]:
    """Holm's (1979) step-down adjustment of the p-values of one family of tests (a table):
    the ``i``-th smallest of ``m`` becomes ``max_{j ≤ i} min(1, (m − j + 1) · p_(j))``; NaN
    (no test) stays NaN and does not count in ``m``. ``adjusted < α`` rejects exactly the
    hypotheses Holm's procedure rejects at ``α``, controlling the family-wise error rate."""
    values = np.asarray(p_values, dtype=np.float64).reshape(-1)
    adjusted = np.full_like(values, np.nan)
    tested = np.flatnonzero(~np.isnan(values))
    order = tested[np.argsort(values[tested], kind="stable")]
    m = len(order)
    scaled = np.minimum(1.0, (m - np.arange(m)) * values[order])
    adjusted[order] = np.maximum.accumulate(scaled) if m else scaled
    return adjusted


def _paired(difference: float, differences: Float[np.ndarray, " resample"], level: float) -> Paired:
    """A :class:`Paired` of the point ``difference`` and its resampled ``differences``."""
    alpha = 1 - level
    low, high, tost_low, tost_high = np.quantile(differences, [alpha / 2, 1 - alpha / 2, alpha, 1 - alpha])
    return Paired(float(difference), float(low), float(high), two_sided_p(differences), level,
                  float(np.std(differences, ddof=1)) if len(differences) > 1 else float("nan"),
                  float(tost_low), float(tost_high))


def counts(task: Any, predictions: Sequence[Any]) -> Float[np.ndarray, "example count"]:
    """Per-example counts of ``task``'s metric (see the module docstring) for ``predictions``
    (label indices or names, as :meth:`attnlens.evaluation.tasks.Task.score` takes them)."""
    gold = task.labels()
    predicted = task.as_indices(predictions, gold)
    metric = task.metric
    if metric == "accuracy":
        if task.kind == "token":
            return np.array([[sum(p == g for p, g in zip(ps, gs, strict=True)), len(gs)]
                             for ps, gs in zip(predicted, gold, strict=True)], dtype=np.float64)
        return np.array([[float(p == g), 1.0] for p, g in zip(predicted, gold, strict=True)])
    if metric in ("f1", "matthews_corrcoef"):
        p, g = np.asarray(predicted) == 1, np.asarray(gold) == 1
        columns = [p & g, ~p & ~g, p & ~g, ~p & g]  # tp, tn, fp, fn
        return np.stack(columns, axis=1).astype(np.float64)
    if metric == "seqeval_f1":
        from seqeval.metrics.sequence_labeling import get_entities

        names = task.label_names
        rows = []
        for ps, gs in zip(predicted, gold, strict=True):
            found = set(get_entities([names[t] for t in ps]))
            true = set(get_entities([names[t] for t in gs]))
            rows.append([len(found & true), len(found), len(true)])
        return np.array(rows, dtype=np.float64).reshape(-1, 3)
    raise InputError(f"no bootstrap for metric {metric!r}")


def from_counts(metric: str, totals: Float[np.ndarray, "*batch count"]) -> Float[np.ndarray, "*batch"]:
    """The metric of summed counts ``totals`` (the last axis: the counts of :func:`counts`)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        if metric == "accuracy":
            value = totals[..., 0] / totals[..., 1]
        elif metric == "f1":
            tp, fp, fn = totals[..., 0], totals[..., 2], totals[..., 3]
            value = 2 * tp / (2 * tp + fp + fn)
        elif metric == "matthews_corrcoef":
            tp, tn, fp, fn = (totals[..., i] for i in range(4))
            value = (tp * tn - fp * fn) / np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
        elif metric == "seqeval_f1":
            value = 2 * totals[..., 0] / (totals[..., 1] + totals[..., 2])
        else:
            raise InputError(f"no bootstrap for metric {metric!r}")
    return np.asarray(np.nan_to_num(value, nan=0.0, posinf=0.0, neginf=0.0))


def weights(n: int, *, resamples: int = RESAMPLES, seed: int = 0) -> Float[np.ndarray, "resample example"]:
    """How often each of ``n`` examples is drawn in each resample (multinomial, seeded)."""
    resamples = whole_number(resamples, "resamples", " of bootstrap resamples (e.g. 1000)", minimum=1)
    seed = whole_number(seed, "seed", minimum=0)
    if n < 1:
        raise InputError("a bootstrap needs at least one evaluated example.")
    return np.random.default_rng(seed).multinomial(n, np.full(n, 1.0 / n), size=resamples).astype(np.float64)


def _level(level: Any) -> float:
    """``level`` as a number strictly between 0 and 1 (0.95: a 95% interval)."""
    level = finite(level, "level", low=0.0, high=1.0)
    if not 0 < level < 1:
        raise InputError(f"level must lie strictly between 0 and 1 (e.g. 0.95), got {level}")
    return level


def run_draws(k: int, *, resamples: int = RESAMPLES, seed: int = 0,
              stream: int = 1) -> Int[np.ndarray, "resample run"] | None:
    """Which of ``k`` runs each resample draws (``k`` with replacement, seeded; a stream of its
    own, so the examples' weights of :func:`weights` are the same with or without it); ``None``
    for one run (nothing to draw)."""
    if k < 2:
        return None
    return np.random.default_rng([seed, stream]).integers(0, k, size=(resamples, k))


def run_mean(values: Float[np.ndarray, "run resample"],
             draws: Int[np.ndarray, "resample run"] | None) -> Float[np.ndarray, " resample"]:
    """The runs' mean on every resample; with ``draws``, the mean of the drawn runs, rescaled
    about the mean of all runs by ``√(k / (k − 1))`` so its variance over the draws is the seed
    mean's, ``s² / k`` (see the module docstring)."""
    mean = values.mean(0)
    if draws is None:
        return mean
    k = values.shape[0]
    drawn = np.take_along_axis(values, draws.T, axis=0).mean(0)
    return mean + np.sqrt(k / (k - 1)) * (drawn - mean)


def _per_run(task: Any, predictions: Sequence[Sequence[Any]],
             drawn: np.ndarray) -> tuple[np.ndarray, Float[np.ndarray, "run resample"]]:
    """Each run's point score and its score on every resample."""
    tables = [counts(task, one) for one in predictions]
    points = np.array([from_counts(task.metric, table.sum(0)) for table in tables])
    return points, np.stack([from_counts(task.metric, drawn @ table) for table in tables])


def bootstrap_counts(table: Float[np.ndarray, "example count"], metric: str, *, resamples: int = RESAMPLES,
                     level: float = LEVEL, seed: int = 0) -> Interval:
    """The ``level`` bootstrap interval of ``metric`` over per-example count rows ``table``
    (:func:`from_counts`; e.g. ``"accuracy"``'s ``[sum, count]`` is any mean over the examples'
    items, as the MLM probe's log-likelihood per masked token)."""
    drawn = weights(len(table), resamples=resamples, seed=seed)
    resampled = from_counts(metric, drawn @ table)
    low, high = np.quantile(resampled, [(1 - level) / 2, (1 + level) / 2])
    return Interval(float(from_counts(metric, table.sum(0))), float(low), float(high), level)


def paired_counts(base: Float[np.ndarray, "example count"], other: Float[np.ndarray, "example count"],
                  metric: str, *, resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0) -> Paired:
    """:func:`paired` on per-example count rows of the same examples (``base`` and ``other``)."""
    if base.shape != other.shape:
        raise InputError(f"paired counts need the same examples: {base.shape} and {other.shape}.")
    drawn = weights(len(base), resamples=resamples, seed=seed)
    differences = from_counts(metric, drawn @ other) - from_counts(metric, drawn @ base)
    difference = float(from_counts(metric, other.sum(0)) - from_counts(metric, base.sum(0)))
    return _paired(difference, differences, level)


def bootstrap(task: Any, predictions: Sequence[Any], *, resamples: int = RESAMPLES, level: float = LEVEL,
              seed: int = 0, runs: bool = False, resample_runs: bool = True) -> Interval:
    """The ``level`` bootstrap interval of ``task``'s score of ``predictions`` over its examples.

    ``runs=True``: ``predictions`` is a list of runs (e.g. one per probe seed) of the same
    examples; the score is their mean, and each resample also draws the runs
    (``resample_runs``; the module docstring), so the interval holds the seeds' spread."""
    level = _level(level)
    flag(resample_runs, "resample_runs")
    flag(runs, "runs (True: predictions is a list of runs, one per seed)")
    predictions = list(predictions) if runs else [predictions]
    points, values = _per_run(task, predictions, weights(len(task), resamples=resamples, seed=seed))
    draws = run_draws(len(predictions), resamples=resamples, seed=seed) if resample_runs else None
    low, high = np.quantile(run_mean(values, draws), [(1 - level) / 2, (1 + level) / 2])
    return Interval(float(points.mean()), float(low), float(high), level)


def paired(task: Any, base: Sequence[Any], other: Sequence[Any], *, resamples: int = RESAMPLES,
           level: float = LEVEL, seed: int = 0, runs: bool = False, resample_runs: bool = True) -> Paired:
    """Paired bootstrap of ``score(other) − score(base)`` on ``task``'s examples: both resampled
    with the same weights. ``runs=True``: both are lists of runs (seeds), their means compared;
    with ``resample_runs`` each resample also draws the runs (the module docstring): paired by
    position when both sides have as many runs (the same seeds), each side's own otherwise."""
    level = _level(level)
    flag(resample_runs, "resample_runs")
    flag(runs, "runs (True: base and other are lists of runs, one per seed)")
    base, other = (list(base), list(other)) if runs else ([base], [other])
    drawn = weights(len(task), resamples=resamples, seed=seed)
    base_points, base_values = _per_run(task, base, drawn)
    points, values = _per_run(task, other, drawn)
    if not resample_runs:
        differences = values.mean(0) - base_values.mean(0)
    elif len(base) == len(other):
        differences = run_mean(values - base_values, run_draws(len(other), resamples=resamples, seed=seed))
    else:
        differences = (run_mean(values, run_draws(len(other), resamples=resamples, seed=seed))
                       - run_mean(base_values, run_draws(len(base), resamples=resamples, seed=seed, stream=2)))
    return _paired(float(points.mean() - base_points.mean()), differences, level)
