"""The pruning curve (Michel et al. 2019, "Are Sixteen Heads Really Better than One?", §4.2 and
Fig. 3): prune heads by importance and score what is left at each fraction, as a table and a
figure. The heads are ablated by the intervention ``"ablation.<mode>"`` of
:func:`attnlens.methods.interventions.build` (the ablation itself is
:mod:`attnlens.methods.ablation`; ``attnlens.ablation`` gathers both).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from jaxtyping import Float
from torch import Tensor

from attnlens.core import checks
from attnlens.core.heads import HeadSet
from attnlens.core.loading import require_bridge
from attnlens.errors import InputError, InputTypeError
from attnlens.methods import interventions
from attnlens.methods.ablation import AblationHooks, Importance, check_order
from attnlens.methods.ablation import hooks as ablation_hooks

#: Fractions of heads pruned in :func:`prune_curve` by default (0, 10 %, ..., 90 %).
FRACTIONS: tuple[float, ...] = tuple(i / 10 for i in range(10))

#: Columns of :func:`prune_curve`'s table.
COLUMNS = {
    "fraction_pruned": "share of all heads pruned",
    "heads_pruned": "number of heads pruned",
    "score": "score_fn(hooks) with those heads ablated",
    "order": "'ascending' (least important pruned first) or 'descending'",
}


def prune_curve(
    model: Any,
    importance: Importance | Float[Tensor, "layer head"],
    score_fn: Callable[[AblationHooks], float],
    *,
    fractions: Sequence[float | int] = FRACTIONS,
    mode: str = "zero",
    order: str | Sequence[str] = "ascending",
    means: Float[Tensor, "layer head d_head"] | None = None,
    constants: Any = None,
) -> tuple[Any, Any]:
    """Prune heads by importance and score what is left (Michel et al. 2019, §4.2 and Fig. 3).

    At each fraction of ``fractions`` the ``round(fraction · heads)`` first heads of
    ``importance`` (an :class:`Importance`, ranked by its layer-normalised ``scores``, or any
    ``[layer, head]`` tensor of scores) in ``order`` (``"ascending"``: least important first, as
    Michel et al. prune; ``"descending"``: most important first; or a list of both) are ablated
    in ``mode`` (``"zero"``, ``"uniform"``, ``"mean"`` with ``means=``, ``"papa"`` with
    ``constants=``) by the intervention ``"ablation.<mode>"``
    (:func:`attnlens.methods.interventions.build`, which makes
    :func:`attnlens.methods.ablation.hooks`), and ``score_fn(hooks)`` gives the score, e.g.
    ``lambda hooks: probing.run(model, "sst2", hooks=hooks).score``. A set of heads already
    scored (fraction 0 in each order) is not scored again.

    The ranking is made once, from ``importance`` as given, and is not re-estimated on the pruned
    model after each step (Hugging Face's ``bertology`` script re-estimates it as it masks heads
    step by step: for that, call :func:`attnlens.evaluation.importance.importance` with
    ``hooks=`` the pruned heads' ablation). It is global: nothing keeps a head in every layer, so a fraction can
    prune a whole layer (as Michel et al.'s code and ``bertology`` do by default).

    Returns ``(table, figure)``: a ``pandas.DataFrame`` with the columns of :data:`COLUMNS`
    (``fraction_pruned``, ``heads_pruned``, ``score``, ``order``) and a plotly figure of score
    against the percentage of heads pruned, one line per order.
    """
    import pandas as pd

    require_bridge(model, "ablation.prune_curve")
    if not callable(score_fn):
        raise InputTypeError(f"score_fn must be a callable score_fn(hooks) -> float; got {checks.describe(score_fn)}.")
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    if not isinstance(importance, Importance):
        scores = checks.shape(checks.tensor(importance, "importance"), "importance", [n_layers, n_heads],
                              "layer, head: one score per head")
        checks.finite_tensor(scores.float(), "importance")
        importance = Importance(scores=scores.detach().float().cpu(), raw=scores.detach().float().cpu())
    elif importance.shape != (n_layers, n_heads):
        raise InputError(
            f"importance is {list(importance.shape)} (layers x heads) but the model has "
            f"[{n_layers}, {n_heads}]: it was computed on another model."
        )
    orders = [order] if isinstance(order, str) else list(order)
    if not orders:
        raise InputError("order must name at least one order: 'ascending' and/or 'descending'.")
    for name in orders:
        check_order(name)
    if isinstance(fractions, str | bytes) or not isinstance(fractions, Iterable):
        raise InputTypeError(f"fractions must be a list of floats in [0, 1]; got {checks.describe(fractions)}.")
    fractions = [checks.finite(f, f"fractions[{i}]", low=0.0, high=1.0) for i, f in enumerate(fractions)]
    if not fractions:
        raise InputError("fractions must hold at least one fraction in [0, 1].")
    # the arguments, checked with ablation's own messages before any score is computed
    ablation_hooks(HeadSet.none(n_layers, n_heads), mode, model=model, means=means, constants=constants)
    scored: dict[bytes, float] = {}
    rows = []
    for name in orders:
        for fraction in fractions:
            pruned = importance.heads(fraction, order=name)
            signature = pruned.mask.numpy().tobytes()
            if signature not in scored:
                hooks = interventions.build(f"ablation.{mode}", model, pruned, means=means, constants=constants)
                value = score_fn(hooks)
                scored[signature] = checks.finite(value, "score_fn's score")
            rows.append(dict(fraction_pruned=fraction, heads_pruned=len(pruned), score=scored[signature],
                             order=name))
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    return table, prune_figure(table, mode=mode)


def prune_figure(table: Any, *, mode: str = "zero") -> Any:
    """Score against the percentage of heads pruned, one line per order (Michel et al. 2019,
    Fig. 3), from the table of :func:`prune_curve`."""
    import plotly.graph_objects as go

    figure = go.Figure()
    names = {"ascending": "least important first", "descending": "most important first"}
    for name in dict.fromkeys(table["order"]):
        points = table[table["order"] == name].sort_values("fraction_pruned")
        figure.add_trace(go.Scatter(
            x=points["fraction_pruned"] * 100, y=points["score"], mode="lines+markers",
            name=names.get(name, name), customdata=points["heads_pruned"],
            hovertemplate="pruned %{x:.0f}% (%{customdata} heads)<br>score %{y:.4f}<extra></extra>",
        ))
    figure.update_layout(
        title=f"Pruning heads by importance (Michel et al. 2019), mode={mode!r}",
        xaxis_title="percentage of heads pruned", yaxis_title="score", height=380, width=560,
        margin={"t": 50, "b": 40},
    )
    figure.update_xaxes(range=[-2, 102])
    return figure
