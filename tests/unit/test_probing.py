"""Probe features and the PAPA probe: exact to HF hidden states, cached, reproducible.

Float16 tolerance: features are float32 hidden states rounded to float16 (round to nearest, 11
significant bits), so each element is within 2⁻¹¹ of its value relatively (plus float16's
subnormal spacing 2⁻²⁴ near 0); the float32 forward itself agrees with HF eager to ~1e-6.
"""

from __future__ import annotations

import time
import warnings

import pytest
import torch

import attnlens
from attnlens import papa
from attnlens.core.inputs import Words
from attnlens.engine import passes
from attnlens.errors import NotFittedError
from attnlens.evaluation import probing
from attnlens.evaluation.probing import features as features_module
from tests import tiny
from tests.typechecks import unchecked

FP16 = 2.0**-11


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def bert():
    return tiny.bert_bridge()


def hf_hidden_states(model, batch):
    """HF eager hidden states [batch, pos, layer, d] (embeddings, then each layer's output),
    read by HF's own forward hooks on the encoder layers (TransformerLens wraps each layer, so
    ``output_hidden_states`` lists wrapper and layer both)."""
    hf = model.original_model
    states = []
    encoder = hf.bert.encoder
    handles = [encoder.layer[0].register_forward_pre_hook(
        lambda module, args, kwargs: states.append(args[0] if args else kwargs["hidden_states"]),
        with_kwargs=True)]
    for layer in encoder.layer:
        handles.append(layer.register_forward_hook(
            lambda module, args, output: states.append(output[0] if isinstance(output, tuple) else output)))
    try:
        with torch.no_grad():
            hf(batch.input_ids, attention_mask=batch.attention_mask, token_type_ids=batch.token_type_ids)
    finally:
        for handle in handles:
            handle.remove()
    return torch.stack(states, dim=2)


def within_fp16(found, reference):
    return bool(((found.float() - reference).abs() <= reference.abs() * FP16 + 2.0**-24 + 1e-5).all())


@pytest.mark.parametrize("examples", [tiny.CORPUS[:6], [(a, b) for a, b in zip(tiny.CORPUS[:3], tiny.CORPUS[3:6], strict=True)]])
def test_features_are_hf_hidden_states_of_real_tokens(bert, examples):
    features = probing.extract(bert, examples, max_len=24, batch_size=4, progress=False)
    batch = attnlens.tokenize(bert, examples, max_len=24, layout="papa")
    reference = hf_hidden_states(bert, batch)
    real = batch.attention_mask.bool()
    assert features.vectors.dtype == torch.float16 and features.vectors.shape == (int(real.sum()), 3, 32)
    assert within_fp16(features.vectors, reference[real])
    assert torch.equal(features.lengths, real.sum(1))
    assert torch.equal(features.positions, torch.arange(24).expand_as(real)[real])


def test_word_features_are_each_words_first_sub_token(bert):
    """Against the tokenizer's own word_ids, one example at a time."""
    examples = [Words(("quick", "foxes", "jumped")), Words(("a", "film", "measured", "postponed"))]
    features = probing.extract(bert, examples, max_len=24, progress=False)
    tokenizer = bert.tokenizer
    offsets = features.offsets
    for index, example in enumerate(examples):
        encoded = tokenizer(list(example.words), is_split_into_words=True)
        firsts = [position for position, word in enumerate(encoded.word_ids())
                  if word is not None and (position == 0 or encoded.word_ids()[position - 1] != word)]
        batch = attnlens.tokenize(bert, [example], max_len=24, layout="papa")
        reference = hf_hidden_states(bert, batch)[0]
        rows = features.vectors[offsets[index] : offsets[index + 1]]
        assert features.positions[offsets[index] : offsets[index + 1]].tolist() == list(range(len(example)))
        # papa layout: the tokens sit where the tokenizer puts them ([CLS] first)
        assert within_fp16(rows, reference[firsts])
    assert features.n_words.tolist() == [3, 4]


def test_identity_hooks_give_identical_features_and_replacement_changes_them(minilm):
    """On MiniLM (a tiny random BERT's heads are near uniform, as are its constants)."""
    bert = minilm
    texts = tiny.CORPUS[:8]
    plain = probing.extract(bert, texts, max_len=16, progress=False, cache=False)
    identity = [(f"blocks.{layer}.attn.hook_pattern", lambda pattern, hook: pattern) for layer in range(6)]
    same = probing.extract(bert, texts, max_len=16, progress=False, hooks=identity, cache_key="identity")
    assert torch.equal(plain.vectors, same.vectors)
    constants = papa.fit(bert, texts, max_len=16, progress=False)
    replaced = probing.extract(bert, texts, max_len=16, progress=False, hooks=papa.hooks(constants))
    assert torch.equal(replaced.vectors[:, 0], plain.vectors[:, 0])  # embeddings: before attention
    change = (replaced.vectors[:, -1].float() - plain.vectors[:, -1].float()).abs().max()
    assert change > 10 * FP16 * plain.vectors[:, -1].float().abs().max(), change  # beyond rounding


def test_a_cache_hit_runs_no_forward_pass(bert, monkeypatch):
    texts = tiny.CORPUS[:5]
    first = probing.extract(bert, texts, max_len=16, progress=False)
    assert (features_module.cache_dir() / f"{first.key}.safetensors").exists()

    def no_pass(*args, **kwargs):
        pytest.fail("a forward pass ran although the features were cached")

    monkeypatch.setattr(passes, "run", no_pass)
    again = probing.extract(bert, texts, max_len=16, progress=False)
    assert torch.equal(again.vectors, first.vectors) and again.key == first.key


def test_two_processes_asking_for_the_same_features_compute_them_once(bert, monkeypatch):
    """A second extraction of the same key waits on the first's lock and reads its file (the lock
    is a file lock, so two threads, each with its own copy of the model, stand for two
    processes): one forward pass, equal features."""
    import threading

    texts = tiny.CORPUS[:5]
    started, calls, run = threading.Event(), [], passes.run

    def slow_run(*args, **kwargs):
        calls.append(1)
        started.set()
        time.sleep(0.5)  # the second extraction arrives while this one is running
        return run(*args, **kwargs)

    monkeypatch.setattr(passes, "run", slow_run)
    found = {}

    def extract(name, model):
        found[name] = probing.extract(model, texts, max_len=16, progress=False)

    first = threading.Thread(target=extract, args=("first", bert))
    first.start()
    assert started.wait(30)
    extract("second", tiny.bert_bridge())
    first.join()
    assert len(calls) == 1, "the second extraction computed the features again"
    assert torch.equal(found["first"].vectors, found["second"].vectors)
    assert found["first"].key == found["second"].key


def test_the_cache_key_changes_with_hooks_examples_and_max_len(bert):
    texts = tiny.CORPUS[:5]
    constants = papa.fit(bert, texts, max_len=16, progress=False)
    keys = {
        probing.extract(bert, texts, max_len=16, progress=False).key,
        probing.extract(bert, texts[:4], max_len=16, progress=False).key,
        probing.extract(bert, texts, max_len=20, progress=False).key,
        probing.extract(bert, texts, max_len=16, progress=False, hooks=papa.hooks(constants)).key,
        probing.extract(bert, texts, max_len=16, progress=False, hooks=papa.hooks(constants, heads=0.5)).key,
    }
    assert len(keys) == 5
    other = attnlens.load(tiny.tiny_bert(seed=1), tokenizer=tiny.bert_tokenizer())
    assert probing.extract(other, texts, max_len=16, progress=False).key not in keys


def test_hooks_without_a_key_are_not_cached_and_say_so(bert):
    hooks = [("blocks.0.attn.hook_pattern", lambda pattern, hook: pattern)]
    with pytest.warns(UserWarning, match="cache_key"):
        features = probing.extract(bert, tiny.CORPUS[:3], max_len=16, progress=False, hooks=hooks)
    assert features.key == "" and not list(features_module.cache_dir().glob("*.safetensors"))


def test_a_damaged_cache_file_is_recomputed(bert):
    texts = tiny.CORPUS[:5]
    first = probing.extract(bert, texts, max_len=16, progress=False)
    path = features_module.cache_dir() / f"{first.key}.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # a flipped byte in the tensors: the checksum catches it
    path.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="Recomputing"):
        again = probing.extract(bert, texts, max_len=16, progress=False)
    assert torch.equal(again.vectors, first.vectors)
    assert probing.clear_cache() == 1 and not path.exists()
    assert not list(features_module.cache_dir().iterdir()), "the lock file is removed too"


def _separable(bert, n=48):
    """Sentences whose label is whether they contain 'fox' (a probe must learn it)."""
    texts, labels = [], []
    for index in range(n):
        base = tiny.CORPUS[index % 4].split()
        label = index % 2
        words = base[:3] + (["fox"] if label else ["dog"]) + base[3:]
        texts.append(" ".join(words))
        labels.append(label)
    return texts, labels


def test_the_probe_learns_is_reproducible_and_round_trips(bert, tmp_path):
    texts, labels = _separable(bert)
    features = probing.extract(bert, texts, max_len=24, progress=False)
    probe = probing.PapaProbe(epochs=30, seed=3).fit(features, labels)
    predicted = probe.predict(features)
    assert sum(int(p == y) for p, y in zip(predicted, labels, strict=True)) / len(labels) >= 0.9
    again = probing.PapaProbe(epochs=30, seed=3).fit(features, labels)
    assert again.predict(features) == predicted
    for name, value in probe.network.state_dict().items():
        assert torch.equal(value, again.network.state_dict()[name]), name
    path = probe.save(tmp_path / "probe.safetensors")
    assert probing.PapaProbe.load(path).predict(features) == predicted


def test_a_token_probe_labels_every_word(bert, tmp_path):
    sentences = [s.split() for s in tiny.CORPUS[:8]]
    examples = [Words(tuple(words)) for words in sentences]
    tags = [[int(word in {"fox", "film", "match", "researchers", "dog"}) for word in words] for words in sentences]
    features = probing.extract(bert, examples, max_len=12, progress=False)  # some words cut
    assert int(features.lengths.sum()) < sum(map(len, sentences))
    probe = probing.PapaProbe(epochs=40).fit(features, tags)
    predicted = probe.predict(features)
    assert [len(p) for p in predicted] == [len(s) for s in sentences]
    path = probe.save(tmp_path / "tokens.safetensors")
    assert probing.PapaProbe.load(path).predict(features) == predicted


def test_probe_arguments_and_labels_are_checked(bert):
    with pytest.raises(ValueError, match="lr"):
        probing.PapaProbe(lr=0.0)
    with pytest.raises(ValueError, match="lr must be a finite number"):
        probing.PapaProbe(lr=float("nan"))
    with unchecked(), pytest.raises(TypeError, match="epochs must be a whole number"):
        probing.PapaProbe(epochs=2.5)
    features = probing.extract(bert, tiny.CORPUS[:3], max_len=16, progress=False)
    with pytest.raises(ValueError, match="2 labels for 3 examples"):
        probing.PapaProbe().fit(features, [0, 1])
    with pytest.raises(RuntimeError, match="not fitted"):
        probing.PapaProbe().predict(features)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        probing.PapaProbe(epochs=1).fit(features, [0, 1, 0])


def test_an_mlm_head_round_trips_and_a_damaged_file_is_refused(bert, tmp_path):
    from attnlens.evaluation.lm.masks import mlm_masks
    from attnlens.evaluation.probing import mlm

    texts = tiny.CORPUS[:8]
    features = probing.extract(bert, texts, max_len=24, progress=False, variant="mlm-test",
                               states=mlm.MaskedStates(bert, rate=0.3, seed=0, examples=texts))
    assert features.kind == "masked"
    batch = attnlens.tokenize(bert, texts, max_len=24, layout="papa")
    masked, targets = mlm_masks(batch, bert.tokenizer, rate=0.3, seed=0, mix=mlm.PROBE_MIX)
    assert torch.equal(features.positions, batch.input_ids[targets])  # the original tokens
    head = mlm.MLMHead(epochs=2).fit(features, int(bert.cfg.d_vocab))
    path = head.save(tmp_path / "head.safetensors")
    assert mlm.MLMHead.load(path).score(features) == head.score(features)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum"):
        mlm.MLMHead.load(path)


def test_the_cache_key_names_the_attnlens_version(bert, monkeypatch):
    """Features cached by another attnlens version are never reused."""
    from attnlens.core import version

    texts = tiny.CORPUS[:3]
    key = features_module.features_key(bert, texts, hooks="none", max_len=16, layout="papa")
    monkeypatch.setattr(version, "__version__", "9.9.9")
    assert features_module.features_key(bert, texts, hooks="none", max_len=16, layout="papa") != key


class _SlowTokenizer:
    """A tokenizer that cannot map tokens to words (``is_fast`` False, as a Python tokenizer);
    transformers 5 gives fast tokenizers wherever it can, so this one wraps one and says no."""

    is_fast = False

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def __call__(self, *args, **kwargs):
        return self._tokenizer(*args, **kwargs)

    def __len__(self):
        return len(self._tokenizer)


def test_words_need_a_tokenizer_that_maps_words_to_sub_tokens(bert):
    slow = _SlowTokenizer(bert.tokenizer)
    for layout in ("papa", "padded"):
        with pytest.raises(ValueError, match="cannot map words to sub-tokens"):
            attnlens.tokenize(slow, [Words(("a", "film"))], max_len=16, layout=layout)


def test_mean_pooling_and_standardisation_follow_their_definitions(bert):
    """At initialisation (w = 1/max_len) the mean pooling is the plain mean of each example's
    standardised real-token vectors, and the standardisation is numpy's per (layer, dimension)
    mean and population standard deviation of the training tokens. Float32 sums of a few hundred
    terms: 1e-5 relative; the statistics in float64: 1e-6."""
    import numpy as np

    texts = tiny.CORPUS[:6]
    features = probing.extract(bert, texts, max_len=24, progress=False)
    probe = probing.PapaProbe(epochs=1, pooling="mean", standardize=True)
    probe.fit(features, [0, 1, 0, 1, 0, 1])
    vectors = features.vectors.double().numpy()
    assert np.allclose(probe.network.mean.numpy(), vectors.mean(0), rtol=1e-6, atol=1e-6)
    assert np.allclose(probe.network.scale.numpy(), vectors.std(0), rtol=1e-5, atol=1e-6)
    network = probing.probe.ProbeNetwork(features.n_layers, features.d_model, 5, 2, features.max_len,
                                         True, 0.0, "mean")
    network.mean.copy_(probe.network.mean)
    network.scale.copy_(probe.network.scale)
    captured = {}
    network.dense.register_forward_hook(lambda module, inputs, output: captured.update(rows=inputs[0]))
    chosen = torch.arange(len(features))
    with torch.no_grad():
        probe.network = network
        probe._logits(features, chosen)
    offsets = features.offsets.tolist()
    standardised = (vectors - probe.network.mean.double().numpy()) / probe.network.scale.double().numpy()
    expected = np.stack([standardised[offsets[i] : offsets[i + 1]].mean(0).reshape(-1) for i in range(len(features))])
    assert np.allclose(captured["rows"].double().numpy(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pooling", ["mean", "sum"])
def test_learned_pooling_equals_standardising_each_token_then_pooling(bert, pooling):
    """The probe pools the raw token vectors first and standardises the pooled vector;
    its definition standardises every token, then sums ``w[l, p] · h_l[p]`` per example (times
    ``max_len / n`` for the mean). With learned, unequal weights both give the same dense inputs
    and the same gradient of ``w``, against that definition in float64: float32 sums of a few
    dozen terms of magnitude ≤ 10 after standardising, so 1e-5 relative and absolute."""
    texts = tiny.CORPUS[:6]
    features = probing.extract(bert, texts, max_len=24, progress=False)
    probe = probing.PapaProbe(epochs=1, pooling=pooling, standardize=True).fit(features, [0, 1, 0, 1, 0, 1])
    network = probe.network
    with torch.no_grad():
        network.position_weights.copy_(torch.rand(network.position_weights.shape,
                                                  generator=torch.Generator().manual_seed(0)))
    captured = {}
    network.dense.register_forward_hook(lambda module, inputs, output: captured.update(rows=inputs[0]))
    network.zero_grad()
    logits, _, _ = probe._logits(features, torch.arange(len(features)))
    captured["rows"].sum().backward()
    got = network.position_weights.grad.clone()

    weights = network.position_weights.detach().double().requires_grad_(True)
    standardised = (features.vectors.double() - network.mean.double()) / network.scale.double()
    offsets = features.offsets.tolist()
    expected = []
    for i in range(len(features)):
        tokens = standardised[offsets[i] : offsets[i + 1]]  # [token, layer, d]
        positions = features.positions[offsets[i] : offsets[i + 1]]
        pooled = (weights[:, positions].T[:, :, None] * tokens).sum(0)
        expected.append((pooled * (features.max_len / len(tokens)) if pooling == "mean" else pooled).reshape(-1))
    expected = torch.stack(expected)
    expected.sum().backward()
    torch.testing.assert_close(captured["rows"].double(), expected.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.double(), weights.grad, rtol=1e-5, atol=1e-5)


def test_the_papers_sum_pooling_round_trips_with_its_settings(bert, tmp_path):
    """pooling='sum', standardize=False is the paper's FreezeExtractPoller (Σ_p w[l,p]·h[p],
    w = 1/max_len, raw vectors); its file records both settings and loads as that probe."""
    import json

    from safetensors.torch import load_file, safe_open

    texts, labels = _separable(bert)
    features = probing.extract(bert, texts, max_len=24, progress=False)
    paper = probing.PapaProbe(epochs=20, pooling="sum", standardize=False, seed=1).fit(features, labels)
    predicted = paper.predict(features)
    path = paper.save(tmp_path / "paper.safetensors")
    loaded = probing.PapaProbe.load(path)
    assert loaded.settings.pooling == "sum" and loaded.settings.standardize is False
    assert loaded.predict(features) == predicted
    with safe_open(str(path), "pt") as handle:
        metadata = handle.metadata()
    settings = json.loads(metadata["settings"])
    assert settings["pooling"] == "sum"
    with pytest.raises(ValueError, match="pooling"):
        probing.PapaProbe(pooling="max")
    assert set(load_file(str(path))) >= {"mean", "scale", "position_weights"}


def test_early_stopping_keeps_the_best_held_out_epoch_and_never_sees_other_examples(bert):
    """The scorer is called after every epoch from ``min_epochs`` on, with held-out indices only
    (a tenth of the training examples, disjoint from the ones trained on); the probe keeps the
    weights of the best epoch: equal to a probe stopped there by the same scorer."""
    texts, labels = _separable(bert)
    features = probing.extract(bert, texts, max_len=24, progress=False)
    values = iter([0.1, 0.5, 0.3, 0.2, 0.1, 0.0, 0.0, 0.0])
    seen: list = []

    def scorer(indices, predicted):
        seen.append(indices.tolist())
        assert len(predicted) == len(indices)
        return next(values)

    probe = probing.PapaProbe(epochs=20, seed=1, early_stopping=True, min_epochs=2, n_iter_no_change=3)
    probe.fit(features, labels, scorer=scorer)
    # judged after epochs 2..6 (5 values: best 0.5 at the 2nd judged one, then 3 without a better)
    assert probe.validation_scores_ == [0.1, 0.5, 0.3, 0.2, 0.1]
    assert probe.epochs_ == 3
    held = seen[0]
    assert all(indices == held for indices in seen)
    assert len(held) == round(0.1 * len(texts))
    stopped = iter([0.1, 0.5])
    short = probing.PapaProbe(epochs=3, seed=1, early_stopping=True, min_epochs=2)
    short.fit(features, labels, scorer=lambda indices, predicted: next(stopped))
    for name, value in probe.network.state_dict().items():
        assert torch.equal(value, short.network.state_dict()[name]), name


def test_choose_epochs_floors_at_the_recipe_and_run_trains_every_seed_that_long(bert, monkeypatch):
    texts, labels = _separable(bert)
    features = probing.extract(bert, texts, max_len=24, progress=False)
    epochs, values = probing.choose_epochs(features, labels, {"epochs": 4, "lr": 1e-3}, factor=3)
    assert 4 <= epochs <= 12
    assert len(values) <= 12 - 4 + 1 and values  # judged from the floor (epoch 4) on
    assert epochs - 4 == max(range(len(values)), key=values.__getitem__)


def test_the_linear_baseline_is_scikit_learns_logistic_regression_with_c_chosen_on_held_out(bert):
    """Reference: cold-started scikit-learn pipelines (StandardScaler, LogisticRegression) on the
    mean-pooled rows, C chosen on the same held-out fifth by accuracy (ties: the smaller C), then
    refitted on all. LinearBaseline warm-starts each fit from the previous solution: the same
    strictly convex optimum, reached to lbfgs's tolerance (gradient ≤ 1e-4; the L2 term makes
    the Hessian ≥ 1/C, so the solutions differ by at most C · 1e-4 per unit of gradient scale:
    1e-3 is loose for C ≤ 0.1), so the coefficients agree to 1e-3 and the predictions exactly."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from attnlens.evaluation.probing.baseline import C_GRID, C_LIMITS, design

    texts, labels = _separable(bert)
    labels = [label if index % 7 else 1 - label for index, label in enumerate(labels)]  # not separable
    features = probing.extract(bert, texts, max_len=24, progress=False)
    baseline = probing.LinearBaseline(seed=0).fit(features, labels)
    rows, targets = design(features), np.asarray(labels)
    order = np.random.default_rng(0).permutation(len(labels))
    cut = round(0.2 * len(labels))
    held, kept = np.sort(order[:cut]), np.sort(order[cut:])
    def held_out_score(C):
        model = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=1000)).fit(rows[kept], targets[kept])
        return float((model.predict(rows[held]) == targets[held]).mean())

    scores = {C: held_out_score(C) for C in C_GRID}
    while True:  # past the grid's edge by factors of 10 while the best C (ties: the smaller) is on it
        best, tried = max(sorted(scores), key=scores.get), sorted(scores)
        beyond = best / 10 if best == tried[0] else best * 10 if best == tried[-1] else None
        if beyond is None or not C_LIMITS[0] <= beyond <= C_LIMITS[1]:
            break
        scores[beyond] = held_out_score(beyond)
    chosen = max(sorted(scores), key=scores.get)
    assert baseline.held_out == pytest.approx(scores, abs=1e-12) and baseline.C == chosen
    reference = make_pipeline(StandardScaler(), LogisticRegression(C=chosen, max_iter=1000)).fit(rows, targets)
    np.testing.assert_allclose(baseline.model[-1].coef_, reference[-1].coef_, atol=1e-3)
    assert baseline.predict(features) == reference.predict(rows).tolist()


def test_a_warm_started_linear_baseline_reaches_the_cold_fits_optimum_in_fewer_iterations(bert):
    """``fit(start=...)`` begins lbfgs at another fitted baseline's solution (papa.curve: the
    one with no head replaced). Here that one was fitted on other features of the same examples
    (max_len 16 instead of 24); the optimum is the cold fit's, to lbfgs's tolerance (coefficients
    to 1e-3, as the test above derives; predictions equal), in no more iterations."""
    import numpy as np

    texts, labels = _separable(bert)
    labels = [label if index % 7 else 1 - label for index, label in enumerate(labels)]  # not separable
    other = probing.extract(bert, texts, max_len=16, progress=False)
    features = probing.extract(bert, texts, max_len=24, progress=False)
    start = probing.LinearBaseline(grid=(0.1,)).fit(other, labels)
    cold = probing.LinearBaseline(grid=(0.1,)).fit(features, labels)
    warm = probing.LinearBaseline(grid=(0.1,)).fit(features, labels, start=start)
    np.testing.assert_allclose(warm.model[-1].coef_, cold.model[-1].coef_, atol=1e-3)
    assert warm.predict(features) == cold.predict(features)
    assert warm.model[-1].n_iter_[0] <= cold.model[-1].n_iter_[0]
    assert not np.array_equal(start.model[-1].coef_, cold.model[-1].coef_)  # a real start elsewhere


def test_a_saved_linear_baseline_loads_back_exactly_and_starts_the_same_fit(bert, tmp_path):
    """``LinearBaseline.save`` / ``load`` (papa.curve's checkpoint keeps a task's first baseline
    this way): the loaded baseline has the same chosen ``C``, held-out scores, parameters and
    arrays, bit for bit, predicts the same, and a fit warm-started from it equals, bit for bit,
    one started from the original (the same lbfgs from the same first point). An unfitted
    baseline has nothing to save."""
    import numpy as np

    texts, labels = _separable(bert)
    labels = [label if index % 7 else 1 - label for index, label in enumerate(labels)]  # not separable
    other = probing.extract(bert, texts, max_len=16, progress=False)
    features = probing.extract(bert, texts, max_len=24, progress=False)
    fitted = probing.LinearBaseline(seed=1).fit(other, labels)
    loaded = probing.LinearBaseline.load(fitted.save(tmp_path / "linear.safetensors"))
    assert (loaded.C, loaded.held_out, loaded.fallback) == (fitted.C, fitted.held_out, fitted.fallback)
    assert loaded.get_params() == {**fitted.get_params(), "grid": list(fitted.grid)}
    for name in ("mean_", "scale_", "var_"):
        assert np.array_equal(getattr(loaded.model[0], name), getattr(fitted.model[0], name))
    for name in ("coef_", "intercept_", "classes_"):
        mine, theirs = getattr(loaded.model[-1], name), getattr(fitted.model[-1], name)
        assert np.array_equal(mine, theirs) and mine.dtype == theirs.dtype
    assert loaded.predict(features) == fitted.predict(features)
    start = {"original": fitted, "loaded": loaded}
    warm = {name: probing.LinearBaseline(grid=(0.1,)).fit(features, labels, start=value) for name, value in start.items()}
    assert np.array_equal(warm["loaded"].model[-1].coef_, warm["original"].model[-1].coef_)
    with pytest.raises(NotFittedError, match="not fitted yet"):
        probing.LinearBaseline().save(tmp_path / "none.safetensors")


def test_a_curve_point_file_reads_back_what_was_written(tmp_path):
    """attnlens.evaluation.points (papa.curve's checkpoint): a point's row reads back equal,
    NaN as NaN and NumPy values as Python's (a float64 to the bit); a first point's result
    keeps its settings, every seed's predictions and its linear baseline's arrays; every point keeps
    every seed's predictions (the paired tests between rows, e.g. versus_average). A key with
    no file is ``None``; a file under another key's name is refused, naming it."""
    import math

    import numpy as np

    from attnlens.errors import FileFormatError
    from attnlens.evaluation import points

    generator = torch.Generator().manual_seed(0)
    features = probing.Features(torch.randn(18, 3, 8, generator=generator).half(), torch.full((6,), 3),
                                torch.arange(3).repeat(6), torch.zeros(0, dtype=torch.long), "sequence", 8, "k")
    linear = probing.LinearBaseline(grid=(0.1,)).fit(features, [0, 1, 0, 1, 0, 1])
    result = probing.ProbeResult(task="sst2", split="dev", metric="accuracy", score=0.5, majority=0.5,
                                 predictions=["neg", "pos"], runs=[["neg", "pos"], ["pos", "pos"]],
                                 settings={"epochs_chosen": 7, "baseline_C": 0.1}, linear=linear)
    columns = {"score": np.float64(1 / 3), "baseline": float("nan"), "significant": np.bool_(True)}
    point = {"task": "sst2", "metric": "accuracy", "seconds": {"probe": 1.25}, "rank": 1, "columns": columns,
             "runs": result.runs, "result": result}
    key = "ab" * 16
    assert points.load(tmp_path, key) is None
    points.save(tmp_path, key, point)
    found = points.load(tmp_path, key)
    assert found["resumed"] is True and (found["task"], found["rank"], found["seconds"]) == ("sst2", 1, {"probe": 1.25})
    assert found["columns"]["score"] == 1 / 3 and math.isnan(found["columns"]["baseline"])
    assert found["columns"]["significant"] is True
    assert found["runs"] == [["neg", "pos"], ["pos", "pos"]]  # every seed's, for tests between rows
    again = found["result"]
    assert again.runs == result.runs and again.predictions == ["neg", "pos"]
    assert again.settings["epochs_chosen"] == 7 and again.settings["baseline_C"] == 0.1
    assert np.array_equal(again.linear.model[-1].coef_, linear.model[-1].coef_)
    points.path_of(tmp_path, key).rename(points.path_of(tmp_path, "cd" * 16))
    with pytest.raises(FileFormatError, match=f"point-{'cd' * 16}.*does not describe a curve point"):
        points.load(tmp_path, "cd" * 16)


def test_a_curve_points_key_is_stable_and_changes_with_what_the_point_depends_on(bert):
    """points.key (the name of a point's file): the same for the same token task loaded twice
    (its Words written by their words, never by an object's address), different when a label,
    the hooks, a setting or the first point differ."""
    import dataclasses

    from attnlens.evaluation import points, tasks
    from tests.conftest import DATA

    def loaded():
        return (tasks.load("ner", "train", data_dir=DATA, limit=12, seed=0),
                tasks.load("ner", "dev", data_dir=DATA, limit=6, seed=0))

    train, evaluation = loaded()
    base = dict(hooks="none", settings={"seeds": 3}, first=None)
    key = points.key(bert, train, evaluation, **base)
    assert points.key(bert, *loaded(), **base) == key and len(key) == 32
    changed = [points.key(bert, train, evaluation, **{**base, **change}) for change in
               ({"hooks": "papa:x"}, {"settings": {"seeds": 2}}, {"first": key})]
    relabelled = train.examples.map(lambda example, index: {"tags": [(tag + 1) % 9 for tag in example["tags"]]
                                                            if index == 0 else example["tags"]}, with_indices=True)
    other = dataclasses.replace(train, examples=relabelled)  # one word's label changed
    assert other.labels() != train.labels()
    changed.append(points.key(bert, other, evaluation, **base))
    assert len({key, *changed}) == 5


def test_standardisation_and_baseline_rows_follow_their_definitions_across_chunks():
    """On more vectors than ``probe.CHUNK`` and more examples than ``baseline.EXAMPLES_AT_A_TIME``
    (synthetic float16 features): the probe's ``mean`` / ``scale`` are numpy's float64 mean and
    population standard deviation over the labelled vectors (a word labelled -1 is left out),
    and :func:`design`'s rows are numpy's per-example means. Tolerances: float32 sums of at most
    ``CHUNK`` terms, added in float64: ``γ_256 ≈ 1.5e-5`` of the sum of magnitudes (the vectors'
    mean magnitude is about 3, their mean about 1: ``rtol`` 1e-4); the design's float32 sums of
    at most 40 terms: ``γ_40 ≈ 2.4e-6`` relative, ``rtol`` 1e-5."""
    import numpy as np

    from attnlens.evaluation.probing import baseline, probe
    from attnlens.evaluation.probing.baseline import design

    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(5, 40, (50,), generator=generator)
    total = int(lengths.sum())
    assert total > 2 * probe.CHUNK and len(lengths) > 2 * baseline.EXAMPLES_AT_A_TIME
    vectors = (torch.randn(total, 3, 8, generator=generator) * 3 + 1).half()
    positions = torch.cat([torch.arange(int(n)) for n in lengths])
    values = vectors.double().numpy()
    offsets = np.concatenate([[0], np.cumsum(lengths.numpy())])

    sequence = probing.Features(vectors, lengths, positions, torch.zeros(0, dtype=torch.long), "sequence", 40)
    fitted = probing.PapaProbe(epochs=1, standardize=True).fit(sequence, [i % 2 for i in range(len(lengths))])
    np.testing.assert_allclose(fitted.network.mean.numpy(), values.mean(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fitted.network.scale.numpy(), values.std(0), rtol=1e-4)
    means = np.stack([values[offsets[i] : offsets[i + 1]].mean(0).reshape(-1) for i in range(len(lengths))])
    np.testing.assert_allclose(design(sequence), means, rtol=1e-5, atol=1e-6)

    words = probing.Features(vectors, lengths, positions, lengths.clone(), "words", 40)
    labels = [[-1 if (i + j) % 5 == 0 else (i + j) % 3 for j in range(int(n))] for i, n in enumerate(lengths)]
    fitted = probing.PapaProbe(epochs=1, standardize=True).fit(words, labels)
    labelled = np.concatenate([np.asarray(tags) >= 0 for tags in labels])
    assert 0 < labelled.sum() < total
    np.testing.assert_allclose(fitted.network.mean.numpy(), values[labelled].mean(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fitted.network.scale.numpy(), values[labelled].std(0), rtol=1e-4)
    np.testing.assert_array_equal(design(words), values.reshape(total, -1).astype(np.float32))
