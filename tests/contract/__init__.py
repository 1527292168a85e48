"""Contract tests: one property, run over every object of a kind (torchmetrics' ``MetricTester``);
each enumerates its kind from attnlens (a registry, or a walk over the package) and fails when
one has no case.

- ``test_accumulators.py``: every accumulator of :func:`attnlens.engine.passes.run` (a walk: classes
  with ``update``/``merge``/``result``): split and merge equals the whole, merge order, state
  round trip;
- ``test_views.py``: every registered view (``attnlens.methods.views``);
- ``test_interventions.py``: every registered intervention (``attnlens.methods.interventions``);
- ``test_estimators.py``: every learner (scikit-learn's estimator contract).
"""
