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


# -- dtypes, rtol's range, an example with no key, padded as a flag, statistics read back (issue 26) ----


@pytest.mark.parametrize("argument", ["pattern", "v"])
def test_an_integer_pattern_or_values_are_refused(argument):
    """An int64 pattern used to give a truncated int64 result."""
    pattern, v = inputs()
    given = {"pattern": pattern, "v": v}
    given[argument] = torch.ones_like(given[argument], dtype=torch.long)
    with pytest.raises(InputTypeError, match=f"{argument} must be a floating-point tensor.*{argument}.float()"), unchecked():
        effective_attention(given["pattern"], given["v"])


@pytest.mark.parametrize("rtol", [2.0, 1.0, 0.0, 1e6])
def test_rtol_outside_zero_to_one_is_refused(rtol):
    """rtol is relative to the largest singular value: 2.0 used to drop every direction (A⊥ = 0)."""
    pattern, v = inputs()
    with pytest.raises(InputError, match=r"rtol must lie in \(0, 1\)"):
        effective_attention(pattern, v, rtol=rtol)
    effective_attention(pattern, v, rtol=0.5)


@pytest.mark.parametrize("padded", ["no", "False", 0, None])
def test_padded_must_be_true_or_false(bridge, padded):
    """padded="no" used to switch the padded-length semantics on (a truthy string)."""
    from attnlens.methods import effective
    from tests import tiny

    pattern, v = inputs()
    calls = [
        lambda: effective_attention(pattern, v, padded=padded),
        lambda: effective.run(bridge, tiny.CORPUS[:2], max_len=16, padded=padded),
        lambda: effective.hooks(bridge, padded=padded),
        lambda: effective.pattern_hooks(bridge, lambda *a: None, padded=padded),
        lambda: effective.statistics(bridge, tiny.CORPUS[:2], max_len=16, padded=padded, progress=False),
    ]
    for call in calls:
        with pytest.raises(InputTypeError, match="padded must be True or False") as info, unchecked():
            call()
        assert type(info.value) is InputTypeError


@pytest.mark.parametrize("function", ["run", "statistics"])
def test_rtol_of_run_and_statistics_is_refused_before_the_forward(bridge, function):
    from attnlens.methods import effective
    from tests import tiny

    call = getattr(effective, function)
    options = {"progress": False} if function == "statistics" else {}
    with pytest.raises(InputError, match=r"rtol must lie in \(0, 1\)"):
        call(bridge, tiny.CORPUS[:2], max_len=16, rtol=2.0, **options)


def statistics_dict():
    from attnlens.methods.effective import EffectiveStatistics

    means = {"to_cls": torch.rand(2, 4), "entropy": torch.rand(2, 4)}
    return EffectiveStatistics(standard=means, effective=dict(means), n_examples=3, n_tokens=30,
                               n_truncated=0).to_dict()


@pytest.mark.parametrize(("field", "value", "error", "words"), [
    ("standard", float("nan"), InputError, "standard['to_cls'] (means per [layer, head]): 1 of 8 values are not finite"),
    ("effective", float("inf"), InputError, "effective['to_cls'] (means per [layer, head]): 1 of 8 values are not finite"),
    ("n_examples", -3, InputError, "n_examples must be at least 0"),
    ("n_tokens", 2.5, InputTypeError, "n_tokens must be a whole number"),
    ("n_truncated", "1", InputTypeError, "n_truncated must be a whole number"),
])
def test_statistics_read_back_refuse_nan_means_and_bad_counts(field, value, error, words):
    from attnlens.errors import FileFormatError
    from attnlens.methods.effective import EffectiveStatistics

    data = statistics_dict()
    if field in ("standard", "effective"):
        data[field]["to_cls"][0][1] = value
    else:
        data[field] = value
    with pytest.raises(error) as info, unchecked():
        EffectiveStatistics.from_dict(data)
    assert type(info.value) is error and words in str(info.value), str(info.value)
    import json

    with pytest.raises(FileFormatError, match="a field has the wrong form"):
        EffectiveStatistics.from_json(json.dumps(data))
    assert EffectiveStatistics.from_dict(statistics_dict()).n_examples == 3
