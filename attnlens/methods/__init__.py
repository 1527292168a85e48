"""Layer 3, ``methods``: ways to read or change attention.

PAPA constants (:mod:`attnlens.methods.papa`), effective attention
(:mod:`attnlens.methods.effective`), head statistics (:mod:`attnlens.methods.stats`), pattern
types (:mod:`attnlens.methods.patterns`), clustering (:mod:`attnlens.methods.clustering`), head
ablation (:mod:`attnlens.methods.ablation`), syntax (:mod:`attnlens.methods.syntax`) and the
views they share (:mod:`attnlens.methods.views`).

Imports ``core`` and ``engine`` only (see :mod:`attnlens.core` for the layers).
"""
