"""hook_pattern is a real, exact intervention point (issue: foundation)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from transformers.masking_utils import (
    and_masks,
    bidirectional_mask_function,
    causal_mask_function,
    eager_mask,
)

import attnlens
from attnlens.core import models, seam
from attnlens.core.seam import key_mask
from tests import tiny
from tests.precision import float32_sum_error

ATOL = 1e-5  # identity hooks vs HF eager, float32


def is_pattern(name: str) -> bool:
    return name.endswith("hook_pattern")


def identity(pattern, hook):
    return pattern.clone()


def eager_reference(bridge):
    """The Hugging Face model of ``bridge`` built anew on transformers' own eager attention, with
    its weights (a deep copy of ``bridge.original_model`` would keep TransformerLens's bridge
    modules inside it, and so would not be an independent reference)."""
    hf = bridge.original_model
    reference = type(hf)._from_config(copy.deepcopy(hf.config), attn_implementation="eager")
    weights = {name.replace("._original_component", ""): value for name, value in hf.state_dict().items()}
    reference.load_state_dict({name: weights[name] for name in reference.state_dict()})
    assert not any("Bridge" in type(module).__name__ or "HookPoint" in type(module).__name__
                   for module in reference.modules())
    return reference.eval()


def first_token(pattern, hook):
    out = torch.zeros_like(pattern)
    out[..., 0] = 1.0
    return out


def uniform(pattern, hook):
    valid = key_mask(pattern)[:, None, None, :].to(pattern.dtype)
    return (valid / valid.sum(-1, keepdim=True)).expand_as(pattern)


@pytest.fixture(scope="module")
def sst2_batch(minilm, sst2_sentences):
    return attnlens.tokenize(minilm, sst2_sentences[:8], max_len=48, layout="padded")


def test_identity_hooks_match_hf_eager_on_minilm(minilm, sst2_batch):
    assert (sst2_batch.attention_mask == 0).any(), "the batch must contain padding"
    reference = eager_reference(minilm)
    with torch.no_grad():
        expected = reference(input_ids=sst2_batch.input_ids, **sst2_batch.model_kwargs()).logits
        got = minilm.run_with_hooks(
            sst2_batch.input_ids, **sst2_batch.model_kwargs(), fwd_hooks=[(is_pattern, identity)]
        )
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "make_model, make_tokenizer, padded",
    [
        (tiny.tiny_bert, tiny.bert_tokenizer, True),
        (tiny.tiny_roberta, tiny.roberta_tokenizer, True),
        (tiny.tiny_gpt2, tiny.gpt2_tokenizer, False),
    ],
    ids=["bert", "roberta", "gpt2"],
)
def test_identity_hooks_match_hf_eager_on_tiny_models(make_model, make_tokenizer, padded):
    hf_model = make_model()
    tokenizer = make_tokenizer()
    model = attnlens.load(hf_model, tokenizer=tokenizer)
    reference = make_model()
    reference.set_attn_implementation("eager")
    texts = tiny.CORPUS[:3] if padded else [tiny.CORPUS[0]] * 2
    encoded = tokenizer(texts, padding=padded, return_tensors="pt")
    kwargs = {"attention_mask": encoded["attention_mask"]}
    with torch.no_grad():
        expected = reference(input_ids=encoded["input_ids"], **kwargs).logits
        got = model.run_with_hooks(encoded["input_ids"], **kwargs, fwd_hooks=[(is_pattern, identity)])
        moved = model.run_with_hooks(encoded["input_ids"], **kwargs, fwd_hooks=[(is_pattern, first_token)])
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    assert (moved - expected).abs().max() > 100 * ATOL, "a pattern edit must move the logits"


def manual_bert_with_uniform_attention(hf, input_ids, attention_mask, token_type_ids):
    """BERT forward written out by hand from HF's submodules, attention uniform over valid keys."""
    bert = hf.bert
    heads = hf.config.num_attention_heads
    hidden = bert.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
    valid = attention_mask[:, None, None, :].float()
    attention = (valid / valid.sum(-1, keepdim=True)).expand(-1, -1, input_ids.shape[1], -1)
    for layer in bert.encoder.layer:
        b, t, d = hidden.shape
        value = layer.attention.self.value(hidden).view(b, t, heads, d // heads).transpose(1, 2)
        context = (attention @ value).transpose(1, 2).reshape(b, t, d)
        attended = layer.attention.output.LayerNorm(layer.attention.output.dense(context) + hidden)
        hidden = layer.output.LayerNorm(layer.output.dense(layer.intermediate(attended)) + attended)
    return hf.cls(hidden)


def test_uniform_edit_moves_logits_and_matches_independent_forward(minilm, sst2_batch):
    with torch.no_grad():
        plain = minilm(sst2_batch.input_ids, **sst2_batch.model_kwargs())
        edited = minilm.run_with_hooks(
            sst2_batch.input_ids, **sst2_batch.model_kwargs(), fwd_hooks=[(is_pattern, uniform)]
        )
        expected = manual_bert_with_uniform_attention(
            minilm.original_model, sst2_batch.input_ids, sst2_batch.attention_mask,
            sst2_batch.token_type_ids,
        )
    assert (edited - plain).abs().max() > 0.1
    valid = sst2_batch.attention_mask.bool()
    torch.testing.assert_close(edited[valid], expected[valid], atol=1e-4, rtol=1e-4)


def test_pytorchs_own_hooks_on_hook_pattern_edit_too(minilm, sst2_batch):
    """A hook registered on hook_pattern with PyTorch's own API (register_forward_hook, or on
    every module) is an intervention as a TransformerLens hook is: the same edit, the same
    output (the seam ran no hook point without a TransformerLens hook, and dropped them)."""
    from torch.nn.modules.module import register_module_forward_hook

    points = [block.attn.hook_pattern for block in minilm.blocks]
    with torch.no_grad():
        edited = minilm.run_with_hooks(
            sst2_batch.input_ids, **sst2_batch.model_kwargs(), fwd_hooks=[(is_pattern, uniform)])
        handles = [point.register_forward_hook(lambda module, inputs, output: uniform(output, None))
                   for point in points]
        try:
            own = minilm(sst2_batch.input_ids, **sst2_batch.model_kwargs())
        finally:
            for handle in handles:
                handle.remove()
        handle = register_module_forward_hook(
            lambda module, inputs, output: uniform(output, None) if module in points else None)
        try:
            every = minilm(sst2_batch.input_ids, **sst2_batch.model_kwargs())
        finally:
            handle.remove()
    torch.testing.assert_close(own, edited, atol=0, rtol=0)
    torch.testing.assert_close(every, edited, atol=0, rtol=0)


def is_scores(name: str) -> bool:
    return name.endswith("hook_attn_scores")


@pytest.mark.parametrize("bridge", ["minilm", "tiny_roberta", "tiny_gpt2", "tiny_llama"])
def test_hook_attn_scores_holds_the_scores_before_the_softmax(bridge, minilm, sst2_sentences):
    """``hook_attn_scores`` holds each layer's scaled scores with the additive mask (what
    TransformerLens's decoders and ``HookedTransformer`` give; on BERT and RoBERTa TransformerLens
    4.3 fired it with the softmaxed pattern): fired once a layer, before ``hook_pattern``, and
    the pattern is the softmax of exactly those scores (the same tensor: bit for bit).

    Reference: ``q·kᵀ / sqrt(d_head)`` from the layer's ``hook_q`` and ``hook_k`` (``hook_rot_q``
    and ``hook_rot_k`` with RoPE), a product of
    ``d_head`` terms whose order may differ from the attention's, so within
    ``γ_{d_head} · Σ|q k| / sqrt(d_head)``; padded keys (an encoder's) score below -1e38."""
    model = minilm if bridge == "minilm" else getattr(tiny, f"{bridge.removeprefix('tiny_')}_bridge")()
    batch = attnlens.tokenize(model, [*sst2_sentences[:3], "it rained ."], max_len=24, layout="padded")
    assert not bool(batch.attention_mask.bool().all()), "the batch must hold padding"
    calls: list[str] = []
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.input_ids, **batch.model_kwargs())
        model.run_with_hooks(batch.input_ids, **batch.model_kwargs(),
                             fwd_hooks=[(lambda name: is_scores(name) or is_pattern(name),
                                         lambda tensor, hook: calls.append(hook.name))])
    n_layers = int(model.cfg.n_layers)
    assert calls == [f"blocks.{layer}.attn.{point}" for layer in range(n_layers)
                     for point in ("hook_attn_scores", "hook_pattern")]
    real = batch.attention_mask.bool()
    for layer in range(n_layers):
        scores, pattern = cache[f"blocks.{layer}.attn.hook_attn_scores"], cache[f"blocks.{layer}.attn.hook_pattern"]
        assert torch.equal(torch.softmax(scores, dim=-1), pattern), layer
        rotated = "rot_" if f"blocks.{layer}.attn.hook_rot_q" in cache else ""  # RoPE: after the rotation
        q, k = (cache[f"blocks.{layer}.attn.hook_{rotated}{name}"] for name in "qk")
        k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)  # grouped key-value heads
        d_head = q.shape[-1]
        expected = torch.einsum("bqhd,bkhd->bhqk", q, k) / d_head**0.5
        bound = float32_sum_error(d_head) * torch.einsum("bqhd,bkhd->bhqk", q.abs(), k.abs()) / d_head**0.5
        compared = real[:, None, None, :]
        if models.of(model).causal:
            compared = compared & torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
        compared = compared.expand_as(scores)
        assert bool(((scores - expected).abs() <= bound)[compared].all()), layer
        if not models.of(model).causal:  # a decoder's masked scores are TransformerLens's to choose
            assert bool((scores[~compared] < -1e38).all()), layer


@pytest.mark.parametrize("model_name", ["minilm", "tiny_roberta"])
def test_an_edit_of_an_encoders_scores_reaches_the_output(model_name, minilm, sst2_batch, sst2_sentences):
    """A hook on one layer's ``hook_attn_scores`` that adds to some scores changes the logits
    exactly as a ``hook_pattern`` there that replaces the pattern by the softmax of the edited
    scores does (the reference: the layer's inputs are the plain run's, so the same tensors
    through the same softmax, bit for bit), and TransformerLens warns of no discarded edit."""
    model = minilm if model_name == "minilm" else tiny.roberta_bridge()
    batch = sst2_batch if model_name == "minilm" else attnlens.tokenize(model, sst2_sentences[:8], max_len=48)
    layer = int(model.cfg.n_layers) - 2

    def edit(scores):
        edited = scores.clone()
        edited[:, 1, :, 1] += 4.0  # head 1 looks at the first word
        return edited

    with torch.no_grad():
        _, cache = model.run_with_cache(batch.input_ids, **batch.model_kwargs())
        plain = model(batch.input_ids, **batch.model_kwargs())
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            edited = model.run_with_hooks(batch.input_ids, **batch.model_kwargs(), fwd_hooks=[
                (f"blocks.{layer}.attn.hook_attn_scores", lambda scores, hook: edit(scores))])
        reference = model.run_with_hooks(batch.input_ids, **batch.model_kwargs(), fwd_hooks=[
            (f"blocks.{layer}.attn.hook_pattern",
             lambda pattern, hook: torch.softmax(edit(cache[f"blocks.{layer}.attn.hook_attn_scores"]), dim=-1))])
    torch.testing.assert_close(edited, reference, atol=0, rtol=0)
    assert float((edited - plain).abs().max()) > 1e-3  # the edit was not discarded


def test_a_deep_copy_keeps_the_seam():
    """``copy.deepcopy`` of a prepared encoder is prepared too: its hook points are its own
    (an edit of the copy's scores changes the copy alone), its scores are scores."""
    model = tiny.bert_bridge()
    twin = copy.deepcopy(model)
    assert seam.is_installed(twin)
    batch = attnlens.tokenize(model, ["it rained all day .", "a b"], max_len=12)
    to_first_word = torch.zeros(12)
    to_first_word[1] = 20.0  # every query looks at the first word
    hooks = [("blocks.0.attn.hook_attn_scores", lambda scores, hook: scores + to_first_word[: scores.shape[-1]])]
    with torch.no_grad():
        plain = model(batch.input_ids, **batch.model_kwargs())
        _, cache = twin.run_with_cache(batch.input_ids, **batch.model_kwargs())
        twin.run_with_hooks(batch.input_ids, **batch.model_kwargs(), fwd_hooks=hooks)
        edited = twin.run_with_hooks(batch.input_ids, **batch.model_kwargs(), fwd_hooks=hooks)
        after = model(batch.input_ids, **batch.model_kwargs())
    assert not torch.equal(cache["blocks.0.attn.hook_attn_scores"], cache["blocks.0.attn.hook_pattern"])
    assert float((edited - plain).abs().max()) > 1e-4
    torch.testing.assert_close(after, plain, atol=0, rtol=0)


def test_each_pattern_hook_runs_once_per_layer(minilm, sst2_batch):
    calls: list[str] = []

    def record(pattern, hook):
        calls.append(hook.name)

    with torch.no_grad():
        minilm.run_with_hooks(
            sst2_batch.input_ids, **sst2_batch.model_kwargs(), fwd_hooks=[(is_pattern, record)]
        )
    assert calls == [f"blocks.{layer}.attn.hook_pattern" for layer in range(minilm.cfg.n_layers)]


def test_gradients_flow_into_a_parameter_inside_a_pattern_hook(minilm, sst2_batch):
    mix = torch.nn.Parameter(torch.tensor(0.3))

    def blend(pattern, hook):
        return mix * pattern + (1 - mix) * uniform(pattern, hook)

    logits = minilm.run_with_hooks(
        sst2_batch.input_ids, **sst2_batch.model_kwargs(), fwd_hooks=[(is_pattern, blend)]
    )
    try:
        logits[sst2_batch.attention_mask.bool()].logsumexp(-1).mean().backward()
    finally:  # the session's model keeps no gradients of this test (later tests read .grad)
        minilm.zero_grad(set_to_none=True)
    assert mix.grad is not None and torch.isfinite(mix.grad) and mix.grad.abs() > 0


def test_run_with_cache_patterns_are_batch_head_query_key(minilm, sst2_batch):
    with torch.no_grad():
        _, cache = minilm.run_with_cache(sst2_batch.input_ids, **sst2_batch.model_kwargs())
    batch, pos = sst2_batch.input_ids.shape
    padded = ~sst2_batch.attention_mask.bool()
    for layer in range(minilm.cfg.n_layers):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
        assert pattern.shape == (batch, minilm.cfg.n_heads, pos, pos)
        assert torch.all(pattern.transpose(1, 3)[padded] == 0), "padded keys must get zero attention"
        torch.testing.assert_close(pattern.sum(-1), torch.ones(batch, pattern.shape[1], pos))


def test_key_mask_inside_hook_is_the_attention_mask(minilm, sst2_batch):
    seen = []

    def record(pattern, hook):
        seen.append(key_mask(pattern).clone())

    with torch.no_grad():
        minilm.run_with_hooks(
            sst2_batch.input_ids, **sst2_batch.model_kwargs(), fwd_hooks=[(is_pattern, record)]
        )
    for mask in seen:
        assert torch.equal(mask, sst2_batch.attention_mask.bool())


def test_papa_layout_keeps_hf_positions(minilm, sst2_sentences):
    """The PAPA layout has padding before the final [SEP]; the bridge must not move it."""
    batch = attnlens.tokenize(minilm, sst2_sentences[:4], max_len=64, layout="papa")
    assert (batch.attention_mask[:, -2] == 0).all(), "padding must precede the final [SEP]"
    reference = eager_reference(minilm)
    with torch.no_grad():
        expected = reference(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask,
            token_type_ids=batch.token_type_ids,
        ).logits
        got = minilm.run_with_hooks(
            batch.input_ids, **batch.model_kwargs(), fwd_hooks=[(is_pattern, identity)]
        )
    valid = batch.attention_mask.bool()
    torch.testing.assert_close(got[valid], expected[valid], atol=ATOL, rtol=0)


@pytest.mark.parametrize("make_model, make_tokenizer", [(tiny.tiny_bert, tiny.bert_tokenizer),
                                                        (tiny.tiny_roberta, tiny.roberta_tokenizer)],
                         ids=["bert", "roberta"])
@pytest.mark.parametrize("padded", [True, False], ids=["padding", "no-padding"])
def test_the_seam_without_hooks_is_hf_eager_bit_for_bit(make_model, make_tokenizer, padded):
    """The seam's attention and mask (made_mask: always made, a padding mask in one kernel) give
    HF eager's logits exactly: the same scores plus the same additive mask, or plus zeros where
    HF skips the mask of a batch without padding (x + 0.0 == x)."""
    model = attnlens.load(make_model(), tokenizer=make_tokenizer())
    reference = make_model()
    reference.set_attn_implementation("eager")
    tokenizer = make_tokenizer()
    texts = tiny.CORPUS[:3] if padded else [tiny.CORPUS[0]] * 2
    encoded = tokenizer(texts, padding=True, return_tensors="pt")
    assert bool((encoded["attention_mask"] == 0).any()) == padded
    with torch.no_grad():
        expected = reference(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"]).logits
        got = model(encoded["input_ids"], attention_mask=encoded["attention_mask"])
    assert torch.equal(got, expected)


def test_made_mask_is_transformers_eager_mask():
    """The one-kernel padding mask equals transformers' construction; anything else is its."""
    padding = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    base = dict(batch_size=3, q_length=4, kv_length=4, q_offset=0, kv_offset=0, attention_mask=padding,
                allow_is_causal_skip=False, dtype=torch.float32, use_vmap=False, device="cpu")
    cases = [dict(mask_function=bidirectional_mask_function),  # the one-kernel case
             dict(mask_function=bidirectional_mask_function, attention_mask=padding.long()),
             dict(mask_function=causal_mask_function),  # transformers' own from here on
             dict(mask_function=and_masks(bidirectional_mask_function, causal_mask_function)),
             dict(mask_function=bidirectional_mask_function, q_length=2, q_offset=2)]
    for case in cases:
        kwargs = {**base, **case}
        expected = eager_mask(**{**kwargs, "attention_mask": kwargs["attention_mask"].bool()},
                              allow_is_bidirectional_skip=False)
        got = seam.made_mask(**{**kwargs, "allow_is_bidirectional_skip": True})
        assert got.shape == expected.shape and torch.equal(got, expected), case


def test_a_batch_the_host_knows_unpadded_needs_no_mask():
    """attnlens's runs say, from the host's copy, that a batch has no padding
    (seam.batch_unpadded): its mask is then not made at all, and the logits are the same bit for
    bit as with the mask of zeros made without that knowledge."""
    padding = torch.ones(2, 5, dtype=torch.bool)
    kwargs = dict(batch_size=2, q_length=5, kv_length=5, q_offset=0, kv_offset=0, attention_mask=padding,
                  mask_function=bidirectional_mask_function, dtype=torch.float32, use_vmap=False, device="cpu")
    with seam.batch_unpadded((2, 5)):
        assert seam.made_mask(**kwargs) is None
    with seam.batch_unpadded((2, 6)):  # another batch's shape: made
        assert torch.equal(seam.made_mask(**kwargs), torch.zeros(2, 1, 5, 5))
    model = tiny.bert_bridge()
    batch = attnlens.tokenize(model, [tiny.CORPUS[0]] * 2, max_len=32, layout="padded")
    assert bool(batch.attention_mask.all())
    with torch.no_grad():
        known = attnlens.run_with_hooks(model, batch)  # host batch: unpadded, no mask made
        made = model(batch.input_ids, **batch.model_kwargs())  # the mask of zeros added
    assert torch.equal(known, made)
