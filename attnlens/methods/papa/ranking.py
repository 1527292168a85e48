"""The order in which heads are replaced, and ``heads=`` read as a :class:`HeadSet`.

:func:`ranked` keeps the first ``count`` heads of a strategy's order (the strategies are listed in
:mod:`attnlens.methods.papa.selection`); :func:`resolve_heads` reads what the hooks accept as ``heads=``.
Neither learns anything: learning ``λ`` runs interventions (:func:`attnlens.papa.learn_lambda`),
so it lives above the hooks, in :mod:`attnlens.methods.papa.selection`, and this module below them.
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from attnlens.core.checks import describe
from attnlens.core.heads import HeadSet, as_headset, n_selected
from attnlens.errors import InputError, InputTypeError
from attnlens.methods.papa.constants import PapaConstants

STRATEGIES: tuple[str, ...] = (
    "lambda",
    "reversed_lambda",
    "first_to_last",
    "last_to_first",
    "random",
    "input_dependence",
)


def ranked(
    strategy: str,
    count: int,
    n_layers: int,
    n_heads: int,
    *,
    scores: Float[Tensor, "layer head"] | None = None,
    seed: int = 0,
) -> HeadSet:
    """The first ``count`` of the ``n_layers × n_heads`` heads in ``strategy``'s order, that order
    kept (:attr:`HeadSet.order`), with ``scores`` and ``strategy`` attached.

    ``scores`` ``[layer, head]`` rank the heads of ``"lambda"`` and ``"input_dependence"`` (lowest
    first) and of ``"reversed_lambda"`` (highest first); ties keep the index order (a stable
    sort). ``seed`` draws the ``"random"`` order. The arguments are taken as checked: ``strategy``
    one of :data:`STRATEGIES`, ``scores`` given where it ranks (:func:`attnlens.papa.select_heads`
    checks them).
    """
    if strategy in ("lambda", "reversed_lambda", "input_dependence"):
        flat = -scores.flatten() if strategy == "reversed_lambda" else scores.flatten()
        ranking = torch.argsort(flat, stable=True).tolist()
    elif strategy == "first_to_last":
        ranking = list(range(n_layers * n_heads))
    elif strategy == "last_to_first":
        ranking = [layer * n_heads + head for layer in reversed(range(n_layers)) for head in range(n_heads)]
    else:  # "random"
        generator = torch.Generator().manual_seed(int(seed))
        ranking = torch.randperm(n_layers * n_heads, generator=generator).tolist()
    order = [divmod(index, n_heads) for index in ranking[:count]]
    selected = HeadSet.from_heads(order, n_layers, n_heads)
    selected.scores, selected.strategy = scores, strategy
    return selected


def input_dependence(constants: Any) -> Float[Tensor, "layer head"]:
    """The heads' input dependence measured by :func:`attnlens.papa.fit`
    (:attr:`PapaConstants.input_dependence`), the ``"input_dependence"`` strategy's scores."""
    if not isinstance(constants, PapaConstants):
        given = "none" if constants is None else type(constants).__name__
        raise InputError(
            "strategy 'input_dependence' ranks heads by the input dependence measured in "
            f"papa.fit; pass constants= fitted with papa.fit (got {given}), or choose another "
            "strategy."
        )
    return constants.input_dependence.float()


def resolve_heads(heads: Any, constants: Any) -> HeadSet:
    """A :class:`HeadSet` from what :func:`attnlens.papa.hooks` accepts as ``heads=``: ``"all"``,
    a :class:`HeadSet`, a list of ``(layer, head)`` pairs (:meth:`HeadSet.from_heads`), a boolean
    ``[layer, head]`` tensor, or a fraction ``k`` in ``[0, 1]``
    (the ``round(k · layers · heads)`` least input-dependent heads of fitted ``constants``)."""
    n_layers, n_heads = constants.n_layers, constants.n_heads
    selected = as_headset(heads, (n_layers, n_heads))
    if selected is None:  # the forms PAPA adds: 'all' and a fraction
        if isinstance(heads, str):
            if heads != "all":
                raise InputError(f"heads={heads!r}: use 'all', a HeadSet, (layer, head) pairs or a fraction in [0, 1].")
            selected = HeadSet.all(n_layers, n_heads)
        elif isinstance(heads, int) and not isinstance(heads, bool):
            raise InputTypeError(
                f"heads={heads} is ambiguous (a count, or the fraction {float(heads)}?): pass a fraction "
                f"as a float (heads={float(heads)}), or a number of heads as "
                f"heads=select_heads('input_dependence', n={heads}, constants=constants)."
            )
        elif isinstance(heads, float):
            if getattr(constants, "kind", None) != "average":
                raise InputError(
                    "heads=<fraction> ranks heads by the input dependence measured in papa.fit; these "
                    "constants are not fitted, so pass heads=select_heads(...)."
                )
            count = n_selected(heads, n_layers, n_heads)
            selected = ranked("input_dependence", count, n_layers, n_heads, scores=input_dependence(constants))
        else:
            raise InputTypeError(
                "heads must be 'all', a HeadSet, a list of (layer, head) pairs, a bool torch tensor or a "
                f"fraction; got {describe(heads)}"
                + ("; convert it with torch.as_tensor(heads)." if hasattr(heads, "__array__") else ".")
            )
    if selected.shape != (n_layers, n_heads):
        raise InputError(f"heads is a {list(selected.shape)} head set; the constants are [{n_layers}, {n_heads}] (layer, head).")
    return selected
