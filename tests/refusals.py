"""The one check of the per-surface refusal tables (tests/unit/test_refusals_*.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from attnlens import AttnlensError
from tests.typechecks import unchecked


def assert_refused(call: Callable[[], Any], error: type, words: str, *, exact: bool = True) -> None:
    """``call()`` raises ``error`` (exactly that class unless ``exact=False``), an
    :class:`attnlens.AttnlensError`, whose message contains ``words`` (the argument's name)."""
    with pytest.raises(error) as info, unchecked():
        call()
    assert (type(info.value) is error if exact else isinstance(info.value, error))
    assert isinstance(info.value, AttnlensError)
    assert words in str(info.value), str(info.value)
