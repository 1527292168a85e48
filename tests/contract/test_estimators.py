"""The estimator contract (scikit-learn's), run over every learner attnlens has.

Every class of attnlens with a ``fit`` method is found by a walk over the package's modules and
must derive from :class:`attnlens.estimator.Estimator` and have a case in :data:`CASES` (a new
learner without one fails :func:`test_every_learner_is_an_estimator_with_a_case`). For each:

1. ``get_params()`` returns the constructor's arguments, the very objects given (``is``);
2. ``sklearn.base.clone`` builds an equal unfitted copy (it checks 1 itself);
3. ``set_params`` changes an argument and what the learner derives from it, refuses a bad value
   as the constructor does (leaving the learner unchanged) and an unknown name by name.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import sklearn.base

import attnlens
from attnlens.core.estimator import Estimator
from attnlens.errors import InputError


def _learners() -> set[type]:
    found = set()
    for info in pkgutil.walk_packages(attnlens.__path__, "attnlens."):
        if info.name.endswith("__main__") or info.name == "attnlens.engine.passes":
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (inspect.isclass(value) and value.__module__.startswith("attnlens")
                    and callable(getattr(value, "fit", None))):
                found.add(value)
    return found


def _cases():
    from attnlens.evaluation.probing import LinearBaseline, PapaProbe
    from attnlens.evaluation.probing.mlm import MLMHead
    from attnlens.methods.patterns import PatternCNN

    # (class, non-default arguments, a change and how to see it, a bad value)
    return {
        PapaProbe: (dict(epochs=7, lr=3e-4, pooling="sum", early_stopping=True),
                    ("lr", 5e-4, lambda e: e.settings.lr), ("dropout", 1.0)),
        LinearBaseline: (dict(grid=[0.5, 1.0], holdout=0.3, seed=2),
                         ("holdout", 0.1, lambda e: e.holdout), ("grid", [])),
        MLMHead: (dict(epochs=3, lr=5e-4), ("batch_size", 64, lambda e: e.batch_size), ("lr", 0.0)),
        PatternCNN: (dict(size=16, epochs=2, class_weight="balanced"),
                     ("epochs", 4, lambda e: e.settings.epochs), ("size", 4)),
    }


CASES = _cases()


def test_every_learner_is_an_estimator_with_a_case():
    learners = _learners()
    assert learners == set(CASES), f"learners without a case: {learners - set(CASES)}"
    assert all(issubclass(learner, Estimator) for learner in learners)


@pytest.mark.parametrize("learner", sorted(CASES, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_get_params_clone_and_set_params(learner):
    arguments, (name, value, derived), (bad, bad_value) = CASES[learner]
    estimator = learner(**arguments)
    params = estimator.get_params()
    assert list(params) == [p for p in inspect.signature(learner.__init__).parameters if p != "self"]
    for key, given in arguments.items():
        assert params[key] is given, key
    copy = sklearn.base.clone(estimator)
    assert type(copy) is learner and copy is not estimator
    assert copy.get_params() == params
    assert estimator.set_params(**{name: value}) is estimator
    assert getattr(estimator, name) == value and derived(estimator) == value
    before = estimator.get_params()
    with pytest.raises(InputError):
        estimator.set_params(**{bad: bad_value})
    assert estimator.get_params() == before
    with pytest.raises(InputError, match="has no parameter 'nonsense'"):
        estimator.set_params(nonsense=1)


@pytest.mark.parametrize("learner", sorted(CASES, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_the_repr_is_the_constructors_call_with_the_changed_arguments(learner):
    """As scikit-learn prints an estimator (``print_changed_only``): the class and the arguments
    that differ from their defaults, in the signature's order; evaluated, it builds the same
    parameters."""
    arguments = CASES[learner][0]
    assert repr(learner()) == f"{learner.__name__}()"
    estimator = learner(**arguments)
    defaults = {name: p.default for name, p in inspect.signature(learner.__init__).parameters.items()}
    changed = [name for name in defaults if name in arguments and arguments[name] != defaults[name]]
    assert changed and len(changed) < len(defaults) - 1  # the case shows both kinds
    assert repr(estimator) == f"{learner.__name__}({', '.join(f'{n}={arguments[n]!r}' for n in changed)})"
    assert eval(repr(estimator), {learner.__name__: learner}).get_params() == estimator.get_params()  # noqa: S307


def _sequence_features(n=60, d=8, n_classes=5, seed=1):
    """Random sequence features whose labels follow their vectors (learnable)."""
    import torch

    from attnlens.evaluation.probing.features import Features

    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 9, (n,), generator=generator)
    positions = torch.cat([torch.arange(int(k)) for k in lengths])
    vectors = torch.randn(int(lengths.sum()), 2, d, generator=generator)
    starts = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    signal = torch.stack([vectors[s : s + k, -1, :n_classes].mean(0) for s, k in zip(starts, lengths, strict=True)])
    labels = signal.argmax(1).tolist()
    return Features(vectors.half(), lengths, positions, torch.zeros(0, dtype=torch.long), "sequence", 8), labels


def test_a_refit_is_a_fresh_fit():
    """scikit-learn's rule: fitting again forgets the earlier fit. A PapaProbe kept the number of
    labels of an earlier fit (a refit on 2 labels still had 5 outputs and predicted labels 2 and
    4), and a LinearBaseline the held-out scores of the earlier C search (a KeyError, or C values
    this fit never tried). Reference: a clone fitted once."""
    from attnlens.evaluation.probing import LinearBaseline, PapaProbe

    features, five = _sequence_features()
    two = [label % 2 for label in five]
    for learner in (PapaProbe(hidden=8, epochs=2), LinearBaseline(grid=(0.01, 1.0))):
        fresh = sklearn.base.clone(learner).fit(features, two)
        refit = learner.fit(features, five).fit(features, two)
        assert refit.predict(features) == fresh.predict(features)
        if isinstance(learner, PapaProbe):
            assert refit.n_labels == fresh.n_labels == 2
        else:
            assert refit.held_out == fresh.held_out and refit.C == fresh.C


def test_set_params_changes_what_the_fit_uses_and_a_fitted_learner_keeps_its_fit():
    """LinearBaseline.set_params(grid=...) changed get_params but the fit searched the old grid;
    a fitted PatternCNN given other classes or size by set_params predicted with them (relabelled
    its outputs, or resized its inputs), where a fitted learner keeps its fit until the next fit."""
    import numpy as np

    from attnlens.evaluation.probing import LinearBaseline
    from attnlens.methods.patterns import TYPES, PatternCNN
    from attnlens.methods.patterns.synthetic import synthetic

    features, labels = _sequence_features(n_classes=2)
    assert LinearBaseline().set_params(grid=(0.5,)).fit(features, labels).C == 0.5
    train = synthetic("all", 8, 16, seed=0)
    maps = train.maps
    cnn = PatternCNN(epochs=1, size=16).fit(maps, train.labels)
    before = cnn.predict_proba(maps)
    cnn.set_params(classes=tuple(reversed(TYPES)), size=8)
    assert np.array_equal(cnn.predict_proba(maps), before) and list(cnn.classes_) == list(TYPES)
    assert cnn.get_params()["size"] == 8  # the next fit's


def test_string_labels_score_as_their_class_indices():
    """LinearBaseline.fit read ``"1"`` as class 1 but score compared the predicted 1 with the
    string: accuracy 0 (and every held-out C scored 0). A label that is no class index is refused
    by name. Reference: the same fit on int labels."""
    from attnlens.evaluation.probing import LinearBaseline, PapaProbe

    features, labels = _sequence_features(n_classes=3)
    as_text = [str(label) for label in labels]
    ints, text = LinearBaseline().fit(features, labels), LinearBaseline().fit(features, as_text)
    assert text.score(features, as_text) == ints.score(features, labels) > 0.5
    assert text.held_out == ints.held_out
    for bad in (["pos"] * len(labels), [0.5] * len(labels)):
        with pytest.raises(InputError, match="is not a class index"):
            PapaProbe(epochs=1).fit(features, bad)
    with pytest.raises(InputError, match="is negative"):
        PapaProbe(epochs=1).fit(features, [-1] + labels[1:])


def test_features_a_learner_was_not_fitted_on_are_refused():
    """NaN features trained a PapaProbe to NaN weights (then refused by its own load) and were
    predicted from without a word; a LinearBaseline fitted on sentences predicted word features
    (lists per word), and an MLM head scored sentence features as masked tokens (-10.4): each
    is now refused by name, as scikit-learn refuses NaN input."""
    import torch

    from attnlens.errors import MismatchError
    from attnlens.evaluation.probing import LinearBaseline, PapaProbe
    from attnlens.evaluation.probing.features import Features
    from attnlens.evaluation.probing.mlm import MLMHead

    features, labels = _sequence_features(n_classes=2)
    broken = Features(features.vectors.clone(), features.lengths, features.positions, features.n_words,
                      features.kind, features.max_len)
    broken.vectors[3, 0, 0] = float("nan")
    for learner in (PapaProbe(epochs=1), LinearBaseline()):
        with pytest.raises(InputError, match="NaN or infinite"):
            sklearn.base.clone(learner).fit(broken, labels)
        with pytest.raises(InputError, match="NaN or infinite"):
            learner.fit(features, labels).predict(broken)
    words = Features(features.vectors, features.lengths, features.positions, features.lengths, "words",
                     features.max_len)
    with pytest.raises(MismatchError, match="fitted on sequence features"):
        LinearBaseline().fit(features, labels).predict(words)
    masked = Features(features.vectors, torch.ones(len(features.positions), dtype=torch.long),
                      torch.randint(0, 50, (len(features.positions),)), torch.zeros(0, dtype=torch.long),
                      "masked", features.max_len)
    head = MLMHead(epochs=1).fit(masked, 50)
    with pytest.raises(InputError, match="masked-token features"):
        head.log_likelihood(features)


def _fit_and_predict(learner):
    """A fresh ``learner`` fitted on small inputs of its kind and what it then predicts (made
    where this is called: inside or outside an autograd mode)."""
    import torch

    from attnlens.evaluation.probing import LinearBaseline, PapaProbe
    from attnlens.evaluation.probing.features import Features
    from attnlens.evaluation.probing.mlm import MLMHead
    from attnlens.methods.patterns import PatternCNN
    from attnlens.methods.patterns.synthetic import synthetic

    if learner is PatternCNN:
        train = synthetic("all", 8, 16, seed=0)
        return torch.as_tensor(PatternCNN(epochs=1, size=16).fit(train.maps, train.labels).predict_proba(train.maps))
    features, labels = _sequence_features(n_classes=2)
    if learner is MLMHead:
        masked = Features(features.vectors, torch.ones(len(features.positions), dtype=torch.long),
                          torch.randint(0, 50, (len(features.positions),), generator=torch.Generator().manual_seed(0)),
                          torch.zeros(0, dtype=torch.long), "masked", features.max_len)
        return torch.as_tensor(MLMHead(epochs=1).fit(masked, 50).log_likelihood(masked))
    made = PapaProbe(hidden=8, epochs=2) if learner is PapaProbe else LinearBaseline(grid=(0.01, 1.0))
    return torch.as_tensor(made.fit(features, labels).predict(features))


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("learner", sorted(CASES, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_a_learner_fits_inside_an_autograd_mode_as_outside(learner, mode):
    """A notebook often runs under ``torch.no_grad()`` or ``torch.inference_mode()``. There the
    PAPA probe's fit failed deep inside ("element 0 of tensors does not require grad"); each
    learner now fits as it does outside (its training under ``attnlens.core.modes.gradients``),
    on inputs made inside the mode: the same predictions, exactly (the same arithmetic)."""
    import torch

    reference = _fit_and_predict(learner)
    with getattr(torch, mode)():
        inside = _fit_and_predict(learner)
    assert torch.equal(inside, reference)
