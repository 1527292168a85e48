"""attnlens: how much does a pretrained transformer use its input-dependent attention?

Methods are hooks on TransformerLens hook points of an unmodified model:

- :mod:`attnlens.papa`: constant attention (Hassid et al. 2022);
- :mod:`attnlens.effective`: effective attention (Brunner et al. 2020; Sun & Marasović 2021);
- :mod:`attnlens.stats`: what heads look at (Clark et al. 2019);
- :mod:`attnlens.compare` and :mod:`attnlens.plots`: head-grid views and reports.

``attnlens.load()`` returns a ``TransformerBridge`` on which ``blocks.{l}.attn.hook_pattern``
is a real intervention point (see :mod:`attnlens.seam`).

``attnlens.compare`` is both a module and callable: ``attnlens.compare(model, "papa",
"effective")`` calls :func:`attnlens.compare.compare`.
"""

from __future__ import annotations

import importlib
from typing import Any

from attnlens.inputs import Batch, tokenize
from attnlens.loading import load

__version__ = "0.1.0"

#: submodules imported on first use (keeps ``import attnlens`` light)
_SUBMODULES = ("papa", "effective", "stats", "plots", "compare", "seam", "corpus", "cli")
#: names re-exported lazily from submodules
_LAZY = {
    "effective_attention": ("attnlens.effective", "effective_attention"),
    "Comparison": ("attnlens.compare", "Comparison"),
}

__all__ = ["Batch", "load", "tokenize", "effective_attention", "Comparison", *_SUBMODULES]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    if name in _SUBMODULES:
        return importlib.import_module(f"attnlens.{name}")
    raise AttributeError(f"module 'attnlens' has no attribute {name!r}")
