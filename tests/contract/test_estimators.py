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
