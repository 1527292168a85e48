"""attnlens inside ``torch.no_grad()`` and ``torch.inference_mode()``, where notebooks often run.

Every entry point gives inside each mode what it gives outside, with its inputs (constants,
batches, features) made inside the mode too. Before: ``compare`` with constants fitted there
failed deep inside ("Inference tensors do not track version counter"), head importance raised a
misleading ``GatesUnused`` ("the loss does not depend on the heads' gates"), and what trains with
autograd (the PAPA probe, PAPA's λ and trainable constants) failed with "element 0 of tensors
does not require grad". Reference: the same calls outside any mode; equal exactly (the same
arithmetic: inside, attnlens switches autograd on with ``attnlens.core.modes.gradients``, and a
cache keyed by an inference tensor's version recomputes instead).
"""

from __future__ import annotations

import pytest
import torch

import attnlens
from attnlens import ablation, papa
from attnlens.evaluation.probing import PapaProbe
from attnlens.evaluation.probing.stacked import fit_many
from tests import tiny
from tests.contract.test_estimators import _sequence_features

MAX_LEN = 16
TEXTS = tiny.CORPUS[:8]


def first_logit(output, batch):
    return output.log_softmax(-1)[..., 0].mean(-1)


def results(model):
    """Each entry point's result on the tiny BERT, its inputs made where this is called."""
    constants = papa.fit(model, TEXTS, max_len=MAX_LEN, progress=False)
    batches = [attnlens.tokenize(model, TEXTS[:4], max_len=MAX_LEN)]

    def loss_fn(logits, batch):
        return logits[batch.attention_mask.bool()].logsumexp(-1).mean()

    trained = papa.train_constants(model, papa.TrainableConstants.from_average(constants), loss_fn=loss_fn,
                                   batches=batches, steps=2, lr=0.1, progress=False)
    comparison = attnlens.compare(model, "papa", "effective", constants=constants, corpus=TEXTS, max_len=MAX_LEN, progress=False)
    features, labels = _sequence_features(n_classes=2)
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
