"""Constants trained with labelled data: the "Toeplitz init." and "average init." rows of PAPA's
Table 1 (Hassid et al. 2022, §5.2).

The paper's labelled matrices start from the Toeplitz matrix or from PAPA's average constants
and "are updated during the training procedure of the probing classifier". :func:`train_constants`
does that for any differentiable loss: every head's pattern is the softmax of
:class:`~attnlens.methods.papa.baselines.TrainableConstants`' logits over each example's valid
keys (replace mode, every head), and Adam steps train the logits, together with the tensors in
``jointly`` (a probe's parameters), while the model's own weights stay frozen. The task-probe
recipe that the curve and Table 1 use is
:func:`attnlens.evaluation.curve_inputs.labelled_constants`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from attnlens.core import seam
from attnlens.core.checks import finite, whole_number
from attnlens.core.modes import gradients
from attnlens.engine.batches import progress_bar
from attnlens.errors import InputError, InputTypeError
from attnlens.methods.papa.baselines import TrainableConstants
from attnlens.methods.papa.constants import PapaConstants
from attnlens.methods.papa.intervene import intervention


@gradients()  # autograd on, whatever the caller's mode
def train_constants(
    model: Any,
    constants: TrainableConstants,
    *,
    loss_fn: Callable[[Tensor, Any], Tensor],
    batches: Iterable[Any],
    steps: int = 200,
    lr: float = 1e-2,
    jointly: Sequence[Tensor] = (),
    jointly_lr: float = 1e-3,
    progress: bool = True,
) -> PapaConstants:
    """Train ``constants``' logits in every head of ``model`` (replace mode) to lower a loss.

    Each step runs ``model`` on the next batch (an :class:`attnlens.Batch`, cycling through
    ``batches``) with every head's pattern the softmax of the logits over the example's valid
    keys, and takes one Adam step (learning rate ``lr``) on the logits, and on the tensors of
    ``jointly`` (e.g. a probe's parameters, as the paper trains the matrices with the probe) with
    ``jointly_lr``, for ``loss_fn(logits, batch)``, a scalar. The model's weights are frozen
    meanwhile (their ``requires_grad`` is restored afterwards) and gradients are taken with
    ``torch.autograd.grad``, so no other ``.grad`` changes. ``constants`` is trained in place;
    returns its :meth:`~TrainableConstants.to_constants` snapshot (``kind="trained"``), usable
    wherever fitted constants are (hooks, the curve, the feature cache's keys).
    """
    if not isinstance(constants, TrainableConstants):
        raise InputTypeError("train_constants trains TrainableConstants (TrainableConstants.from_toeplitz(model, "
                             f"max_len=...) or .from_average(fitted)), not {type(constants).__name__}.")
    steps = whole_number(steps, "steps", " of training steps", minimum=1)
    lr, jointly_lr = finite(lr, "lr", low=0.0), finite(jointly_lr, "jointly_lr", low=0.0)
    batches, jointly = list(batches), list(jointly)
    if not batches:
        raise InputError("train_constants needs at least one batch.")
    frozen = [(param, param.requires_grad) for param in model.parameters()]
    for param, _ in frozen:
        param.requires_grad_(False)
    constants.logits.requires_grad_(True)
    trained = [constants.logits, *jointly]
    groups = [{"params": [constants.logits], "lr": lr}, *([{"params": jointly, "lr": jointly_lr}] if jointly else [])]
    optimizer = torch.optim.Adam(groups)
    bar = progress_bar(range(steps), "papa.train_constants", progress, unit="step")
    try:
        with intervention(model, constants, heads="all", mode="replace"):
            for batch in itertools.islice(itertools.cycle(batches), steps):
                with seam.batch_positions(batch.position_ids):  # a compact batch's positions
                    loss = loss_fn(model(batch.input_ids, **batch.model_kwargs()), batch)
                if loss.ndim != 0:
                    raise InputError(f"loss_fn must return a scalar, got shape {tuple(loss.shape)}.")
                gradients = torch.autograd.grad(loss, trained, allow_unused=True) if loss.requires_grad else [None]
                if gradients[0] is None:
                    raise InputError("loss_fn's loss does not depend on the constants; compute it from the "
                                     "model's outputs (or hooked activations) of the batch it is given.")
                for tensor, gradient in zip(trained, gradients, strict=True):
                    tensor.grad = gradient
                optimizer.step()
                bar.set_postfix(loss=f"{float(loss.detach()):.4g}", refresh=False)
                bar.update(1)
    finally:
        bar.close()
        for param, requires_grad in frozen:
            param.requires_grad_(requires_grad)
    return constants.to_constants()
