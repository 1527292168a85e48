"""Modes: a model in eval mode with each module's own mode given back after (:func:`eval_mode`),
and autograd's, whatever the caller's (:func:`gradients`, :func:`version`).

``nn.Module.eval()`` walks the whole module tree and sets every flag, and a TransformerBridge
walks the Hugging Face model it wraps as well: about 850 modules for MiniLM, 6 ms at one thread,
twice per pass over a corpus. :func:`eval_mode` does that only when some module is in training
mode; a model already in eval mode (what :func:`attnlens.load` returns) is left as it is. After,
exactly the modules that were training train again, whatever mixture of modes they had.

A notebook often runs everything under ``torch.inference_mode()`` or ``torch.no_grad()``. What
attnlens trains (probes, the pattern CNN, PAPA's λ and trainable constants) and head importance
(gradients of the gates) run under :func:`gradients`, which switches autograd on inside any of
them; and what attnlens caches by a tensor's in-place version asks :func:`version`, since a tensor
made under inference mode has no version counter.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def _modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every module of ``model``, and of the Hugging Face model a bridge keeps outside its own
    module tree (``original_model``), each once."""
    found = {id(module): module for module in model.modules()}
    original = getattr(model, "original_model", None)
    if isinstance(original, torch.nn.Module):
        for module in original.modules():
            found.setdefault(id(module), module)
    return list(found.values())


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``model`` in eval mode (dropout off) inside the block; the modes it had after it."""
    training = [module for module in _modules(model) if module.training]
    if not training:
        yield model
        return
    model.eval()
    try:
        yield model
    finally:
        for module in training:
            module.training = True


@contextmanager
def gradients() -> Iterator[None]:
    """Autograd on inside the block, whatever the caller's mode: ``torch.inference_mode(False)``
    (tensors made inside are ordinary ones, which autograd may save) and ``torch.enable_grad()``
    (under ``torch.no_grad()`` too). Also a decorator (``@gradients()``): what attnlens trains
    runs under it, so ``fit`` works inside ``with torch.inference_mode():``."""
    with torch.inference_mode(False), torch.enable_grad():
        yield


def version(tensor: torch.Tensor) -> object:
    """``tensor``'s in-place version (``Tensor._version``, which every in-place change bumps), for a
    cache to tell whether it changed; a tensor made under ``torch.inference_mode`` keeps none, so it
    gets a new object each time: always changed (recomputed, never a stale entry)."""
    return object() if tensor.is_inference() else tensor._version
