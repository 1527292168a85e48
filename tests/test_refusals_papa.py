"""Refusals of the PAPA API (issue 26): numbers that are not what they claim (pattern 2),
constants fitted on pairs used on single sentences (pattern 3), a single task name (pattern 6).
Each asserts the exact error class (under AttnlensError) and that the message names the argument."""

from __future__ import annotations

import pytest
import torch

from attnlens import papa
from attnlens.errors import AttnlensError, InputError, InputTypeError, MismatchError
from tests import tiny
from tests.typechecks import unchecked


@pytest.fixture(scope="module")
def bridge():
    return tiny.bert_bridge()


def refused(error_class, argument: str, call, *args, **kwargs) -> AttnlensError:
    """``call`` raises exactly ``error_class``, naming ``argument``: attnlens' own check, as a
    user without the tests' run-time annotation checks sees it."""
    with pytest.raises(error_class) as info, unchecked():
        call(*args, **kwargs)
    assert type(info.value) is error_class and isinstance(info.value, AttnlensError)
    assert argument in str(info.value), str(info.value)
    return info.value


def test_a_fractional_seed_is_refused_not_rounded():
    refused(InputTypeError, "seed", papa.select_heads, "random", fraction=0.5, n_layers=2, n_heads=4, seed=1.5)
    chosen = papa.select_heads("random", fraction=0.5, n_layers=2, n_heads=4, seed=1)
    assert len(chosen.order) == 4


@pytest.mark.parametrize("n", [float("nan"), 2.5, "3"])
def test_a_count_that_is_not_a_whole_number_is_refused(n):
    refused(InputTypeError, "n must be a whole number", papa.select_heads, "random", n=n, n_layers=2, n_heads=4)


@pytest.mark.parametrize("fraction", [float("nan"), float("inf"), -0.1, 1.5])
def test_a_fraction_outside_zero_to_one_or_nan_is_refused(fraction):
    refused(InputError, "fraction", papa.select_heads, "random", fraction=fraction, n_layers=2, n_heads=4)


def test_a_lambda_with_a_nan_is_refused_not_ranked():
    lam = torch.rand(2, 4)
    lam[1, 2] = float("nan")
    error = refused(InputError, "lam", papa.select_heads, "lambda", n=3, lam=lam)
    assert "(1, 2)" in str(error)


@pytest.mark.parametrize("max_len", [0, -3])
def test_a_length_below_one_is_refused(bridge, max_len):
    refused(InputError, "max_len", papa.uniform, bridge, max_len=max_len)
    refused(InputError, "max_len", papa.TrainableConstants.from_toeplitz, bridge, max_len=max_len)


def test_a_fractional_length_is_refused(bridge):
    refused(InputTypeError, "max_len", papa.uniform, bridge, max_len=8.5)


def test_trainable_constants_with_a_nan_row_are_refused(bridge):
    trainable = papa.TrainableConstants.from_toeplitz(bridge, max_len=8)
    logits = trainable.logits.detach().clone()
    logits[1, 0, 3] = float("nan")
    refused(InputError, "logits", papa.TrainableConstants, logits, model_id=trainable.model_id,
            layout=trainable.layout, max_len=8, init="toeplitz")
    with torch.no_grad():  # a training step that diverged
        trainable.logits[1, 0, 3] = float("nan")
    batch = papa_batch(bridge, ["the dog barks ."], 8)
    with pytest.raises(InputError, match=r"TrainableConstants.logits\[1\].*not finite"):
        trainable.layer_pattern(1, batch.attention_mask.bool(), dtype=torch.float32)


def papa_batch(bridge, texts, max_len):
    from attnlens import tokenize

    return tokenize(bridge, texts, max_len=max_len, layout="papa")


def test_constants_fitted_on_pairs_are_refused_on_single_sentences(bridge):
    from attnlens import run_with_hooks

    pairs = [(a, b) for a, b in zip(tiny.CORPUS[:4], tiny.CORPUS[4:8], strict=True)]
    fitted_on_pairs = papa.fit(bridge, pairs, max_len=24, progress=False)
    assert fitted_on_pairs.pairs is True
    hooks = papa.hooks(fitted_on_pairs)
    error = refused(MismatchError, "fitted on sentence pairs", run_with_hooks, bridge,
                    papa_batch(bridge, tiny.CORPUS[:2], 24), hooks)
    assert "single sentences" in str(error)
    run_with_hooks(bridge, papa_batch(bridge, pairs[:2], 24), hooks)  # what they were made for
    # the pass engine checks each batch too (features, probes, LM scores run through it)
    from attnlens.probing.features import extract

    with pytest.raises(MismatchError, match="fitted on sentence pairs"):
        extract(bridge, tiny.CORPUS[:2], hooks=hooks, cache=False, max_len=24, layout="papa", progress=False)


def test_curve_takes_one_task_name_as_that_task(bridge, monkeypatch):
    """papa.curve(tasks="sst2") probes sst2, not the tasks s, s, t and 2."""
    from attnlens import probing

    seen = []

    def first_task(model, task, **options):
        seen.append(task)
        raise KeyboardInterrupt  # enough: the task it was asked for is known

    monkeypatch.setattr(probing, "run", first_task)
    with pytest.raises(KeyboardInterrupt):
        papa.curve(bridge, papa.uniform(bridge, max_len=8), "sst2", fractions=[0.0], strategy="random")
    assert seen == ["sst2"]
