"""Which heads to replace: :class:`HeadSet` and :func:`select_heads`.

Every strategy ranks all ``layers × heads`` heads in the order they should be replaced and keeps
the first ``round(k · layers · heads)`` (``fraction=k``, rounding halves up) or the first ``n``:

- ``"lambda"``: lowest learned ``λ`` first. ``λ`` is learned by blending every head
  (``B = λ·A + (1 − λ)·C``) and training ``θ`` (``λ = sigmoid(θ)``) with any differentiable
  loss you pass (:func:`learn_lambda`), or given as ``lam=``;
- ``"reversed_lambda"``: highest ``λ`` first;
- ``"first_to_last"``: layer 0 first (heads in index order within a layer);
- ``"last_to_first"``: the last layer first (heads in index order within a layer);
- ``"random"``: a random order drawn with ``seed``;
- ``"input_dependence"``: label-free, least input-dependent head first, by
  :attr:`PapaConstants.input_dependence` measured during the fit (the mean squared distance
  between each example's attention rows and the head's mean rows).

The orders themselves, and ``heads=`` read as a :class:`HeadSet`, are in
:mod:`attnlens.methods.papa.ranking`, below the hooks; this module learns ``λ`` by running them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from attnlens.core import seam
from attnlens.core.checks import finite, finite_tensor, tensor, whole_number
from attnlens.core.heads import HeadSet, n_selected  # HeadSet's old home: re-exported
from attnlens.core.loading import require_bridge
from attnlens.core.modes import gradients
from attnlens.engine.batches import progress_bar
from attnlens.errors import InputError
from attnlens.methods.papa.intervene import intervention
from attnlens.methods.papa.ranking import STRATEGIES, input_dependence, ranked, resolve_heads

__all__ = ["STRATEGIES", "HeadSet", "learn_lambda", "n_selected", "resolve_heads", "select_heads"]


def select_heads(
    strategy: str,
    *,
    fraction: float | None = None,
    n: int | None = None,
    constants: Any = None,
    model: Any = None,
    n_layers: int | None = None,
    n_heads: int | None = None,
    seed: int = 0,
    lam: Float[Tensor, "layer head"] | None = None,
    loss_fn: Callable[[Tensor, Any], Tensor] | None = None,
    batches: Iterable[Any] | None = None,
    steps: int = 100,
    lr: float = 0.05,
    progress: bool = True,
) -> HeadSet:
    """The heads to replace, by ``strategy`` (one of :data:`STRATEGIES`), in replacement order.

    Give ``fraction=k`` (``round(k · layers · heads)`` heads) or ``n=`` (a count). The shape comes
    from ``constants``, ``model``, ``n_layers``/``n_heads``, or a ``[layer, head]`` ``lam=`` alone. ``"input_dependence"`` needs fitted
    ``constants`` (:class:`PapaConstants` from :func:`attnlens.papa.fit`). The λ strategies use
    ``lam=`` (exactly ``[n_layers, n_heads]``) if given, otherwise learn it with
    :func:`learn_lambda` (``model``, ``constants``, ``loss_fn``, ``batches``, ``steps``, ``lr``,
    ``progress``). The returned :class:`HeadSet` carries ``order`` and ``scores``.
    """
    if strategy not in STRATEGIES:
        raise InputError(f"Unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}.")
    seed = whole_number(seed, "seed")
    if lam is not None:
        lam = tensor(lam, "lam")
    if lam is not None and constants is None and model is None and n_layers is None and n_heads is None:
        if lam.ndim == 2:  # a λ table alone says the shape
            n_layers, n_heads = lam.shape
    n_layers, n_heads = _shape(constants, model, n_layers, n_heads)
    if (fraction is None) == (n is None):
        raise InputError("Pass exactly one of fraction= and n=.")
    count = n_selected(fraction, n_layers, n_heads) if n is None else whole_number(n, "n", " of heads")
    if not 0 <= count <= n_layers * n_heads:
        raise InputError(f"n must lie in [0, {n_layers * n_heads}] (the {n_layers} x {n_heads} heads), got {count}.")
    if strategy in ("lambda", "reversed_lambda") and lam is None:
        steps = whole_number(steps, "steps", " of training steps", minimum=1)
        lr = finite(lr, "lr", low=0.0)
    scores = None
    if strategy in ("lambda", "reversed_lambda"):
        if lam is None:
            if model is None or constants is None or loss_fn is None or batches is None:
                raise InputError(
                    f"strategy {strategy!r} needs lam=, or model=, constants=, loss_fn= and "
                    "batches= to learn it."
                )
            lam = learn_lambda(
                model, constants, loss_fn=loss_fn, batches=batches, steps=steps, lr=lr,
                progress=progress,
            )
        scores = finite_tensor(torch.as_tensor(lam).detach().float().cpu(), "lam")
        if scores.shape != (n_layers, n_heads):
            raise InputError(
                f"lam= is {list(scores.shape)}, not [n_layers, n_heads] = [{n_layers}, {n_heads}]; "
                f"pass one λ per head as a [{n_layers}, {n_heads}] tensor (layers first)."
            )
    elif strategy == "input_dependence":
        scores = input_dependence(constants)
    return ranked(strategy, count, n_layers, n_heads, scores=scores, seed=seed)


@gradients()  # autograd on, whatever the caller's mode
def learn_lambda(
    model: Any,
    constants: Any,
    *,
    loss_fn: Callable[[Tensor, Any], Tensor],
    batches: Iterable[Any],
    steps: int = 100,
    lr: float = 0.05,
    progress: bool = True,
    jointly: Sequence[Tensor] = (),
    jointly_lr: float = 1e-3,
) -> Float[Tensor, "layer head"]:
    """Learn ``λ`` per head by blending every head with ``constants`` and minimizing a loss.

    Each step runs ``model`` on the next batch (an :class:`attnlens.Batch`, cycling through
    ``batches``) with blend hooks and takes an Adam step on ``θ`` (``λ = sigmoid(θ)``, ``θ``
    starts at 0) for ``loss_fn(logits, batch)``, e.g. a probe's loss. ``progress`` shows a tqdm
    bar over the ``steps`` with the last loss. Returns ``λ`` ``[layer, head]`` (detached).

    Only ``θ`` is trained, and the tensors in ``jointly`` (e.g. a probe's parameters, which the
    paper trains together with ``λ``), with their own Adam learning rate ``jointly_lr``: the
    model's weights and trainable constants' logits are frozen meanwhile (their
    ``requires_grad`` is restored afterwards), and gradients are taken with
    ``torch.autograd.grad``, so no other ``.grad`` (the model's, the constants') is changed.
    """
    steps = whole_number(steps, "steps", " of training steps", minimum=1)
    lr, jointly_lr = finite(lr, "lr", low=0.0), finite(jointly_lr, "jointly_lr", low=0.0)
    batches = list(batches)
    if not batches:
        raise InputError("learn_lambda needs at least one batch.")
    frozen = _freeze([*model.parameters(), *_parameters(constants)])
    bar = progress_bar(range(steps), "papa.learn_lambda", progress, unit="step")
    try:
        jointly = list(jointly)
        with intervention(model, constants, heads="all", mode="blend") as blend:
            groups = [{"params": [blend.theta], "lr": lr}]
            if jointly:
                groups.append({"params": jointly, "lr": jointly_lr})
            optimizer = torch.optim.Adam(groups)
            for batch in itertools.islice(itertools.cycle(batches), steps):
                with seam.batch_positions(batch.position_ids):  # a compact batch's positions
                    loss = loss_fn(model(batch.input_ids, **batch.model_kwargs()), batch)
                blend.theta.grad = _theta_gradient(loss, blend.theta, jointly)
                optimizer.step()
                bar.set_postfix(loss=f"{float(loss.detach()):.4g}", refresh=False)
                bar.update(1)
            return blend.lam.detach()
    finally:
        bar.close()
        for param, requires_grad in frozen:
            param.requires_grad_(requires_grad)


def _parameters(constants: Any) -> list[Tensor]:
    """Trainable tensors of ``constants`` (the logits of :class:`TrainableConstants`), if any."""
    parameters = getattr(constants, "parameters", None)
    return list(parameters()) if callable(parameters) else []


def _freeze(params: list[Tensor]) -> list[tuple[Tensor, bool]]:
    """Set ``requires_grad=False`` on ``params``; returns each with its previous setting."""
    frozen = [(param, param.requires_grad) for param in params]
    for param, _ in frozen:
        param.requires_grad_(False)
    return frozen


def _theta_gradient(loss: Tensor, theta: Tensor, jointly: Sequence[Tensor] = ()) -> Float[Tensor, "layer head"]:
    """``d loss / d θ``, without touching any other tensor's ``.grad`` but those of
    ``jointly``, which get theirs (one backward pass for all)."""
    if loss.ndim != 0:
        raise InputError(f"loss_fn must return a scalar, got shape {tuple(loss.shape)}.")
    gradient = None
    if loss.requires_grad:
        gradient, *others = torch.autograd.grad(loss, [theta, *jointly], allow_unused=True)
        for tensor, grad in zip(jointly, others, strict=True):
            tensor.grad = grad
    if gradient is None:
        raise InputError(
            "loss_fn's loss does not depend on the blended attention; compute it from the logits "
            "learn_lambda passes it."
        )
    return gradient


def _shape(constants: Any, model: Any, n_layers: int | None, n_heads: int | None) -> tuple[int, int]:
    if constants is not None:
        return constants.n_layers, constants.n_heads
    if model is not None:
        require_bridge(model, "papa.select_heads")
        return int(model.cfg.n_layers), int(model.cfg.n_heads)
    if n_layers is None or n_heads is None:
        raise InputError("Pass constants=, model= or n_layers= and n_heads=.")
    return (whole_number(n_layers, "n_layers", " of layers", minimum=1),
            whole_number(n_heads, "n_heads", " of heads per layer", minimum=1))
