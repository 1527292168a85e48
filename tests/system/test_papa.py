"""PAPA constants: fit, merge, save/load, checkpoint/resume, data-free and trainable constants."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnlens
from attnlens import papa
from attnlens.core.loading import default_model_path
from tests import interrupts, tiny
from tests.precision import float32_sum_error

MERGE_ATOL = 1e-12  # float64 sums added in another order


@pytest.fixture(scope="module")
def hf_eager():
    """An independent Hugging Face copy of MiniLM's encoder, on transformers' eager attention.

    Loaded from disk rather than deep-copied from the bridge: a copy of the bridge's wrapped
    model reports every layer's attention three times in ``output_attentions``.
    """
    from transformers import BertModel

    return BertModel.from_pretrained(str(default_model_path()), attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def texts(sst2_sentences) -> list[str]:
    return sst2_sentences[:40]


def plain_loop(model, hf, examples, *, max_len, layout, batch_size):
    """Mean attention, pair counts and input dependence, one example at a time, in NumPy float64.

    The attentions come from the independent HF eager copy, run on the same batches as
    ``papa.fit`` (compact PAPA batches with their position ids, as the fit runs them: same
    shapes, so the same float32 kernels: seam.attention_forward is eager attention line for
    line). One example per forward would compare float32 forwards of other shapes, whose last
    bits may differ with BLAS blocking and the thread count: noise of the forward, not of the fit
    (compact against padded forwards: tests/unit/test_compact_layout.py). Everything after the forward
    is float64, each example's valid block added at its layout positions. Also returns
    max|attention| over valid pairs, for the tolerance.
    """
    cfg = model.cfg
    sums = np.zeros((cfg.n_layers, cfg.n_heads, max_len, max_len))
    counts = np.zeros((max_len, max_len))
    kept = []  # (layout positions of the real tokens, their attentions) per example
    for start in range(0, len(examples), batch_size):
        batch = attnlens.tokenize(model, examples[start : start + batch_size], max_len=max_len, layout=layout,
                                  compact=True)
        with torch.no_grad():
            out = hf(input_ids=batch.input_ids, **batch.model_kwargs(), output_attentions=True)
        assert len(out.attentions) == cfg.n_layers
        for index in range(len(batch)):
            valid = batch.attention_mask[index].numpy().astype(bool)
            where = batch.positions[index].numpy()[valid]
            block = np.ix_(where, where)
            attention = np.stack([a[index].double().numpy() for a in out.attentions])[..., valid, :][..., valid]
            sums[(..., *block)] += attention
            counts[block] += 1
            kept.append((block, attention))
    mean = np.where(counts > 0, sums / np.maximum(counts, 1), 0.0)
    distance = np.zeros((cfg.n_layers, cfg.n_heads))
    tokens = 0
    for block, attention in kept:
        distance += ((attention - mean[(..., *block)]) ** 2).sum(axis=(-2, -1))
        tokens += attention.shape[-1]
    largest = max(float(np.abs(attention).max()) for _, attention in kept)
    return mean, counts, distance / tokens, tokens, largest


@pytest.mark.parametrize(
    "layout, kind, max_len",
    [("papa", "sentences", 64), ("papa", "pairs", 48), ("padded", "sentences", 32)],
)
def test_fit_equals_plain_loop_over_hf_eager_attentions(
    minilm, hf_eager, texts, mrpc_pairs, layout, kind, max_len
):
    corpus = texts if kind == "sentences" else mrpc_pairs[:12]
    if (layout, kind) == ("papa", "sentences"):
        # the call, default batch_size 32: two batches of 32 and 8
        batch_size = 32
        constants = papa.fit(minilm, corpus, max_len=max_len, progress=False)
    else:
        batch_size = 5
        constants = papa.fit(minilm, corpus, max_len=max_len, layout=layout, batch_size=batch_size, progress=False)
    mean, counts, dependence, tokens, largest = plain_loop(
        minilm, hf_eager, corpus, max_len=max_len, layout=layout, batch_size=batch_size
    )
    # The attentions are the same float32 numbers on both sides (same batches); the fit then sums
    # each batch's B <= batch_size masked attentions in float32 (a BLAS product, any order) and
    # adds the batch totals into float64. Per (layer, head, query, key) with count c:
    #   |float32 batch sum - exact| <= gamma_{B-1} * sum_i |a_i|     (Higham, any order)
    #   => |fit mean - exact mean| <= gamma_{B-1} * sum_i |a_i| / c <= gamma_{B-1} * max|a|.
    # input_dependence = sum_{q,k}(squares - sums**2 / c) / tokens: squares has one more float32
    # rounding (a*a) per term, so gamma_B * max|a| * sum_i |a_i|; sums**2 / c moves by about
    # 2 * mean * (error of sums) <= 2 * max|a| * gamma_B * sum_i |a_i|. Summed over (q, k), the
    # valid attention of each valid query row sums to 1, so sum_{q,k,i} |a| = tokens, and
    #   |fit dependence - exact| <= 3 * gamma_B * max|a|.
    # The float64 steps (running sums, division, the reference loop) are ~1e-16 relative to
    # values <= 40: 1e-12 covers them. For batch_size 32 and max|a| <= 1: 1.85e-6 and 5.7e-6.
    mean_atol = float32_sum_error(batch_size) * largest + 1e-12
    dependence_atol = 3 * float32_sum_error(batch_size + 1) * largest + 1e-12

    assert constants.mean.shape == (6, 12, max_len, max_len)
    assert constants.counts.shape == (6, 12, max_len, max_len)
    np.testing.assert_array_equal(constants.pair_counts.numpy(), counts)
    np.testing.assert_allclose(constants.mean.numpy(), mean, atol=mean_atol, rtol=0)
    np.testing.assert_allclose(constants.input_dependence.numpy(), dependence, atol=dependence_atol, rtol=0)
    assert constants.sums.dtype == torch.float64 and constants.pair_counts.dtype == torch.int64
    assert (constants.n_examples, constants.n_tokens) == (len(corpus), tokens)
    assert constants.pairs is (kind == "pairs")
    assert constants.model_id == "sentence-transformers/all-MiniLM-L6-v2"
    assert (constants.layout, constants.max_len) == (layout, max_len)
    assert constants.n_truncated == attnlens.tokenize(minilm, corpus, max_len=max_len, layout=layout).n_truncated
    # never-seen pairs are 0; every head has some input dependence
    assert torch.all(constants.mean[:, :, counts == 0] == 0)
    assert torch.all(constants.input_dependence > 0)


def test_fit_streams_any_iterable_and_datasets_columns(minilm, texts):
    import datasets

    reference = papa.fit(minilm, texts[:12], max_len=32, batch_size=4, progress=False)
    from_generator = papa.fit(minilm, (t for t in texts[:12]), max_len=32, batch_size=4, progress=False)
    dataset = datasets.Dataset.from_dict({"sentence": texts[:12]})
    from_column = papa.fit(minilm, dataset["sentence"], max_len=32, batch_size=4, progress=False)
    for other in (from_generator, from_column):
        assert torch.equal(other.sums, reference.sums)
        assert torch.equal(other.pair_counts, reference.pair_counts)
    with pytest.raises(TypeError, match="column"):
        papa.fit(minilm, dataset, max_len=32, progress=False)
    with pytest.raises(TypeError, match="not one string"):
        papa.fit(minilm, "one sentence", max_len=32, progress=False)


def test_empty_corpus_is_an_error(minilm, capsys):
    """One error; a corpus known to be empty (it has a length) is refused before the pass draws
    a progress bar, a generator when it ends without an example."""
    with pytest.raises(ValueError, match="corpus is empty: papa.fit needs at least one string"):
        papa.fit(minilm, [], max_len=32)
    assert capsys.readouterr().err == ""
    with pytest.raises(ValueError, match="corpus is empty"):
        papa.fit(minilm, iter(()), max_len=32, progress=False)


def test_merge_of_two_fits_equals_fit_of_both(minilm, texts):
    first, second = texts[:16], texts[16:28]
    # in corpus order, so that the parts run the whole fit's batches (by length, each part would
    # be ordered on its own: the same constants up to float32 rounding)
    kwargs = dict(max_len=32, batch_size=8, progress=False, by_length=False)
    merged = papa.fit(minilm, first, **kwargs).merge(papa.fit(minilm, second, **kwargs))
    whole = papa.fit(minilm, first + second, **kwargs)
    added = sum([papa.fit(minilm, first, **kwargs), papa.fit(minilm, second, **kwargs)])

    for got in (merged, added):
        torch.testing.assert_close(got.sums, whole.sums, atol=MERGE_ATOL, rtol=0)
        torch.testing.assert_close(got.squares, whole.squares, atol=MERGE_ATOL, rtol=0)
        torch.testing.assert_close(got.mean, whole.mean, atol=MERGE_ATOL, rtol=0)
        assert torch.equal(got.pair_counts, whole.pair_counts)
        assert got.metadata == whole.metadata


def test_merge_refuses_another_model_or_layout(minilm, texts):
    constants = papa.fit(minilm, texts[:4], max_len=32, progress=False)
    padded = papa.fit(minilm, texts[:4], max_len=32, layout="padded", progress=False)
    with pytest.raises(ValueError, match="layout 'papa' vs 'padded'"):
        constants + padded
    with pytest.raises(ValueError, match="model_id"):
        constants.merge(constants.replace(model_id="bert-base-uncased"))
    with pytest.raises(ValueError, match="Only fitted averages"):
        constants + papa.toeplitz(constants)


def test_save_then_load_is_bit_exact_and_load_refuses_another_model(minilm, texts, tmp_path):
    constants = papa.fit(minilm, texts[:10], max_len=32, batch_size=4, progress=False)
    path = constants.save(tmp_path / "constants.safetensors")
    assert [p.name for p in tmp_path.iterdir()] == ["constants.safetensors"], "no temporary file left"

    loaded = papa.PapaConstants.load(path, minilm)
    for name in ("sums", "squares", "pair_counts"):
        assert torch.equal(getattr(loaded, name), getattr(constants, name))
        assert getattr(loaded, name).dtype == getattr(constants, name).dtype
    assert torch.equal(loaded.mean, constants.mean)
    assert loaded.metadata == constants.metadata

    other = tiny.bert_bridge()
    with pytest.raises(ValueError, match="constants were fitted on 'sentence-transformers/all-MiniLM-L6-v2', model is"):
        papa.load(path, other)
    constants.replace(model_id="someone/else", fingerprint=None).save(path)  # no weights to compare
    with pytest.raises(ValueError, match="fitted on 'someone/else', model is 'sentence-transformers"):
        papa.load(path, minilm)
    # the same weights under another id (e.g. the model loaded by path, or moved): the fingerprint
    # vouches for them
    constants.replace(model_id="someone/else").save(path)
    assert papa.load(path, minilm).model_id == "someone/else"


@pytest.mark.parametrize("every", [1, 100])
def test_interrupted_fit_resumes_to_the_uninterrupted_result(minilm, texts, tmp_path, every, monkeypatch):
    corpus = texts[:36]
    kwargs = dict(max_len=32, batch_size=8, progress=False)
    whole = papa.fit(minilm, corpus, **kwargs)
    checkpoint = tmp_path / "fit.ckpt"
    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        interrupts.at_batch(patch, 3)  # Ctrl-C as the third batch starts
        papa.fit(minilm, corpus, checkpoint=checkpoint, checkpoint_every=every, **kwargs)
    saved = papa.load(checkpoint)
    assert saved.n_examples == 16, "two full batches were consumed before the interrupt"

    resumed = papa.fit(minilm, corpus, checkpoint=checkpoint, checkpoint_every=every, **kwargs)
    for name in ("sums", "squares", "pair_counts"):
        assert torch.equal(getattr(resumed, name), getattr(whole, name))
    assert resumed.metadata == whole.metadata
    again = papa.fit(minilm, corpus, checkpoint=checkpoint, **kwargs)  # finished: nothing left
    assert torch.equal(again.sums, whole.sums)

    with pytest.raises(ValueError, match="layout='papa', max_len=32; this fit asks for layout='papa', max_len=48"):
        papa.fit(minilm, corpus, checkpoint=checkpoint, max_len=48, progress=False)
    with pytest.raises(ValueError, match="only has|has only"):
        papa.fit(minilm, corpus[:5], checkpoint=checkpoint, **kwargs)


def test_data_free_constants(minilm):
    n = 16
    eye, harmonic = papa.identity(minilm, max_len=n), papa.toeplitz(minilm, max_len=n)
    flat, nothing = papa.uniform(minilm, max_len=n), papa.zeros(minilm, max_len=n, layout="padded")
    assert torch.equal(eye.mean[3, 5], torch.eye(n, dtype=torch.float64))
    i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    weights = 1.0 / ((i - j).abs() + 1).double()
    torch.testing.assert_close(harmonic.mean[0, 0], weights / weights.sum(-1, keepdim=True))
    torch.testing.assert_close(flat.mean[5, 11], torch.full((n, n), 1.0 / n, dtype=torch.float64))
    assert torch.equal(nothing.mean, torch.zeros(6, 12, n, n, dtype=torch.float64))
    for constants in (eye, harmonic, flat, nothing):
        assert constants.model_id == attnlens.core.loading.model_id(minilm)
        assert constants.counts.shape == constants.sums.shape
    assert (nothing.layout, eye.layout, nothing.renormalize, eye.renormalize) == ("padded", "papa", False, True)
    with pytest.raises(ValueError, match="input_dependence is measured during papa.fit"):
        _ = eye.input_dependence
    with pytest.raises(ValueError, match="max_len"):
        papa.identity(minilm)


def test_layer_mean_follows_reassigned_sums_and_counts(minilm):
    """The hooks' ``layer_mean`` cache must not outlive the tensors it was computed from: after
    ``.sums`` or ``.pair_counts`` is reassigned (the new tensor may get a freed one's id and
    version counter) or changed in place, it gives the new mean. Reference: ``sums / counts``
    in NumPy float64 cast to float32; exact (the same IEEE division and rounding)."""
    constants = papa.uniform(minilm, max_len=8)
    shape = constants.sums.shape
    generator = torch.Generator().manual_seed(0)
    for step in range(50):
        constants.layer_mean(2, dtype=torch.float32, device="cpu")  # cache the current mean
        if step % 3 == 2:
            constants.pair_counts = torch.randint(0, 4, (8, 8), generator=generator)
        else:
            constants.sums = torch.rand(shape, generator=generator, dtype=torch.float64)
        if step % 5 == 4:
            constants.sums.mul_(2.0)
        got = constants.layer_mean(2, dtype=torch.float32, device="cpu").numpy()
        sums, counts = constants.sums[2].numpy(), constants.pair_counts.numpy()
        want = np.where(counts > 0, sums / np.maximum(counts, 1), 0.0).astype(np.float32)
        np.testing.assert_array_equal(got, want, err_msg=f"step {step}")


def test_trainable_constants_are_masked_softmaxes(minilm, texts):
    constants = papa.fit(minilm, texts[:12], max_len=32, progress=False)
    batch = attnlens.tokenize(minilm, texts[20:24], max_len=32)
    valid = batch.attention_mask.bool()
    trainable = papa.TrainableConstants.from_average(constants)
    for layer in (0, 5):
        replaced = constants.layer_pattern(layer, valid, dtype=torch.float32)
        learned = trainable.layer_pattern(layer, valid, dtype=torch.float32)
        torch.testing.assert_close(learned, replaced, atol=1e-6, rtol=0)
    snapshot = trainable.to_constants()
    assert snapshot.kind == "trained"
    torch.testing.assert_close(
        snapshot.layer_pattern(2, valid, dtype=torch.float32),
        trainable.layer_pattern(2, valid, dtype=torch.float32),
        atol=1e-6, rtol=0,
    )
    harmonic = papa.TrainableConstants.from_toeplitz(constants)
    torch.testing.assert_close(
        harmonic.layer_pattern(1, valid, dtype=torch.float32),
        papa.toeplitz(constants).layer_pattern(1, valid, dtype=torch.float32),
        atol=1e-6, rtol=0,
    )
    # trainable through the hooks, with any loss
    hooks = papa.hooks(trainable, heads="all")
    assert hooks.parameters() == [trainable.logits]
    logits = minilm.run_with_hooks(batch.input_ids, **batch.model_kwargs(), fwd_hooks=hooks)
    logits[valid].logsumexp(-1).mean().backward()
    grad = trainable.logits.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    for param in minilm.parameters():
        param.grad = None


# ---- files that are not constants, old files, and weights fingerprints ----------------------


def test_load_of_a_file_that_is_not_constants_is_a_value_error_saying_why(tmp_path):
    from safetensors.torch import save_file

    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a safetensors file at all")
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    foreign = tmp_path / "foreign.safetensors"  # a valid safetensors file of something else
    save_file({"weight": torch.zeros(2, 2)}, str(foreign))
    cases = {
        garbage: "Error while deserializing header",
        empty: "Error while deserializing header",
        foreign: "its format is None",
    }
    for path, reason in cases.items():
        with pytest.raises(ValueError, match=rf"{path.name} is not an attnlens constants file .*: {reason}"):
            papa.load(path)
    with pytest.raises(FileNotFoundError):
        papa.load(tmp_path / "missing.safetensors")


@pytest.fixture(scope="module")
def tiny_berts():
    """Two tiny BERTs of one name ('BertForMaskedLM') with different weights."""
    return [attnlens.load(tiny.tiny_bert(seed), tokenizer=tiny.bert_tokenizer()) for seed in (0, 1)]


def test_constants_of_a_model_with_other_weights_are_refused(tiny_berts, tmp_path):
    first, second = tiny_berts
    assert attnlens.core.loading.model_id(first) == attnlens.core.loading.model_id(second)
    constants = papa.fit(first, tiny.CORPUS, max_len=16, progress=False)
    assert constants.fingerprint == attnlens.core.fingerprints.weights_fingerprint(first)
    refusal = r"other weights than this model's .* papa\.fit\(model, corpus\).* constants\.fingerprint = None"
    constants.check_compatible(first)
    with pytest.raises(ValueError, match=refusal):
        constants.check_compatible(second)
    with pytest.raises(ValueError, match=refusal):
        with papa.intervention(second, constants):
            pass
    with pytest.raises(ValueError, match=refusal):
        papa.TrainableConstants.from_average(constants).check_compatible(second)
    path = constants.save(tmp_path / "first.safetensors")
    assert papa.load(path, first).fingerprint == constants.fingerprint
    with pytest.raises(ValueError, match=refusal):
        papa.load(path, second)
    with pytest.raises(ValueError, match="models with different weights"):
        constants + papa.fit(second, tiny.CORPUS, max_len=16, progress=False)
    with pytest.raises(ValueError, match=refusal):  # resuming another model's checkpoint
        papa.fit(second, tiny.CORPUS, max_len=16, progress=False, checkpoint=path)
    constants.replace(fingerprint=None).check_compatible(second)  # the documented way round


def test_constants_saved_before_fingerprints_still_load(tiny_berts, tmp_path):
    """Files written before ``causal`` and ``fingerprint`` were recorded have neither key."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    first, second = tiny_berts
    path = papa.fit(first, tiny.CORPUS, max_len=16, progress=False).save(tmp_path / "new.safetensors")
    with safe_open(str(path), framework="pt") as handle:
        metadata = {k: v for k, v in handle.metadata().items() if k not in ("causal", "fingerprint")}
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    from attnlens.core.files import tensor_checksum

    metadata["checksum"] = tensor_checksum(tensors)  # what attnlens wrote then: the tensors only
    old = tmp_path / "old.safetensors"
    save_file(tensors, str(old), metadata=metadata)
    with pytest.warns(UserWarning, match="older attnlens"):
        loaded = papa.load(old, second)  # no fingerprint: the weights are not checked
    assert (loaded.fingerprint, loaded.causal) == (None, None)
    assert torch.equal(loaded.sums, papa.load(path).sums)


@pytest.mark.parametrize("checkpointed", ["pairs", "sentences"])
def test_resuming_a_checkpoint_with_the_other_kind_of_inputs_says_so(tiny_berts, tmp_path, checkpointed):
    model = tiny_berts[0]
    pairs = list(zip(tiny.CORPUS[:8], tiny.CORPUS[8:], strict=True))
    first, then = (pairs, tiny.CORPUS) if checkpointed == "pairs" else (tiny.CORPUS, pairs)
    checkpoint = tmp_path / "fit.ckpt"
    papa.fit(model, first[:4], max_len=16, progress=False, checkpoint=checkpoint)
    fitted, given = ("sentence pairs", "single sentences")[:: 1 if checkpointed == "pairs" else -1]
    with pytest.raises(ValueError, match=f"checkpoint .*fit.ckpt was fitted on {fitted}; this corpus holds {given}"):
        papa.fit(model, then, max_len=16, progress=False, checkpoint=checkpoint)
    # without a checkpoint, a corpus that changes kind half-way is said to mix them
    with pytest.raises(ValueError, match="The corpus mixes single sentences and sentence pairs"):
        papa.fit(model, first[:4] + then[4:8], max_len=16, batch_size=4, progress=False)


def test_fit_shows_the_shared_progress_bar_from_where_it_resumes(tiny_berts, tmp_path, monkeypatch):
    from attnlens.engine import batches, passes

    calls = []
    shared = batches.progress_bar

    def recording(corpus, description, enabled, *, initial=0):
        calls.append((description, enabled, initial))
        return shared(corpus, description, enabled, initial=initial)

    monkeypatch.setattr(passes, "progress_bar", recording)
    model, checkpoint = tiny_berts[0], tmp_path / "fit.ckpt"
    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        interrupts.at_batch(patch, 3)
        papa.fit(model, tiny.CORPUS, max_len=16, batch_size=4, progress=False,
                 checkpoint=checkpoint, checkpoint_every=1)
    papa.fit(model, tiny.CORPUS, max_len=16, batch_size=4, progress=False, checkpoint=checkpoint)
    assert calls == [("papa.fit", False, 0), ("papa.fit", False, 8)]


def test_decoder_constants_do_not_depend_on_batch_size_when_the_tokenizer_pads_left():
    """Constants are indexed by position. With left padding a token's padded position would shift
    with the longest text of its batch; the padded layout pads on the right so it does not."""
    import copy

    tokenizer = copy.deepcopy(tiny.gpt2_tokenizer())
    tokenizer.pad_token, tokenizer.padding_side = tokenizer.eos_token, "left"
    model = attnlens.load(tiny.tiny_gpt2(), tokenizer=tokenizer)
    texts = tiny.CORPUS[:6]
    one = papa.fit(model, texts, max_len=24, layout="padded", batch_size=1, progress=False)
    all_ = papa.fit(model, texts, max_len=24, layout="padded", batch_size=6, progress=False)
    assert torch.equal(one.pair_counts, all_.pair_counts)
    # batch_size 1 adds single float32 patterns (exact in float64); batch_size 6 first sums 6 of
    # them in float32: <= float32_sum_error(6) * max|a| = 3.0e-7 on a mean (see the fit test).
    # The forwards differ in shape ([1, n] vs [6, 24]), so the patterns may differ in their last
    # bits too: that part is not an accumulation bound; 5e-7 is allowed for it (observed 3e-8 with
    # 1, 2 and 4 threads). A position shifted by left padding moves the means by more than 1e-2.
    atol = float32_sum_error(6) * float(all_.mean.abs().max()) + 5e-7
    torch.testing.assert_close(one.mean, all_.mean, atol=atol, rtol=0)


def test_constants_follow_the_weights_across_folders_and_are_saved_readable(tmp_path):
    """A copy of a model folder has another id (its absolute path) but the same weights: its
    constants are accepted. The file gets the usual permissions (not mkstemp's 0600)."""
    import os

    for folder in ("a", "b"):
        tiny.tiny_bert().save_pretrained(tmp_path / folder)
        tiny.bert_tokenizer().save_pretrained(tmp_path / folder)
    first, copy = (attnlens.load(str(tmp_path / folder)) for folder in ("a", "b"))
    assert attnlens.core.loading.model_id(first) != attnlens.core.loading.model_id(copy)
    path = papa.fit(first, tiny.CORPUS, max_len=16, progress=False).save(tmp_path / "c.safetensors")
    assert papa.load(path, copy).fingerprint == attnlens.core.fingerprints.weights_fingerprint(copy)
    mask = os.umask(0o022)
    os.umask(mask)
    assert (path.stat().st_mode & 0o777) == 0o666 & ~mask
