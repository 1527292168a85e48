"""Interrupting a pass of :func:`attnlens.engine.passes.run` part-way, as Ctrl-C or SIGTERM would.

A pass by length reads a window of examples before its first batch runs, so an interrupt raised
by the corpus's iterator would come before any batch; these helpers interrupt the pass at the
start of a given batch instead (in its tokenization), after the batches before it have run.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from attnlens.engine import batches


def raise_interrupt() -> None:
    raise KeyboardInterrupt


def send(signal_number: int) -> Callable[[], None]:
    """Send ``signal_number`` to this process (it arrives while the batch runs)."""
    return lambda: os.kill(os.getpid(), signal_number)


def at_batch(monkeypatch: pytest.MonkeyPatch, number: int,
             interrupt: Callable[[], None] = raise_interrupt) -> None:
    """Call ``interrupt()`` as the pass's batch ``number`` (counted from 1) starts: its
    tokenization. ``raise_interrupt`` stops the pass before that batch runs; a signal
    (``send(signal.SIGINT)``) arrives during it, so the pass finishes the batch, saves and stops."""
    original, calls = batches.tokenize, []

    def tokenize(*args, **kwargs):
        calls.append(1)
        if len(calls) == number:
            interrupt()
        return original(*args, **kwargs)

    monkeypatch.setattr(batches, "tokenize", tokenize)

