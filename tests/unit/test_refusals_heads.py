"""Refusals of head sets (issue 26): layer and head counts, (layer, head) indices and fractions
go through attnlens.core.checks; each row asserts the exact error class and the argument named."""

from __future__ import annotations

import pytest
import torch

from attnlens.core.heads import HeadSet, n_selected
from attnlens.errors import InputError, InputTypeError
from tests.refusals import assert_refused

NAN = float("nan")

CASES = [
    # (call, argument, bad value, error class, fragment of the message)
    (lambda v: HeadSet.all(v, 4), "n_layers", 2.5, InputTypeError, "n_layers must be a whole number"),
    (lambda v: HeadSet.all(v, 4), "n_layers", True, InputTypeError, "n_layers must be a whole number"),
    (lambda v: HeadSet.all(v, 4), "n_layers", "4", InputTypeError, "n_layers must be a whole number"),
    (lambda v: HeadSet.all(v, 4), "n_layers", 0, InputError, "n_layers must be at least 1"),
    (lambda v: HeadSet.none(2, v), "n_heads", -1, InputError, "n_heads must be at least 1"),
    (lambda v: HeadSet.none(2, v), "n_heads", NAN, InputTypeError, "n_heads must be a whole number"),
    (lambda v: HeadSet.from_heads(v, 2, 4), "heads", [(-1, 0)], InputError, "outside the model's 2 layers"),
    (lambda v: HeadSet.from_heads(v, 2, 4), "heads", [(2, 0)], InputError, "outside the model's 2 layers"),
    (lambda v: HeadSet.from_heads(v, 2, 4), "heads", [(0, 4)], InputError, "outside the model's 2 layers"),
    (lambda v: HeadSet.from_heads(v, 2, 4), "heads", [(True, 0)], InputTypeError, "heads[0]'s layer"),
    (lambda v: HeadSet.from_heads(v, 2, 4), "heads", [(0.0, 1)], InputTypeError, "heads[0]'s layer"),
    (lambda v: HeadSet.from_heads(v, 2, 4), "heads", [(0, 1), (0, 1.5)], InputTypeError, "heads[1]'s head"),
    (lambda v: HeadSet.from_heads(v, 2, 4), "heads", [("0", 1)], InputTypeError, "heads[0]'s layer"),
    (lambda v: HeadSet.from_heads(v, 2, 4), "heads", [0], InputError, "heads[0] is 0"),
    (lambda v: HeadSet.from_heads(v, 2, 4), "heads", 3, InputTypeError, "heads must be (layer, head) pairs"),
    (lambda v: HeadSet.from_heads([(0, 0)], v, 4), "n_layers", 1.5, InputTypeError, "n_layers must be a whole number"),
    (lambda v: HeadSet(v), "mask", torch.ones(2, 4), InputTypeError, "HeadSet mask must be a bool"),
    (lambda v: n_selected(v, 2, 4), "fraction", NAN, InputError, "fraction must be a finite number"),
    (lambda v: n_selected(v, 2, 4), "fraction", 1.5, InputError, "fraction must lie in [0.0, 1.0]"),
    (lambda v: n_selected(v, 2, 4), "fraction", "0.5", InputTypeError, "fraction must be a number"),
    (lambda v: n_selected(v, 2, 4), "fraction", True, InputTypeError, "fraction must be a number"),
    (lambda v: n_selected(0.5, v, 4), "n_layers", 2.5, InputTypeError, "n_layers must be a whole number"),
]


@pytest.mark.parametrize(("call", "argument", "value", "error", "words"), CASES,
                         ids=[f"{argument}={value!r}" for _, argument, value, _, _ in CASES])
def test_a_bad_argument_is_refused_by_name(call, argument, value, error, words):
    assert_refused(lambda: call(value), error, words)


def test_good_arguments_still_work():
    assert len(HeadSet.from_heads([(1, 3), (0, 0)], 2, 4)) == 2
    assert len(HeadSet.all(2, 4)) == 8 and n_selected(0.5, 2, 4) == 4
