"""Run-time checks of attnlens' annotations during the tests (installed in ``conftest.py``).

Every function and dataclass of attnlens is checked by beartype against its jaxtyping
annotations (dtype, rank, axis sizes shared within one call). A few tests pass what the
annotations exclude on purpose, to test attnlens' own error messages: a user who does not run
these checks gets those messages. They do it inside :func:`unchecked`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jaxtyping


@contextlib.contextmanager
def unchecked() -> Iterator[None]:
    """Turn the run-time annotation checks off (``jaxtyping_disable``) inside the block."""
    before = jaxtyping.config.jaxtyping_disable
    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        yield
    finally:
        jaxtyping.config.update("jaxtyping_disable", before)
