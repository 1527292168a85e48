"""A PAPA curve's points: the columns of a point's row, the options of a task's later points,
and the finished points kept in a folder so that an interrupted curve resumes.

``papa.curve(..., checkpoint=folder)`` writes every finished point of a task to one file in
``folder``, atomically (:func:`attnlens.core.files.write_atomic`, with a checksum): the row's columns
(score, intervals, baselines, the paired test against no head replaced), every seed's predictions
and its seconds, and
for a task's first point (no head replaced) also what its later points need: the chosen epochs
and ``C`` (in the result's settings), every seed's predictions and the fitted linear baseline,
whose solution starts theirs. The same call again reads every point it finds there instead of
training it, so an interrupted curve loses only the points that were running, and its table is
the same as an uninterrupted one's (the later points start from the same baseline solution, read
back exactly; on the probes trained again in a smaller stack, see
:func:`attnlens.evaluation.curve.curve`).

A point's file is named by its :func:`key`, a hash of everything its numbers depend on:
attnlens's version, the model (name and weights fingerprint), the task's training and
evaluation examples and labels, the hooks' key (and the names of hooks the model carries,
:func:`attnlens.engine.hooks.on_model`), the probe's and the baseline's settings and, for
a later point, its first point's key. A point of other settings is simply not found (and
computed); a damaged file is refused with one error naming it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnlens.core import version  # read at each call: the version now (tests set it)
from attnlens.core.files import read_checked, safetensors_bytes, tensor_checksum, write_atomic
from attnlens.core.fingerprints import identity
from attnlens.core.inputs import Words
from attnlens.engine.hooks import on_model
from attnlens.errors import FileFormatError
from attnlens.evaluation import conventions
from attnlens.evaluation.probing import LinearBaseline, ProbeResult, paired
from attnlens.evaluation.probing.intervals import paired_counts
from attnlens.evaluation.probing.scoring import task_examples

#: File format of a curve point.
FORMAT = "attnlens.CurvePoint/2"

#: The fields of a point kept in its file (the curve's ``point`` dicts; ``result`` apart):
#: ``runs`` are every seed's predictions (for the paired tests between its rows).
FIELDS = ("task", "metric", "seconds", "rank", "columns", "runs")


def key(model: Any, train: Any, evaluation: Any, *, hooks: str, settings: Mapping[str, Any],
        first: str | None) -> str:
    """The hash naming a point's file: attnlens's version, the format, the model, the training
    and evaluation examples and labels, ``hooks`` (their key), ``settings`` (everything else
    that the point's numbers depend on, JSON-ready) and ``first`` (the key of the task's first
    point; ``None`` for the first point itself)."""

    digest = hashlib.sha256()
    header = {"attnlens": version.__version__, "format": FORMAT, **identity(model), "task": train.name,
              "split": evaluation.split,
              "hooks": hooks, "settings": settings, "first": first, **_on_model(model)}
    digest.update(json.dumps(header, sort_keys=True, default=str).encode())
    for examples in (train, evaluation):
        for value in (examples.inputs(), examples.labels()):
            digest.update(json.dumps(_ready(value), ensure_ascii=False, default=str).encode() + b"\n")
    return digest.hexdigest()[:32]


def _on_model(model: Any) -> dict[str, list[str]]:
    """The hooks ``model`` carries (:func:`attnlens.engine.hooks.on_model`), by name alone (no key
    names their functions), as a key's entry; none (so every key as before) without them."""
    carried = on_model(model)
    return {"on_model": carried} if carried else {}


def labelled_path(folder: str | os.PathLike, model: Any, train: Any, init: str, start: Any,
                  settings: Mapping[str, Any]) -> Path:
    """The file in a curve's checkpoint ``folder`` of the constants trained with ``train``'s labels
    from ``init`` (:func:`attnlens.evaluation.curve_inputs.labelled_constants`), named by a hash of
    what they depend on: attnlens's version, the model, the training examples and labels, the
    start (``init`` and the constants ``start`` it trains from) and the recipe's ``settings``. A
    resumed curve reads them instead of training them again, and so finds its points."""
    digest = hashlib.sha256()
    header = {"attnlens": version.__version__, **identity(model), "task": train.name, "init": init, "settings": settings,
              "start": tensor_checksum({name: getattr(start, name) for name in ("sums", "squares", "pair_counts")}),
              **_on_model(model)}
    digest.update(json.dumps(header, sort_keys=True, default=str).encode())
    for value in (train.inputs(), train.labels()):
        digest.update(json.dumps(_ready(value), ensure_ascii=False, default=str).encode() + b"\n")
    return Path(folder) / f"labelled-{digest.hexdigest()[:32]}.safetensors"


def path_of(folder: str | os.PathLike, point_key: str) -> Path:
    """The file of the point named ``point_key`` in ``folder``."""
    return Path(folder) / f"point-{point_key}.safetensors"


def save(folder: str | os.PathLike, point_key: str, point: Mapping[str, Any]) -> Path:
    """Write ``point`` (a curve point: :data:`FIELDS`, and ``result``, a task's first point's
    :class:`attnlens.evaluation.probing.ProbeResult` or ``None``) to its file in ``folder``."""
    metadata = {"format": FORMAT, "key": point_key,
                "point": json.dumps({name: _ready(point[name]) for name in FIELDS})}
    tensors: dict[str, Any] = {}
    result = point.get("result")
    if result is not None:
        metadata["result"] = json.dumps({**result.to_dict(), "runs": _ready(result.runs)})
        if result.linear is not None:
            linear, linear_metadata = result.linear.state()
            tensors = {f"linear.{name}": value for name, value in linear.items()}
            metadata["linear"] = json.dumps(linear_metadata)
    return write_atomic(path_of(folder, point_key), safetensors_bytes(tensors, metadata))


def load(folder: str | os.PathLike, point_key: str) -> dict[str, Any] | None:
    """The point saved under ``point_key`` in ``folder`` (with ``"resumed": True``), or
    ``None`` when there is none. A file that was changed, or that does not describe a point, is
    refused with one error naming it (:class:`~attnlens.errors.DamagedFileError`,
    :class:`~attnlens.errors.FileFormatError`)."""
    path = path_of(folder, point_key)
    if not path.is_file():
        return None
    metadata, tensors = read_checked(path, what="curve point", format=FORMAT)
    try:
        if metadata["key"] != point_key:
            raise ValueError(f"it holds the point {metadata['key']!r}")
        point = json.loads(metadata["point"])
        found = {name: point[name] for name in FIELDS}
        found["result"] = None
        if "result" in metadata:
            data = json.loads(metadata["result"])
            result = ProbeResult.from_dict(data)
            result.runs = data["runs"]
            result.predictions = result.runs[0]
            if "linear" in metadata:
                linear = {name.removeprefix("linear."): value for name, value in tensors.items()}
                result.linear = LinearBaseline.from_state(linear, json.loads(metadata["linear"]))
            found["result"] = result
    except (KeyError, TypeError, ValueError, IndexError) as error:
        raise FileFormatError(f"curve point file {path} does not describe a curve point ({error}); "
                              "delete it, and the curve computes that point again.") from None
    return {**found, "resumed": True}


def task_key(model: Any, task: Any, hooks: str, first_hooks: str, options: dict, fast: bool) -> str:
    """The key of a task's point under hooks of key ``hooks`` in a curve's checkpoint folder
    (:func:`attnlens.evaluation.points.key`): its examples, its settings (``options``, the
    point's :func:`attnlens.evaluation.probing.run` arguments before the first point's choices, and
    ``fast``) and, for a later point, the key of its first point (hooks ``first_hooks``)."""
    train, evaluation, *_ = task_examples(model, task, options["data_dir"], None, options["train_limit"],
                                          options["eval_limit"], options["seed"], options["max_len"],
                                          options["layout"])
    settings = {name: value for name, value in options.items() if name not in ("data_dir", "progress")}
    settings["fast"] = fast
    first = key(model, train, evaluation, hooks=first_hooks, settings=settings, first=None)
    return first if hooks == first_hooks else key(model, train, evaluation, hooks=hooks, settings=settings,
                                                  first=first)


def columns(result: Any, unchanged: Any, seed: int) -> dict:
    """A curve point's score columns: its interval, baselines, the paired test against the same
    task with no head replaced (``unchanged``; none for that point itself), resampling the same
    examples, and the paired test of the probe against its linear baseline."""
    linear, versus_linear = result.baseline_interval, result.versus_baseline
    row = dict(
        score=result.score, low=result.interval.low, high=result.interval.high,
        seed_std=result.seed_std, baseline=result.baseline, baseline_low=linear.low if linear else float("nan"),
        baseline_high=linear.high if linear else float("nan"), majority=result.majority,
        majority_low=result.majority_interval.low, majority_high=result.majority_interval.high,
        versus_linear=versus_linear.difference if versus_linear else float("nan"),
        versus_linear_low=versus_linear.low if versus_linear else float("nan"),
        versus_linear_high=versus_linear.high if versus_linear else float("nan"),
    )
    if result is unchanged:
        return {**row, "difference": 0.0, "difference_low": 0.0, "difference_high": 0.0}
    versus = paired(result.evaluation, unchanged.runs, result.runs, runs=True, seed=seed,
                    resamples=result.settings["resamples"])
    return {**row, **conventions.paired_columns(versus, unchanged.score)}


def later_options(options: dict, first: Any, probe: dict | None) -> dict:
    """A task's options for its later points: the epochs chosen at its first point (no head
    replaced) and its linear baseline's ``C``, whose solution starts theirs (a warm start: the
    same optimum, a third of the iterations)."""
    if first.settings.get("epochs_chosen"):
        options = {**options, "select_epochs": False,
                   "probe": {**(probe or {}), "epochs": first.settings["epochs_chosen"]}}
    if first.settings.get("baseline_C") is not None:
        options = {**options, "baseline_C": first.settings["baseline_C"], "baseline_start": first.linear}
    return options


def versus_average(average: Sequence[Any], runs: Sequence[Any], evaluation: Any, *, seed: int,
                   resamples: int) -> dict:
    """A baseline row's columns of its paired test against the average constants in every head:
    ``average`` and ``runs``, every seed's predictions of the two rows, on the examples of
    ``evaluation`` (paired by seed, as every test of a curve)."""
    return _versus_average(paired(evaluation, average, runs, runs=True, seed=seed, resamples=resamples))


def lm_versus_average(average: Any, score: Any, *, seed: int) -> dict:
    """An LM baseline row's columns of its paired test against the average constants in every
    head (per-text counts of the MLM probe; none for the model's own head)."""
    if score.counts is None or average.counts is None:
        return {}
    return _versus_average(paired_counts(average.counts, score.counts, "accuracy", seed=seed))


def _versus_average(versus: Any) -> dict:
    return dict(versus_average=versus.difference, versus_average_low=versus.low, versus_average_high=versus.high,
                versus_average_p=versus.p_value)


def lm_columns(score: Any, unchanged: Any, seed: int) -> dict:
    """An LM point's interval and paired test against no head replaced, where the score has
    per-text counts (the MLM probe); none for the model's own head (a corpus-level number)."""
    if score.counts is None or unchanged.counts is None:
        return {}
    interval = dict(low=score.interval.low, high=score.interval.high)
    if score is unchanged:
        return {**interval, "difference": 0.0, "difference_low": 0.0, "difference_high": 0.0}
    versus = paired_counts(unchanged.counts, score.counts, "accuracy", seed=seed)
    return {**interval, **conventions.paired_columns(versus, unchanged.value)}


def _ready(value: Any) -> Any:
    """``value`` as JSON-ready Python that reads back equal: NumPy and torch scalars as Python
    numbers and bools (NaN stays NaN), containers as lists and dicts, a token task's
    :class:`~attnlens.core.inputs.Words` as ``{"words": [...]}`` (as the features' key)."""
    if isinstance(value, Words):
        return {"words": list(value.words)}
    if isinstance(value, Mapping):
        return {str(name): _ready(item) for name, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [_ready(item) for item in value]
    if hasattr(value, "detach"):  # a tensor
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return _ready(value.tolist())
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value
