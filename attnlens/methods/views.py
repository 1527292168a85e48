"""Which attention an analysis reads: a *view*, one value (:class:`View`) in one registry
(:data:`REGISTRY`, :func:`register_view`, :func:`get_view`, with the one "Unknown view" error of
:func:`unknown_view`), and what it implies for the pass.

- ``"standard"``: the model's own attention patterns;
- ``"effective"``: effective attention (Brunner et al. 2020, :mod:`attnlens.methods.effective`), signed;
- ``"norm"``: norm-based attention (Kobayashi et al. 2020, :mod:`attnlens.methods.norm`), each row
  of ``α·‖f(x)‖`` normalised (``raw``: the norms themselves);
- fitted :class:`~attnlens.papa.PapaConstants` (or trainable ones): every head replaced by its
  constant through :func:`attnlens.papa.hooks` and read back from the patterns; the inputs then
  take the constants' layout and ``max_len``.

:func:`attnlens.methods.view_setup.setup` turns a view into the pass settings every corpus
analysis (pattern types, syntactic heads, clustering) uses, so they all accept the same views
with the same errors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
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


def _norm(layer: Any) -> Any:
    from attnlens.methods import norm  # torch: not when the command line reads the names

    return norm.layer_maps(layer)


def _norm_raw(layer: Any) -> Any:
    from attnlens.methods import norm

    return norm.layer_raw(layer)


#: what a view may read of a layer (:attr:`View.reads`): the pattern (``LayerPatterns.pattern``),
#: the value vectors (``LayerPatterns.values``, captured by the engine only when a view of the
#: pass reads them) and the output weights ``W_O`` (``LayerPatterns.output_weights``)
READS: frozenset[str] = frozenset({"pattern", "values", "output_weights"})


@dataclass(frozen=True)
class View:
    """A view: which attention an analysis reads, as a value.

    ``name``; ``description`` (one line); ``signed``: whether its maps can leave ``[0, 1]``
    (effective attention: drawn on a diverging scale, rows need not sum to 1); ``maps``: how its
    maps are made from what the pass engine hands each accumulator, a
    :class:`attnlens.engine.accumulator.LayerPatterns` (``maps(layer) -> [batch, head, query, key]``);
    ``takes_constants``: whether the view is given by PAPA constants (the constants are the view
    value; their hooks make the patterns the maps are read from; their layout is the inputs':
    :func:`attnlens.methods.view_setup.setup`).

    ``intervention``: the name, in :data:`attnlens.methods.interventions.REGISTRY`, of the
    intervention that runs the model under this view (built with
    :func:`attnlens.methods.interventions.build`; a view given by a value with ``constants=``
    it): the hooks :func:`attnlens.methods.view_setup.setup` installs for a view given by a
    value, and those the scores of :func:`attnlens.compare` run under (None: the view only
    reads the maps another way).
    ``accepts``: for a view given by a value (``takes_constants``), whether a value is one of its
    values (PAPA: fitted or trainable constants); such a value carries the ``max_len`` and
    ``layout`` its inputs must have and ``check_compatible(model)``. ``value_hint``: what to give
    for it, said when its name is given instead. ``blind_below_d_head``: its maps equal the
    pattern on a text of at most ``d_head`` real tokens whose values are independent (effective
    attention: the values then span every direction), so :func:`attnlens.compare` shows a longer example and says how many
    texts are that short.

    ``reads``: what the view reads of a layer, a subset of :data:`READS`. The engine captures the
    value vectors only for a pass whose views read them: :attr:`needs_values` (``"values"`` is
    read; the accumulators that read a view copy it onto
    :attr:`attnlens.engine.accumulator.Accumulator.needs_values`, which makes the engine capture
    them). ``raw``: for a view whose maps are normalised rows of other maps (the norms
    of ``"norm"``), how those raw maps are read (``raw(layer) -> [batch, head, query, key]``,
    :func:`attnlens.methods.maps.maps` with ``raw=True``); None: the maps are the raw ones.

    ``stacks``: :attr:`maps` of a stack of layers
    (:meth:`attnlens.engine.accumulator.LayerPatterns.stack`) are the concatenation of each
    layer's, so a pass that keeps a batch's layers makes them in one call (one launch per
    operator instead of one per layer on a GPU): true of maps made example by example from the
    pattern and values alone (``"standard"``, ``"effective"``) and of a view given by
    constants (``"papa"``: :meth:`read` makes a stack's maps with one call of the constants'
    ``layer_pattern``), not of those that read a layer's own weights (``"norm"``: ``W_O``).

    ``causal``: on a decoder its maps hold no weight on keys after the query (true of every view
    registered here: a decoder's effective attention projects each row onto the values of the
    keys its query reads, :mod:`attnlens.engine.effective_causal`), so figures blank those keys;
    False for a view of your own whose maps may reach them."""

    name: str
    description: str
    signed: bool
    maps: Callable[[Any], Any] = _pattern
    takes_constants: bool = False
    intervention: str | None = None
    accepts: Callable[[Any], bool] | None = None
    value_hint: str = ""
    blind_below_d_head: bool = False
    reads: frozenset[str] = frozenset({"pattern"})
    raw: Callable[[Any], Any] | None = None
    stacks: bool = False
    causal: bool = True

    def __post_init__(self) -> None:
        reads = frozenset(self.reads)
        if not reads <= READS:
            raise InputError(f"View {self.name!r} reads {sorted(reads - READS)}; a view reads some of "
                             f"{', '.join(sorted(READS))}.")
        object.__setattr__(self, "reads", reads)  # a frozen dataclass: set once, here

    @property
    def needs_values(self) -> bool:
        """Whether the view reads the layer's value vectors (``"values"`` in :attr:`reads`)."""
        return "values" in self.reads

    def read(self, layer: Any, constants: Any = None, *, causal: bool | None = None) -> Any:
        """This view's maps of one :class:`attnlens.engine.accumulator.LayerPatterns`. A view given by PAPA
        constants, with ``constants``: the constants restricted to the batch's valid tokens
        (:meth:`attnlens.papa.PapaConstants.layer_pattern`, float32), so that it is read in the
        same pass as the others, without hooks; without them, :attr:`maps` (the patterns, under
        the pass's ``papa.hooks``). The constants' maps are made once per layer of a batch
        (:meth:`attnlens.engine.accumulator.LayerPatterns.shared`) for every accumulator that reads them;
        for a stack of layers (:meth:`attnlens.engine.accumulator.LayerPatterns.stack`) in one call."""
        if self.takes_constants and constants is not None:
            import torch

            # a stack of layers: the constants' patterns of all of them at once
            return layer.shared(("view", self.name, id(constants), causal), lambda: constants.layer_pattern(
                layer.layers or layer.layer, layer.batch.key_mask, dtype=torch.float32, causal=causal,
                positions=layer.batch.compact_positions))
        return self.maps(layer)


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


def names(*, constants: bool | None = None, among: Iterable[str] | None = None) -> tuple[str, ...]:
    """The registered views' names in order; ``constants=False`` only those given by name (not by
    PAPA constants), ``True`` only those; ``among``: only these."""
    kept = [name for name, view in REGISTRY.items()
            if constants is None or view.takes_constants == constants]
    return tuple(name for name in kept if among is None or name in set(among))


def unknown_view(view: Any, *, among: Iterable[str] | None = None, where: str = "") -> InputError:
    """The one "Unknown view" error: what was given, the views that are accepted where it was
    (``among``, default all) and what each is. ``where``: e.g. ``" for HeadDistances"``."""
    accepted = names(among=among)
    listing = ", ".join(repr(name) for name in accepted)
    details = "; ".join(f"{name!r}: {REGISTRY[name].description}" for name in accepted)
    hint = ""
    by_value = [value for value in REGISTRY.values() if value.takes_constants]
    given = REGISTRY.get(view) if isinstance(view, str) else None
    if by_value and not any(REGISTRY[name].takes_constants for name in accepted):
        first = by_value[0]
        hint = (f" ({first.name!r}: run the pass with hooks=interventions.build({first.intervention!r}, "
                f"model, constants=...) and view={accepted[0]!r})" if accepted else "")
    elif given is not None and given.takes_constants and given.value_hint:
        hint = f" ({view!r} needs {given.value_hint})"
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
    if not isinstance(view, str | View):
        taking = [name for name in accepted if _takes(REGISTRY[name], view)]
        if taking:
            return REGISTRY[taking[0]]
    raise unknown_view(view, among=among, where=where)


def value_settings(constants: Any) -> dict[str, Any]:
    """What an accumulator reading a view given by a value records of it for a resume
    (:meth:`attnlens.engine.accumulator.Accumulator.settings`): the checksum of the PAPA
    constants, or None without them."""
    return {"constants": None if constants is None else constants.checksum()}


def _takes(view: View, value: Any) -> bool:
    """Whether ``value`` is one of the values of ``view`` (:attr:`View.accepts`)."""
    return view.takes_constants and view.accepts is not None and bool(view.accepts(value))


def resolve(view: Any) -> tuple[str, Any]:
    """``(name, constants or None)`` of a view: the name of a view given by name (``"standard"``,
    ``"effective"``, any registered view that does not take constants) or a value of a view given
    by one (PAPA constants: ``"papa"``, with them); ``InputError`` for anything else, the name of
    a view given by a value included (the view needs the value itself)."""
    if not isinstance(view, str | View) and any(_takes(value, view) for value in REGISTRY.values()):
        return get_view(view).name, view
    if isinstance(view, str) and view in names(constants=False):
        return view, None
    raise unknown_view(view)


# ------------------------------------------------------------------------------------------------
# the views attnlens has (a view defined elsewhere registers itself the same way)


def _papa_constants(value: Any) -> bool:
    """Whether ``value`` is PAPA constants, fitted or trainable (the ``"papa"`` view's values)."""
    from attnlens.methods.papa import PapaConstants, TrainableConstants  # torch: only for a value

    return isinstance(value, PapaConstants | TrainableConstants)


register_view(View("standard", "the model's attention", signed=False, stacks=True))
register_view(View("papa", "PAPA constants (attnlens.papa.fit(model, texts) or papa.load(path))",
                   signed=False, takes_constants=True, intervention="papa", accepts=_papa_constants, stacks=True,
                   value_hint="the PAPA constants themselves: view=attnlens.papa.fit(model, texts)"))
register_view(View("effective", "effective attention (Brunner et al. 2020), signed", signed=True,
                   maps=_effective, reads=frozenset({"pattern", "values"}), intervention="effective",
                   blind_below_d_head=True, stacks=True))
register_view(View("norm", "norm-based attention (Kobayashi et al. 2020): weight x ||f(x)||, rows normalised",
                   signed=False, maps=_norm, raw=_norm_raw, reads=frozenset({"pattern", "values", "output_weights"})))
