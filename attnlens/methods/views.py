"""Which attention an analysis reads: a *view*, one value (:class:`View`) in one registry
(:data:`REGISTRY`, :func:`register_view`, :func:`get_view`, with the one "Unknown view" error of
:func:`unknown_view`), and what it implies for the pass.

- ``"standard"``: the model's own attention patterns;
- ``"effective"``: effective attention (Brunner et al. 2020, :mod:`attnlens.effective`), signed;
- fitted :class:`~attnlens.papa.PapaConstants` (or trainable ones): every head replaced by its
  constant through :func:`attnlens.papa.hooks` and read back from the patterns; the inputs then
  take the constants' layout and ``max_len``.

:func:`setup` turns a view into the pass settings every corpus analysis (pattern types,
syntactic heads, clustering) uses, so they all accept the same views with the same errors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from attnlens.errors import InputError


def describe(value: Any) -> str:
    """:func:`attnlens.core.checks.describe`, imported when needed (the command line's parser
    reads the views' names without importing torch)."""
    from attnlens.core.checks import describe as describe_value

    return describe_value(value)


def _pattern(layer: Any) -> Any:
    return layer.pattern


def _effective(layer: Any) -> Any:
    return layer.effective


@dataclass(frozen=True)
class View:
    """A view: which attention an analysis reads, as a value.

    ``name``; ``description`` (one line); ``signed``: whether its maps can leave ``[0, 1]``
    (effective attention: drawn on a diverging scale, rows need not sum to 1); ``maps``: how its
    maps are made from what the pass engine hands each accumulator, a
    :class:`attnlens.passes.LayerPatterns` (``maps(layer) -> [batch, head, query, key]``);
    ``needs_effective``: whether the engine must compute effective attention for it;
    ``takes_constants``: whether the view is given by PAPA constants (the constants are the view
    value; their hooks make the patterns the maps are read from); ``default_layout``: the inputs'
    layout, a fixed name, or a callable of the model (None: the model's own,
    :func:`attnlens.inputs.default_layout`)."""

    name: str
    description: str
    signed: bool
    maps: Callable[[Any], Any] = _pattern
    needs_effective: bool = False
    takes_constants: bool = False
    default_layout: str | Callable[[Any], str] | None = None

    def read(self, layer: Any, constants: Any = None, *, causal: bool | None = None) -> Any:
        """This view's maps of one :class:`attnlens.passes.LayerPatterns`. A view given by PAPA
        constants, with ``constants``: the constants restricted to the batch's valid tokens
        (:meth:`attnlens.papa.PapaConstants.layer_pattern`, float32), so that it is read in the
        same pass as the others, without hooks; without them, :attr:`maps` (the patterns, under
        the pass's ``papa.hooks``). The constants' maps are made once per layer of a batch
        (:meth:`attnlens.passes.LayerPatterns.shared`) for every accumulator that reads them."""
        if self.takes_constants and constants is not None:
            import torch

            return layer.shared(("view", self.name, id(constants), causal), lambda: constants.layer_pattern(
                layer.layer, layer.key_mask, dtype=torch.float32, causal=causal,
                positions=layer.batch.compact_positions))
        return self.maps(layer)

    def layout(self, model: Any) -> str:
        """The layout of this view's inputs on ``model`` by default."""
        from attnlens.core.inputs import default_layout

        if self.default_layout is None:
            return default_layout(model)
        return self.default_layout(model) if callable(self.default_layout) else self.default_layout


#: every view, by name, in report order: the one registry every module asks
REGISTRY: dict[str, View] = {}


def register_view(view: View) -> View:
    """Add ``view`` to :data:`REGISTRY` (a name registered twice is an error); returns it."""
    if not isinstance(view, View):
        raise InputError(f"register_view takes a View, got {describe(view)}.")
    if view.name in REGISTRY and REGISTRY[view.name] is not view:
        raise InputError(f"a view named {view.name!r} is already registered.")
    REGISTRY[view.name] = view
    return view


register_view(View("standard", "the model's attention", signed=False))
register_view(View("papa", "PAPA constants (attnlens.papa.fit(model, texts) or papa.load(path))",
                   signed=False, takes_constants=True))
register_view(View("effective", "effective attention (Brunner et al. 2020), signed", signed=True,
                   maps=_effective, needs_effective=True))


def names(*, constants: bool | None = None, among: Iterable[str] | None = None) -> tuple[str, ...]:
    """The registered views' names in order; ``constants=False`` only those given by name (not by
    PAPA constants), ``True`` only those; ``among``: only these."""
    kept = [name for name, view in REGISTRY.items()
            if constants is None or view.takes_constants == constants]
    return tuple(name for name in kept if among is None or name in set(among))


def signed_names() -> frozenset[str]:
    """The names of the signed views (:attr:`View.signed`)."""
    return frozenset(name for name, view in REGISTRY.items() if view.signed)


def unknown_view(view: Any, *, among: Iterable[str] | None = None, where: str = "") -> InputError:
    """The one "Unknown view" error: what was given, the views that are accepted where it was
    (``among``, default all) and what each is. ``where``: e.g. ``" for HeadDistances"``."""
    accepted = names(among=among)
    listing = ", ".join(repr(name) for name in accepted)
    details = "; ".join(f"{name!r}: {REGISTRY[name].description}" for name in accepted)
    hint = ""
    if any(REGISTRY[name].takes_constants for name in REGISTRY) and not any(
        REGISTRY[name].takes_constants for name in accepted
    ):
        hint = " (PAPA constants: run the pass with hooks=papa.hooks(constants) and view='standard')"
    elif view == "papa":
        hint = " ('papa' needs the PAPA constants themselves: view=attnlens.papa.fit(model, texts))"
    return InputError(f"Unknown view {describe(view)}{where}; use {listing} ({details}){hint}.")


def get_view(view: Any, *, among: Iterable[str] | None = None, where: str = "") -> View:
    """The registered :class:`View` of ``view``: a name, a :class:`View`, or PAPA constants (the
    ``"papa"`` view). ``among``: the names accepted here (default all); anything else raises the
    one "Unknown view" :class:`~attnlens.errors.InputError` (:func:`unknown_view`)."""
    accepted = names(among=among)
    if isinstance(view, View) and REGISTRY.get(view.name) is view and view.name in accepted:
        return view
    if isinstance(view, str) and view in accepted:
        return REGISTRY[view]
    if not isinstance(view, str | View) and _is_constants(view):
        papa = [name for name in accepted if REGISTRY[name].takes_constants]
        if papa:
            return REGISTRY[papa[0]]
    raise unknown_view(view, among=among, where=where)


def _is_constants(value: Any) -> bool:
    from attnlens.methods.papa import PapaConstants, TrainableConstants

    return isinstance(value, PapaConstants | TrainableConstants)


#: the views given by name (the others take PAPA constants as their value)
NAMED: tuple[str, ...] = names(constants=False)


def resolve(view: Any) -> tuple[str, Any]:
    """``(name, constants or None)`` of a view: a name given by name (``"standard"``,
    ``"effective"``) or PAPA constants (``"papa"``, with them); ``ValueError`` for anything else,
    the string ``"papa"`` included (the view needs the constants themselves)."""
    if _is_constants(view):
        return get_view(view).name, view
    if isinstance(view, str) and view in NAMED:
        return view, None
    raise unknown_view(view)


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
