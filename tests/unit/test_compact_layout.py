"""The compact PAPA layout equals the padded one (issue 25): same logits, probe features, fitted
constants and hooked logits, at the length of the longest real text instead of ``max_len``.

The reference is the padded layout itself (every text padded to ``max_len``, its final [SEP] at
``max_len - 1``), computed by the same model in the same run: the compact form must give the
same numbers up to float32 rounding.

Tolerances. Compact and padded runs compute the same sums in another order (a masked key adds an
exact 0, but a matrix product over 17 instead of 64 keys is blocked differently, and a batch of
another width takes other BLAS kernels). A float32 sum of ``n`` terms in two orders differs by at
most about ``n·u·Σ|terms|`` with ``u = 2⁻²⁴ ≈ 6·10⁻⁸``, typically ``√n·u·Σ|terms|``. The longest
sums here are MiniLM's MLP (1536 terms) and d_model (384): ``√1536·u ≈ 2.4·10⁻⁶`` relative per
sum, a few such sums in each of 6 layers, amplified by LayerNorm's division by a standard
deviation below 1: ``RTOL = 1e-4`` relative with ``ATOL = 1e-5`` times the tensor's largest value
covers that with room (the measured differences are ~1e-6). Features are stored in float16
(11 significant bits): two float32 values that differ by ~1e-6 can round to neighbouring float16
values, one float16 step apart, so features get ``rtol = 2⁻¹⁰ ≈ 1e-3``. Fitted constants are
float64 means of per-batch float32 sums of at most ``batch_size`` attention values in ``[0, 1]``:
``32·u ≈ 2·10⁻⁶`` per batch sum, so ``1e-5`` absolute on the mean.
"""

from __future__ import annotations

import pytest
import torch

import attnlens
from attnlens import papa
from attnlens.core.inputs import compact_batch
from attnlens.engine import passes
from attnlens.engine.accumulator import Accumulator
from attnlens.engine.forward import run_with_hooks
from attnlens.evaluation import probing, tasks
from tests import tiny
from tests.conftest import DATA

RTOL, ATOL = 1e-4, 1e-5
FEATURES_RTOL = 2.0**-10
CONSTANTS_ATOL = 1e-5


def close(actual, expected, *, rtol=RTOL, atol=ATOL):
    scale = float(expected.abs().max()) or 1.0
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol * scale)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def bert():
    return tiny.bert_bridge()


@pytest.fixture(scope="module")
def roberta():
    return attnlens.load(tiny.tiny_roberta(), tokenizer=tiny.roberta_tokenizer())


@pytest.fixture(scope="module")
def gpt2():
    """A tiny GPT-2 whose tokenizer names start, separator and pad tokens, so that the PAPA
    layout applies to a decoder (its positions come from the mask)."""
    from transformers import GPT2TokenizerFast

    tokenizer = tiny._saved(GPT2TokenizerFast(
        tokenizer_object=tiny.bpe_tokenizer_files(), bos_token="<s>", eos_token="</s>",
        cls_token="<s>", sep_token="</s>", pad_token="<pad>",
    ), "gpt2-papa")
    return attnlens.load(tiny.tiny_gpt2(), tokenizer=tokenizer)


SENTENCES = tiny.CORPUS[:4] + ["short .", "a b"]
PAIRS = [(a, b) for a, b in zip(tiny.CORPUS[:4], ["yes .", "it was not .", "a dog", "the film ."], strict=True)]


def logits(model, batch, hooks=()):
    output = run_with_hooks(model, batch, hooks)
    return getattr(output, "logits", output).detach()


def assert_same_logits(model, examples, max_len, hooks=()):
    """Compact logits equal the padded layout's at every real token, in order."""
    padded = attnlens.tokenize(model, examples, max_len=max_len, layout="papa")
    compact = attnlens.tokenize(model, examples, max_len=max_len, layout="papa", compact=True)
    assert compact.compact and not padded.compact
    assert torch.equal(compact.positions[compact.attention_mask.bool()],
                       padded.positions[padded.attention_mask.bool()])
    close(logits(model, compact, hooks)[compact.attention_mask.bool()],
          logits(model, padded, hooks)[padded.attention_mask.bool()])


def assert_same_fit_and_hooks(model, examples, max_len):
    reference = papa.fit(model, examples, max_len=max_len, layout="papa", batch_size=4, progress=False,
                         compact=False)
    fitted = papa.fit(model, examples, max_len=max_len, layout="papa", batch_size=4, progress=False)
    assert torch.equal(fitted.pair_counts, reference.pair_counts)
    assert (fitted.n_examples, fitted.n_tokens) == (reference.n_examples, reference.n_tokens)
    torch.testing.assert_close(fitted.mean, reference.mean, rtol=0, atol=CONSTANTS_ATOL)
    torch.testing.assert_close(fitted.input_dependence, reference.input_dependence, rtol=1e-4, atol=1e-7)
    for heads in ("all", 0.5):
        assert_same_logits(model, examples, max_len, papa.hooks(reference, heads=heads))


def assert_same_features(model, examples, max_len):
    reference = probing.extract(model, examples, max_len=max_len, layout="papa", cache=False,
                                compact=False, progress=False, batch_size=4)
    features = probing.extract(model, examples, max_len=max_len, layout="papa", cache=False,
                               progress=False, batch_size=4)
    assert torch.equal(features.lengths, reference.lengths)
    assert torch.equal(features.positions, reference.positions)
    close(features.vectors.float(), reference.vectors.float(), rtol=FEATURES_RTOL, atol=FEATURES_RTOL)


@pytest.mark.parametrize("examples", [SENTENCES, PAIRS], ids=["sentences", "pairs"])
@pytest.mark.parametrize("name", ["bert", "roberta", "gpt2"])
def test_tiny_models_give_the_padded_layouts_numbers(request, name, examples):
    """Tiny BERT (explicit position ids), RoBERTa and GPT-2 (positions counted by the model):
    logits, fitted constants, hooked logits and probe features."""
    model = request.getfixturevalue(name)
    assert_same_logits(model, examples, 32)
    assert_same_fit_and_hooks(model, examples, 32)
    assert_same_features(model, examples, 32)


@pytest.mark.slow
def test_minilm_sst2_sentences_and_mrpc_pairs(minilm, sst2_sentences, mrpc_pairs):
    """The default model on real data: SST-2 sentences at max_len 64, MRPC pairs at 128 (the
    middle separator at 64)."""
    for examples, max_len in ((sst2_sentences[:16], 64), (mrpc_pairs[:8], 128)):
        assert_same_logits(minilm, examples, max_len)
        assert_same_fit_and_hooks(minilm, examples, max_len)
        assert_same_features(minilm, examples, max_len)


def test_a_compact_batch_is_as_wide_as_its_longest_text(bert):
    """Width = the longest real example, not max_len; the layout's positions are kept (the final
    separator at max_len - 1, a pair's middle one at max_len // 2); the engine runs it."""
    batch = attnlens.tokenize(bert, SENTENCES, max_len=64, compact=True)
    real = batch.attention_mask.sum(1)
    assert batch.input_ids.shape[1] == int(real.max()) < 64
    last = batch.positions.gather(1, (real - 1)[:, None]).squeeze(1)
    assert (last == 63).all()
    pairs = attnlens.tokenize(bert, PAIRS, max_len=64, compact=True)
    sep = bert.tokenizer.sep_token_id
    assert ((pairs.positions == 32) == ((pairs.input_ids == sep) & (pairs.positions < 63))).all()
    assert pairs.input_ids.shape[1] == int(pairs.attention_mask.sum(1).max())
    widths = []

    class Widths(Accumulator):
        name, compact = "widths", True

        def update(self, layer):
            widths.append(layer.pattern.shape[-1])

    passes.run(bert, SENTENCES, [Widths()], max_len=64, layout="papa", progress=False)
    assert widths and max(widths) == int(real.max())
    widths.clear()
    passes.run(bert, SENTENCES, [Widths()], max_len=64, layout="papa", progress=False, compact=False)
    assert set(widths) == {64}


def test_positions_matter_so_the_test_can_fail(bert):
    """Without its position ids a compact BERT batch puts [SEP] at n-1: other logits. And an
    accumulator that reads columns keeps the padded layout."""
    compact = attnlens.tokenize(bert, SENTENCES, max_len=32, compact=True)
    shuffled = compact_batch(compact)
    assert shuffled is compact
    kwargs = compact.model_kwargs()
    assert torch.equal(kwargs["position_ids"], compact.position_ids)
    kwargs["position_ids"] = None
    wrong = bert(compact.input_ids, **kwargs).detach()
    right = logits(bert, compact)
    mask = compact.attention_mask.bool()
    assert (wrong[mask] - right[mask]).abs().max() > 1e-3


def test_compact_batches_are_refused_where_they_cannot_be_read(bert):
    constants = papa.fit(bert, SENTENCES, max_len=32, progress=False)
    compact = attnlens.tokenize(bert, SENTENCES, max_len=32, compact=True)
    hooks = papa.hooks(constants)
    with pytest.raises(ValueError, match="run_with_hooks"):  # the hooks cannot know its positions
        bert.run_with_hooks(compact.input_ids, **compact.model_kwargs(), fwd_hooks=list(hooks))
    with pytest.raises(ValueError, match="layout='papa'"):
        compact_batch(attnlens.tokenize(bert, SENTENCES, max_len=32, layout="padded"))
    # a compact batch of a shorter max_len fits in the constants' positions, but its final [SEP]
    # sits at another one (it ran, reading a middle position's constant there): refused, through
    # a call (run_with_hooks, a pass) and inside the hooks, which see its positions
    shorter = attnlens.tokenize(bert, SENTENCES, max_len=12, compact=True)
    with pytest.raises(ValueError, match="tokenized with max_len=12, whose final separator"):
        run_with_hooks(bert, shorter, hooks)
    with pytest.raises(ValueError, match="max_len=32; the inputs have positions up to 11"):
        width = shorter.input_ids.shape[1]
        papa.check_inputs(constants, torch.ones(len(SENTENCES), 4, width, width), shorter.attention_mask.bool(),
                          shorter.position_ids)
    with pytest.raises(ValueError, match="tokenized with max_len=12"):
        probing.extract(bert, SENTENCES, hooks=hooks, max_len=12, cache=False, progress=False)


def test_the_curve_extracts_every_feature_once(bert, monkeypatch):
    """Fraction 0 and a fraction that replaces no head share one probing run (a repeated
    fraction is refused: test_curve); each distinct intervention extracts its train and dev
    features once; probe time is reported."""
    constants = papa.fit(bert, tiny.CORPUS, max_len=32, progress=False)
    extractions = []
    original = passes.run

    def counting(model, corpus, accumulators, **kwargs):
        if any(isinstance(a, probing.features.HiddenStates) for a in accumulators):
            extractions.append(kwargs.get("description"))
        return original(model, corpus, accumulators, **kwargs)

    monkeypatch.setattr(passes, "run", counting)
    train = tasks.load("sst2", "train", data_dir=DATA, limit=48, seed=0)
    curve = papa.curve(bert, constants, [train], fractions=(0, 0.01, 0.5, 1), baselines=("uniform",),
                       data_dir=DATA, eval_limit=24, seeds=1, baseline=False, probe=dict(epochs=1),
                       progress=False)
    assert len(curve.table) == 5
    distinct = 4  # none (0 and 0.01 of 8 heads), 0.5, 1.0, uniform
    assert len(extractions) == 2 * distinct, extractions
    assert len(curve.timings) == distinct
    scores = curve.table["score"].tolist()
    assert scores[0] == scores[1]
    assert 0 < curve.probe_seconds < curve.seconds and 0 < curve.probe_share < 1


def test_ablation_head_means_run_compact_and_equal_the_padded_ones(bert):
    """Mean ablation's values (a sum over real tokens) are the same from compact batches."""
    from attnlens import ablation

    means = {}
    for compact in (False, True):
        accumulator = ablation.HeadMeans(bert)
        passes.run(bert, SENTENCES, [accumulator], max_len=32, layout="papa", batch_size=4,
                   progress=False, compact=compact)
        means[compact] = accumulator.result()
    close(means[True], means[False])
    assert torch.equal(ablation.head_means(bert, SENTENCES, max_len=32, layout="papa", batch_size=4,
                                           progress=False),
                       means[True])


def test_word_features_come_back_in_the_examples_order(bert):
    """Token-task examples (Words) run shortest first in compact batches; their first-sub-token
    vectors, word indices and word counts come back in the examples' order."""
    words = [attnlens.Words(tuple(text.split())) for text in SENTENCES]
    assert probing.features.by_length(bert.tokenizer, words) != list(range(len(words)))  # the order is changed
    assert_same_features(bert, words, 32)
    features = probing.extract(bert, words, max_len=32, layout="papa", cache=False, progress=False)
    assert features.n_words.tolist() == [len(example) for example in words]


@pytest.mark.parametrize("examples", [SENTENCES, PAIRS], ids=["sentences", "pairs"])
@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_compares_accumulators_run_compact_and_equal_the_padded_ones(request, name, examples):
    """What `attnlens.compare` computes in its pass, standard, PAPA and effective: the head
    statistics (their to_prev / to_next read neighbours by position: the last word and the final
    [SEP] are neighbouring columns of a compact batch, not neighbouring positions), the pattern
    types (the diagonal band by position) and the distances from standard; and the distances
    between heads of Clark et al.'s clustering (HeadDistances). Tolerances as for
    logits (module docstring); the type counts must be equal (a share that sits on a threshold
    within 1e-6 would flip one: none does here)."""
    from attnlens.comparison.accumulator import ViewsAccumulator
    from attnlens.core.loading import is_causal
    from attnlens.methods.clustering import HeadDistances
    from attnlens.methods.patterns import templates
    from attnlens.methods.patterns.counts import PatternTypes
    from attnlens.methods.stats import Distance, Statistics

    model = request.getfixturevalue(name)
    constants = papa.fit(model, examples, max_len=32, layout="papa", batch_size=4, progress=False)
    causal = is_causal(model)
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    widths = []

    class Widths(Accumulator):
        name, compact = "widths", True

        def update(self, layer):
            widths.append(layer.pattern.shape[-1])

    class Shares(Accumulator):
        """The pattern-type classifier's chance-corrected shares of every (example, head),
        summed per layer and region (the type counts alone hide small differences)."""

        name, compact = "shares", True

        def __init__(self):
            self.sums = {}

        def update(self, layer):
            found = templates.features(layer.pattern, templates.Positions.from_batch(layer.batch))
            for region, values in found.items():
                key = (layer.layer, region)
                self.sums[key] = self.sums.get(key, 0.0) + values.double().sum(0)

        def result(self):
            return {f"{layer}.{region}": value for (layer, region), value in self.sums.items()}

    def parts():
        views = ("standard", "papa", "effective")
        return [Widths(), Shares(),
                *(Statistics(n_layers, n_heads, view, constants=constants, causal=causal) for view in views),
                *(PatternTypes(n_layers, n_heads, view=view, constants=constants, causal=causal) for view in views),
                *(Distance(n_layers, n_heads, view, constants=constants, causal=causal) for view in views[1:]),
                *(HeadDistances(n_layers, n_heads, view) for view in ("standard", "effective"))]

    results = {}
    for compact in (False, True):
        accumulators = parts()
        passes.run(model, examples, accumulators, max_len=32, layout="papa", batch_size=4, progress=False,
                   compact=compact)
        results[compact] = [accumulator.counts if isinstance(accumulator, PatternTypes) else accumulator.result()
                            for accumulator in accumulators[1:]]
    assert min(widths) < 32 and 32 in widths  # the first run was padded, the second compact
    assert ViewsAccumulator.compact  # compare's own pass runs compact
    for padded, compact in zip(results[False], results[True], strict=True):
        if isinstance(padded, dict):  # statistics, shares: {name: [layer, head] or [head]}
            assert padded.keys() == compact.keys()
            for key in padded:
                if "." in key:  # shares: chance-corrected, near 0, each of order 1 per example
                    torch.testing.assert_close(compact[key], padded[key], rtol=RTOL, atol=ATOL * len(examples))
                else:
                    close(compact[key], padded[key])
        elif padded.dtype in (torch.float32, torch.float64):  # a distance
            close(compact.double(), padded.double())
        else:  # type counts
            assert torch.equal(compact, padded)
