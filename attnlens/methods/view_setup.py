"""A view made ready for a pass: :func:`setup` checks a view (a name or the value of a view given
by one, such as PAPA constants) against a model and decides the pass's inputs and hooks
(:class:`ViewSetup`), so that every corpus analysis (pattern types, syntactic heads, clustering)
accepts the same views with the same errors. The views themselves are
:data:`attnlens.methods.views.REGISTRY`, read when :func:`setup` is called; the hooks come from
:func:`attnlens.methods.interventions.build`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attnlens.core.checks import describe
from attnlens.core.inputs import LAYOUTS, check_max_len
from attnlens.errors import InputError
from attnlens.methods import interventions
from attnlens.methods.views import REGISTRY, View, resolve


@dataclass
class ViewSetup:
    """A view made ready for :func:`attnlens.engine.passes.run`: its ``name``, ``constants`` (or None),
    the ``max_len`` and ``layout`` of the inputs and the ``hooks`` that install it."""

    name: str
    constants: Any
    max_len: int
    layout: str
    hooks: list = field(default_factory=list)

    @property
    def view(self) -> View:
        """The registered :class:`View` of :attr:`name`."""
        return REGISTRY[self.name]


def setup(model: Any, view: Any, *, max_len: Any = None, layout: str | None = None,
          default_max_len: int = 128, hooks: Any = ()) -> ViewSetup:
    """Check ``view`` against ``model`` and decide the inputs: the value of a view given by one
    (PAPA constants) imposes its own ``max_len`` and layout (giving others is an error), and the
    view's intervention (:attr:`View.intervention`, built by
    :func:`attnlens.methods.interventions.build` on every head) is installed; else ``max_len``
    defaults to ``default_max_len`` and ``layout`` to ``"padded"``: the model's ordinary input
    (``[CLS] w1 … wk [SEP]`` at positions ``0 … k+1`` on an encoder, as Clark et al. and Kovaleva
    et al. ran BERT), which :func:`attnlens.compare` and :mod:`attnlens.methods.effective` take
    too without PAPA constants; the PAPA layout (its final separator at ``max_len − 1``) is for
    the constants, whose positions are fixed. ``hooks``: further interventions, run after the
    view's own."""
    name, constants = resolve(view)
    fwd_hooks = list(hooks)
    if constants is not None:
        constants.check_compatible(model)
        for given, theirs, what in ((max_len, constants.max_len, "max_len"), (layout, constants.layout, "layout")):
            if given is not None and given != theirs:
                raise InputError(
                    f"PAPA constants are fitted with {what}={theirs!r}, not {given!r}: the inputs "
                    f"must be laid out as the constants are; leave out {what}= (or give {theirs!r})."
                )
        max_len, layout = constants.max_len, constants.layout
        intervention = REGISTRY[name].intervention
        if intervention is not None:  # the value's hooks make the patterns the maps are read from
            fwd_hooks = [*interventions.build(intervention, model, "all", constants=constants), *fwd_hooks]
    layout = "padded" if layout is None else layout
    if layout not in LAYOUTS:
        raise InputError(f"Unknown layout {describe(layout)}; use one of {', '.join(LAYOUTS)}.")
    max_len = check_max_len(model, default_max_len if max_len is None else max_len, layout=layout)
    return ViewSetup(name, constants, max_len, layout, fwd_hooks)
