"""Learners in scikit-learn's shape: ``get_params``, ``set_params`` and ``sklearn.base.clone``.

scikit-learn's contract (``sklearn.base.BaseEstimator``): the constructor stores every argument,
unchanged, as an attribute of the same name; ``get_params`` reads them back by the constructor's
signature; ``set_params`` changes some of them; ``clone`` builds an unfitted copy from
``get_params``. attnlens's learners (:class:`~attnlens.evaluation.probing.PapaProbe`,
:class:`~attnlens.evaluation.probing.LinearBaseline`, :class:`~attnlens.evaluation.probing.mlm.MLMHead`,
:class:`~attnlens.methods.patterns.PatternCNN`) take :class:`Estimator` for that, and keep their own
``fit``, ``predict`` / ``score`` and ``save`` / ``load``. Unlike scikit-learn they check their
arguments in the constructor (one clear error where the mistake is made), and ``set_params``
checks the new ones the same way, by building a fresh instance. As in scikit-learn, the repr
is the constructor's call with the arguments that differ from their defaults
(``PapaProbe(epochs=3, lr=0.0003)``).
"""

from __future__ import annotations

import inspect
from typing import Any

from attnlens.errors import InputError


class Estimator:
    """``get_params`` / ``set_params`` from the constructor's keyword arguments (see the module
    docstring). A subclass stores each argument as an attribute of the same name."""

    def __repr__(self) -> str:
        """The constructor's call with the arguments that differ from their defaults, as
        scikit-learn prints an estimator (``print_changed_only``)."""
        defaults = {name: parameter.default for name, parameter in inspect.signature(type(self).__init__).parameters.items()}
        changed = [f"{name}={value!r}" for name, value in self.get_params().items()
                   if not _same(value, defaults.get(name, inspect.Parameter.empty))]
        return f"{type(self).__name__}({', '.join(changed)})"

    @classmethod
    def _param_names(cls) -> list[str]:
        signature = inspect.signature(cls.__init__)
        return [name for name, parameter in signature.parameters.items()
                if name != "self" and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor's arguments, as given (``deep`` is scikit-learn's; nothing is nested)."""
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params: Any) -> Estimator:
        """Change constructor arguments (checked as the constructor checks them); returns
        ``self``. A fitted estimator keeps its fit until the next ``fit``."""
        names = self._param_names()
        unknown = sorted(set(params) - set(names))
        if unknown:
            raise InputError(f"{type(self).__name__} has no parameter {unknown[0]!r}; its parameters are "
                             f"{', '.join(names)}.")
        fresh = type(self)(**{**self.get_params(), **params})  # the constructor's checks
        for name in names:
            setattr(self, name, getattr(fresh, name))
        self._after_set_params(fresh)
        return self

    def _after_set_params(self, fresh: Estimator) -> None:
        """Copy what the constructor derives from its arguments (e.g. a settings object)."""


def _same(value: Any, default: Any) -> bool:
    """Whether an argument is its default (a sequence given as a list equals its default tuple)."""
    if isinstance(value, list | tuple) and isinstance(default, list | tuple):
        return tuple(value) == tuple(default)
    try:
        return bool(value == default)
    except (TypeError, ValueError, RuntimeError):  # a tensor or array: never a default here
        return False
