"""Refusals of ablation (issue 26): counts, seeds, fractions, layer indices and tensors of
attnlens.ablation go through attnlens.core.checks and are named before any forward pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlens import ablation
from attnlens.core.heads import HeadSet
from attnlens.errors import InputError, InputTypeError
from tests import tiny
from tests.refusals import assert_refused

NAN = float("nan")


@pytest.fixture(scope="module")
def bridge():
    return tiny.bert_bridge()


def importance(bridge):
    return ablation.Importance(scores=torch.rand(2, 4), raw=torch.rand(2, 4))


CASES = [
    # (call(bridge, value), argument, bad value, error class, fragment of the message)
    (lambda m, v: ablation.hooks(HeadSet.all(2, 4), "mean", means=v), "means", np.zeros((2, 4, 8)), InputTypeError, "means must be a torch tensor"),
    (lambda m, v: ablation.hooks(v, "zero"), "heads", np.ones((2, 4), bool), InputTypeError, "heads must be a HeadSet"),
    (lambda m, v: ablation.hooks(v, "zero"), "heads", [(0, 1)], InputError, "(layer, head) pairs need the model's shape: pass model="),
    (lambda m, v: ablation.hooks(v, "zero", model=m), "heads", [(2, 1)], InputError, "head (2, 1) is outside the model's 2 layers x 4 heads"),
    (lambda m, v: ablation.importance(m, tiny.CORPUS[:2], mask_rate=v, progress=False), "mask_rate", "0.5", InputTypeError, "mask_rate must be a number"),
    (lambda m, v: ablation.importance(m, tiny.CORPUS[:2], mask_rate=v, progress=False), "mask_rate", NAN, InputError, "mask_rate must be a finite number"),
    (lambda m, v: ablation.importance(m, tiny.CORPUS[:2], seed=v, progress=False), "seed", 1.5, InputTypeError, "seed must be a whole number"),
    (lambda m, v: ablation.importance(m, "sst2", train_limit=v, progress=False), "train_limit", 2.5, InputTypeError, "train_limit must be a whole number"),
    (lambda m, v: ablation.importance(m, "sst2", train_limit=v, progress=False), "train_limit", 0, InputError, "train_limit must be at least 1"),
    (lambda m, v: ablation.importance(m, "sst2", limit=v, progress=False), "limit", "4", InputTypeError, "limit must be a whole number"),
    (lambda m, v: ablation.importance(m, tiny.CORPUS[:2], batch_size=v, progress=False), "batch_size", 0, InputError, "batch_size must be at least 1"),
    (lambda m, v: importance(m).heads(v), "fraction", True, InputTypeError, "fraction must be a number"),
    (lambda m, v: importance(m).heads(v), "fraction", 1.5, InputError, "fraction must lie in"),
    (lambda m, v: importance(m).heads(n=v), "n", 2.5, InputTypeError, "n must be a whole number"),
    (lambda m, v: ablation.prune_curve(m, importance(m), lambda h: 1.0, fractions=v), "fractions", [0.0, NAN], InputError, "fractions[1] must be a finite number"),
    (lambda m, v: ablation.prune_curve(m, importance(m), lambda h: 1.0, fractions=v), "fractions", [True], InputTypeError, "fractions[0] must be a number"),
    (lambda m, v: ablation.prune_curve(m, v, lambda h: 1.0), "importance", np.zeros((2, 4)), InputTypeError, "importance must be a torch tensor"),
    (lambda m, v: ablation.prune_curve(m, v, lambda h: 1.0), "importance", torch.full((2, 4), NAN), InputError, "importance: 8 of 8 values are not finite"),
    (lambda m, v: ablation.output_hook(m, v), "layer", 2, InputError, "layer must be in 0..1"),
    (lambda m, v: ablation.output_hook(m, v), "layer", -1, InputError, "layer must be in 0..1"),
    (lambda m, v: ablation.output_hook(m, v), "layer", 1.0, InputTypeError, "layer must be a whole number"),
    (lambda m, v: ablation.normalize_by_layer(v), "raw", np.zeros((2, 4)), InputTypeError, "raw must be a torch tensor"),
    (lambda m, v: ablation.normalize_by_layer(v), "raw", torch.full((2, 4), NAN), InputError, "raw: 8 of 8 values are not finite"),
    (lambda m, v: ablation.Gates(m, None, mask_rate=v), "mask_rate", 1.5, InputError, "mask_rate must lie in"),
    (lambda m, v: ablation.Gates(m, None, seed=v), "seed", "4", InputTypeError, "seed must be a whole number"),
    (lambda m, v: ablation.uniform_pattern(torch.ones(1, 4, dtype=torch.bool), v, causal=False), "n_queries", 2.5, InputTypeError, "n_queries must be a whole number"),
    (lambda m, v: ablation.uniform_pattern(torch.ones(1, 4, dtype=torch.bool), v, causal=False), "n_queries", 0, InputError, "n_queries must be at least 1"),
]


@pytest.mark.parametrize(("call", "argument", "value", "error", "words"), CASES,
                         ids=[f"{argument}={value!r}"[:40] for _, argument, value, _, _ in CASES])
def test_a_bad_argument_is_refused_by_name(bridge, call, argument, value, error, words):
    assert_refused(lambda: call(bridge, value), error, words)


@pytest.mark.parametrize("route", ["cpu", "device"])
def test_a_loss_that_is_not_finite_is_refused_naming_its_batch(bridge, route, monkeypatch):
    """A loss of NaN from the third batch on: one InputError naming that batch's first example,
    at once where reading it is free (the CPU), once at the pass's end off it (the device route,
    forced here: the batch noted on the device, nothing read per batch)."""
    from attnlens.core import devices

    if route == "device":
        monkeypatch.setattr(devices, "reads_are_free", lambda where: False)
        monkeypatch.setattr(devices, "width_multiple", lambda where: 1)

    def loss(output, batch):
        value = output.float().logsumexp(-1).mean(-1)
        return value * float("nan") if batch.start >= 4 else value

    with pytest.raises(InputError, match="loss is not finite .* starting at example 4"):
        ablation.importance(bridge, tiny.CORPUS[:8], loss=loss, batch_size=2, progress=False)


@pytest.mark.parametrize("causal", ["no", "False", 0, None])
def test_causal_of_uniform_pattern_must_be_true_or_false(causal):
    """causal="no" used to hide the keys after each query (a truthy string)."""
    valid = torch.ones(1, 4, dtype=torch.bool)
    assert_refused(lambda: ablation.uniform_pattern(valid, 4, causal=causal), InputTypeError, "causal")
    assert ablation.uniform_pattern(valid, 4, causal=False).triu(1).any()


@pytest.mark.parametrize("field", ["scores", "raw"])
@pytest.mark.parametrize("bad", [NAN, float("inf")])
def test_importance_with_nan_or_inf_is_refused(field, bad):
    """A NaN score used to be ranked (argsort puts it last) and pruned in that order; from_dict
    and from_json used to load it."""
    import json

    from attnlens.errors import FileFormatError

    values = {"scores": torch.rand(2, 4), "raw": torch.rand(2, 4)}
    values[field][1, 2] = bad
    assert_refused(lambda: ablation.Importance(**values), InputError, f"Importance {field}")
    data = ablation.Importance(scores=torch.rand(2, 4), raw=torch.rand(2, 4)).to_dict()
    data[field][1][2] = bad
    error = pytest.raises(InputError, ablation.Importance.from_dict, data).value
    assert "(first at index (1, 2))" in str(error)
    with pytest.raises(FileFormatError, match=f"Importance {field}"):
        ablation.Importance.from_json(json.dumps(data))
