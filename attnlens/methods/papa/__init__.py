"""PAPA: how much does a pretrained model rely on input-dependent attention? (Hassid et al. 2022)

Each head's attention is replaced by a constant matrix, the head's mean attention over an
unlabeled corpus, with hooks on an unmodified model::

    import attnlens
    from attnlens import papa

    model = attnlens.load()
    constants = papa.fit(model, texts, max_len=64)              # PapaConstants
    batch = attnlens.tokenize(model, texts[:8], max_len=64)     # the same layout ("papa")
    logits = model.run_with_hooks(
        batch.input_ids, **batch.model_kwargs(),
        fwd_hooks=papa.hooks(constants, heads=0.5),   # the 36 least input-dependent heads
    )

``batch.model_kwargs()`` passes ``position_ids=None`` so BERT keeps positions ``0 .. max_len-1``
(otherwise the bridge re-derives positions from the mask and moves the final [SEP]).

- :func:`fit` -> :class:`PapaConstants` (``sums``, ``counts``, ``mean``, ``input_dependence``,
  merge / ``+``, ``save`` / ``load``, checkpoint and resume);
- data-free :func:`identity`, :func:`toeplitz`, :func:`zeros`, :func:`uniform`, and
  :class:`TrainableConstants`;
- :func:`hooks` / :func:`intervention`: ``mode="replace"`` or ``"blend"``;
  :func:`constant_pattern`: the pattern a constant gives a batch (causal on a decoder such as
  GPT-2: no key after the query);
- :class:`HeadSet` and :func:`select_heads`: which heads to replace.

What replacing heads costs (the PAPA curve and Table 1) is evaluation:
:mod:`attnlens.evaluation.curve` and :mod:`attnlens.evaluation.table`; ``attnlens.papa`` gathers
both layers' names.
"""

from attnlens.methods.papa.baselines import TrainableConstants, identity, toeplitz, uniform, zeros
from attnlens.methods.papa.constants import PapaConstants
from attnlens.methods.papa.fitting import fit
from attnlens.methods.papa.intervene import PapaHooks, check_inputs, hooks, intervention
from attnlens.methods.papa.replace import constant_pattern, softmax_pattern
from attnlens.methods.papa.selection import STRATEGIES, HeadSet, learn_lambda, select_heads

load = PapaConstants.load

__all__ = [
    "HeadSet",
    "PapaConstants",
    "PapaHooks",
    "STRATEGIES",
    "TrainableConstants",
    "check_inputs",
    "constant_pattern",
    "fit",
    "hooks",
    "identity",
    "intervention",
    "learn_lambda",
    "load",
    "select_heads",
    "softmax_pattern",
    "toeplitz",
    "uniform",
    "zeros",
]
