"""Head ablation and head importance (Michel et al. 2019, "Are Sixteen Heads Really Better than
One?", NeurIPS 2019), as hooks on an unmodified model.

transformers 5 silently ignores ``head_mask``, so every ablation here is a TransformerLens hook:

- :func:`hooks` returns ``fwd_hooks`` (:class:`AblationHooks`, with a stable :meth:`~AblationHooks.key`
  so that probe features under them are cached) that ablate the heads of a :class:`HeadSet` in
  one of four named modes (:data:`MODES`):

  - ``"zero"``: the head's output ``z`` (``blocks.{l}.attn.hook_z``, ``[batch, pos, head,
    d_head]``, the input of the output projection) is 0 at every position: Michel et al.'s
    masking (their ``ξ_h = 0``); it equals giving the head an all-zero pattern;
  - ``"uniform"``: the head's attention (``blocks.{l}.attn.hook_pattern``) becomes uniform over
    the valid keys of each query: the real tokens (:func:`attnlens.core.seam.key_mask`), and on a
    causal model (a decoder) only those at or before the query;
  - ``"mean"``: the head's output ``z`` is replaced by its corpus mean, one ``d_head`` vector per
    head (the mean over every real token of a corpus, the same at every position), from
    :func:`head_means` (mean ablation);
  - ``"papa"``: the head's attention is replaced by PAPA constants (Hassid et al. 2022),
    delegating to :func:`attnlens.papa.hooks` (``constants=``).

- :func:`importance`: Michel et al.'s head importance (§4.1, eq. 2),
  ``I_h = E_x |∂L(x)/∂ξ_h|``, where a gate ``ξ_h = 1`` multiplies head ``h``'s output ``z``, computed
  over a corpus as one pass of the pass engine (:func:`attnlens.engine.passes.run`, with gradients) and
  normalised per layer by the ℓ2 norm (§4.2, "we normalize the importance scores by layer").
- :func:`prune_curve`: prune heads least important first and score what is left at each
  fraction (Michel et al.'s Fig. 3), as a table and a figure.

::

    from attnlens import ablation

    from attnlens.evaluation import probing
    scores = ablation.importance(model, texts, loss=my_loss)     # Importance
    table, figure = ablation.prune_curve(
        model, scores, lambda hooks: probing.run(model, "sst2", hooks=hooks).score)

``attnlens.ablation`` gathers names of two layers: the ablation itself,
:mod:`attnlens.methods.ablation` (hooks, head means, :class:`Importance`), computing importance,
:mod:`attnlens.evaluation.importance`, whose loss is the model's own LM loss or a task probe's,
and the pruning curve, :mod:`attnlens.evaluation.pruning` (its hooks built by
:func:`attnlens.methods.interventions.build`).
"""

from attnlens.evaluation.importance import (
    Gates,
    GatesUnused,
    LossFn,
    ProbeLoss,
    importance,
    task_loss,
)
from attnlens.evaluation.pruning import COLUMNS, FRACTIONS, prune_curve, prune_figure
from attnlens.methods.ablation import (
    MODES,
    ORDERS,
    AblationHooks,
    HeadMeans,
    Importance,
    head_means,
    hooks,
    normalize_by_layer,
    output_hook,
    uniform_pattern,
)

__all__ = [
    "COLUMNS",
    "FRACTIONS",
    "MODES",
    "ORDERS",
    "AblationHooks",
    "Gates",
    "GatesUnused",
    "HeadMeans",
    "Importance",
    "LossFn",
    "ProbeLoss",
    "head_means",
    "hooks",
    "importance",
    "normalize_by_layer",
    "output_hook",
    "prune_curve",
    "prune_figure",
    "task_loss",
    "uniform_pattern",
]
