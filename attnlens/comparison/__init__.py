"""The comparison layer: ``attnlens.compare(model, "papa", "effective")``, views of attention
compared head by head over a corpus, one idea per module:

- :mod:`attnlens.comparison.result`: :class:`~attnlens.comparison.result.Comparison`, the result
  (table, figures, HTML report, JSON);
- :mod:`attnlens.comparison.accumulator`:
  :class:`~attnlens.comparison.accumulator.ViewsAccumulator`, the one pass over the corpus as a
  collection of the methods' own accumulators for every registered view;
- :mod:`attnlens.comparison.run`: :func:`~attnlens.comparison.run.compare`, its argument checks
  and the pass (``attnlens.compare`` is this function, imported on first use).

What each view costs (``compare(tasks=...)``) is :mod:`attnlens.evaluation.view_scores`.
"""
