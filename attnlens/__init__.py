"""attnlens: how much does a pretrained transformer use its input-dependent attention?

Methods are hooks on TransformerLens hook points of an unmodified model:

- :mod:`attnlens.papa`: constant attention (Hassid et al. 2022);
- :mod:`attnlens.methods.effective`: effective attention (Brunner et al. 2020; Sun & Marasović 2021);
- :mod:`attnlens.methods.stats`: what heads look at (Clark et al. 2019);
- :func:`attnlens.compare` (:mod:`attnlens.comparison`) and :mod:`attnlens.core.plots`: head-grid views and reports;
- :mod:`attnlens.engine.passes`: the one loop over a corpus (accumulators, checkpoints, torchrun);
- :mod:`attnlens.core.models`: one file of facts per architecture (BERT, RoBERTa, GPT-2, Llama);
- :mod:`attnlens.evaluation.tasks`, :mod:`attnlens.evaluation.probing` and :mod:`attnlens.evaluation.lm`: what an intervention
  costs (task probes, LM scores; :func:`attnlens.papa.curve`).

The modules live in one-way layers, lowest first; a module imports only its own layer and lower
ones, not even inside a function, and no imports form a cycle
(``tests/unit/test_layers.py``):

- ``core`` (:mod:`attnlens.core`): ``inputs``, ``loading``, ``seam``, ``models`` (one file per
  architecture), ``heads``, ``checks``, ``files``, ``corpus``, ``devices``, ``result``,
  ``plots``, ``notebook``, ...; and :mod:`attnlens.errors`;
- ``engine`` (:mod:`attnlens.engine`): ``passes``, the one loop over a corpus, and its parts
  (``accumulator``, ``batches``, ``forward``, ``split``, ``checkpoints``, ``distributed``,
  ``hooks``, ``recording``); ``effective`` (effective attention of a layer);
- ``methods`` (:mod:`attnlens.methods`): ``papa``, ``effective``, ``norm``, ``stats``,
  ``patterns``, ``syntax``, ``clustering``, ``ablation``; ``views`` (their registry), ``maps``
  and ``interventions`` (a view's maps and an intervention's hooks, built from values);
- ``evaluation`` (:mod:`attnlens.evaluation`): ``tasks``, ``probing``, ``lm``, ``curve`` and
  ``table`` (PAPA's), ``importance`` and ``pruning``, ``conventions`` and ``claims``;
- ``present`` (:mod:`attnlens.present`): ``figures``, ``columns``, ``report``, ``explorer``,
  ``kept``, ``display``, ``export``;
- ``comparison`` (:mod:`attnlens.comparison`): ``result``, ``accumulator``, ``run``;
- ``cli`` (:mod:`attnlens.cli`): one module per command.

Each module has one name, its path in the layers (``attnlens.engine.passes``,
``attnlens.evaluation.probing.features``, ...). ``attnlens.papa`` and ``attnlens.ablation`` are
facades: they gather the public names of two layers each; the lazily imported names below
(``attnlens.load``, ``attnlens.compare``, ...) are the entry points.

``attnlens.run_with_hooks(model, batch, hooks)`` runs a :class:`Batch` with its mask and
positions (never forget ``**batch.model_kwargs()``).

``attnlens.load()`` returns a ``TransformerBridge`` on which ``blocks.{l}.attn.hook_pattern``
is a real intervention point (see :mod:`attnlens.core.seam`).

``attnlens.compare(model, "papa", "effective")`` is :func:`attnlens.comparison.run.compare`,
imported on first use; its result is a :class:`attnlens.comparison.result.Comparison`.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers and IDEs; at run time every name below is imported lazily
    from attnlens.comparison.result import Comparison
    from attnlens.comparison.run import compare
    from attnlens.core.inputs import Batch, Words, tokenize
    from attnlens.core.loading import load
    from attnlens.engine.forward import model_inputs, run_with_hooks
    from attnlens.methods.effective import effective_attention
    from attnlens.methods.maps import maps
    from attnlens.present.export import to_circuitsvis

from attnlens.core.version import __version__  # noqa: F401  (attnlens.__version__)
from attnlens.errors import AttnlensError  # a leaf module: every error attnlens raises on purpose

if "ipykernel.zmqshell" in sys.modules:  # a Jupyter kernel: keep tqdm.auto (transformers and the
    importlib.import_module("attnlens.core.notebook").quiet_tqdm_auto()  # hub use it) from warning

#: the layers and facades, imported on first use (keeps ``import attnlens`` light: no torch, transformers,
#: TransformerLens, plotly or pandas until a name that needs them is used; ``attnlens --help``
#: stays fast)
_SUBMODULES = (
    "core", "engine", "methods", "evaluation", "present", "comparison", "cli",  # the layers
    "papa", "ablation", "errors",  # the facades and the errors
)
#: names re-exported lazily from submodules
_LAZY = {
    "Batch": ("attnlens.core.inputs", "Batch"),
    "Words": ("attnlens.core.inputs", "Words"),
    "tokenize": ("attnlens.core.inputs", "tokenize"),
    "load": ("attnlens.core.loading", "load"),
    "effective_attention": ("attnlens.methods.effective", "effective_attention"),
    "maps": ("attnlens.methods.maps", "maps"),
    "Comparison": ("attnlens.comparison.result", "Comparison"),
    "compare": ("attnlens.comparison.run", "compare"),
    "run_with_hooks": ("attnlens.engine.forward", "run_with_hooks"),
    "model_inputs": ("attnlens.engine.forward", "model_inputs"),
    "to_circuitsvis": ("attnlens.present.export", "to_circuitsvis"),
}

__all__ = [
    "Batch", "Words", "load", "tokenize", "effective_attention", "maps", "compare", "Comparison", "run_with_hooks",
    "model_inputs", "to_circuitsvis", "AttnlensError", *_SUBMODULES,
]


def __getattr__(name: str) -> Any:
    """Import a re-exported name or a submodule on first use (PEP 562)."""
    if name in _LAZY:
        module, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module), attribute)
        globals()[name] = value  # later look-ups skip this function
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"attnlens.{name}")  # the import binds attnlens.<name>
    raise AttributeError(f"module 'attnlens' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names (lazy ones included) and the module's dunders."""
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})
