"""Which attention an analysis reads: a *view* and what it implies for the pass.

- ``"standard"``: the model's own attention patterns;
- ``"effective"``: effective attention (Brunner et al. 2020, :mod:`attnlens.effective`), signed;
- fitted :class:`~attnlens.papa.PapaConstants` (or trainable ones): every head replaced by its
  constant through :func:`attnlens.papa.hooks` and read back from the patterns; the inputs then
  take the constants' layout and ``max_len``.

:func:`setup` turns a view into the pass settings every corpus analysis (pattern types,
syntactic heads, clustering) uses, so they all accept the same views with the same errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attnlens.core.checks import describe
from attnlens.errors import InputError

#: the views given by name
NAMED: tuple[str, ...] = ("standard", "effective")


def resolve(view: Any) -> tuple[str, Any]:
    """``(name, constants or None)`` of a view: ``"standard"``, ``"effective"`` or ``"papa"``
    (with its constants); ``ValueError`` for anything else."""
    from attnlens.methods.papa import PapaConstants, TrainableConstants

    if isinstance(view, PapaConstants | TrainableConstants):
        return "papa", view
    if isinstance(view, str) and view in NAMED:
        return view, None
    hint = ""
    if view == "papa":
        hint = " ('papa' needs the constants themselves: view=attnlens.papa.fit(model, texts))"
    raise InputError(
        f"Unknown view {describe(view)}{hint}: use 'standard' (the model's attention), 'effective' "
        "(effective attention) or PAPA constants (attnlens.papa.fit(model, texts) or papa.load(path))."
    )


@dataclass
class ViewSetup:
    """A view made ready for :func:`attnlens.passes.run`: its ``name``, ``constants`` (or None),
    the ``max_len`` and ``layout`` of the inputs and the ``hooks`` that install it."""

    name: str
    constants: Any
    max_len: int
    layout: str
    hooks: list = field(default_factory=list)

    @property
    def effective(self) -> bool:
        return self.name == "effective"


def setup(model: Any, view: Any, *, max_len: Any = None, layout: str | None = None,
          default_max_len: int = 128, hooks: Any = ()) -> ViewSetup:
    """Check ``view`` against ``model`` and decide the inputs: PAPA constants impose their own
    ``max_len`` and layout (giving others is an error), else ``max_len`` defaults to
    ``default_max_len`` and ``layout`` to the model's (:func:`attnlens.inputs.default_layout`).
    ``hooks``: further interventions, run after the view's own."""
    from attnlens.core.inputs import LAYOUTS, check_max_len, default_layout

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
        from attnlens.methods import papa

        fwd_hooks = [*papa.hooks(constants), *fwd_hooks]
    layout = default_layout(model) if layout is None else layout
    if layout not in LAYOUTS:
        raise InputError(f"Unknown layout {describe(layout)}; use one of {', '.join(LAYOUTS)}.")
    max_len = check_max_len(model, default_max_len if max_len is None else max_len, layout=layout)
    return ViewSetup(name, constants, max_len, layout, fwd_hooks)
