"""Stacked probes (attnlens.evaluation.probing.stacked.fit_many): each member of a stacked fit
equals its own separate :meth:`PapaProbe.fit` with the same seed.

Reference: ``PapaProbe(**member.get_params()).fit(...)`` on the member's own features, i.e. the
single-probe path, untouched by the stacking.

Tolerance, 1e-5 on parameters and logits (CPU, float32). The two fits run the same operations on
the same numbers (the same initial weights, example order and dropout bits: see the module
docstring); what may differ is only the order of float32 sums: ``torch.baddbmm`` over the member
axis against ``nn.Linear``'s ``addmm``, and the per-member reductions of the loss. A reordered sum
of ``k`` terms differs by at most ``k · 2⁻²⁴`` of the sum of their magnitudes, here ``k ≤ 3·8·12``
products of O(1) numbers: a relative difference of the gradients below ~1e-5, typically
``√k · 2⁻²⁴ ≈ 1e-6``. Adam divides each gradient by its running root mean square, so a relative
difference δ of a gradient moves that step's update by at most about ``lr · δ`` (``lr`` = 1e-2:
≤ 1e-7 per step), and a fit here makes at most ~100 steps: ≤ 1e-5 in the worst case, ~1e-6
expected (3e-7 measured). Logits are sums of those parameters times O(1) inputs over a 16-wide
hidden layer, so the same bound applies to them up to that small factor, which is why the
predicted labels are compared exactly and the logits to 1e-5.
"""

from __future__ import annotations

import pytest
import torch

from attnlens.errors import InputError, MismatchError
from attnlens.evaluation.probing.features import Features
from attnlens.evaluation.probing.probe import PapaProbe
from attnlens.evaluation.probing.stacked import fit_many

TOLERANCE = 1e-5
SEEDS = (0, 1, 2)
SETTINGS = dict(hidden=16, batch_size=8, lr=1e-2, early_stopping=True, n_iter_no_change=2, epochs=12)


def _sequence(generator: torch.Generator, like: Features | None = None, n: int = 80) -> tuple[Features, list]:
    """Sequence features (3 layers × 8, ``max_len`` 12) whose labels depend on the mean vector
    (learnable, with noise, so that the held-out loss improves for a few epochs, then stops);
    ``like``: the same examples (lengths, positions), other vectors: another point of a task."""
    lengths = torch.randint(2, 13, (n,), generator=generator) if like is None else like.lengths
    positions = torch.cat([torch.arange(int(k)) for k in lengths]) if like is None else like.positions
    vectors = torch.randn(int(lengths.sum()), 3, 8, generator=generator)
    starts = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    signal = torch.stack([vectors[s : s + k, -1, :3].mean(0) for s, k in zip(starts, lengths, strict=True)])
    labels = (signal + 0.5 * torch.randn(n, 3, generator=generator)).argmax(1).tolist()
    return Features(vectors.half(), lengths, positions, torch.zeros(0, dtype=torch.long), "sequence", 12), labels


def _words(generator: torch.Generator, like: Features | None = None, n: int = 60) -> Features:
    """Word features: up to 8 words per example, some cut (no vector) by ``max_len``."""
    if like is None:
        n_words = torch.randint(1, 9, (n,), generator=generator)
        kept = torch.minimum(n_words, torch.randint(1, 9, (n,), generator=generator))
        positions = torch.cat([torch.arange(int(k)) for k in kept])
    else:
        n_words, kept, positions = like.n_words, like.lengths, like.positions
    vectors = torch.randn(int(kept.sum()), 3, 8, generator=generator).half()
    return Features(vectors, kept, positions, n_words, "words", 12)


def _logits(probe: PapaProbe, features: Features) -> torch.Tensor:
    probe.network.eval()
    with torch.no_grad():
        return probe._logits(features, torch.arange(len(features)))[0]


def _check_members(probes: list, feature_sets: list, labels: list, scorer=None) -> list[int]:
    """Each fitted member against its own separate fit; returns the members' chosen epochs."""
    for probe, features in zip(probes, feature_sets, strict=True):
        alone = PapaProbe(**probe.get_params()).fit(features, labels, scorer=scorer)
        assert probe.epochs_ == alone.epochs_
        assert probe.validation_scores_ == pytest.approx(alone.validation_scores_, abs=TOLERANCE)
        mine, theirs = probe.network.state_dict(), alone.network.state_dict()
        assert mine.keys() == theirs.keys()
        for name, value in theirs.items():
            torch.testing.assert_close(mine[name], value, rtol=0, atol=TOLERANCE, msg=name)
        torch.testing.assert_close(_logits(probe, features), _logits(alone, features), rtol=0, atol=TOLERANCE)
        assert probe.predict(features) == alone.predict(features)
        assert probe.score(features, labels) == alone.score(features, labels)
    return [probe.epochs_ for probe in probes]


@pytest.mark.parametrize("options", [{"pooling": "mean", "standardize": True}, {}], ids=["mean", "paper"])
def test_three_seeds_on_two_feature_sets_each_equal_their_own_fit(options):
    """3 seeds × 2 feature sets of one shape (two points of a task), early stopping on the
    held-out loss: six members, which stop at different epochs (finished members leave)."""
    generator = torch.Generator().manual_seed(0)
    first, labels = _sequence(generator)
    second, _ = _sequence(generator, like=first)
    sets = [first, second] * len(SEEDS)
    probes = [PapaProbe(**SETTINGS, **options, seed=seed) for seed in SEEDS for _ in range(2)]
    assert fit_many(probes, sets, labels) == probes
    epochs = _check_members(probes, sets, labels)
    assert len(set(epochs)) > 1  # per-member stopping was exercised


def test_word_probes_with_a_scorer_and_their_own_epochs_equal_their_own_fit():
    """Word features (rows padded per member), early stopping judged by a scorer of the
    predicted lists, and members of different ``epochs`` (3, 5, 7 on the two feature sets)."""
    generator = torch.Generator().manual_seed(1)
    first = _words(generator)
    second = _words(generator, like=first)
    tags = [torch.randint(0, 4, (int(k),), generator=generator).tolist() for k in first.n_words]

    def scorer(indices, predicted):
        pairs = [(p, t) for i, ps in zip(indices, predicted, strict=True) for p, t in zip(ps, tags[i], strict=True)]
        return sum(p == t for p, t in pairs) / len(pairs)

    sets = [first, second] * len(SEEDS)
    probes = [PapaProbe(**{**SETTINGS, "epochs": 3 + 2 * seed}, seed=seed) for seed in SEEDS for _ in range(2)]
    fit_many(probes, sets, tags, scorer=scorer)
    _check_members(probes, sets, tags, scorer=scorer)


def test_seeds_on_one_feature_set_without_early_stopping_and_a_member_saves_and_loads(tmp_path):
    generator = torch.Generator().manual_seed(2)
    features, labels = _sequence(generator)
    probes = fit_many([PapaProbe(**{**SETTINGS, "early_stopping": False, "epochs": 3}, seed=seed) for seed in SEEDS],
                      features, labels, task="sst2", label_names=["a", "b", "c"])
    assert _check_members(probes, [features] * len(SEEDS), labels) == [3, 3, 3]
    loaded = PapaProbe.load(probes[1].save(tmp_path / "member.safetensors"))
    assert loaded.predict(features) == probes[1].predict(features)
    assert loaded.made_for["task"] == "sst2"


def test_stacked_probes_refuse_settings_or_features_they_cannot_share():
    generator = torch.Generator().manual_seed(3)
    features, labels = _sequence(generator)
    other, _ = _sequence(generator, n=40)
    with pytest.raises(InputError, match="lr"):
        fit_many([PapaProbe(lr=1e-3), PapaProbe(lr=1e-2, seed=1)], features, labels)
    with pytest.raises(MismatchError, match="one shape"):
        fit_many([PapaProbe(), PapaProbe(seed=1)], [features, other], labels)
    with pytest.raises(InputError, match="2 feature sets for 3 probes"):
        fit_many([PapaProbe(), PapaProbe(seed=1), PapaProbe(seed=2)], [features, features], labels)
    with pytest.raises(InputError, match="no probe"):
        fit_many([], features, labels)
