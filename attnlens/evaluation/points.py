"""A PAPA curve's finished points, kept in a folder so that an interrupted curve resumes.

``papa.curve(..., checkpoint=folder)`` writes every finished point of a task to one file in
``folder``, atomically (:func:`attnlens.core.files.write_atomic`, with a checksum): the row's columns
(score, intervals, baselines, the paired test against no head replaced) and its seconds, and
for a task's first point (no head replaced) also what its later points need: the chosen epochs
and ``C`` (in the result's settings), every seed's predictions and the fitted linear baseline,
whose solution starts theirs. The same call again reads every point it finds there instead of
training it, so an interrupted curve loses only the points that were running, and its table is
the same as an uninterrupted one's in every digit (the later points start from the same
baseline solution, read back exactly).

A point's file is named by its :func:`key`, a hash of everything its numbers depend on:
attnlens's version, the model (name and weights fingerprint), the task's training and
evaluation examples and labels, the hooks' key, the probe's and the baseline's settings and, for
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
from attnlens.core.files import read_checked, safetensors_bytes, write_atomic
from attnlens.core.inputs import Words
from attnlens.core.loading import model_id, weights_fingerprint
from attnlens.errors import FileFormatError
from attnlens.evaluation.probing import LinearBaseline, ProbeResult

#: File format of a curve point.
FORMAT = "attnlens.CurvePoint/1"

#: The fields of a point kept in its file (the curve's ``point`` dicts; ``result`` apart).
FIELDS = ("task", "metric", "seconds", "rank", "columns")


def key(model: Any, train: Any, evaluation: Any, *, hooks: str, settings: Mapping[str, Any],
        first: str | None) -> str:
    """The hash naming a point's file: attnlens's version, the format, the model, the training
    and evaluation examples and labels, ``hooks`` (their key), ``settings`` (everything else
    that the point's numbers depend on, JSON-ready) and ``first`` (the key of the task's first
    point; ``None`` for the first point itself)."""

    digest = hashlib.sha256()
    header = {"attnlens": version.__version__, "format": FORMAT, "model": model_id(model),
              "weights": weights_fingerprint(model), "task": train.name, "split": evaluation.split,
              "hooks": hooks, "settings": settings, "first": first}
    digest.update(json.dumps(header, sort_keys=True, default=str).encode())
    for examples in (train, evaluation):
        for value in (examples.inputs(), examples.labels()):
            digest.update(json.dumps(_ready(value), ensure_ascii=False, default=str).encode() + b"\n")
    return digest.hexdigest()[:32]


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
            result = ProbeResult._from_dict(data)
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
