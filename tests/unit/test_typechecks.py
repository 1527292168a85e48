"""The test suite checks attnlens' jaxtyping annotations at run time (see tests/typechecks.py).

If the import hook in conftest.py stopped working, every annotation would silently go unchecked
again; these tests fail instead.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import jaxtyping
import pytest
import torch

import attnlens
from attnlens import papa
from attnlens.methods.effective import effective_attention
from tests import tiny
from tests.typechecks import unchecked


def test_wrong_rank_dtype_or_axis_size_is_a_type_check_error():
    mask = torch.ones(2, 5, dtype=torch.bool)
    # rank: a [query, key] constant where [head, max_len, max_len] is annotated
    with pytest.raises(jaxtyping.TypeCheckError, match="parameter 'constant'"):
        papa.constant_pattern(torch.rand(5, 5), mask)
    # dtype: a 0/1 integer mask where a Bool mask is annotated
    with pytest.raises(jaxtyping.TypeCheckError, match="parameter 'key_mask'"):
        papa.constant_pattern(torch.rand(1, 5, 5), mask.long())
    # axis sizes shared within a call: the pattern's keys are 5, the values' 4
    with pytest.raises(jaxtyping.TypeCheckError, match="parameter 'v'"):
        effective_attention(torch.rand(2, 3, 5, 5), torch.rand(2, 3, 4, 8))
    assert papa.constant_pattern(torch.rand(1, 8, 8), mask).shape == (2, 1, 5, 5)
    # without the checks, attnlens' own message (what a user without them sees)
    with unchecked(), pytest.raises(ValueError, match=r"constant must be \[head, query, key\]"):
        papa.constant_pattern(torch.rand(5, 5), mask)


def test_unchecked_restores_the_checks():
    with unchecked():
        pass
    with pytest.raises(jaxtyping.TypeCheckError):
        attnlens.tokenize(tiny.bert_tokenizer(), ["a"], max_len=8, layout="left")


def test_every_function_of_every_module_is_checked():
    """The hook covers the whole package, the lead's modules included."""
    unchecked_functions = []
    for info in pkgutil.walk_packages(attnlens.__path__, "attnlens."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if inspect.isfunction(value) and value.__module__ == info.name:
                if not hasattr(value, "__wrapped__"):
                    unchecked_functions.append(f"{info.name}.{name}")
    assert unchecked_functions == []
