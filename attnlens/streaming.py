"""Deprecated: the corpus loop lives in :mod:`attnlens.passes` (the pass engine).

These names are kept so existing imports work: :func:`corpus_iterator`, :func:`chunks`,
:func:`progress_bar`, :func:`device_of` and :func:`run_patterns` are those of
:mod:`attnlens.passes`.
"""

from __future__ import annotations

from attnlens.passes import chunks, corpus_iterator, device_of, progress_bar, run_patterns

__all__ = ["chunks", "corpus_iterator", "device_of", "progress_bar", "run_patterns"]
