"""Contract tests: one property, run over every object of a kind (torchmetrics' ``MetricTester``).

- ``test_accumulators.py``: every accumulator of :func:`attnlens.passes.run` (found by a walk over
  attnlens; a class with ``update``/``merge``/``result`` and no case fails the suite).
- Views and interventions: their contracts go here, as ``test_views.py`` and
  ``test_interventions.py``, enumerated from attnlens' registries of views and interventions once
  those exist (a view's pattern rows over valid keys, an intervention's identity setting leaving
  the logits unchanged, ...), in the same form: a table of cases, one parametrized property each,
  and a test that fails when the registry holds something without a case.
"""
