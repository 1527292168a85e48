"""A probe trained on a task's features under hooks and scored on its evaluation split, with
the linear and majority baselines and bootstrap intervals: :func:`run`, and :func:`run_many`
for several hook sets at once (one stacked fit); :func:`choose_epochs`, the epochs chosen on a
held-out tenth of the training examples."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from attnlens.core import devices
from attnlens.core.checks import finite, optional_count, whole_number
from attnlens.core.fingerprints import fingerprints_kept
from attnlens.core.inputs import default_layout
from attnlens.engine.forward import device_of
from attnlens.engine.hooks import on_model
from attnlens.errors import InputError
from attnlens.evaluation import tasks
from attnlens.evaluation.probing.baseline import LinearBaseline
from attnlens.evaluation.probing.features import Features, extract, hooks_key
from attnlens.evaluation.probing.intervals import bootstrap, paired
from attnlens.evaluation.probing.probe import PapaProbe
from attnlens.evaluation.probing.recipes import TABLE3, Recipe
from attnlens.evaluation.probing.result import ProbeResult, warn_if_below
from attnlens.evaluation.probing.stacked import fit_many

#: Training examples a probe sees by default (PAPA's curve on 2 CPU cores fits in minutes).
TRAIN_LIMIT = 4000
#: :func:`choose_epochs` tries up to this many times the recipe's epochs.
EPOCH_FACTOR = 3
#: :func:`choose_epochs` stops after this many epochs without a better held-out score.
PATIENCE = 3


def as_seeds(seeds: Any, seed: int) -> list[int]:
    """The probe seeds of ``seeds`` (``None``: ``[seed]``; a count: that many from ``seed``; a
    list: those), checked: whole numbers, at least one."""
    seed = whole_number(seed, "seed")
    if seeds is None:
        return [seed]
    if isinstance(seeds, str | bytes) or not isinstance(seeds, Sequence):  # a count (a float, a bool refused)
        return [seed + offset for offset in range(whole_number(seeds, "seeds", " (a count) or a list of whole numbers", minimum=1))]
    chosen = [whole_number(value, f"seeds[{i}]") for i, value in enumerate(seeds)]
    if not chosen:
        raise InputError("seeds is empty; give a number of seeds (e.g. 3) or a list (e.g. [0, 1, 2]).")
    return chosen


@fingerprints_kept()  # the weights do not change during a run: fingerprinted once
def run(
    model: Any,
    task: Any,
    *,
    data_dir: Any = None,
    eval_split: str | None = None,
    hooks: Any = (),
    train_limit: int | None = TRAIN_LIMIT,
    eval_limit: int | None = None,
    seed: int = 0,
    seeds: int | Sequence[int] | None = None,
    max_len: int | None = None,
    layout: str | None = None,
    batch_size: int = 32,
    probe: PapaProbe | dict | None = None,
    baseline: bool = True,
    baseline_C: float | None = None,
    baseline_start: LinearBaseline | None = None,
    select_epochs: bool = True,
    resamples: int = 1000,
    cache: bool = True,
    cache_key: str | None = None,
    progress: bool = True,
) -> ProbeResult:
    """Train the PAPA probe on ``task``'s train split under ``hooks`` and score it on the dev
    split (or ``eval_split``, e.g. ``"test"`` where that file has labels), with the linear and
    majority baselines and 95% bootstrap intervals.

    ``task``: a name of :data:`attnlens.evaluation.tasks.NAMES` or a task from :func:`attnlens.evaluation.tasks.load`
    (then its split is the training set, and the evaluation split is loaded beside it).
    ``train_limit`` / ``eval_limit``: a seeded subset of that many examples (``None``: all).
    ``max_len`` / ``layout``: how texts are tokenized (default ``max_len``: the task's row of
    PAPA's Table 3, :data:`attnlens.evaluation.probing.TABLE3`; default layout: the model's; PAPA
    constants' hooks need their own). ``probe``: a :class:`PapaProbe` (unfitted) or keyword
    arguments over the task's Table 3 recipe (its ``lr``, ``batch_size``, ``epochs``).
    ``seeds``: probe seeds (a count, from ``seed``, or a list), trained together as one stacked
    model (:func:`fit_many`: each seed the same fit as alone); the score is their mean, and
    its intervals resample the seeds as well as the examples (:mod:`attnlens.evaluation.probing.intervals`;
    with one seed they hold the examples' noise only).
    ``baseline``: also fit :class:`LinearBaseline`; ``baseline_C``: its ``C`` (no held-out
    search; :func:`attnlens.papa.curve` passes the ``C`` chosen with no head replaced to every
    later point of a task, as it does the epochs); ``baseline_start``: a fitted
    :class:`LinearBaseline` on the same labels whose solution is the solver's first point (warm
    start: papa.curve starts every later point from the one with no head replaced).
    ``select_epochs``: choose the number of
    epochs on a held-out tenth of the training examples, never on the evaluation split
    (:func:`choose_epochs`: up to :data:`EPOCH_FACTOR` × the recipe's epochs, early stopping on
    the task's metric of the held-out examples), then train every seed on all training examples for that many epochs;
    ``False``: exactly the recipe's epochs (the paper's probe). ``resamples``: bootstrap resamples per
    interval. ``cache`` / ``cache_key``: see :func:`attnlens.evaluation.probing.features.extract`.
    A probe scoring below the majority class or the linear baseline warns (:class:`ProbeWarning`).
    :func:`run_many` does the same under several interventions at once.
    """
    return run_many(model, task, [hooks], cache_keys=[cache_key], data_dir=data_dir, eval_split=eval_split,
                    train_limit=train_limit, eval_limit=eval_limit, seed=seed, seeds=seeds, max_len=max_len,
                    layout=layout, batch_size=batch_size, probe=probe, baseline=baseline, baseline_C=baseline_C,
                    baseline_start=baseline_start, select_epochs=select_epochs, resamples=resamples, cache=cache,
                    progress=progress, stacklevel=4)[0]


@fingerprints_kept()  # the weights do not change during a run: fingerprinted once
def run_many(
    model: Any,
    task: Any,
    interventions: Sequence[Any],
    *,
    cache_keys: Sequence[str | None] | None = None,
    data_dir: Any = None,
    eval_split: str | None = None,
    train_limit: int | None = TRAIN_LIMIT,
    eval_limit: int | None = None,
    seed: int = 0,
    seeds: int | Sequence[int] | None = None,
    max_len: int | None = None,
    layout: str | None = None,
    batch_size: int = 32,
    probe: PapaProbe | dict | None = None,
    baseline: bool = True,
    baseline_C: float | None = None,
    baseline_start: LinearBaseline | None = None,
    select_epochs: bool = True,
    resamples: int = 1000,
    cache: bool = True,
    budget: int | None = None,
    done: Callable[[int, ProbeResult], None] | None = None,
    progress: bool = True,
    stacklevel: int = 3,
) -> list[ProbeResult]:
    """:func:`run` under each of ``interventions`` (a list of hook sets: e.g. the points of
    PAPA's curve, each a share of heads replaced), on the same examples with the same options:
    one :class:`ProbeResult` per hook set, in order, each the result :func:`run` gives for it
    (``cache_keys``: one per hook set, as :func:`run`'s ``cache_key``).

    The probes of every hook set and seed train together as one stacked model
    (:func:`fit_many`, one member per (hook set, seed), each the same fit as alone: its own
    features, seed and held-out split), so that a GPU runs one sequence of kernels for all of
    them. The features of the hook sets in one stack are held at once: as many hook sets as
    fit in ``budget`` bytes of features (train and evaluation; default: a quarter of the memory
    free on the model's device, :func:`attnlens.core.devices.free_bytes`) train together, the
    next ones in the next stack. ``done(index, result)``: called as each hook set's result is
    ready (e.g. to write it to a checkpoint before the next stack trains).
    ``seconds["probe"]`` of each result is its share of its stack's fit (the fit's time over
    its hook sets); with ``select_epochs``, each hook set's epochs are chosen on its own
    features. ``stacklevel``: the frame a :class:`ProbeWarning` names, as in
    :func:`warnings.warn` (a wrapper such as :func:`run` passes one more)."""
    interventions = list(interventions)
    if not interventions:
        raise InputError("interventions is empty; give at least one hook set (() for none).")
    cache_keys = [None] * len(interventions) if cache_keys is None else list(cache_keys)
    if len(cache_keys) != len(interventions):
        raise InputError(f"{len(cache_keys)} cache keys for {len(interventions)} hook sets; give one per hook set.")
    train_limit, eval_limit, batch_size, max_len = _sizes(train_limit, eval_limit, batch_size, max_len)
    chosen_seeds = as_seeds(seeds, seed)
    resamples = whole_number(resamples, "resamples", " of bootstrap resamples (e.g. 1000)", minimum=1)
    if baseline_C is not None and not (finite(baseline_C, "baseline_C", low=0.0) > 0):
        raise InputError(f"baseline_C must be above 0 (the inverse regularisation), not {baseline_C!r}.")
    train, evaluation, row, max_len, layout = task_examples(model, task, data_dir, eval_split, train_limit,
                                                            eval_limit, seed, max_len, layout)
    if isinstance(probe, PapaProbe) and (len(chosen_seeds) > 1 or len(interventions) > 1):
        raise InputError("several seeds or hook sets need the probe's settings, not a PapaProbe; "
                         "pass probe=dict(...).")
    given = {**row.probe_settings(), "progress": progress, **(probe or {})} if not isinstance(probe, PapaProbe) else {}
    names = train.label_names
    labels = train.labels()
    carried = on_model(model)  # recorded in each result's settings: its features ran under them

    def held_out_score(indices: Any, predicted: list) -> float:
        return train.select(indices.tolist()).score(predicted)

    budget = (devices.free_bytes(device_of(model)) // 4 if budget is None
              else whole_number(budget, "budget", " of bytes", minimum=1))
    results: list[ProbeResult] = []
    held: list[int] = []  # the hook sets whose features are held, not yet fitted
    features: dict[int, tuple[Features, Features]] = {}
    chosen: dict[int, tuple[int | None, list]] = {}
    seconds: dict[int, dict] = {}
    for index, (hooks, cache_key) in enumerate(zip(interventions, cache_keys, strict=True)):
        started = time.perf_counter()
        features[index] = _features(model, train, evaluation, hooks=hooks, cache=cache, cache_key=cache_key,
                                    max_len=max_len, layout=layout, batch_size=batch_size, progress=progress)
        extracted = time.perf_counter()
        chosen[index] = (choose_epochs(features[index][0], labels, {**given, "seed": chosen_seeds[0]},
                                       task=train.name, scorer=held_out_score)
                         if select_epochs and not isinstance(probe, PapaProbe) else (None, []))
        seconds[index] = {"features": extracted - started, "probe": time.perf_counter() - extracted}
        held.append(index)
        size = sum(part.vectors.nbytes for part in features[index])
        if index + 1 < len(interventions) and (len(held) + 1) * size <= budget:
            continue  # room for the next hook set's features too
        # the held hook sets' probes, every seed, at once: one stacked model (probing.stacked)
        started = time.perf_counter()
        probes = ([probe] if isinstance(probe, PapaProbe) else
                  [PapaProbe(**{**given, **({"epochs": chosen[one][0]} if chosen[one][0] else {}), "seed": value})
                   for one in held for value in chosen_seeds])
        fitted_probes = (fit_many(probes, [features[one][0] for one in held for _ in chosen_seeds], labels,
                                  task=train.name, label_names=names)
                         if len(probes) > 1 else
                         [probes[0].fit(features[held[0]][0], labels, task=train.name, label_names=names)])
        fit_seconds = (time.perf_counter() - started) / len(held)
        for position, one in enumerate(held):
            share = len(fitted_probes) // len(held)
            results.append(_result(
                train, evaluation, features.pop(one), fitted_probes[position * share:(position + 1) * share],
                chosen[one], seconds[one], fit_seconds, baseline=baseline, baseline_C=baseline_C,
                baseline_start=baseline_start, held_out_score=held_out_score,
                settings={"hooks": hooks_key(interventions[one]) if cache_keys[one] is None else cache_keys[one],
                          **({"on_model": carried} if carried else {}),
                          "train_limit": train_limit, "eval_limit": eval_limit, "seed": seed,
                          "seeds": chosen_seeds, "max_len": max_len, "layout": layout, "resamples": resamples}))
            warn_if_below(results[-1], stacklevel=stacklevel)
            if done is not None:
                done(one, results[-1])
        held = []
    return results


def _result(train: Any, evaluation: Any, features: tuple[Features, Features], fitted_probes: list[PapaProbe],
            chosen: tuple[int | None, list], seconds: dict, fit_seconds: float, *, baseline: bool,
            baseline_C: float | None, baseline_start: LinearBaseline | None, held_out_score: Any,
            settings: dict) -> ProbeResult:
    """One hook set's :class:`ProbeResult` from its features and fitted probes (one per seed):
    their predictions, the linear and majority baselines, and the intervals."""
    train_features, eval_features = features
    names = train.label_names
    seed, resamples = settings["seed"], settings["resamples"]

    def named(predicted: list) -> list:
        if train.kind == "token":
            return [[names[label] for label in tags] for tags in predicted]
        return [names[label] for label in predicted]

    started = time.perf_counter()
    runs = [named(one.predict(eval_features)) for one in fitted_probes]
    fitted = time.perf_counter()
    baseline_predictions: list = []
    if baseline:
        linear = (LinearBaseline(seed=seed) if baseline_C is None else
                  LinearBaseline(seed=seed, grid=(baseline_C,))).fit(train_features, train.labels(), held_out_score,
                                                                     start=baseline_start)
        baseline_predictions = named(linear.predict(eval_features))
    seconds = {**seconds, "probe": seconds["probe"] + fit_seconds + fitted - started,
               "baseline": time.perf_counter() - fitted}
    interval = bootstrap(evaluation, runs, runs=True, resamples=resamples, seed=seed)
    majority_label = train.majority_label()
    majority_predictions = ([[majority_label] * len(tags) for tags in evaluation.labels()]
                            if train.kind == "token" else [majority_label] * len(evaluation))
    majority_interval = bootstrap(evaluation, majority_predictions, resamples=resamples, seed=seed)
    baseline_interval = (bootstrap(evaluation, baseline_predictions, resamples=resamples, seed=seed)
                         if baseline else None)
    # probe − linear baseline on the same resamples: does the probe match it?
    versus_baseline = (paired(evaluation, [baseline_predictions], runs, runs=True, resamples=resamples,
                              seed=seed) if baseline else None)
    scores = [float(evaluation.score(one)) for one in runs]
    settings = {**settings, "probe": vars(fitted_probes[0].settings).copy(),
                "baseline_C": linear.C if baseline else None, "resamples": resamples,
                "epochs_chosen": chosen[0], "validation_scores": chosen[1]}
    settings = {key: settings[key] for key in ("hooks", "train_limit", "eval_limit", "seed", "seeds", "max_len",
                                               "layout", "probe", "baseline_C", "resamples", "epochs_chosen",
                                               "validation_scores")} | (
        {"on_model": settings["on_model"]} if "on_model" in settings else {})
    return ProbeResult(
        task=train.name, split=evaluation.split, metric=evaluation.metric,
        score=float(sum(scores) / len(scores)), majority=float(evaluation.majority_score(train)),
        predictions=runs[0], n_train=len(train), n_eval=len(evaluation), settings=settings,
        seconds=seconds, interval=interval, scores=scores,
        seed_std=float(_std(scores)), baseline=baseline_interval.score if baseline else float("nan"),
        baseline_interval=baseline_interval, majority_interval=majority_interval, runs=runs,
        baseline_predictions=baseline_predictions, evaluation=evaluation,
        versus_baseline=versus_baseline, linear=linear if baseline else None,
    )


def _sizes(train_limit: Any, eval_limit: Any, batch_size: Any, max_len: Any
           ) -> tuple[int | None, int | None, int, int | None]:
    """:func:`run_many`'s counts, checked (one clear error each)."""
    return (optional_count(train_limit, "train_limit", " of training examples (or None for all)"),
            optional_count(eval_limit, "eval_limit", " of evaluated examples (or None for all)"),
            whole_number(batch_size, "batch_size", " of examples per batch (e.g. 32)", minimum=1),
            None if max_len is None else whole_number(max_len, "max_len", " of tokens (e.g. 128)", minimum=1))


def task_examples(model: Any, task: Any, data_dir: Any, eval_split: str | None, train_limit: int | None,
                  eval_limit: int | None, seed: int, max_len: int | None, layout: str | None
                  ) -> tuple[Any, Any, Recipe, int, str]:
    """:func:`run`'s training and evaluation examples, the task's Table 3 row, and the
    ``max_len`` and layout their features take (the row's and the model's by default)."""

    train = (tasks.load(task, "train", data_dir=data_dir, limit=train_limit, seed=seed)
             if isinstance(task, str) else task)
    evaluation = tasks.load(train.name, eval_split or "dev", data_dir=data_dir, limit=eval_limit, seed=seed)
    row = TABLE3.get(train.name, TABLE3["sst2"])
    return (train, evaluation, row, row.max_len if max_len is None else max_len,
            default_layout(model) if layout is None else layout)


def _features(model: Any, train: Any, evaluation: Any, **options: Any) -> tuple[Features, Features]:
    """The features of the training and the evaluation examples (:func:`extract`'s ``options``)."""
    return (extract(model, train.inputs(), description=f"{train.name} train", **options),
            extract(model, evaluation.inputs(), description=f"{train.name} {evaluation.split}", **options))


def choose_epochs(features: Features, labels: list, settings: dict, *, task: str | None = None,
                  scorer: Any = None, factor: int | None = None) -> tuple[int, list[float]]:
    """The number of epochs to train a probe of ``settings`` on ``features``, chosen on a
    held-out tenth of them (never on the evaluation split). The recipe's ``settings["epochs"]``
    is the floor: a probe trains on the other nine tenths for ``epochs`` to ``factor`` ×
    ``epochs`` epochs (:data:`EPOCH_FACTOR`), judged after each from the floor on by
    ``scorer(indices, predictions)`` (the task's metric; without one, the cross-entropy), and
    stops after :data:`PATIENCE` epochs without a better one; the best epoch is chosen. Returns
    it and the held-out values from the floor on.

    Why a floor and a ceiling: PAPA's Table 3 gives epochs for probes trained on whole training
    sets; on fewer examples an epoch is fewer optimisation steps (4,000 of CoNLL's 14,041
    sentences: 4 epochs are 29% of the paper's steps), and MiniLM's NER probe at 4 epochs stays
    below a linear model, while more steps overfit SST-2 and a held-out tenth of CoLA (400
    sentences) is too noisy an MCC to cut its 15 epochs (measurements in ``docs/probing.md``)."""
    factor = EPOCH_FACTOR if factor is None else factor
    floor = int(settings.get("epochs", 10))
    selector = PapaProbe(**{**settings, "epochs": floor * factor, "min_epochs": floor,
                            "early_stopping": True, "n_iter_no_change": PATIENCE, "progress": False})
    selector.fit(features, labels, task=task, scorer=scorer)
    return selector.epochs_, list(selector.validation_scores_)


def _std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


