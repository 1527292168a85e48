"""One small comparison of the default model, computed once and shared by several test files."""

from __future__ import annotations

import functools

#: texts of the shared comparison: the first of the default corpus (two are longer than d_head)
N_TEXTS = 14
MAX_LEN = 48


def texts() -> list[str]:
    from attnlens.core.corpus import default_corpus

    return default_corpus(N_TEXTS)


@functools.cache
def small_comparison(model):
    """``attnlens.compare(model, "papa", "effective")`` on :func:`texts` (cached per model)."""
    import attnlens

    return attnlens.compare(
        model, "papa", "effective", corpus=texts(), max_len=MAX_LEN, progress=False
    )
