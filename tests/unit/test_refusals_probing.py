"""Refusals of probing (issue 26, pattern 3): a probe records what it was fitted on and refuses
other features; a cached features file is only used under its own key."""

from __future__ import annotations

import pytest
import torch

from attnlens.errors import AttnlensError, InputError, InputTypeError, MismatchError, NotFittedError
from attnlens.evaluation import probing
from tests import tiny
from tests.refusals import assert_refused


def word_features(n: int = 6, d_model: int = 8, kind: str = "words"):
    from attnlens.evaluation.probing.features import Features

    generator = torch.Generator().manual_seed(0)
    lengths = torch.full((n,), 3, dtype=torch.long)
    vectors = torch.randn(3 * n, 3, d_model, generator=generator).half()
    positions = torch.arange(3).repeat(n)
    n_words = torch.full((n,), 3, dtype=torch.long) if kind == "words" else torch.zeros(0, dtype=torch.long)
    return Features(vectors, lengths, positions, n_words, kind, 8, "")


@pytest.fixture()
def ner_probe(tmp_path):
    from attnlens.evaluation.probing.probe import PapaProbe

    labels = [[0, 1, 2]] * 6
    path = PapaProbe(epochs=1).fit(word_features(), labels, task="ner",
                                   label_names=["O", "B-PER", "I-PER"]).save(tmp_path / "ner.safetensors")
    return PapaProbe.load(path)


def test_a_probe_for_one_task_refuses_another_tasks_features(ner_probe):
    assert ner_probe.made_for["task"] == "ner"  # recorded in the file
    assert len(ner_probe.predict(word_features(), task="ner")) == 6
    with pytest.raises(MismatchError) as info:
        ner_probe.predict(word_features(), task="pos")
    assert type(info.value) is MismatchError and "task 'ner'" in str(info.value) and "'pos'" in str(info.value)


def test_a_probe_refuses_features_of_another_kind_or_width(ner_probe):
    with pytest.raises(MismatchError, match="kind 'words'.*'sequence'"):
        ner_probe.predict(word_features(kind="sequence"))
    with pytest.raises(MismatchError, match="d_model 8.*16"):
        ner_probe.predict(word_features(d_model=16))


def test_a_probe_refuses_another_models_features_of_the_same_width(tmp_path, monkeypatch):
    """Features record the model that computed them (name and weights fingerprint; saved, read
    back, kept by subset and to), and a probe or a linear baseline fitted on them refuses
    features of another model,
    here tiny BERT with other weights: the same width, so nothing else would tell them apart (it
    scored them without a word)."""
    from attnlens.evaluation.probing import features as module
    from attnlens.evaluation.probing.features import Features
    from attnlens.evaluation.probing.probe import PapaProbe

    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path))
    options = dict(max_len=16, layout="papa", progress=False)
    one, other = tiny.bert_bridge(), tiny.bert_bridge(seed=1)
    mine = module.extract(one, tiny.CORPUS[:4], **options)
    theirs = module.extract(other, tiny.CORPUS[:4], **options)
    assert mine.model == module.model_identity(one) and mine.model != theirs.model
    assert mine.d_model == theirs.d_model
    assert Features.load(mine.save(tmp_path / "f.safetensors")).model == mine.model
    assert mine.subset([1, 0]).model == mine.to("cpu").model == mine.model
    assert module.extract(one, tiny.CORPUS[:4], **options).model == mine.model  # read from the cache
    probe = PapaProbe(epochs=1).fit(mine, [0, 1, 0, 1])
    probe = PapaProbe.load(probe.save(tmp_path / "p.safetensors"))
    assert len(probe.predict(mine)) == 4
    with pytest.raises(MismatchError, match=r"fitted on model .*; the features given have model .*weights edited since.*hooks="):
        probe.predict(theirs)
    baseline = probing.LinearBaseline(grid=(0.1,)).fit(mine, [0, 1, 0, 1])
    baseline = probing.LinearBaseline.load(baseline.save(tmp_path / "b.safetensors"))
    assert len(baseline.predict(mine)) == 4
    with pytest.raises(MismatchError, match=r"fitted on features of model .*; these are of model .*weights edited since.*hooks="):
        baseline.predict(theirs)


def test_an_mlm_head_refuses_another_models_features(tmp_path):
    """A fitted MLM head records the model of its masked-token features (in its file too) and
    refuses features of another model of the same width; features of no recorded model (made
    by hand, or older files) are not checked."""
    import dataclasses

    from attnlens.evaluation.probing.mlm import MLMHead

    masked = dataclasses.replace(word_features(kind="sequence"), kind="masked", model="tiny@00aa")
    head = MLMHead(epochs=1).fit(masked, vocab_size=3)
    head = MLMHead.load(head.save(tmp_path / "h.safetensors"))
    assert head.fitted_on_ == "tiny@00aa"
    assert head.log_likelihood(masked).shape == (masked.vectors.shape[0],)
    assert head.log_likelihood(dataclasses.replace(masked, model="")).shape == (masked.vectors.shape[0],)
    with pytest.raises(MismatchError, match="fitted on features of model 'tiny@00aa'; these are of model 'tiny@11bb'"):
        head.score(dataclasses.replace(masked, model="tiny@11bb"))


def test_an_unfitted_probe_says_so():
    from attnlens.evaluation.probing.probe import PapaProbe

    with pytest.raises(NotFittedError, match="not fitted yet"):
        PapaProbe().predict(word_features())
    assert issubclass(NotFittedError, AttnlensError) and issubclass(NotFittedError, RuntimeError)


def test_cached_features_swapped_between_keys_are_not_used_under_the_wrong_key(tmp_path, monkeypatch):
    from attnlens.evaluation.probing import features as module

    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path))
    bridge = tiny.bert_bridge()
    first, second = tiny.CORPUS[:2], tiny.CORPUS[2:5]
    options = dict(max_len=16, layout="papa", progress=False)
    a = module.extract(bridge, first, **options)
    b = module.extract(bridge, second, **options)
    path_a, path_b = module.cache_dir() / f"{a.key}.safetensors", module.cache_dir() / f"{b.key}.safetensors"
    data_a, data_b = path_a.read_bytes(), path_b.read_bytes()
    path_a.write_bytes(data_b)  # two valid files, swapped
    path_b.write_bytes(data_a)
    with pytest.warns(UserWarning, match="holds the features of cache key"):
        again = module.extract(bridge, first, **options)
    assert len(again) == len(first) and again.key == a.key
    assert torch.equal(again.vectors, a.vectors)


NAN = float("nan")


class SmallTask:
    """A task-like object of 4 examples: enough for the bootstrap's own refusals."""

    metric, kind, name = "accuracy", "sequence", "sst2"

    def __len__(self):
        return 4

    def labels(self):
        return [0, 1, 0, 1]


def sst2_like():
    return SmallTask()


def probe_run(**options):
    return probing.run(tiny.bert_bridge(), "sst2", progress=False, cache=False, **options)


def fitted_probe():
    from attnlens.evaluation.probing.probe import PapaProbe

    return PapaProbe(epochs=1).fit(word_features(kind="sequence"), [0, 1] * 3)


ROWS = [
    # (call(value), argument, bad value, error class, fragment of the message)
    (lambda v: probing.bootstrap(sst2_like(), [0, 1, 1, 0], resamples=v), "resamples", 2.5, InputTypeError, "resamples must be a whole number"),
    (lambda v: probing.bootstrap(sst2_like(), [0, 1, 1, 0], resamples=v), "resamples", 0, InputError, "resamples must be at least 1"),
    (lambda v: probing.bootstrap(sst2_like(), [0, 1, 1, 0], resamples=v), "resamples", True, InputTypeError, "resamples must be a whole number"),
    (lambda v: probing.bootstrap(sst2_like(), [0, 1, 1, 0], level=v), "level", NAN, InputError, "level must be a finite number"),
    (lambda v: probing.bootstrap(sst2_like(), [0, 1, 1, 0], level=v), "level", 1.5, InputError, "level must lie in"),
    (lambda v: probing.bootstrap(sst2_like(), [0, 1, 1, 0], level=v), "level", 1, InputError, "level must lie strictly between 0 and 1"),
    (lambda v: probing.bootstrap(sst2_like(), [0, 1, 1, 0], level=v), "level", "0.9", InputTypeError, "level must be a number"),
    (lambda v: probing.bootstrap(sst2_like(), [0, 1, 1, 0], seed=v), "seed", 1.5, InputTypeError, "seed must be a whole number"),
    (lambda v: probing.paired(sst2_like(), [0, 1, 1, 0], [0, 0, 1, 1], resamples=v), "resamples", -1, InputError, "resamples must be at least 1"),
    (lambda v: probing.paired(sst2_like(), [0, 1, 1, 0], [0, 0, 1, 1], level=v), "level", 0, InputError, "level must lie strictly"),
    (lambda v: probing.paired(sst2_like(), [0, 1, 1, 0], [0, 0, 1, 1], seed=v), "seed", "4", InputTypeError, "seed must be a whole number"),
    (lambda v: probing.bootstrap(sst2_like(), [0, 1, 1, 0], resample_runs=v), "resample_runs", 1, InputTypeError, "resample_runs must be True or False"),
    (lambda v: probing.paired(sst2_like(), [0, 1, 1, 0], [0, 0, 1, 1], resample_runs=v), "resample_runs", None, InputTypeError, "resample_runs must be True or False"),
    (lambda v: probe_run(train_limit=v), "train_limit", 2.5, InputTypeError, "train_limit must be a whole number"),
    (lambda v: probe_run(train_limit=v), "train_limit", 0, InputError, "train_limit must be at least 1"),
    (lambda v: probe_run(eval_limit=v), "eval_limit", True, InputTypeError, "eval_limit must be a whole number"),
    (lambda v: probe_run(seed=v), "seed", 1.5, InputTypeError, "seed must be a whole number"),
    (lambda v: probe_run(seeds=v), "seeds", 2.5, InputTypeError, "seeds must be a whole number"),
    (lambda v: probe_run(seeds=v), "seeds", [], InputError, "seeds is empty"),
    (lambda v: probe_run(batch_size=v), "batch_size", 0, InputError, "batch_size must be at least 1"),
    (lambda v: probe_run(resamples=v), "resamples", NAN, InputTypeError, "resamples must be a whole number"),
    (lambda v: probe_run(max_len=v), "max_len", "64", InputTypeError, "max_len must be a whole number"),
    (lambda v: probe_run(baseline_C=v), "baseline_C", 0.0, InputError, "baseline_C must be above 0"),
    (lambda v: probe_run(baseline_C=v), "baseline_C", NAN, InputError, "baseline_C must be"),
    (lambda v: word_features().subset(v), "indices", [6], InputError, "indices[0] must be in 0..5"),
    (lambda v: word_features().subset(v), "indices", [-1], InputError, "indices[0] must be in 0..5"),
    (lambda v: word_features().subset(v), "indices", [0.5], InputTypeError, "indices[0] must be a whole number"),
    (lambda v: word_features().subset(v), "indices", [True], InputTypeError, "indices[0] must be a whole number"),
    (lambda v: word_features().subset(v), "indices", [], InputError, "indices is empty"),
    (lambda v: word_features().subset(v), "indices", torch.tensor([0.0]), InputTypeError, "indices must be whole numbers"),
    (lambda v: fitted_probe().predict(word_features(kind="sequence"), batch_size=v), "batch_size", 0, InputError, "batch_size must be at least 1"),
    (lambda v: fitted_probe().predict(word_features(kind="sequence"), batch_size=v), "batch_size", 2.5, InputTypeError, "batch_size must be a whole number"),
    (lambda v: probing.PapaProbe(dropout=v), "dropout", "0.1", InputTypeError, "dropout must be a number"),
    (lambda v: probing.PapaProbe(epochs=v), "epochs", 2.5, InputTypeError, "epochs must be a whole number"),
    (lambda v: probing.PapaProbe(early_stopping=v), "early_stopping", "yes", InputTypeError, "early_stopping must be True or False"),
    (lambda v: probing.PapaProbe(validation_fraction=v), "validation_fraction", 0.9, InputError, "validation_fraction must lie in"),
    (lambda v: probing.PapaProbe(n_iter_no_change=v), "n_iter_no_change", 0, InputError, "n_iter_no_change must be at least 1"),
    (lambda v: probing.PapaProbe(min_epochs=v), "min_epochs", 1.5, InputTypeError, "min_epochs must be a whole number"),
    (lambda v: probing.LinearBaseline(grid=v), "grid", [0.1, NAN], InputError, "grid[1] must be a finite number"),
    (lambda v: probing.LinearBaseline(grid=v), "grid", "0.1", InputTypeError, "grid must be a list"),
    (lambda v: probing.LinearBaseline(grid=v), "grid", [], InputError, "grid is empty"),
    (lambda v: probing.LinearBaseline(holdout=v), "holdout", True, InputTypeError, "holdout must be a number"),
]


@pytest.mark.parametrize(("call", "argument", "value", "error", "words"), ROWS,
                         ids=[f"{argument}={value!r}"[:40] for _, argument, value, _, _ in ROWS])
def test_a_bad_argument_is_refused_by_name(call, argument, value, error, words):
    assert_refused(lambda: call(value), error, words)
