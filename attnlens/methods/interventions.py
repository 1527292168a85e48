"""Interventions as values: one registry of the ways attnlens changes a model's heads.

An :class:`Intervention` is a value: its ``name``, what it does, the hook point it edits and how
to build it, ``build(model, heads, **options) -> Hooks`` (:class:`attnlens.engine.hooks.Hooks`,
the one hook-list type: TransformerLens ``fwd_hooks`` with a stable ``key()`` and ``apply()``).
Every kind attnlens has is registered here (:data:`REGISTRY`), and :func:`build` is the one way
to make one by name (unknown names raise one error that lists them)::

    hooks = interventions.build("ablation.zero", model, heads)
    with hooks.apply(model):
        ...

The kinds are thin names over the functions that define them, which keep working as before:
``"papa"`` / ``"papa.blend"`` are :func:`attnlens.papa.hooks` (``constants=``, ``lam=``, ``fast=``),
``"effective"`` / ``"effective.null"`` are :func:`attnlens.methods.effective.hooks` (on the layers that
hold a selected head: effective attention replaces a layer's patterns whole), and
``"ablation.<mode>"`` are :func:`attnlens.ablation.hooks` for each of
:data:`attnlens.ablation.MODES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnlens.core.checks import describe
from attnlens.core.heads import HeadSet
from attnlens.engine.hooks import Hooks
from attnlens.errors import InputError
from attnlens.methods import ablation, effective, papa
from attnlens.methods.ablation import MODES as ABLATION_MODES
from attnlens.methods.effective.model import EffectiveHooks


@dataclass(frozen=True)
class Intervention:
    """One kind of intervention. ``build(model, heads, **options)`` gives its :class:`Hooks`;
    ``heads`` is a :class:`HeadSet` (``[layer, head]``), ``options`` what the kind needs
    (:attr:`needs`: e.g. ``constants``, ``means``). ``point``: the hook point it edits
    (``"hook_pattern"`` or ``"hook_z"``). ``per_head``: whether it changes the selected heads only
    (else whole layers: those holding a selected head). ``preserves_output``: whether the model's
    output stays the same up to float error (effective attention: ``A⊥V = AV``)."""

    name: str
    description: str
    build: Callable[..., Hooks]
    point: str
    needs: tuple[str, ...] = ()
    per_head: bool = True
    preserves_output: bool = False

    def __call__(self, model: Any, heads: Any, **options: Any) -> Hooks:
        missing = [need for need in self.needs if options.get(need) is None]
        if missing:
            raise InputError(f"the intervention {self.name!r} needs {', '.join(f'{m}=' for m in missing)}.")
        return self.build(model, heads, **options)


#: every registered intervention, by name
REGISTRY: dict[str, Intervention] = {}


def register_intervention(intervention: Intervention) -> Intervention:
    """Add ``intervention`` to :data:`REGISTRY` (a name registered twice is an error)."""
    if not isinstance(intervention, Intervention):
        raise InputError(f"register_intervention takes an Intervention, got {describe(intervention)}.")
    if intervention.name in REGISTRY and REGISTRY[intervention.name] is not intervention:
        raise InputError(f"an intervention named {intervention.name!r} is already registered.")
    REGISTRY[intervention.name] = intervention
    return intervention


def get_intervention(name: Any) -> Intervention:
    """The registered intervention called ``name``; ``InputError`` naming the registered ones."""
    if isinstance(name, Intervention):
        return name
    if isinstance(name, str) and name in REGISTRY:
        return REGISTRY[name]
    raise InputError(f"Unknown intervention {describe(name)}; use one of {', '.join(sorted(REGISTRY))}.")


def build(name: Any, model: Any, heads: Any = "all", **options: Any) -> Hooks:
    """The hooks of intervention ``name`` on ``heads`` (a :class:`HeadSet`, a boolean
    ``[layer, head]`` tensor, or ``"all"``) of ``model``."""
    intervention = get_intervention(name)
    return intervention(model, _headset(model, heads), **options)


def _headset(model: Any, heads: Any) -> HeadSet:
    import torch

    if isinstance(heads, HeadSet):
        return heads
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    if isinstance(heads, str) and heads == "all":
        return HeadSet(torch.ones(n_layers, n_heads, dtype=torch.bool))
    if isinstance(heads, torch.Tensor) and heads.dtype == torch.bool:
        return HeadSet(heads)
    raise InputError(f"heads must be a HeadSet, a boolean [layer, head] tensor or 'all', got {describe(heads)}.")


# ------------------------------------------------------------------------------------------------
# the kinds attnlens has


def _papa(mode: str) -> Callable[..., Hooks]:
    def make(model: Any, heads: HeadSet, *, constants: Any = None, lam: Any = None, fast: bool = False) -> Hooks:
        constants.check_compatible(model)
        return papa.hooks(constants, heads=heads, mode=mode, lam=lam, fast=fast)

    return make


def _effective(mode: str) -> Callable[..., Hooks]:
    def make(model: Any, heads: HeadSet, *, rtol: Any = None, padded: bool = False) -> Hooks:
        layers = [layer for layer in range(heads.shape[0]) if bool(heads.mask[layer].any())]
        if not layers:  # no layer: no hook (effective.hooks takes an empty list as "none given")
            return EffectiveHooks([], f"effective:{mode}:layers=[]:rtol={rtol}:padded={padded}")
        return effective.hooks(model, mode, layers=layers, rtol=rtol, padded=padded)  # type: ignore[arg-type]

    return make


def _ablation(mode: str) -> Callable[..., Hooks]:
    def make(model: Any, heads: HeadSet, *, means: Any = None, constants: Any = None) -> Hooks:
        return ablation.hooks(heads, mode, model=model, means=means, constants=constants)

    return make


def _register_builtin() -> None:
    register_intervention(Intervention(
        "papa", "the heads' attention replaced by PAPA constants (papa.hooks, mode='replace')",
        _papa("replace"), "hook_pattern", needs=("constants",)))
    register_intervention(Intervention(
        "papa.blend", "the heads' attention blended with PAPA constants, λ·A + (1 − λ)·C "
        "(papa.hooks, mode='blend')", _papa("blend"), "hook_pattern", needs=("constants",)))
    register_intervention(Intervention(
        "effective", "each pattern replaced by its effective attention (effective.hooks); the "
        "output does not change", _effective("effective"), "hook_pattern", per_head=False,
        preserves_output=True))
    register_intervention(Intervention(
        "effective.null", "each pattern replaced by its null-space part A − A⊥ (effective.hooks, "
        "mode='null'): every head's output is ~0", _effective("null"), "hook_pattern", per_head=False))
    for mode, what in ABLATION_MODES.items():
        needs = {"mean": ("means",), "papa": ("constants",)}.get(mode, ())
        point = "hook_pattern" if mode in ("uniform", "papa") else "hook_z"
        register_intervention(Intervention(f"ablation.{mode}", what, _ablation(mode), point, needs=needs))


_register_builtin()
