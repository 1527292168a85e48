"""Probing a frozen model under any hooks: how much of a task its layers still carry.

::

    from attnlens.evaluation import probing
    result = probing.run(model, "sst2", data_dir="../shared/data", hooks=papa.hooks(constants))
    result.score, result.metric, result.predictions[:3]

:func:`run` loads the task's train split (``train_limit`` examples, a seeded subset) and its dev
split (or ``eval_split``), extracts every layer's vectors once per (model, hooks, examples,
``max_len``, layout) through the pass engine (:func:`features.extract`, cached on disk, see
:mod:`attnlens.evaluation.probing.features`), trains the PAPA probe (:class:`PapaProbe`, Hassid et al. 2022)
on the train features and scores its predictions on the evaluation split with the task's metric
(:mod:`attnlens.evaluation.tasks`). Seeds make a run reproducible: the same call twice gives the same score.
"""

from __future__ import annotations

from attnlens.evaluation.probing.baseline import LinearBaseline
from attnlens.evaluation.probing.features import (
    Features,
    cache_dir,
    clear_cache,
    extract,
    hooks_key,
)
from attnlens.evaluation.probing.intervals import Interval, Paired, bootstrap, paired
from attnlens.evaluation.probing.probe import PapaProbe, ProbeSettings
from attnlens.evaluation.probing.recipes import TABLE3, Recipe, recipe
from attnlens.evaluation.probing.result import ProbeResult, ProbeWarning
from attnlens.evaluation.probing.scoring import (
    EPOCH_FACTOR,
    TRAIN_LIMIT,
    choose_epochs,
    run,
    run_many,
)
from attnlens.evaluation.probing.stacked import fit_many

__all__ = [
    "EPOCH_FACTOR", "Features", "Interval", "LinearBaseline", "Paired", "PapaProbe", "ProbeResult", "ProbeSettings",
    "ProbeWarning", "Recipe", "TABLE3", "TRAIN_LIMIT", "bootstrap", "cache_dir", "choose_epochs", "clear_cache",
    "extract", "fit_many", "hooks_key", "paired", "recipe", "run", "run_many",
]
