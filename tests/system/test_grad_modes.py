"""attnlens inside ``torch.no_grad()``, ``torch.inference_mode()`` and ``torch.autocast``, where
notebooks often run.

Every entry point gives inside each mode what it gives outside, with its inputs (constants,
batches, features) made inside the mode too. Before: ``compare`` with constants fitted there
failed deep inside ("Inference tensors do not track version counter"), head importance raised a
misleading ``GatesUnused`` ("the loss does not depend on the heads' gates"), and what trains with
autograd (the PAPA probe, PAPA's λ and trainable constants) failed with "element 0 of tensors
does not require grad". Reference: the same calls outside any mode; equal exactly (the same
arithmetic: inside, attnlens switches autograd on with ``attnlens.core.modes.gradients``, and a
cache keyed by an inference tensor's version recomputes instead). Under ``torch.autocast``
attnlens turns autocast off (``attnlens.core.modes.own_arithmetic``): the same, exactly, and one
warning.
"""

from __future__ import annotations

import contextlib
import re
import warnings

import pytest
import torch

import attnlens
from attnlens import ablation, papa
from attnlens.core import modes
from attnlens.core.modes import ReducedPrecisionOff, own_arithmetic
from attnlens.evaluation import probing
from attnlens.evaluation.lm import scorer
from attnlens.evaluation.probing import LinearBaseline, PapaProbe
from attnlens.evaluation.probing.stacked import fit_many
from tests import tiny
from tests.contract.test_estimators import _sequence_features

MAX_LEN = 16
TEXTS = tiny.CORPUS[:8]


def first_logit(output, batch):
    return output.log_softmax(-1)[..., 0].mean(-1)


def results(model, made=None):
    """Each entry point's result on the tiny BERT, its inputs made where this is called (the probes'
    features: ``made``, when given)."""
    constants = papa.fit(model, TEXTS, max_len=MAX_LEN, progress=False)
    batches = [attnlens.tokenize(model, TEXTS[:4], max_len=MAX_LEN)]

    def loss_fn(logits, batch):
        return logits[batch.attention_mask.bool()].logsumexp(-1).mean()

    trained = papa.train_constants(model, papa.TrainableConstants.from_average(constants), loss_fn=loss_fn,
                                   batches=batches, steps=2, lr=0.1, progress=False)
    comparison = attnlens.compare(model, "papa", "effective", constants=constants, corpus=TEXTS, max_len=MAX_LEN, progress=False)
    features, labels = made or _sequence_features(n_classes=2)
    stacked = fit_many([PapaProbe(hidden=8, epochs=2, seed=seed) for seed in (0, 1)], features, labels)
    return {
        "papa.fit": constants.sums,
        "compare": torch.as_tensor(comparison.table.select_dtypes("number").to_numpy()),
        "importance": ablation.importance(model, TEXTS, loss=first_logit, max_len=MAX_LEN, progress=False).raw,
        "learn_lambda": papa.learn_lambda(model, constants, loss_fn=loss_fn, batches=batches, steps=2, lr=0.1,
                                          progress=False),
        "train_constants": trained.mean,
        "fit_many": torch.as_tensor([probe.predict(features) for probe in stacked]),
    }


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_every_entry_point_runs_inside_an_autograd_mode_as_outside(mode):
    model = tiny.bert_bridge()
    reference = results(model)
    with getattr(torch, mode)():
        inside = results(model)
    for name, value in reference.items():
        assert torch.equal(inside[name], value), name
    assert all(p.requires_grad and p.grad is None for p in model.parameters())


# -- under torch.autocast and another default dtype --------------------------------------------


def arithmetic_results(model, decoder, made):
    """:func:`results` and the entry points whose arithmetic torch's global settings would change
    beside them: feature extraction (read from the cache, and computed), the single-batch forward
    and maps, a single probe and the torch linear baseline (on the features ``made``), and the
    decoder's LM score."""
    batch = attnlens.tokenize(model, TEXTS[:4], max_len=MAX_LEN)
    features, labels = made
    extracted = {cache: probing.extract(model, TEXTS, max_len=MAX_LEN, progress=False, cache=cache).vectors
                 for cache in (True, False)}
    constants = papa.fit(model, TEXTS, max_len=MAX_LEN, progress=False)
    return {
        **results(model, made),
        "extract (cached)": extracted[True],
        "extract": extracted[False],
        "run_with_hooks": attnlens.run_with_hooks(model, batch, papa.hooks(constants, heads=0.5)),
        "maps effective": attnlens.maps(model, batch, "effective"),
        "maps norm": attnlens.maps(model, batch, "norm"),
        "PapaProbe": torch.as_tensor(PapaProbe(hidden=8, epochs=2).fit(features, labels).predict(features)),
        "LinearBaseline": torch.as_tensor(LinearBaseline(solver="torch", grid=(0.01, 1.0)).fit(features, labels)
                                          .predict(features)),
        "lm.score": torch.tensor(scorer.score(decoder, TEXTS, max_len=MAX_LEN, progress=False).value,
                                 dtype=torch.float64),
    }


@contextlib.contextmanager
def default_dtype(dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


@contextlib.contextmanager
def matmul_precision(precision):
    """``torch.set_float32_matmul_precision(precision)`` inside the block, each backend's
    ``fp32_precision`` given back after."""
    backends = (torch.backends.cuda.matmul, torch.backends.mkldnn.matmul)
    before, legacy = [backend.fp32_precision for backend in backends], torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(legacy)
        for backend, value in zip(backends, before, strict=True):
            backend.fp32_precision = value


def matmul_state():
    return torch.backends.cuda.matmul.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision


#: torch's global settings a notebook may run attnlens under, and the warning each gives
SETTINGS = {
    "autocast bfloat16": (lambda: torch.autocast("cpu", dtype=torch.bfloat16), r"torch.autocast is on for cpu \(bfloat16\)"),
    "autocast float16": (lambda: torch.autocast("cpu", dtype=torch.float16), r"torch.autocast is on for cpu \(float16\)"),
    "default float64": (lambda: default_dtype(torch.float64), None),
    # bfloat16 products on this CPU when it has AVX512-BF16 or AMX (oneDNN), TensorFloat-32 on a GPU
    "matmul precision medium": (lambda: matmul_precision("medium"),
                                r"float32 matrix products are reduced to tf32 on cuda, bf16 on mkldnn"),
}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_every_entry_point_runs_in_its_own_arithmetic_under_torchs_global_settings(setting, tmp_path, monkeypatch):
    """Under ``torch.autocast`` and ``torch.set_float32_matmul_precision("medium")`` (one
    :class:`ReducedPrecisionOff` warning) and after ``torch.set_default_dtype(torch.float64)`` (no
    warning) every entry point gives exactly what it gives outside: attnlens computes in the model's dtype and trains in float32, which its cache
    keys name. Before, under autocast a feature extraction stopped inside ``torch.cat``
    ("Unexpected floating ScalarType in at::autocast::prioritize"), ``papa.fit`` and ``compare``
    gave bfloat16's numbers (the constants 0.016 and the table 0.125 from float32's on MiniLM),
    and the cache served a float32 extraction to an autocast one; under a float64 default the
    probe and the torch baseline stopped inside ``index_add_`` ("self (Float) and source
    (Double) must have the same scalar type"); under ``"medium"`` on a CPU with AVX512-BF16 (oneDNN's
    bfloat16 products) eight of the fourteen differed (``compare`` by 2.4e-7 on the tiny BERT; TensorFloat-32's
    products on a GPU are 1e-3 relative off), under float32's keys."""
    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path))
    model, decoder = tiny.bert_bridge(), tiny.gpt2_bridge()
    made = _sequence_features(n_classes=2)
    reference = arithmetic_results(model, decoder, made)
    enter, warned = SETTINGS[setting]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with enter():
            before = torch.is_autocast_enabled("cpu"), torch.get_default_dtype(), matmul_state()
            inside = arithmetic_results(model, decoder, made)
            assert (torch.is_autocast_enabled("cpu"), torch.get_default_dtype(), matmul_state()) == before
    assert matmul_state() == ("none", "none")  # given back
    off = [str(warning.message) for warning in caught if issubclass(warning.category, ReducedPrecisionOff)]
    if warned is None:
        assert not off
    else:
        assert off and all(re.search(f"{warned}.*dtype=torch.bfloat16", text) for text in off)
    for name, value in reference.items():
        assert torch.equal(inside[name], value), name


def test_own_arithmetic_computes_float32_products_in_full_precision_whatever_the_backend():
    """Whatever the CPU (the entry-point test above sees a difference only where oneDNN has
    bfloat16 products): inside, every backend's float32 products are "ieee"; the caller's
    "tf32" / "bf16" are back after, and torch's legacy getter still reads them."""
    with matmul_precision("high"):
        with pytest.warns(ReducedPrecisionOff, match="reduced to tf32 on cuda, tf32 on mkldnn"), own_arithmetic():
            assert matmul_state() == ("ieee", "ieee")
        assert matmul_state() == ("tf32", "tf32") and torch.get_float32_matmul_precision() == "high"
    assert torch.get_float32_matmul_precision() == "highest"


def test_own_arithmetic_reads_torchs_one_setting_before_backends_had_their_own(monkeypatch):
    """A torch before 2.9 (attnlens supports 2.6) has no ``torch.backends.<name>.matmul``, only
    ``torch.set_float32_matmul_precision``: that one is read, set to "highest" inside and given
    back (stood in for by a backend without ``matmul``, torch.backends.cpu)."""
    monkeypatch.setattr(modes, "MATMUL_BACKENDS", ("cpu",))
    assert modes.matmul_precisions() == {"torch": "ieee"}
    with matmul_precision("high"):
        with pytest.warns(ReducedPrecisionOff, match="reduced to high on torch"), own_arithmetic():
            assert torch.get_float32_matmul_precision() == "highest"
        assert torch.get_float32_matmul_precision() == "high"


def test_own_arithmetic_warns_only_when_autocast_is_on():
    """Outside autocast nothing is warned and nothing changes; inside, the block runs without it
    and in float32, and the caller's settings are back after."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with own_arithmetic():
            assert not torch.is_autocast_enabled("cpu")
        with default_dtype(torch.float64), own_arithmetic():
            assert torch.get_default_dtype() == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.warns(ReducedPrecisionOff, match="cpu"):
        with own_arithmetic():
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
