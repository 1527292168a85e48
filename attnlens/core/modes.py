"""Run a model in eval mode, and give each of its modules its own mode back after.

``nn.Module.eval()`` walks the whole module tree and sets every flag, and a TransformerBridge
walks the Hugging Face model it wraps as well: about 850 modules for MiniLM, 6 ms at one thread,
twice per pass over a corpus. :func:`eval_mode` does that only when some module is in training
mode; a model already in eval mode (what :func:`attnlens.load` returns) is left as it is. After,
exactly the modules that were training train again, whatever mixture of modes they had.
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
