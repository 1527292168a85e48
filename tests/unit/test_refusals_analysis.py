"""Refusals of the analyses (issue 26): stats, patterns, clustering and syntax take their
counts, lengths, seeds and tensors through attnlens.core.checks; each row asserts the exact error
class and the argument named."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlens.errors import InputError, InputTypeError
from attnlens.methods import clustering, patterns, stats, syntax
from tests.refusals import assert_refused

NAN = float("nan")
TABLE = None  # syntax.figure refuses top before reading its table

CASES = [
    # (call, argument, bad value, error class, fragment of the message)
    (lambda v: stats.Statistics(v, 4), "n_layers", 2.5, InputTypeError, "n_layers must be a whole number"),
    (lambda v: stats.Statistics(2, v), "n_heads", 0, InputError, "n_heads must be at least 1"),
    (lambda v: stats.AttentionStatistics(v, 4), "n_layers", "2", InputTypeError, "n_layers must be a whole number"),
    (lambda v: patterns.PatternTypes(v, 4), "n_layers", -1, InputError, "n_layers must be at least 1"),
    (lambda v: patterns.synthetic("diagonal", v), "n", 2.5, InputTypeError, "n must be a whole number"),
    (lambda v: patterns.synthetic("diagonal", 2, length=v), "length", True, InputTypeError, "length must be a whole number"),
    (lambda v: patterns.synthetic("diagonal", 2, seed=v), "seed", 1.5, InputTypeError, "seed must be a whole number"),
    (lambda v: patterns.Positions.from_tokens(["a", "b"], length=v), "length", 2.5, InputTypeError, "length must be a whole number"),
    (lambda v: patterns.Positions.from_tokens(["a", "b"], length=v), "length", 0, InputError, "length must be at least 1"),
    (lambda v: patterns.classify(v, tokens=["a"] * 6), "pattern", torch.full((6, 6), NAN), InputError, "pattern: the maps hold NaN"),
    (lambda v: patterns.PatternCNN(lr=v), "lr", "0.1", InputTypeError, "lr must be a number"),
    (lambda v: patterns.PatternCNN(epochs=v), "epochs", 0, InputError, "epochs must be at least 1"),
    (lambda v: clustering.embed(np.zeros((3, 3)), seed=v), "seed", 1.5, InputTypeError, "seed must be a whole number"),
    (lambda v: clustering.embed(np.zeros((3, 3)), seed=v), "seed", True, InputTypeError, "seed must be a whole number"),
    (lambda v: clustering.embed(v), "distances", torch.zeros(3, 3), InputTypeError, "distances must be a NumPy array"),
    (lambda v: clustering.embed(v), "distances", np.full((3, 3), NAN), InputError, "distances must be a square matrix of finite"),
    (lambda v: clustering.embed(v), "distances", np.zeros((2, 3)), InputError, "distances must be a square matrix"),
    (lambda v: syntax.figure(TABLE, top=v), "top", 2.5, InputTypeError, "top must be a whole number"),
    (lambda v: syntax.figure(TABLE, top=v), "top", 0, InputError, "top must be at least 1"),
]


@pytest.mark.parametrize(("call", "argument", "value", "error", "words"), CASES,
                         ids=[f"{argument}={value!r}"[:40] for _, argument, value, _, _ in CASES])
def test_a_bad_argument_is_refused_by_name(call, argument, value, error, words):
    assert_refused(lambda: call(value), error, words)


# -- flags (issue 26): a truthy string is not True ------------------------------------------------

FLAG_CASES = [
    # (call, argument, bad value, fragment of the message)
    (lambda v: patterns.classify(torch.eye(6), tokens=["a"] * 6, causal=v), "causal", "no", "causal"),
    (lambda v: patterns.classify(torch.eye(6), tokens=["a"] * 6, causal=v), "causal", 0, "causal"),
    (lambda v: patterns.Positions.from_tokens(["a", "b"], causal=v), "causal", "False", "causal"),
    (lambda v: patterns.PatternCNN(augment=v), "augment", "no", "augment"),
    (lambda v: patterns.PatternCNN(augment=v), "augment", None, "augment"),
    (lambda v: _probing().bootstrap(None, [[0, 1]], runs=v), "runs", "yes", "runs"),
    (lambda v: _probing().paired(None, [[0, 1]], [[1, 0]], runs=v), "runs", 1, "runs"),
]


def _probing():
    from attnlens.evaluation import probing

    return probing


@pytest.mark.parametrize(("call", "argument", "value", "words"), FLAG_CASES,
                         ids=[f"{argument}={value!r}" for _, argument, value, _ in FLAG_CASES])
def test_a_flag_that_is_not_a_bool_is_refused(call, argument, value, words):
    assert_refused(lambda: call(value), InputTypeError, f"{words}")
    assert_refused(lambda: call(value), InputTypeError, "must be True or False")
