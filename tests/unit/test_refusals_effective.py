"""Refusals of effective attention (issue 26, pattern 7): NumPy arrays, a string rtol and
non-finite values are named, not failed on deep inside."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlens.errors import InputError, InputTypeError
from attnlens.methods.effective import effective_attention
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


def test_a_nan_row_of_the_pattern_is_named():
    """The pattern goes through the values' finiteness check (it used to give NaN rows back)."""
    pattern, v = inputs()
    pattern[0, 0, 1] = float("nan")
    count = pattern.shape[-1]
    with pytest.raises(InputError, match=rf"pattern \(the attention\): {count} of {pattern.numel()} values "
                                         r"are not finite \(NaN or inf\) \(first at index \(0, 0, 1, 0\)\)"):
        effective_attention(pattern, v)


@pytest.fixture(scope="module")
def bridge():
    from tests import tiny

    return tiny.bert_bridge()


LAYER_ROWS = [
    # (argument, bad value, error class, fragment of the message)
    ("layers", [2], InputError, "layers[0] must be in 0..1"),
    ("layers", [-1], InputError, "layers[0] must be in 0..1"),
    ("layers", [0, 1.0], InputTypeError, "layers[1] must be a whole number"),
    ("layers", [True], InputTypeError, "layers[0] must be a whole number"),
    ("layers", 1, InputTypeError, "layers must be a list"),
    ("layers", [], InputError, "layers is empty"),
    ("rtol", float("nan"), InputError, "rtol must be a finite number"),
    ("rtol", "1e-3", InputTypeError, "rtol must be a number"),
    ("rtol", -1.0, InputError, "rtol must lie in"),
]


@pytest.mark.parametrize("function", ["hooks", "pattern_hooks"])
@pytest.mark.parametrize(("argument", "value", "error", "words"), LAYER_ROWS,
                         ids=[f"{a}={v!r}" for a, v, _, _ in LAYER_ROWS])
def test_layers_and_rtol_of_the_hooks_are_named(bridge, function, argument, value, error, words):
    from attnlens.methods import effective

    call = effective.hooks if function == "hooks" else (
        lambda model, **kw: effective.pattern_hooks(model, lambda *a: None, **kw))
    with pytest.raises(error) as info, unchecked():
        call(bridge, **{argument: value})
    assert type(info.value) is error and words in str(info.value), str(info.value)
