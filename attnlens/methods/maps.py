"""Any registered view's maps for one batch: ``attnlens.maps(model, batch, view)``.

One forward of the batch, read by the pass engine's own hooks
(:func:`attnlens.engine.forward.pattern_hooks`): every layer's pattern (and value vectors, when
the view reads them: :attr:`attnlens.methods.views.View.reads`) is handed to the view as a
:class:`attnlens.engine.accumulator.LayerPatterns`, exactly as a corpus pass hands it to an
accumulator, and the view's maps are gathered into one ``[layer, batch, head, query, key]``
tensor. The forward stops after the last layer's pattern. A new view registered with
:func:`attnlens.methods.views.register_view` is read here with no other change.
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from attnlens.core import devices
from attnlens.core.checks import describe, flag
from attnlens.core.inputs import Batch
from attnlens.core.loading import require_bridge
from attnlens.core.modes import eval_mode, own_arithmetic
from attnlens.engine.accumulator import LayerPatterns, PassBatch
from attnlens.engine.forward import check_token_ids, device_of, pattern_hooks, run_patterns
from attnlens.errors import InputError, InputTypeError
from attnlens.methods import views


def maps(model: Any, batch: Batch, view: Any = "standard", *, raw: bool = False
         ) -> Float[Tensor, "layer batch head query key"]:
    """``view``'s maps of every layer for ``batch``: ``[layer, batch, head, query, key]``.

    ``model``: a TransformerBridge (:func:`attnlens.load`); ``batch``: a :class:`attnlens.Batch`
    (:func:`attnlens.tokenize`); ``view``: the name of a registered view (``"standard"``,
    ``"effective"``, ``"norm"``, ...; :data:`attnlens.methods.views.REGISTRY`), a registered
    :class:`~attnlens.methods.views.View`, or the value of a view given by one (PAPA constants,
    checked against the model and the batch's layout). ``raw=True``: the maps before the view's
    row normalisation, for a view that has them (:attr:`View.raw`; ``"norm"``: ``α · ‖f(x)‖``).

    Axes: the model's layers; the batch's examples; its query heads (a model with grouped
    key-value heads still has one map per query head); query and key positions (the batch's
    columns; padding keys hold 0 in ``"norm"``, and what the model gives them in
    ``"standard"``). Read under ``torch.no_grad`` in eval mode, on the model's device; the
    model's output is not computed (the forward stops after the last layer's pattern).
    """
    require_bridge(model, "attnlens.maps")
    if not isinstance(batch, Batch):
        raise InputTypeError(f"attnlens.maps takes a Batch from attnlens.tokenize, got {describe(batch)}.")
    chosen = views.get_view(view)
    raw = flag(raw, "raw")
    constants = None if isinstance(view, str | views.View) else view
    if chosen.takes_constants:
        if constants is None:  # its name: the maps need its value
            raise InputError(f"the {chosen.name!r} view is given to maps by its value, not its name: pass "
                             f"{chosen.value_hint or 'its value'} (attnlens.maps(model, batch, constants)).")
        constants.check_compatible(model, batch)
    if raw and chosen.raw is None:
        having = [name for name, value in views.REGISTRY.items() if value.raw is not None]
        raise InputError(f"the view {chosen.name!r} has no raw maps (its maps are the raw ones); raw=True "
                         f"is for {', '.join(repr(name) for name in having) or 'no registered view'}.")
    check_token_ids(model, batch)
    on_device = batch.to(device_of(model))
    # its tokens counted on the batch given, where that is free (a batch on the host); a batch
    # given on a device is counted there
    n_tokens = int(batch.attention_mask.sum()) if devices.reads_are_free(batch.attention_mask) else None
    current = PassBatch(on_device, 0, model, n_tokens=n_tokens, on_host=batch)
    n_layers = int(model.cfg.n_layers)
    gathered: list[Tensor] = []

    def on_pattern(layer: int, pattern: Tensor, values: Tensor | None, valid: Tensor) -> None:
        patterns = LayerPatterns(layer, pattern, current, values)
        made = chosen.raw(patterns) if raw else chosen.read(patterns, constants)
        if not gathered:  # one buffer, filled as the forward goes: each layer's maps freed at once
            gathered.append(made.new_empty((n_layers, *made.shape)))
        gathered[0][layer].copy_(made)

    hooks = pattern_hooks(model, on_pattern, values=chosen.needs_values)
    with eval_mode(model), torch.no_grad(), own_arithmetic():
        run_patterns(model, on_device, hooks)
    return gathered[0]
