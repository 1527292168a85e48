"""Effective attention on the whole MiniLM through hooks: run, replace / null modes, statistics.

Tolerances: padded batch vs each sequence alone 1e-5 absolute; logits with every pattern replaced
by its effective attention 1e-4 absolute; null mode: each layer's head outputs z at most 1e-5 of
the standard z (Frobenius norms); streamed statistics vs the same statistics from full maps 1e-5.
"""

from __future__ import annotations

import copy
import warnings

import einops
import pytest
import torch

import attnlens
from attnlens.methods import effective
from attnlens.methods.effective import effective_attention
from attnlens.methods.effective.reference import effective_attention_loop
from attnlens.methods.stats import STATISTICS, AttentionStatistics, token_classes
from tests import tiny
from tests.typechecks import unchecked

D_HEAD = 32


pytestmark = pytest.mark.usefixtures("single_blas_thread")


def is_z(name: str) -> bool:
    return name.endswith("attn.hook_z")


@pytest.fixture(scope="module")
def mixed_texts(sst2_sentences, wikitext_paragraphs) -> list[str]:
    """Short and long texts: SST-2 sentences (12 to 47 tokens) and WikiText paragraphs (> 96)."""
    return [sst2_sentences[i] for i in (0, 2, 34, 78, 345)] + wikitext_paragraphs[:3]


@pytest.fixture(scope="module")
def mixed_batch(minilm, mixed_texts):
    batch = attnlens.tokenize(minilm, mixed_texts, max_len=96, layout="padded")
    lengths = batch.attention_mask.sum(-1)
    assert (lengths < D_HEAD).any() and (lengths > D_HEAD).any() and (lengths == 96).any()
    return batch


@pytest.fixture(scope="module")
def mixed_run(minilm, mixed_batch):
    return effective.run(minilm, mixed_batch)


def test_run_returns_standard_and_effective_patterns_per_layer(minilm, mixed_batch, mixed_run):
    n_layers, n_heads = minilm.cfg.n_layers, minilm.cfg.n_heads
    batch, pos = mixed_batch.input_ids.shape
    assert mixed_run.standard.shape == (n_layers, batch, n_heads, pos, pos)
    assert mixed_run.effective.shape == mixed_run.standard.shape
    assert torch.equal(mixed_run.valid, mixed_batch.attention_mask.bool())
    with torch.no_grad():
        logits, cache = minilm.run_with_cache(mixed_batch.input_ids, **mixed_batch.model_kwargs())
    torch.testing.assert_close(mixed_run.logits, logits, atol=0, rtol=0)
    for layer in range(n_layers):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
        v = einops.rearrange(cache[f"blocks.{layer}.attn.hook_v"], "b k h d -> b h k d")
        torch.testing.assert_close(mixed_run.standard[layer], pattern, atol=0, rtol=0)
        expected = effective_attention(pattern, v, key_mask=mixed_run.valid)
        torch.testing.assert_close(mixed_run.effective[layer], expected, atol=0, rtol=0)
    torch.testing.assert_close(mixed_run.null, mixed_run.standard - mixed_run.effective)


def test_padded_batch_equals_each_sequence_alone(minilm, mixed_texts, mixed_batch, mixed_run):
    lengths = mixed_batch.attention_mask.sum(-1).tolist()
    worst = 0.0
    for row in (0, 3, 4, 5):  # 12, 33, 47 and 96 tokens
        text = mixed_texts[row]
        alone = attnlens.tokenize(minilm, [text], max_len=96, layout="padded")
        assert bool(alone.attention_mask.all()) and alone.input_ids.shape[1] == lengths[row]
        single = effective.run(minilm, alone)
        n = lengths[row]
        got = mixed_run.effective[:, row, :, :n, :n]
        worst = max(worst, float((got - single.effective[:, 0]).abs().max()))
        # padded keys get no effective attention
        assert torch.all(mixed_run.effective[:, row, :, :, n:] == 0)
    assert worst <= 1e-5, f"max abs difference {worst:.2e}"


def test_replacing_every_pattern_by_effective_attention_leaves_logits_unchanged(
    minilm, mixed_batch, mixed_run
):
    valid = mixed_run.valid
    long = valid.sum(-1) > D_HEAD
    # the replacement is a real change of the patterns...
    assert (mixed_run.effective - mixed_run.standard)[:, long].abs().max() > 0.5
    with torch.no_grad():
        plain = minilm(mixed_batch.input_ids, **mixed_batch.model_kwargs())
        replaced = minilm.run_with_hooks(
            mixed_batch.input_ids, **mixed_batch.model_kwargs(), fwd_hooks=effective.hooks(minilm)
        )
        with effective.hooked(minilm, "effective"):
            in_context = minilm(mixed_batch.input_ids, **mixed_batch.model_kwargs())
    # ...that leaves the output unchanged
    torch.testing.assert_close(replaced, plain, atol=1e-4, rtol=0)
    torch.testing.assert_close(in_context, replaced, atol=0, rtol=0)
    assert not minilm.hook_dict["blocks.0.attn.hook_pattern"].fwd_hooks, "hooks must be removed"


def test_null_space_mode_zeroes_the_heads_outputs(minilm, mixed_batch):
    kwargs = mixed_batch.model_kwargs()
    with torch.no_grad():
        plain, cache = minilm.run_with_cache(mixed_batch.input_ids, **kwargs, names_filter=is_z)
        z_null: dict[int, torch.Tensor] = {}

        def record(z, hook):  # hook.name is the alias target, blocks.{l}.attn.o.hook_in
            z_null[int(hook.name.split(".")[1])] = z.detach().clone()

        nulled = minilm.run_with_hooks(
            mixed_batch.input_ids,
            **kwargs,
            fwd_hooks=[*effective.hooks(minilm, "null"), (is_z, record)],
        )
    assert len(z_null) == minilm.cfg.n_layers
    for layer, z in z_null.items():
        standard = cache[f"blocks.{layer}.attn.hook_z"]
        assert z.shape == standard.shape  # [batch, pos, head, d_head]
        assert z.norm() <= 1e-5 * standard.norm(), f"layer {layer}: {z.norm() / standard.norm():.2e}"
    assert (nulled - plain).abs().max() > 1.0, "removing every head's output must change the logits"


@pytest.mark.parametrize(
    "make_model, make_tokenizer",
    [(tiny.tiny_roberta, tiny.roberta_tokenizer), (tiny.tiny_gpt2, tiny.gpt2_tokenizer)],
    ids=["roberta", "gpt2"],
)
def test_effective_mode_on_other_architectures(make_model, make_tokenizer):
    """d_head is 8 in the tiny models, so every sequence here has a non-trivial null space."""
    model = attnlens.load(make_model(), tokenizer=make_tokenizer())
    encoded = make_tokenizer()([" ".join(tiny.CORPUS[:2])], return_tensors="pt")
    with torch.no_grad():
        plain = model(encoded["input_ids"])
        replaced = model.run_with_hooks(encoded["input_ids"], fwd_hooks=effective.hooks(model))
    torch.testing.assert_close(replaced, plain, atol=1e-4, rtol=0)
    result = effective.run(model, encoded["input_ids"])
    assert (result.standard - result.effective).abs().max() > 0.01


def test_modes_and_layers_are_checked(minilm):
    with unchecked(), pytest.raises(ValueError, match="mode"):
        effective.hooks(minilm, "nul")
    with pytest.raises(ValueError, match="layers"):
        effective.hooks(minilm, layers=[6])
    assert len(effective.hooks(minilm, layers=[0, 2])) == 4


def test_statistics_stream_over_a_corpus(minilm, sst2_sentences, wikitext_paragraphs):
    corpus = sst2_sentences[:7] + wikitext_paragraphs[:3]
    streamed = effective.statistics(minilm, corpus, max_len=64, batch_size=4, progress=False)
    # the same means from full maps of the whole corpus in one batch
    batch = attnlens.tokenize(minilm, corpus, max_len=64, layout="padded")
    full = effective.run(minilm, batch)
    classes = token_classes(minilm.tokenizer, batch.input_ids)
    expected = {kind: AttentionStatistics(6, 12) for kind in ("standard", "effective")}
    for layer in range(6):
        expected["standard"].update(layer, full.standard[layer], classes, full.valid)
        expected["effective"].update(layer, full.effective[layer], classes, full.valid)
    assert streamed.n_examples == len(corpus) and streamed.n_tokens == int(batch.attention_mask.sum())
    for kind in ("standard", "effective"):
        means = getattr(streamed, kind)
        for name in ("to_cls", "to_sep", "to_punct"):
            assert means[name].shape == (6, 12)
            torch.testing.assert_close(means[name], expected[kind].means()[name], atol=1e-5, rtol=0)
    assert (streamed.effective["to_sep"] - streamed.standard["to_sep"]).abs().max() > 1e-3
    frame = streamed.table
    assert set(frame["attention"]) == {"standard", "effective"} and len(frame) == 2 * len(STATISTICS) * 72


def test_papa_layout_padding_in_the_middle(minilm, sst2_sentences):
    """PAPA puts padding before the final [SEP]: the valid keys need not be a prefix."""
    texts = [s for s in sst2_sentences if 40 <= len(minilm.tokenizer(s)["input_ids"]) <= 50][:3]
    batch = attnlens.tokenize(minilm, texts, max_len=64, layout="papa")
    valid = batch.attention_mask.bool()
    assert bool(valid[:, -1].all()) and not bool(valid[:, -2].any())
    result = effective.run(minilm, batch)
    with torch.no_grad():
        _, cache = minilm.run_with_cache(batch.input_ids, **batch.model_kwargs())
    block = (valid[:, None, :, None] & valid[:, None, None, :]).expand_as(result.effective[0])
    for layer in (0, 5):
        v = einops.rearrange(cache[f"blocks.{layer}.attn.hook_v"], "b k h d -> b h k d")
        expected = effective_attention_loop(result.standard[layer], v, valid)
        error = (result.effective[layer].double() - torch.from_numpy(expected)).abs()[block]
        assert error.max() <= 1e-5
        assert torch.all(result.effective[layer].transpose(1, 3)[~valid] == 0)


def padded_gpt2():
    """Tiny GPT-2 with a pad token (a copy: the cached tokenizer stays without one)."""
    tokenizer = copy.deepcopy(tiny.gpt2_tokenizer())
    tokenizer.pad_token = tokenizer.eos_token
    return attnlens.load(tiny.tiny_gpt2(), tokenizer=tokenizer)


def left_padded(batch: attnlens.Batch) -> attnlens.Batch:
    """The same texts with the padding moved before them, as a generation-style batch has it
    (``tokenize`` pads on the right; a user's own batch may not)."""
    shifts = (~batch.attention_mask.bool()).sum(-1).tolist()
    rows = [torch.roll(x, shift, dims=-1) for x, shift in zip(batch.input_ids, shifts, strict=True)]
    masks = [torch.roll(x, shift, dims=-1) for x, shift in zip(batch.attention_mask, shifts, strict=True)]
    ids, mask = torch.stack(rows), torch.stack(masks)
    return attnlens.Batch(ids, mask, torch.zeros_like(ids), 0, "padded", batch.max_len,
                          token_types=False, positions_from_mask=True)


GPT2_TEXTS = [tiny.CORPUS[0], " ".join(tiny.CORPUS[:2])]


def test_decoder_runs_the_plain_hugging_face_forward():
    """GPT-2 has no token types (given zeros, HF would add the embedding of token 0 everywhere):
    ``run`` on a padded batch, or on ids, gives the HF model's own logits on real tokens."""
    model = padded_gpt2()
    batch = attnlens.tokenize(model, GPT2_TEXTS, max_len=64, layout="padded")
    valid = batch.attention_mask.bool()
    assert not bool(valid.all())
    with torch.no_grad():
        expected = model.original_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        alone = model.original_model(input_ids=batch.input_ids[1:]).logits
    torch.testing.assert_close(effective.run(model, batch).logits[valid], expected[valid], atol=1e-5, rtol=0)
    torch.testing.assert_close(effective.run(model, batch.input_ids[1:]).logits, alone, atol=1e-5, rtol=0)


def test_left_padded_decoder_equals_each_sequence_alone():
    """Left padding shifts a short sequence's tokens; positions come from the mask, so its
    standard and effective patterns on the valid block are those of the sequence run alone."""
    model = padded_gpt2()
    batch = left_padded(attnlens.tokenize(model, GPT2_TEXTS, max_len=64, layout="padded"))
    valid = batch.attention_mask.bool()
    n = int(valid[0].sum())
    assert n < valid.shape[1] and not bool(valid[0, 0])
    together = effective.run(model, batch)
    alone = effective.run(model, attnlens.tokenize(model, GPT2_TEXTS[:1], max_len=64, layout="padded"))
    for maps in ("standard", "effective"):
        short = getattr(together, maps)[:, 0][..., -n:, -n:]
        torch.testing.assert_close(short, getattr(alone, maps)[:, 0], atol=1e-5, rtol=0)


def test_decoder_hooks_infer_the_mask_of_a_left_padded_run():
    """Run by hand (``run_with_hooks`` with an attention mask, no Batch), GPT-2's padded query rows
    are uniform over every key; the inferred mask must leave those rows out."""
    model = padded_gpt2()
    batch = left_padded(attnlens.tokenize(model, GPT2_TEXTS, max_len=64, layout="padded"))
    valid = batch.attention_mask.bool()
    seen = {}

    def record(layer, pattern, eff, mask):
        seen[layer] = (pattern, eff, mask)

    names = [f"blocks.{layer}.attn.hook_v" for layer in range(model.cfg.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.input_ids, attention_mask=batch.attention_mask, names_filter=names)
        model.run_with_hooks(
            batch.input_ids, attention_mask=batch.attention_mask, fwd_hooks=effective.pattern_hooks(model, record)
        )
    for layer, (pattern, eff, mask) in seen.items():
        assert torch.equal(mask, valid)
        v = einops.rearrange(cache[f"blocks.{layer}.attn.hook_v"], "b k h d -> b h k d")
        expected = torch.from_numpy(effective_attention_loop(pattern, v, valid, causal=True))
        block = (valid[:, None, :, None] & valid[:, None, None, :]).expand_as(eff)
        assert (eff.double() - expected).abs()[block].max() <= 1e-5


def test_left_padded_decoder_uses_the_batch_mask():
    """GPT-2 has no seam: with left padding its padded query rows see no key and come out uniform,
    so a mask inferred from the pattern would count every padded key as real. ``run`` must use the
    batch's mask: A⊥ equals the loop on the valid block and is 0 on padded keys."""
    model = padded_gpt2()
    batch = left_padded(attnlens.tokenize(model, GPT2_TEXTS, max_len=64, layout="padded"))
    valid = batch.attention_mask.bool()
    assert not bool(valid[0, 0]) and bool(valid[0, -1])  # padding first
    result = effective.run(model, batch)
    assert torch.equal(result.valid, valid)
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.input_ids, **batch.model_kwargs())
    block = (valid[:, None, :, None] & valid[:, None, None, :]).expand_as(result.effective[0])
    for layer in range(model.cfg.n_layers):
        v = einops.rearrange(cache[f"blocks.{layer}.attn.hook_v"], "b k h d -> b h k d")
        expected = effective_attention_loop(result.standard[layer], v, valid, causal=True)
        assert (result.effective[layer].double() - torch.from_numpy(expected)).abs()[block].max() <= 1e-5
        assert torch.all(result.effective[layer].transpose(1, 3)[~valid] == 0)


def test_models_without_attnlens_preparation_are_refused():
    from transformer_lens.model_bridge import TransformerBridge

    raw = tiny.tiny_bert()
    for call in (lambda: effective.hooks(raw), lambda: effective.run(raw, torch.ones(1, 4, dtype=torch.long))):
        with pytest.raises(TypeError, match=r"attnlens\.load"):
            call()
    bridge = TransformerBridge.boot_transformers(str(attnlens.core.loading.default_model_path()), device="cpu")
    with pytest.raises(ValueError, match=r"attnlens\.load"):
        effective.hooks(bridge, "null")


def test_statistics_progress_counts_the_corpus(minilm, sst2_sentences, monkeypatch):
    from attnlens.engine import batches, passes

    bars = []
    original = batches.progress_bar

    def spy(*args, **kwargs):
        bars.append(original(*args, **kwargs))
        return bars[-1]

    monkeypatch.setattr(passes, "progress_bar", spy)
    corpus = sst2_sentences[:5]
    effective.statistics(minilm, corpus, max_len=32, batch_size=2, progress=True)
    assert [(bar.total, bar.n) for bar in bars] == [(5, 5)]  # a percentage and an ETA are shown


def test_run_warns_once_when_no_text_is_longer_than_d_head(minilm, monkeypatch):
    """effective.run warns, once per process, when no text of its batch is longer than d_head
    tokens (then A⊥ = A by construction), read off the batch given on the host; a batch given
    on a device is not read for it (a wait for the device per call)."""
    from attnlens.core import devices
    from attnlens.engine import effective as engine

    monkeypatch.setattr(engine, "_WARNED", set())
    long_text = " ".join(["word"] * 60)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        effective.run(minilm, [long_text, "short ."])  # one text is longer: no warning
    monkeypatch.setattr(devices, "reads_are_free", lambda where: False)  # as a batch on a device
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        effective.run(minilm, ["short ."])
    monkeypatch.undo()
    monkeypatch.setattr(engine, "_WARNED", set())
    with pytest.warns(UserWarning, match="No text has more than d_head = 32 tokens"):
        effective.run(minilm, ["short .", "also short ."])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        effective.run(minilm, ["short ."])  # once per process


def test_a_short_text_with_a_repeated_token_on_a_rope_decoder():
    """A RoPE decoder's first layer sees no positions: a repeated token has the same values there,
    so a text of fewer than d_head tokens still has a left null space (it was returned as A).
    ``effective.run`` against the float64 SVD loop on every layer (ATOL: float32 values; the
    grouped key-value heads repeated for their query heads), and the part that reaches the
    output unchanged."""
    model = tiny.llama_bridge()
    d_head = int(model.cfg.d_head)
    batch = attnlens.tokenize(model, ["fox fox fox fox", "the quick brown fox"], max_len=16, layout="padded")
    valid = batch.attention_mask.bool()
    assert int(valid.sum(-1).max()) <= d_head
    result = effective.run(model, batch)
    names = [f"blocks.{layer}.attn.hook_v" for layer in range(model.cfg.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.input_ids, **batch.model_kwargs(), names_filter=names)
    for layer in range(model.cfg.n_layers):
        v = einops.rearrange(cache[names[layer]], "b k h d -> b h k d")
        v = v.repeat_interleave(model.cfg.n_heads // v.shape[1], dim=1)
        pattern, got = result.standard[layer], result.effective[layer]
        expected = torch.from_numpy(effective_attention_loop(pattern, v, valid, causal=True))
        block = (valid[:, None, :, None] & valid[:, None, None, :]).expand_as(got)
        assert (got.double() - expected).abs()[block].max() <= 1e-5, layer
        torch.testing.assert_close(got @ v, pattern @ v, atol=1e-5, rtol=1e-5)
    # the repeats' null space (within each row's visible keys: smaller than over the whole text)
    assert (result.effective[0, 0] - result.standard[0, 0]).abs().max() > 1e-3


def test_a_pass_certifies_short_sequences_only_where_it_has_them(minilm, wikitext_paragraphs, monkeypatch):
    """Off the CPU (the device routes, forced) a pass tells effective attention the shortest
    text of a batch from the host's copy of its inputs: a batch with no text of at most d_head
    tokens computes no certificate of short sequences (about 26 kernels a batch), one with such
    a text does; the statistics are the same either way."""
    from attnlens.core import devices
    from attnlens.engine import effective as engine

    calls = []
    real = engine._independent_values
    monkeypatch.setattr(engine, "_independent_values", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(devices, "reads_are_free", lambda where: False)
    long_texts = wikitext_paragraphs[:4]
    effective.statistics(minilm, long_texts, max_len=64, batch_size=4, progress=False)
    assert calls == []
    with_short = effective.statistics(minilm, [*long_texts[:3], "a short text ."], max_len=64, batch_size=4,
                                      progress=False)
    assert len(calls) == 1
    monkeypatch.setattr(devices, "reads_are_free", lambda where: True)  # the CPU route: the same table
    on_cpu = effective.statistics(minilm, [*long_texts[:3], "a short text ."], max_len=64, batch_size=4,
                                  progress=False)
    numbers = on_cpu.table.select_dtypes("number").columns
    assert (with_short.table[numbers] - on_cpu.table[numbers]).abs().max().max() <= 1e-5
