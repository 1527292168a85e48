"""Effective attention (Brunner et al. 2020; Sun & Marasović 2021).

- :func:`effective_attention`: ``A⊥ = A P`` for a batch of patterns and value vectors
  (:mod:`attnlens.engine.effective`, below the methods: the pass engine computes it for every
  accumulator that reads ``LayerPatterns.effective``);
- :func:`run`, :func:`hooks`, :func:`hooked`, :func:`statistics`, :func:`pattern_hooks`: the same on a whole model
  through TransformerLens hooks (:mod:`attnlens.methods.effective.model`).
"""

from __future__ import annotations

from attnlens.engine.effective import effective_attention
from attnlens.methods.effective.model import (
    MODES,
    EffectiveRun,
    EffectiveStatistics,
    hooked,
    hooks,
    pattern_hooks,
    run,
    statistics,
)

__all__ = [
    "MODES",
    "EffectiveRun",
    "EffectiveStatistics",
    "effective_attention",
    "hooked",
    "hooks",
    "pattern_hooks",
    "run",
    "statistics",
]

