"""What each view of a comparison costs: task and language-model scores with the model run
under the view (:attr:`attnlens.comparison.result.Comparison.scores`, ``compare(tasks=...)``).

A view is run by the intervention it names (:attr:`attnlens.methods.views.View.intervention`),
built by :func:`attnlens.methods.interventions.build`: a view given by PAPA constants replaces
every head, then the least input-dependent half of them; effective attention replaces every
pattern (the output stays the same, ``A⊥V = AV``: its score is a check). A view without an
intervention (one that only reads the maps another way) has no score.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from attnlens.core.corpus import corpus_iterator
from attnlens.core.fingerprints import fingerprints_kept
from attnlens.evaluation import probing
from attnlens.evaluation.lm import scorer
from attnlens.methods import interventions
from attnlens.methods import views as registry
from attnlens.methods.papa.ranking import resolve_heads

#: Columns of :attr:`attnlens.comparison.result.Comparison.scores`.
SCORE_COLUMNS = {
    "view": "the view the model ran under: the model's own attention (standard), a view given by "
            "constants with all heads or half of them replaced (papa (all heads), papa (half of "
            "the heads)), or a view with an intervention of its own (effective)",
    "task": "task name, or 'lm' for the language-model score",
    "metric": "the task's metric, or the LM score's kind (own head or MLM probe)",
    "score": "on the evaluation split (LM: negative log-perplexity, nats per token)",
    "majority": "score of always predicting the most frequent training label",
    "relative": "score / the standard view's score",
}
#: the share of heads the second score of a view given by constants replaces (the least
#: input-dependent ones, :func:`attnlens.methods.papa.ranking.resolve_heads`)
HALF = 0.5


def view_hooks(model: Any, names: Sequence[str], constants: Any) -> dict[str, Any]:
    """``score row name -> hooks`` of the views ``names``: the first view (the model's own
    attention) without hooks, then each view with an intervention, built by
    :func:`attnlens.methods.interventions.build` (a view given by constants: every head, then
    the :data:`HALF` least input-dependent ones)."""
    hooks: dict[str, Any] = {names[0]: ()}
    for name in names[1:]:
        view = registry.get_view(name)
        if view.intervention is None:
            continue
        if view.takes_constants:
            hooks[f"{name} (all heads)"] = interventions.build(view.intervention, model, "all", constants=constants)
            hooks[f"{name} (half of the heads)"] = interventions.build(
                view.intervention, model, resolve_heads(HALF, constants), constants=constants)
        else:
            hooks[name] = interventions.build(view.intervention, model, "all")
    return hooks


@fingerprints_kept()  # the weights do not change while the views are scored: fingerprinted once
def view_scores(
    model: Any, names: Sequence[str], constants: Any, *, tasks: Sequence[str],
    lm_texts: Sequence[str] | None, data_dir: Any, train_limit: Any, eval_limit: Any,
    max_len: int, layout: str, batch_size: int, progress: bool,
) -> pd.DataFrame:
    """Task and LM scores per view (:data:`SCORE_COLUMNS`; see
    :func:`attnlens.compare`): one row per (view, task), a probe per task of
    :mod:`attnlens.evaluation.tasks` (:func:`attnlens.evaluation.probing.run_many`, every view's
    probe in one stacked model) and the LM score
    of ``lm_texts`` (:func:`attnlens.evaluation.lm.scorer.evaluate`), ``relative`` to the first view's."""
    if isinstance(tasks, str):
        tasks = [tasks]
    views = view_hooks(model, names, constants)
    rows = []
    for task in tasks:  # every view's probe at once (run_many: one stacked model, each as run's)
        results = probing.run_many(model, task, list(views.values()), data_dir=data_dir, train_limit=train_limit,
                                   eval_limit=eval_limit, max_len=max_len, layout=layout,
                                   batch_size=batch_size, progress=progress)
        for view, result in zip(views, results, strict=True):
            rows.append(dict(view=view, task=result.task, metric=result.metric, score=result.score,
                             majority=result.majority))
    if lm_texts is not None:
        for view, hooks in views.items():
            result = scorer.evaluate(model, list(corpus_iterator(lm_texts, name="lm_texts")), hooks=hooks, max_len=max_len, layout=layout,
                                 batch_size=batch_size, progress=progress)
            rows.append(dict(view=view, task="lm", metric=result.name, score=result.value,
                             majority=float("nan")))
    table = pd.DataFrame(rows, columns=[c for c in SCORE_COLUMNS if c != "relative"])
    first = table[table["view"] == names[0]].set_index("task")["score"]
    table["relative"] = [row.score / first[row.task] if first[row.task] else float("nan")
                         for row in table.itertuples()]
    return table
