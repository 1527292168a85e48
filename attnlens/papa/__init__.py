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
  :class:`TrainableConstants`, trained with any loss by :func:`train_constants` (the labelled rows
  of Table 1);
- :func:`hooks` / :func:`intervention`: ``mode="replace"`` or ``"blend"``;
  :func:`constant_pattern`: the pattern a constant gives a batch (causal on a decoder such as
  GPT-2: no key after the query);
- :class:`HeadSet` and :func:`select_heads`: which heads to replace;
- :func:`curve`: what replacing them costs, task probes and LM scores at growing fractions of
  heads replaced (:class:`Curve`: table and figure), with intervals and baselines;
- :func:`table`: PAPA's Table 1 of a model (:class:`PapaTable`): original, average constants,
  data-free matrices and matrices trained with labels in every head, per task.

``attnlens.papa`` gathers names of two layers: the method, :mod:`attnlens.methods.papa`
(constants, their hooks, head selection), and what replacing heads costs,
:mod:`attnlens.evaluation.curve` and :mod:`attnlens.evaluation.table`. It is a facade of names
only: the modules themselves are imported from their layers (``attnlens.methods.papa.fitting``).
"""

from attnlens.evaluation.curve import Curve, curve
from attnlens.evaluation.table import PapaTable, table
from attnlens.methods.papa import (
    STRATEGIES,
    HeadSet,
    PapaConstants,
    PapaHooks,
    TrainableConstants,
    check_inputs,
    constant_pattern,
    fit,
    hooks,
    identity,
    intervention,
    learn_lambda,
    load,
    select_heads,
    softmax_pattern,
    toeplitz,
    train_constants,
    uniform,
    zeros,
)

__all__ = [
    "Curve",
    "HeadSet",
    "PapaConstants",
    "PapaHooks",
    "PapaTable",
    "STRATEGIES",
    "TrainableConstants",
    "check_inputs",
    "constant_pattern",
    "curve",
    "fit",
    "hooks",
    "identity",
    "intervention",
    "learn_lambda",
    "load",
    "select_heads",
    "softmax_pattern",
    "table",
    "toeplitz",
    "train_constants",
    "uniform",
    "zeros",
]
