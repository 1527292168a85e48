"""Reuse freed memory: glibc's allocator settings for the large tensors of a pass.

A pass over a corpus makes and frees, layer after layer, tensors of tens of megabytes: one
``[batch, head, query, key]`` map of 32 texts × 12 heads × 128² float32 is 25 MB, and each
statistic of :func:`attnlens.compare` makes a few. glibc's ``malloc`` hands blocks above its
mmap threshold straight back to the kernel when they are freed, and trims the top of its heap
once more than its trim threshold is free there (by default, after warm-up, 32 MB and 64 MB).
The next layer's tensors are then zero-filled by the kernel page by page again: measured on the
embedded corpus at one thread, 4.1 million page faults, and 28% of ``compare``'s time
(``docs/performance.md``, "Freed memory").

:func:`reuse_freed_memory` fixes the mmap threshold at 32 MB (the most glibc's own dynamic
threshold reaches, so blocks below it come from the heap as they would after warm-up) and the
trim threshold at :data:`TRIM_THRESHOLD`: freed blocks stay in the process, and a later tensor
of the same size reuses them. Results are bit for bit the same; the cost is that up to
:data:`TRIM_THRESHOLD` of freed memory stays with the process (its resident size does not shrink
after a pass). :func:`attnlens.engine.passes.run` and :meth:`attnlens.evaluation.probing.PapaProbe.fit` (whose
features may come from the cache, with no pass before it) call it; it acts once per process. Set
``ATTNLENS_REUSE_MEMORY=0`` before the first pass or fit to keep glibc's defaults. On other C
libraries (macOS, Windows, musl) it does nothing and returns False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

#: mallopt parameters (glibc's ``malloc.h``)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: blocks below this come from the heap (glibc's largest dynamic mmap threshold, 64-bit)
MMAP_THRESHOLD = 32 * 1024 * 1024
#: free memory the heap keeps at its top before it is given back to the kernel
TRIM_THRESHOLD = 1024 * 1024 * 1024
#: set to ``0`` (before the first pass) to keep glibc's own settings
ENVIRONMENT = "ATTNLENS_REUSE_MEMORY"

_applied: bool | None = None


def _libc() -> ctypes.CDLL | None:
    """glibc, or None on any other C library."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def reuse_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds (module docstring) once per process; returns whether
    they are set. False without glibc, or with ``ATTNLENS_REUSE_MEMORY=0``."""
    global _applied
    if _applied is not None:
        return _applied
    if os.environ.get(ENVIRONMENT, "1").strip() == "0":
        _applied = False
        return _applied
    libc = _libc()
    _applied = bool(
        libc is not None
        and libc.mallopt(M_MMAP_THRESHOLD, ctypes.c_int(MMAP_THRESHOLD)) == 1
        and libc.mallopt(M_TRIM_THRESHOLD, ctypes.c_int(TRIM_THRESHOLD)) == 1
    )
    return _applied
