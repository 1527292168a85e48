"""Refusals of effective attention (issue 26, pattern 7): NumPy arrays, a string rtol and
non-finite values are named, not failed on deep inside."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlens.effective import effective_attention
from attnlens.errors import InputError, InputTypeError
from tests.typechecks import unchecked


def inputs():
    generator = torch.Generator().manual_seed(0)
    pattern = torch.softmax(torch.randn(1, 2, 6, 6, generator=generator), -1)
    v = torch.randn(1, 2, 6, 4, generator=generator)
    return pattern, v


@pytest.mark.parametrize("argument", ["pattern", "v"])
def test_numpy_arrays_are_named(argument):
    pattern, v = inputs()
    given = {"pattern": pattern, "v": v}
    given[argument] = given[argument].numpy()
    with pytest.raises(InputTypeError, match=f"{argument} must be a torch tensor, got a ndarray.*torch.as_tensor") as info, unchecked():
        effective_attention(given["pattern"], given["v"])
    assert type(info.value) is InputTypeError and isinstance(info.value, TypeError)
    assert isinstance(np.asarray(pattern), np.ndarray)


def test_rtol_as_a_string_is_named():
    pattern, v = inputs()
    with pytest.raises(InputTypeError, match="rtol must be a number .* got the string '1e-6'"), unchecked():
        effective_attention(pattern, v, rtol="1e-6")
    with pytest.raises(InputError, match="rtol must be a finite number"):
        effective_attention(pattern, v, rtol=float("nan"))


def test_an_inf_in_v_is_named():
    pattern, v = inputs()
    v[0, 1, 2, 3] = float("inf")
    with pytest.raises(InputError, match=r"v \(the values\): 1 of 48 values are not finite .*\(0, 1, 2, 3\)"):
        effective_attention(pattern, v)
