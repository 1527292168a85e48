"""Modes: a model in eval mode with each module's own mode given back after (:func:`eval_mode`),
and autograd's and torch's arithmetic, whatever the caller's (:func:`gradients`, :func:`version`,
:func:`own_arithmetic`).

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

A notebook may also change torch's global arithmetic. Under ``torch.autocast`` every matrix
product of a float32 model is a bfloat16 (or float16) one; after
``torch.set_default_dtype(torch.float64)`` every tensor and layer made without a dtype is float64.
attnlens computes in the model's dtype and trains in float32, and its keys (features cache,
checkpoints, PAPA constants, curve points) name those: under autocast a feature extraction
stopped on mixed dtypes deep inside torch and ``papa.fit`` or ``compare`` gave half-precision
numbers under a float32 model's name; under a float64 default a probe stopped inside its pooling
(a float64 layer on float32 features). :func:`own_arithmetic` gives attnlens's passes, forwards,
training and predictions their own: autocast off and float32 products in full float32 (after
``torch.set_float32_matmul_precision("high")``, TensorFloat-32 on a GPU; ``"medium"``, bfloat16
on a CPU with AVX512-BF16 or AMX: numbers 1e-7 to 1e-3 off float32's, under float32's keys), with one
:class:`ReducedPrecisionOff` warning, and float32 as the default dtype. A model loaded in bfloat16 (``attnlens.load(..., dtype=torch.bfloat16)``)
is what runs attnlens in it, its statistics accumulated in float32.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import torch

from attnlens.errors import AttnlensWarning

#: the device types whose ``torch.autocast`` :func:`own_arithmetic` turns off
AUTOCAST_DEVICES = ("cpu", "cuda", "mps", "xpu")
#: the ``torch.backends`` whose float32 matrix products :func:`own_arithmetic` keeps in full
#: precision (``torch.backends.<name>.matmul.fp32_precision``): cuBLAS, and oneDNN on the CPU
#: (bfloat16 products on a CPU with AVX512-BF16 or AMX under ``"medium"``)
MATMUL_BACKENDS = ("cuda", "mkldnn")
#: the ``fp32_precision`` values that leave float32 products in float32 ("none": torch's default)
FULL_PRECISION = frozenset({"none", "ieee"})


class ReducedPrecisionOff(AttnlensWarning):
    """``torch.autocast``, or TensorFloat-32 or bfloat16 float32 matrix products
    (``torch.set_float32_matmul_precision("high")`` or ``"medium"``), was on around an attnlens
    call: attnlens turned it off inside, so its numbers are the model's dtype's, as its keys say
    (:func:`own_arithmetic`)."""


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
    runs under it, so ``fit`` works inside ``with torch.inference_mode():``; with
    :func:`own_arithmetic`, it trains in float32 whatever the caller's autocast and default dtype."""
    with torch.inference_mode(False), torch.enable_grad(), own_arithmetic():
        yield


@contextmanager
def own_arithmetic() -> Iterator[None]:
    """attnlens's own arithmetic inside the block, whatever the caller's: ``torch.autocast`` off
    for every device type it is on for (of :data:`AUTOCAST_DEVICES`); float32 matrix products in
    full float32 (``fp32_precision`` ``"ieee"`` for each of :data:`MATMUL_BACKENDS`, where
    ``torch.set_float32_matmul_precision("high")`` or ``"medium"`` makes them TensorFloat-32 or
    bfloat16 ones); one :class:`ReducedPrecisionOff` warning naming what was on; and float32 as
    torch's default dtype (what attnlens makes without naming a dtype: a probe's layers, a sum's
    zeros). The caller's settings are given back after. A few microseconds when all are already
    so. Also a decorator. What attnlens runs (its passes, forwards, training and predictions) runs
    under it: the numbers its keys name."""
    on = [device for device in AUTOCAST_DEVICES if torch.is_autocast_enabled(device)]
    matmuls = matmul_precisions()
    reduced = {name: value for name, value in matmuls.items() if value not in FULL_PRECISION}
    default = torch.get_default_dtype()
    if not on and not reduced and default == torch.float32:
        yield
        return
    if on or reduced:
        named = []
        if on:
            named.append("torch.autocast is on for " + ", ".join(
                f"{device} ({str(torch.get_autocast_dtype(device)).removeprefix('torch.')})" for device in on))
        if reduced:
            named.append("float32 matrix products are reduced to " + ", ".join(
                f"{value} on {name}" for name, value in reduced.items()) + " (torch.set_float32_matmul_precision)")
        warnings.warn(
            f"{'; '.join(named)}: attnlens computes in the model's dtype, in full precision, "
            "as its cache keys, checkpoints and constants record, so it turns reduced precision off "
            "inside its calls. To run attnlens in bfloat16, load the model in it: "
            "attnlens.load(..., dtype=torch.bfloat16) (statistics are accumulated in float32).",
            ReducedPrecisionOff,
            stacklevel=3,
        )
    with ExitStack() as stack:
        for device in on:
            stack.enter_context(torch.autocast(device, enabled=False))
        set_matmul_precisions(dict.fromkeys(reduced, "ieee"))
        torch.set_default_dtype(torch.float32)
        try:
            yield
        finally:
            torch.set_default_dtype(default)
            set_matmul_precisions({name: matmuls[name] for name in reduced})


def matmul_precisions() -> dict[str, str]:
    """The precision of float32 matrix products, by backend of :data:`MATMUL_BACKENDS`
    (``torch.backends.<name>.matmul.fp32_precision``: "none", "ieee", "tf32" or "bf16"); with a
    torch before 2.9, which has one setting for all, ``{"torch": "ieee"}`` for
    ``torch.get_float32_matmul_precision()`` "highest", else ``{"torch": "high"}`` or "medium"."""
    if all(hasattr(getattr(torch.backends, name), "matmul") for name in MATMUL_BACKENDS):
        return {name: getattr(torch.backends, name).matmul.fp32_precision for name in MATMUL_BACKENDS}
    legacy = torch.get_float32_matmul_precision()
    return {"torch": "ieee" if legacy == "highest" else legacy}


def set_matmul_precisions(precisions: dict[str, str]) -> None:
    """Set what :func:`matmul_precisions` reads (``"ieee"`` for ``"torch"``: "highest")."""
    for name, value in precisions.items():
        if name == "torch":
            torch.set_float32_matmul_precision("highest" if value == "ieee" else value)
        else:
            getattr(torch.backends, name).matmul.fp32_precision = value


def version(tensor: torch.Tensor) -> object:
    """``tensor``'s in-place version (``Tensor._version``, which every in-place change bumps), for a
    cache to tell whether it changed; a tensor made under ``torch.inference_mode`` keeps none, so it
    gets a new object each time: always changed (recomputed, never a stale entry)."""
    return object() if tensor.is_inference() else tensor._version
