"""Refusals of probing (issue 26, pattern 3): a probe records what it was fitted on and refuses
other features; a cached features file is only used under its own key."""

from __future__ import annotations

import pytest
import torch

from attnlens.errors import AttnlensError, MismatchError, NotFittedError
from tests import tiny


def word_features(n: int = 6, d_model: int = 8, kind: str = "words"):
    from attnlens.probing.features import Features

    generator = torch.Generator().manual_seed(0)
    lengths = torch.full((n,), 3, dtype=torch.long)
    vectors = torch.randn(3 * n, 3, d_model, generator=generator).half()
    positions = torch.arange(3).repeat(n)
    n_words = torch.full((n,), 3, dtype=torch.long) if kind == "words" else torch.zeros(0, dtype=torch.long)
    return Features(vectors, lengths, positions, n_words, kind, 8, "")


@pytest.fixture()
def ner_probe(tmp_path):
    from attnlens.probing.probe import PapaProbe

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


def test_an_unfitted_probe_says_so():
    from attnlens.probing.probe import PapaProbe

    with pytest.raises(NotFittedError, match="not fitted yet"):
        PapaProbe().predict(word_features())
    assert issubclass(NotFittedError, AttnlensError) and issubclass(NotFittedError, RuntimeError)


def test_cached_features_swapped_between_keys_are_not_used_under_the_wrong_key(tmp_path, monkeypatch):
    from attnlens.probing import features as module

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
