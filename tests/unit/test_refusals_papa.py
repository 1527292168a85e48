"""Refusals of the PAPA API (issue 26): numbers that are not what they claim (pattern 2),
constants fitted on pairs used on single sentences (pattern 3), a single task name (pattern 6).
Each asserts the exact error class (under AttnlensError) and that the message names the argument."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlens import papa
from attnlens.errors import AttnlensError, InputError, InputTypeError, MismatchError
from tests import tiny
from tests.refusals import assert_refused
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
    from attnlens.evaluation.probing.features import extract

    with pytest.raises(MismatchError, match="fitted on sentence pairs"):
        extract(bridge, tiny.CORPUS[:2], hooks=hooks, cache=False, max_len=24, layout="papa", progress=False)


def test_curve_takes_one_task_name_as_that_task(bridge, monkeypatch):
    """papa.curve(tasks="sst2") probes sst2, not the tasks s, s, t and 2."""
    from attnlens.evaluation import probing

    seen = []

    def first_task(model, task, **options):
        seen.append(task)
        raise KeyboardInterrupt  # enough: the task it was asked for is known

    monkeypatch.setattr(probing, "run", first_task)
    with pytest.raises(KeyboardInterrupt):
        papa.curve(bridge, papa.uniform(bridge, max_len=8), "sst2", fractions=[0.0], strategy="random")
    assert seen == ["sst2"]


def learn(bridge, **options):
    batches = [papa_batch(bridge, tiny.CORPUS[:2], 8)]
    return papa.learn_lambda(bridge, papa.uniform(bridge, max_len=8), loss_fn=lambda o, b: o.sum(),
                             batches=batches, progress=False, **options)


def curve(bridge, **options):
    options = {"fractions": [0.0], **options}
    return papa.curve(bridge, papa.uniform(bridge, max_len=8), ["sst2"], strategy="random", progress=False, **options)


NAN = float("nan")
ROWS = [
    # (call(bridge, value), argument, bad value, error class, fragment of the message)
    (lambda m, v: papa.select_heads("random", fraction=0.5, n_layers=v, n_heads=4), "n_layers", 2.5, InputTypeError, "n_layers must be a whole number"),
    (lambda m, v: papa.select_heads("random", fraction=0.5, n_layers=2, n_heads=v), "n_heads", True, InputTypeError, "n_heads must be a whole number"),
    (lambda m, v: papa.select_heads("random", fraction=0.5, n_layers=v, n_heads=4), "n_layers", 0, InputError, "n_layers must be at least 1"),
    (lambda m, v: papa.select_heads("random", n=v, n_layers=2, n_heads=4), "n", 9, InputError, "n must lie in [0, 8]"),
    (lambda m, v: papa.select_heads("random", fraction=v, n_layers=2, n_heads=4), "fraction", "0.5", InputTypeError, "fraction must be a number"),
    (lambda m, v: papa.select_heads("lambda", n=2, lam=v), "lam", np.ones((2, 4)), InputTypeError, "lam must be a torch tensor"),
    (lambda m, v: papa.select_heads("lambda", n=2, model=m, constants=papa.uniform(m, max_len=8), batches=[],
                                    loss_fn=lambda o, b: o.sum(), steps=v), "steps", 2.5, InputTypeError, "steps must be a whole number"),
    (lambda m, v: learn(m, steps=v), "steps", 0, InputError, "steps must be at least 1"),
    (lambda m, v: learn(m, steps=v), "steps", "4", InputTypeError, "steps must be a whole number"),
    (lambda m, v: learn(m, lr=v), "lr", NAN, InputError, "lr must be a finite number"),
    (lambda m, v: learn(m, lr=v), "lr", -1.0, InputError, "lr must lie in"),
    (lambda m, v: learn(m, jointly_lr=v), "jointly_lr", True, InputTypeError, "jointly_lr must be a number"),
    (lambda m, v: papa.hooks(papa.uniform(m, max_len=8), mode="blend", lam=v), "lam", True, InputTypeError, "lam must be a number in [0, 1] or"),
    (lambda m, v: papa.hooks(papa.uniform(m, max_len=8), mode="blend", lam=v), "lam", np.ones((2, 4)), InputTypeError, "lam must be a number in [0, 1] or"),
    (lambda m, v: papa.hooks(papa.uniform(m, max_len=8), heads=v), "heads", np.ones((2, 4), bool), InputTypeError, "heads must be 'all'"),
    (lambda m, v: papa.hooks(papa.uniform(m, max_len=8), heads=v), "heads", torch.ones(3, 4, dtype=torch.bool), InputError, "heads is a [3, 4] head set"),
    (lambda m, v: papa.hooks(papa.uniform(m, max_len=8), heads=v), "heads", [(2, 0)], InputError, "head (2, 0) is outside the model's 2 layers x 4 heads"),
    (lambda m, v: papa.hooks(papa.uniform(m, max_len=8), heads=v), "heads", [(0, 1, 2)], InputError, "heads must be (layer, head) pairs"),
    (lambda m, v: papa.hooks(papa.uniform(m, max_len=8), heads=v), "heads", [(0, 1), (0, 1)], InputError, "head (0, 1) is listed twice"),
    (lambda m, v: papa.PapaConstants.empty(m, max_len=v, layout="papa"), "max_len", 2.5, InputTypeError, "max_len must be a whole number"),
    (lambda m, v: papa.PapaConstants.empty(m, max_len=v, layout="papa"), "max_len", 0, InputError, "max_len must be at least 1"),
    (lambda m, v: papa.uniform(m, max_len=8).layer_mean(v, dtype=torch.float32, device="cpu"), "layer", 2, InputError, "layer must be in 0..1"),
    (lambda m, v: papa.uniform(m, max_len=8).layer_mean(v, dtype=torch.float32, device="cpu"), "layer", -1, InputError, "layer must be in 0..1"),
    (lambda m, v: papa.uniform(m, max_len=8).layer_mean(v, dtype=torch.float32, device="cpu"), "layer", 1.0, InputTypeError, "layer must be a whole number"),
    (lambda m, v: papa.TrainableConstants.from_average(papa.fit(m, tiny.CORPUS[:2], max_len=8, progress=False), floor=v), "floor", 0, InputError, "floor must be above 0"),
    (lambda m, v: papa.TrainableConstants.from_average(papa.fit(m, tiny.CORPUS[:2], max_len=8, progress=False), floor=v), "floor", "1e-3", InputTypeError, "floor must be a number"),
    (lambda m, v: curve(m, fractions=v), "fractions", [0.5, NAN], InputError, "fractions[1] must be a finite number"),
    (lambda m, v: curve(m, fractions=v), "fractions", [], InputError, "fractions is empty"),
    (lambda m, v: papa.curve(m, papa.uniform(m, max_len=8), v, strategy="random", progress=False), "tasks", [], InputError, "tasks is empty"),
    (lambda m, v: curve(m, train_limit=v), "train_limit", 2.5, InputTypeError, "train_limit must be a whole number"),
    (lambda m, v: curve(m, eval_limit=v), "eval_limit", 0, InputError, "eval_limit must be at least 1"),
    (lambda m, v: curve(m, seed=v), "seed", 1.5, InputTypeError, "seed must be a whole number"),
    (lambda m, v: curve(m, seeds=v), "seeds", 2.5, InputTypeError, "seeds must be a whole number"),
    (lambda m, v: curve(m, seeds=v), "seeds", [], InputError, "seeds is empty"),
    (lambda m, v: curve(m, seeds=v), "seeds", [0, 1.5], InputTypeError, "seeds[1] must be a whole number"),
    (lambda m, v: curve(m, batch_size=v), "batch_size", "4", InputTypeError, "batch_size must be a whole number"),
    (lambda m, v: curve(m, lambda_steps=v), "lambda_steps", 0, InputError, "lambda_steps must be at least 1"),
    (lambda m, v: curve(m, lambda_examples=v), "lambda_examples", 2.5, InputTypeError, "lambda_examples must be a whole number"),
    (lambda m, v: curve(m, fast=v), "fast", "yes", InputTypeError, "fast must be True, False or None"),
    (lambda m, v: curve(tiny.gpt2_bridge(), fast=v), "fast", True, InputError, "fast=True: this model's heads cannot skip"),
    (lambda m, v: papa.hooks(papa.uniform(m, max_len=8), fast=v), "fast", 1, InputTypeError, "fast must be True or False"),
    (lambda m, v: papa.hooks(papa.uniform(m, max_len=8), mode="blend", fast=v), "fast", True, InputError, "fast=True applies only to full replacement"),
]


@pytest.mark.parametrize(("call", "argument", "value", "error", "words"), ROWS,
                         ids=[f"{argument}={value!r}"[:40] for _, argument, value, _, _ in ROWS])
def test_a_bad_argument_is_refused_by_name(bridge, call, argument, value, error, words):
    assert_refused(lambda: call(bridge, value), error, words)


# -- flags, data-free constants, constant and softmax patterns, layer_mean's dtype (issue 26) ----------


@pytest.mark.parametrize("causal", ["no", "False", 0, 1])
def test_causal_of_the_hooks_must_be_true_false_or_none(bridge, causal):
    """causal="no" used to be read as True (a truthy string): an encoder's constants replaced as
    a decoder's, keys after each query dropped."""
    constants = papa.uniform(bridge, max_len=8)
    refused(InputTypeError, "causal", papa.hooks, constants, causal=causal)
    for accepted in (None, True, False):
        assert papa.hooks(constants, causal=accepted).causal in (None, True, False)


@pytest.fixture(scope="module")
def gpt2():
    return tiny.gpt2_bridge()


@pytest.mark.parametrize("make", [papa.uniform, papa.identity, papa.toeplitz, papa.zeros])
def test_data_free_constants_take_the_models_default_layout(bridge, gpt2, make):
    """A decoder has no [CLS]/[SEP] to fix in place: its data-free constants are made in its own
    layout ('padded', as papa.fit makes them), not in the 'papa' layout it cannot tokenize."""
    from attnlens import run_with_hooks, tokenize
    from attnlens.core.inputs import default_layout

    made = make(gpt2, max_len=8)
    assert made.layout == default_layout(gpt2) == "padded"
    assert make(bridge, max_len=8).layout == "papa"
    run_with_hooks(gpt2, tokenize(gpt2, tiny.CORPUS[:2], max_len=8, layout=made.layout), papa.hooks(made))
    refused(InputError, "PAPA layout needs a tokenizer", make, gpt2, max_len=8, layout="papa")


@pytest.mark.parametrize("max_len", [2, 1000, 100_000])
def test_data_free_constants_check_max_len_against_the_model(bridge, max_len):
    """Too short for a real token in the layout, or past the model's 128 positions: refused
    before a [max_len, max_len] matrix is made (100 000 used to allocate 80 GB)."""
    for make in (papa.uniform, papa.identity, papa.toeplitz, papa.zeros, papa.TrainableConstants.from_toeplitz):
        refused(InputError, f"max_len={max_len}", make, bridge, max_len=max_len)


@pytest.mark.parametrize("like", [None, "bert-base-uncased", 5])
def test_data_free_constants_need_a_model_or_constants(like):
    for make in (papa.uniform, papa.identity, papa.toeplitz, papa.zeros, papa.TrainableConstants.from_toeplitz):
        refused(InputTypeError, "like=", make, like, max_len=8)


def constant_and_mask(fill=None, dtype=torch.float32):
    constant = torch.rand(4, 8, 8, generator=torch.Generator().manual_seed(0)).to(dtype)
    if fill is not None:
        constant[1, 2, 3] = fill
    return constant, torch.ones(2, 8, dtype=torch.bool)


@pytest.mark.parametrize(("fill", "words"), [(float("nan"), "not finite"), (float("inf"), "not finite"),
                                              (-0.5, "below 0")])
def test_a_constant_with_nan_inf_or_a_negative_weight_is_refused(fill, words):
    """Such a row used to come back silently uniform (NaN and negative sums fail ``total > 0``)."""
    constant, mask = constant_and_mask(fill)
    error = refused(InputError, "constant", papa.constant_pattern, constant, mask)
    assert words in str(error) and "(1, 2, 3)" in str(error)


@pytest.mark.parametrize("fill", [float("nan"), float("inf"), float("-inf")])
def test_logits_with_nan_or_inf_are_refused(fill):
    """They used to give NaN patterns."""
    logits, mask = constant_and_mask(fill)
    error = refused(InputError, "logits", papa.softmax_pattern, logits, mask)
    assert "not finite" in str(error) and "(1, 2, 3)" in str(error)
    assert torch.isfinite(papa.softmax_pattern(-constant_and_mask()[0], mask)).all()  # negative logits are fine


@pytest.mark.parametrize("call", [papa.constant_pattern, papa.softmax_pattern], ids=["constant", "softmax"])
def test_an_integer_or_numpy_matrix_or_dtype_is_refused_by_name(call):
    name = "constant" if call is papa.constant_pattern else "logits"
    constant, mask = constant_and_mask()
    refused(InputTypeError, f"{name} must be a floating-point tensor", call, constant.long(), mask)
    refused(InputTypeError, f"{name} must be a torch tensor", call, constant.numpy(), mask)
    refused(InputTypeError, "key_mask must be a torch tensor", call, constant, mask.numpy())
    refused(InputTypeError, "dtype must be a floating torch dtype", call, constant, mask, dtype=torch.int64)
    refused(InputTypeError, "dtype must be a floating torch dtype", call, constant, mask, dtype="float32")


def test_the_checks_of_a_pattern_do_not_read_a_device(monkeypatch):
    """Off the CPU only dtypes and shapes are checked: reading the values would make the host wait
    for the device at every layer (forced here by saying reads are not free)."""
    from attnlens.core import devices

    constant, mask = constant_and_mask(-0.5)
    monkeypatch.setattr(devices, "reads_are_free", lambda where: False)
    papa.constant_pattern(constant, mask)
    with pytest.raises(InputTypeError, match="constant must be a floating-point tensor"), unchecked():
        papa.constant_pattern(constant.long(), mask)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, "float32", None])
def test_layer_mean_needs_a_floating_torch_dtype(bridge, dtype):
    """torch.int64 used to give all zeros (the means truncated), "float32" a torch error."""
    constants = papa.uniform(bridge, max_len=8)
    refused(InputTypeError, "dtype must be a floating torch dtype", constants.layer_mean, 0, dtype=dtype, device="cpu")
    assert constants.layer_mean(0, dtype=torch.float64, device="cpu").sum() > 0
