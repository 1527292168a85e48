"""What a forward skips where nothing hooks it. attnlens.core.norms: the normalization bridges of a
loaded model call the Hugging Face module directly while nothing hooks their ``hook_scale`` /
``hook_normalized``, and TransformerLens's own method otherwise; the seam calls an unhooked
``hook_pattern`` not at all. Reference: the same bridge with TransformerLens's method (the instance's
shortcut removed). Bit for bit: both run the same Hugging Face module on the same input (no hook),
or the very same method (hooked)."""

from __future__ import annotations

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import attnlens
from attnlens.core import norms
from tests import tiny

TEXTS = ["the quick brown fox jumps over the lazy dog .", "slow ."]


#: bridges whose normalizations run the Hugging Face module (TransformerLens's native path);
#: GPT-2's compute LayerNorm in Python (there the method is never called)
MODELS = {"bert": tiny.bert_bridge, "llama": tiny.llama_bridge}


def uninstalled(model):
    """The same bridge with TransformerLens's own method in every normalization bridge."""
    for module in norms._norms(model):
        del module.__dict__[norms.METHOD]
    return model


class Operators(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def run(model, hooks=(), cache=False):
    batch = attnlens.tokenize(model, TEXTS, max_len=16, layout="padded")
    with torch.no_grad():
        if cache:
            return model.run_with_cache(batch.input_ids, **batch.model_kwargs(),
                                        names_filter=lambda name: "hook_scale" in name or "hook_normalized" in name)
        return attnlens.run_with_hooks(model, batch, hooks)


@pytest.mark.parametrize("name", list(MODELS))
def test_unhooked_norms_skip_the_observation_and_give_the_same_output(name):
    model = MODELS[name]()
    assert norms.is_installed(model) and len(norms._norms(model)) >= 3
    with Operators() as direct:
        fast = run(model)
    reference = uninstalled(MODELS[name]())
    assert not norms.is_installed(reference)
    with Operators() as slow:
        expected = run(reference)
    assert torch.equal(fast, expected)
    # TransformerLens's observation: at least rsqrt and sqrt per normalization, none left
    n_norms = len(norms._norms(model))
    assert slow.count["rsqrt"] >= n_norms and slow.count["sqrt"] >= n_norms
    assert direct.count["rsqrt"] + direct.count["sqrt"] <= slow.count["rsqrt"] + slow.count["sqrt"] - 2 * n_norms
    assert sum(direct.count.values()) < sum(slow.count.values())


@pytest.mark.parametrize("name", list(MODELS))
def test_hooked_norms_show_and_edit_what_transformerlens_does(name):
    model, reference = MODELS[name](), uninstalled(MODELS[name]())
    logits, cache = run(model, cache=True)
    expected_logits, expected = run(reference, cache=True)
    assert torch.equal(logits, expected_logits)
    assert sorted(cache.keys()) == sorted(expected.keys()) and len(cache.keys()) >= 6
    for key in expected.keys():
        assert torch.equal(cache[key], expected[key]), key
    first = next(key for key in expected.keys() if key.endswith("hook_normalized"))
    edit = [(first, lambda value, hook: value * 0.5)]
    with pytest.warns(UserWarning):  # TransformerLens's own warning: an edit takes its python path
        edited = run(model, hooks=edit)
    with pytest.warns(UserWarning):
        expected_edit = run(reference, hooks=edit)
    assert torch.equal(edited, expected_edit) and not torch.equal(edited, logits)


def test_an_unhooked_pattern_hook_costs_no_kernel():
    """The seam (attnlens.core.seam) hands the pattern to TransformerLens's hook_pattern, with
    the key mask a hook may read; with no hook on it neither is needed (no comparison of the
    additive mask per layer), with one both are."""
    model = tiny.bert_bridge()
    batch = attnlens.tokenize(model, TEXTS, max_len=16)
    seen = []
    with torch.no_grad():
        with Operators() as plain:
            logits = model(batch.input_ids, **batch.model_kwargs())
        with Operators() as hooked:
            hooked_logits = model.run_with_hooks(
                batch.input_ids, **batch.model_kwargs(),
                fwd_hooks=[("blocks.0.attn.hook_pattern",
                            lambda pattern, hook: seen.append(attnlens.core.seam.key_mask(pattern)))])
    assert plain.count["gt"] == 0 and hooked.count["gt"] == 1  # layer 0's key mask, read off its mask
    assert torch.equal(logits, hooked_logits)
    assert torch.equal(seen[0], batch.attention_mask.bool())


def test_unhooked_pattern_hooks_of_constant_heads_cost_no_kernel(monkeypatch):
    """The same for fast constant heads (``papa.intervention(fast=True)``) on the route that
    assembles each layer's pattern (off the CPU, forced here): the key mask is read once a
    forward, for the constants, and again for a layer only where a hook reads its pattern."""
    model = tiny.bert_bridge()
    batch = attnlens.tokenize(model, TEXTS, max_len=16)
    constants = attnlens.papa.fit(model, TEXTS * 4, max_len=16, progress=False)
    monkeypatch.setattr(attnlens.core.devices, "reads_are_free", lambda where: False)
    with torch.no_grad(), attnlens.papa.intervention(model, constants, heads=0.5, fast=True):
        model(batch.input_ids, **batch.model_kwargs())  # the first forward casts the constants' means once
        with Operators() as plain:
            logits = model(batch.input_ids, **batch.model_kwargs())
        with Operators() as hooked:
            hooked_logits = model.run_with_hooks(
                batch.input_ids, **batch.model_kwargs(),
                fwd_hooks=[("blocks.0.attn.hook_pattern", lambda pattern, hook: None)])
    # the hook adds one comparison (layer 0's key mask); the other layers add none, hooked or not
    assert hooked.count["gt"] == plain.count["gt"] + 1
    assert torch.equal(logits, hooked_logits)
