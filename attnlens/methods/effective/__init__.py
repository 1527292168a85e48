"""Effective attention (Brunner et al. 2020; Sun & Marasović 2021).

- :func:`effective_attention`: ``A⊥ = A P`` for a batch of patterns and value vectors
  (:mod:`attnlens.engine.effective`, below the methods: the pass engine computes it for every
  accumulator that reads ``LayerPatterns.effective``);
- :func:`run`, :func:`hooks`, :func:`hooked`, :func:`statistics`, :func:`pattern_hooks`: the same on a whole model
  through TransformerLens hooks (:mod:`attnlens.effective.model`).
"""

from __future__ import annotations

import importlib
from typing import Any

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


def __getattr__(name: str) -> Any:
    """``attnlens.effective.core``, the module of before, as an attribute: it is
    :mod:`attnlens.engine.effective` now (importing it warns, :mod:`attnlens._aliases`)."""
    if name == "core":
        return importlib.import_module("attnlens.effective.core")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
