"""TransformerLens's weight processing (``enable_compatibility_mode()``, ``process_weights()``)
keeps a bridge's output and rewrites some of what attnlens reads (:mod:`attnlens.core.processing`):
the value biases folded into the output bias, the writing weights centred on LayerNorm models.

Each analysis is run on a tiny random model (biases drawn non-zero, as a trained model's are)
before processing, the reference, and again after: what the processing leaves alone gives the
reference's numbers; what reads a changed quantity is refused by name, never a silent other
number (before, effective attention moved by 0.11 and the norm-based view by 0.25 on the tiny
GPT-2, 0.14 and 0.33 on MiniLM, with the logits the same to 7e-6). The changed quantities are
shown to change (``hook_v``, ``W_O``, the residual stream), so no refusal guards nothing.

Tolerance: the processed weights are the same products re-associated in float32 (a bias added
to another sum, a mean subtracted): ``1e-5`` absolute on values of order 1 (sums of at most
``d_model = 48`` terms, ``γ_48 ≈ 3e-6``; observed ≤ 1e-6); probe features are stored in float16,
so there a difference of one float16 rounding, ``2⁻¹⁰`` relative.
"""

from __future__ import annotations

import pytest
import torch

import attnlens
from attnlens import ablation
from attnlens.core import processing
from attnlens.core.heads import HeadSet
from attnlens.evaluation.probing import features
from attnlens.methods import interventions, papa
from tests import tiny

#: TransformerLens's own note that a post-norm adapter keeps its LayerNorm weights unfolded
pytestmark = pytest.mark.filterwarnings("ignore:.*does not support fold_ln:UserWarning")

MAX_LEN = 40
TEXTS = tiny.CORPUS[:4]
MODELS = {"gpt2": tiny.gpt2_bridge, "roberta": tiny.roberta_bridge, "llama": tiny.llama_bridge}
#: what TransformerLens's default processing changes, by model: GPT-2 (LayerNorm, pre-norm, value
#: biases) all three; RoBERTa (post-norm) not its residual stream; Llama (RMSNorm, no biases) none
CHANGED = {
    "gpt2": {"values", "output_weights", "residual"},
    "roberta": {"values", "output_weights"},
    "llama": set(),
}
#: what each analysis reads of the model among processing.CHANGES
READS = {
    "maps.standard": set(),
    "maps.effective": {"values"},
    "maps.norm": {"values", "output_weights"},
    "papa.fit": set(),
    "ablation.uniform": set(),
    "ablation.mean": set(),
    "ablation.zero": {"values"},
    "intervention.effective": {"values"},
    "importance": {"values"},
    "features": {"residual"},
}


def with_biases(make):
    """``make()`` with every bias drawn from N(0, 0.2²) (Hugging Face initialises them to 0,
    which would leave nothing for the processing to fold)."""
    bridge = make()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in bridge.original_model.named_parameters():
            if name.endswith("bias"):
                parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator))
    return bridge


def first_logit(output, batch):
    """A differentiable loss per example for head importance (the tiny models' LM heads are
    untrained, so the default LM loss is refused)."""
    return output.log_softmax(-1)[..., 0].mean(-1)


def analysis(bridge, name):
    """The result of analysis ``name`` on the fixed texts, as one tensor."""
    batch = attnlens.tokenize(bridge, TEXTS, max_len=MAX_LEN)
    if name.startswith("maps."):
        return attnlens.maps(bridge, batch, name.removeprefix("maps."))
    if name == "papa.fit":
        return papa.fit(bridge, TEXTS, max_len=MAX_LEN, progress=False).sums
    if name == "importance":
        return ablation.importance(bridge, TEXTS, loss=first_logit, max_len=MAX_LEN, progress=False).raw
    if name == "features":
        return features.extract(bridge, TEXTS, cache=False, max_len=MAX_LEN, progress=False).vectors.float()
    n_layers, n_heads = int(bridge.cfg.n_layers), int(bridge.cfg.n_heads)
    heads = HeadSet(torch.arange(n_layers * n_heads).reshape(n_layers, n_heads) % 3 == 0)
    if name == "intervention.effective":
        hooks = interventions.build("effective", bridge, heads)
    else:
        mode = name.removeprefix("ablation.")
        means = ablation.head_means(bridge, TEXTS, max_len=MAX_LEN, progress=False) if mode == "mean" else None
        hooks = ablation.hooks(heads, mode, model=bridge, means=means)
    with torch.no_grad():
        return attnlens.run_with_hooks(bridge, batch, hooks).log_softmax(-1)


def readings(bridge):
    """What the processing may change, read through TransformerLens itself: ``hook_v``, ``W_O``
    and the last block's output."""
    batch = attnlens.tokenize(bridge, TEXTS, max_len=MAX_LEN)
    _, cache = bridge.run_with_cache(batch.input_ids, **batch.model_kwargs())
    last = int(bridge.cfg.n_layers) - 1
    return {"values": cache["blocks.0.attn.hook_v"], "output_weights": bridge.blocks[0].attn.W_O.detach().clone(),
            "residual": cache[f"blocks.{last}.hook_out"]}


def assert_same(after, before, name):
    if name == "features":
        torch.testing.assert_close(after, before, rtol=2.0**-10, atol=1e-5, msg=name)
    else:
        torch.testing.assert_close(after, before, rtol=0, atol=1e-5, msg=name)


@pytest.mark.parametrize("arch", list(MODELS))
def test_processed_weights_give_the_same_numbers_or_are_refused(arch):
    bridge = with_biases(MODELS[arch])
    assert processing.changed(bridge) == frozenset()
    reference = {name: analysis(bridge, name) for name in READS}
    raw = readings(bridge)

    bridge.enable_compatibility_mode(disable_warnings=True)
    assert processing.changed(bridge) == CHANGED[arch]
    processed = readings(bridge)
    for quantity in processing.CHANGES:  # each refusal guards a real change; the rest are equal
        moved = float((processed[quantity] - raw[quantity]).abs().max())
        assert (moved > 1e-3) == (quantity in CHANGED[arch]), (quantity, moved)
    for name, reads in READS.items():
        if reads & CHANGED[arch]:
            with pytest.raises(processing.ProcessedWeights, match=r"no_processing=True\)") as refused:
                analysis(bridge, name)
            assert "enable_compatibility_mode()" in str(refused.value), name
        else:
            assert_same(analysis(bridge, name), reference[name], name)


def test_compatibility_mode_without_processing_changes_no_number():
    """``enable_compatibility_mode(no_processing=True)`` (TransformerLens's hook names alone)
    keeps the weights: every analysis runs and gives the reference's numbers."""
    bridge = with_biases(tiny.gpt2_bridge)
    reference = {name: analysis(bridge, name) for name in READS}
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    assert processing.changed(bridge) == frozenset()
    for name in READS:
        assert_same(analysis(bridge, name), reference[name], name)


def test_the_refusal_names_what_changed_and_the_fix():
    bridge = with_biases(tiny.roberta_bridge)
    bridge.enable_compatibility_mode(disable_warnings=True)
    with pytest.raises(processing.ProcessedWeights) as refused:
        processing.check(bridge, ("values", "output_weights"), "the norm-based view")
    message = str(refused.value)
    assert message.startswith("the norm-based view needs")
    assert "value biases are folded into the output bias" in message and "W_O (centred" in message
    assert "attnlens.load(...) again" in message and "no_processing=True" in message
    processing.check(bridge, ("residual",), "probe features")  # RoBERTa normalizes what it hands on
