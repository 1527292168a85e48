"""Layer 4, ``evaluation``: what an intervention costs.

Tasks (:mod:`attnlens.evaluation.tasks`), probes (:mod:`attnlens.evaluation.probing`), language
model scores (:mod:`attnlens.evaluation.lm`), the PAPA curve and Table 1
(:mod:`attnlens.evaluation.curve`, :mod:`attnlens.evaluation.table`) and head importance
(:mod:`attnlens.evaluation.importance`).

Imports ``core``, ``engine`` and ``methods`` only (see :mod:`attnlens.core` for the layers).
"""
