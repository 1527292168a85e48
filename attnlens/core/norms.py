"""TransformerLens's normalization bridges without the work nobody reads.

A TransformerLens 4.x ``NormalizationBridge`` (every LayerNorm and RMSNorm of a bridge) runs the
Hugging Face module it wraps through ``_hf_autograd_forward_with_hooks``: at every call it first
computes the values its ``hook_scale`` and ``hook_normalized`` would show (the mean, the centred
input, the variance, ``rsqrt``, ``sqrt`` and a product: nine kernels), passes them through those
hook points, and, when no hook returned an edit, returns the Hugging Face module's own output.
With no hook on either point, those values go nowhere: 117 of the 266 operators of a MiniLM
forward (13 LayerNorms), each a kernel launch on a GPU, where a forward is bound by launches.

:func:`install` gives each normalization bridge of a model a method that calls the Hugging
Face module directly while neither hook point holds a hook (forward or backward, added by
``run_with_hooks``, ``run_with_cache``, ``model.hooks()`` or ``add_hook``: TransformerLens's own
test of whether to go the slow way), and TransformerLens's method otherwise. The output is the
same bit for bit (the same module on the same input), and so is everything the hook points show
or edit when hooked. What changes: a hook registered on the hook points by other means than
TransformerLens's (a global ``torch.nn.modules.module.register_module_forward_hook``) no longer
sees these two points unless one of them is hooked.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from attnlens.core.seam import hooked

#: the method of TransformerLens's normalization bridges that :func:`install` shortcuts
METHOD = "_hf_autograd_forward_with_hooks"


def install(bridge: Any) -> Any:
    """Give every normalization bridge of ``bridge`` the direct path (in place; returns it)."""
    for module in _norms(bridge):
        setattr(module, METHOD, functools.partial(_direct, module))
    return bridge


def is_installed(bridge: Any) -> bool:
    """Whether every normalization bridge of ``bridge`` has the direct path."""
    return all(isinstance(vars(module).get(METHOD), functools.partial) for module in _norms(bridge))


def _norms(bridge: Any) -> list[Any]:
    """The normalization bridges of ``bridge`` that have TransformerLens 4.x's method."""
    # imported here, as attnlens.core.loading imports TransformerLens: seconds of imports that
    # ``import attnlens`` (and ``attnlens --help``) does without
    from transformer_lens.model_bridge.generalized_components.normalization import (
        NormalizationBridge,
    )

    return [module for module in bridge.modules()
            if isinstance(module, NormalizationBridge) and hasattr(type(module), METHOD)]


def _direct(module: Any, x: Tensor) -> Tensor:
    """The Hugging Face module's output, as TransformerLens returns it when nothing edits the
    hook points; TransformerLens's own method when a hook is on them (or for its pass-through
    slots, ``torch.nn.Identity``)."""
    original = module.original_component
    if hooked(module.hook_scale) or hooked(module.hook_normalized) or isinstance(original, torch.nn.Identity):
        return getattr(type(module), METHOD)(module, x)
    result = original(x)
    return result if result.dtype == x.dtype else result.to(x.dtype)
