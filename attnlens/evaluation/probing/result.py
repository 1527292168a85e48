"""What a probe scored on a task: :class:`ProbeResult`, its baselines and intervals, and
:class:`ProbeWarning`, which a probe scoring below a baseline gives (:func:`warn_if_below`)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from attnlens.core.plots import score_bars
from attnlens.core.result import Result, frame, plain
from attnlens.errors import AttnlensWarning
from attnlens.evaluation.probing.intervals import Interval, Paired


class ProbeWarning(AttnlensWarning):
    """A probe scored below one of its baselines (the majority class or the linear model)."""


@dataclass
class ProbeResult(Result):
    """A probe's score on a task, with its baselines and intervals.

    ``score``: the task's metric of the probe's predictions, averaged over ``seeds`` (``scores``:
    one per seed; ``seed_std``: their standard deviation, 0 for one seed). ``interval``: its 95%
    bootstrap interval over the evaluation examples and, with several seeds, the seeds
    (:func:`attnlens.evaluation.probing.bootstrap`; one seed's interval cannot hold the seeds' spread).
    ``baseline`` / ``baseline_interval``: the same for the linear baseline
    (:class:`LinearBaseline`, on the same features; ``nan`` when ``baseline=False``).
    ``versus_baseline``: the paired bootstrap of ``score − baseline`` on the same resamples
    (:class:`Paired`; ``None`` without the baseline): the probe matches the baseline when its
    interval holds 0, beats it when the interval is above 0.
    ``majority`` / ``majority_interval``: always predicting the most frequent training label.
    ``evaluation``: the evaluated :class:`attnlens.evaluation.tasks.Task`; ``linear``: the fitted
    :class:`LinearBaseline` (``None`` without it).
    ``predictions``: label names per evaluated example (tag strings per word for token tasks) of
    the first seed; ``runs``: those of every seed. Aligned with ``tasks.load(task, split)``'s
    examples. ``seconds``: time spent extracting features (``"features"``: forward passes, or
    reading the cache), training and running the probe (``"probe"``) and the baseline
    (``"baseline"``).

    A :class:`~attnlens.core.result.Result`: :attr:`table` is the summary in one row
    (:attr:`COLUMNS`), :meth:`figure` the probe beside its baselines, and :meth:`to_json` writes
    the summary: everything but ``predictions``, ``runs``, ``baseline_predictions``,
    ``evaluation`` and ``linear``, which :meth:`from_json` leaves empty (and ``None``)."""

    COLUMNS = {
        "task": "task name",
        "split": "the evaluated split",
        "metric": "the task's metric",
        "score": "the probe's score, mean over seeds",
        "low": "95% bootstrap interval of score over the evaluation examples and the probe seeds: lower end",
        "high": "95% bootstrap interval of score: upper end",
        "seed_std": "standard deviation of the score over probe seeds (0 for one seed)",
        "n_seeds": "probe seeds",
        "baseline": "the linear baseline's score on the same features (NaN without it)",
        "baseline_low": "95% bootstrap interval of baseline: lower end",
        "baseline_high": "95% bootstrap interval of baseline: upper end",
        "versus_baseline": "score minus baseline, on the same examples",
        "versus_baseline_low": "95% paired bootstrap interval of versus_baseline: lower end",
        "versus_baseline_high": "95% paired bootstrap interval of versus_baseline: upper end",
        "majority": "score of always predicting the most frequent training label",
        "majority_low": "95% bootstrap interval of majority: lower end",
        "majority_high": "95% bootstrap interval of majority: upper end",
        "n_train": "training examples",
        "n_eval": "evaluated examples",
    }
    FORMAT = "attnlens.ProbeResult/1"

    task: str
    split: str
    metric: str
    score: float
    majority: float
    predictions: list = field(repr=False)
    n_train: int = 0
    n_eval: int = 0
    settings: dict = field(default_factory=dict, repr=False)
    seconds: dict = field(default_factory=dict, repr=False)
    interval: Interval | None = None
    scores: list = field(default_factory=list)
    seed_std: float = 0.0
    baseline: float = float("nan")
    baseline_interval: Interval | None = None
    majority_interval: Interval | None = None
    runs: list = field(default_factory=list, repr=False)
    baseline_predictions: list = field(default_factory=list, repr=False)
    evaluation: Any = field(default=None, repr=False)
    versus_baseline: Paired | None = None
    linear: Any = field(default=None, repr=False)

    def __repr__(self) -> str:
        interval = f" [{self.interval.low:.4f}, {self.interval.high:.4f}]" if self.interval else ""
        return (
            f"ProbeResult({self.task} {self.split}: {self.metric} {self.score:.4f}{interval} "
            f"(linear {self.baseline:.4f}, majority {self.majority:.4f}), trained on {self.n_train}, "
            f"evaluated on {self.n_eval})"
        )

    @property
    def table(self) -> Any:
        """The summary as one row of :attr:`COLUMNS`."""
        nan = float("nan")
        interval, linear, majority = self.interval, self.baseline_interval, self.majority_interval
        versus = self.versus_baseline
        return frame([{
            "task": self.task, "split": self.split, "metric": self.metric, "score": self.score,
            "low": interval.low if interval else nan, "high": interval.high if interval else nan,
            "seed_std": self.seed_std, "n_seeds": max(1, len(self.scores)), "baseline": self.baseline,
            "baseline_low": linear.low if linear else nan, "baseline_high": linear.high if linear else nan,
            "versus_baseline": versus.difference if versus else nan,
            "versus_baseline_low": versus.low if versus else nan,
            "versus_baseline_high": versus.high if versus else nan,
            "majority": self.majority, "majority_low": majority.low if majority else nan,
            "majority_high": majority.high if majority else nan, "n_train": self.n_train,
            "n_eval": self.n_eval,
        }], self.COLUMNS)

    def figure(self) -> Any:
        """The probe beside the linear and the majority baselines, each with its 95% interval
        (:func:`attnlens.core.plots.score_bars`)."""

        row = self.table.iloc[0]
        names = [name for name in ("probe", "linear", "majority")
                 if name != "linear" or row["baseline"] == row["baseline"]]  # no NaN bar
        prefix = {"probe": "", "linear": "baseline_", "majority": "majority_"}
        value = {"probe": "score", "linear": "baseline", "majority": "majority"}
        return score_bars(names, [row[value[n]] for n in names], [row[prefix[n] + "low"] for n in names],
                          [row[prefix[n] + "high"] for n in names], yaxis=self.metric,
                          title=f"{self.task} ({self.split}): probe and baselines")

    def to_dict(self) -> dict[str, Any]:
        def interval(value: Any) -> Any:
            return None if value is None else plain(vars(value))

        return {"task": self.task, "split": self.split, "metric": self.metric, "score": self.score,
                "majority": self.majority, "n_train": self.n_train, "n_eval": self.n_eval,
                "settings": plain(self.settings), "seconds": plain(self.seconds),
                "interval": interval(self.interval), "scores": plain(self.scores),
                "seed_std": self.seed_std, "baseline": plain(self.baseline),
                "baseline_interval": interval(self.baseline_interval),
                "majority_interval": interval(self.majority_interval),
                "versus_baseline": interval(self.versus_baseline)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeResult:
        def number(value: Any) -> float:
            return float("nan") if value is None else float(value)

        def read(kind: Any, value: Any) -> Any:
            return None if value is None else kind(**{key: number(item) for key, item in value.items()})

        return cls(task=data["task"], split=data["split"], metric=data["metric"], score=number(data["score"]),
                   majority=number(data["majority"]), predictions=[], n_train=int(data["n_train"]),
                   n_eval=int(data["n_eval"]), settings=dict(data.get("settings") or {}),
                   seconds=dict(data.get("seconds") or {}), interval=read(Interval, data.get("interval")),
                   scores=[number(x) for x in data.get("scores") or []], seed_std=number(data["seed_std"]),
                   baseline=number(data["baseline"]), baseline_interval=read(Interval, data.get("baseline_interval")),
                   majority_interval=read(Interval, data.get("majority_interval")),
                   versus_baseline=read(Paired, data.get("versus_baseline")))




def warn_if_below(result: ProbeResult, stacklevel: int = 2) -> None:
    """One :class:`ProbeWarning` naming each baseline the probe's score falls below."""
    below = []
    if result.score < result.majority:
        below.append(f"the majority class ({result.majority:.4f})")
    if result.score < result.baseline:
        versus = result.versus_baseline
        significance = ("" if versus is None else
                        f", significantly: paired 95% interval of the difference [{versus.low:.4f}, "
                        f"{versus.high:.4f}]" if versus.significant else
                        f", within noise: paired 95% interval of the difference [{versus.low:.4f}, "
                        f"{versus.high:.4f}]")
        below.append(f"the linear baseline ({result.baseline:.4f}{significance})")
    if below:
        warnings.warn(
            f"the probe's {result.metric} on {result.task} {result.split}, {result.score:.4f}, is below "
            f"{' and '.join(below)}: the probe, not the model, may limit this score. Use more "
            "training examples (train_limit=), more seeds, or report the baseline beside it.",
            ProbeWarning, stacklevel=stacklevel,
        )
