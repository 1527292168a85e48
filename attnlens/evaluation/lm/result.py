"""The LM score as a result: :class:`LMScore`, and the kinds of score it can hold (:data:`KINDS`,
:data:`NAMES`). See :mod:`attnlens.evaluation.lm` for what each kind measures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from attnlens.core.plots import score_bars
from attnlens.core.result import Result, frame, plain
from attnlens.errors import InputError
from attnlens.evaluation.probing.intervals import Interval

__all__ = ["KINDS", "LMScore", "NAMES"]

#: the kinds of score, and how each is named wherever a score is shown
KINDS: dict[str, str] = {
    "causal": "causal LM",
    "mlm": "MLM (fixed masks)",
    "pll": "pseudo-log-likelihood",
}
#: every kind of score a :class:`LMScore` can hold: the head's own, and the MLM probe
#: (:func:`attnlens.evaluation.probing.mlm.probe`)
NAMES: dict[str, str] = {**KINDS, "probe": "MLM probe"}


@dataclass(frozen=True)
class LMScore(Result):
    """A score of the model's own LM head over a corpus.

    ``value``: minus the mean negative log-likelihood per predicted token (nats; higher is
    better); ``kind``: ``"causal"``, ``"mlm"`` or ``"pll"`` (see :data:`KINDS`); ``n_tokens``:
    predicted tokens (causal: real tokens but each text's first; mlm: masked tokens; pll: real
    non-special tokens); ``n_examples``: texts; ``perplexity``: ``exp(-value)`` (for ``"pll"``
    the pseudo-perplexity of Salazar et al. 2020, also :attr:`pseudo_perplexity`);
    ``model_id``; ``settings``: what else the number depends on (``max_len``, ``mask_rate``,
    ``seed``, ``mask`` (what replaces a masked token), ``hooks``: how many intervention hooks
    ran) and ``n_truncated``, the texts cut by ``max_len``. The MLM probe (kind ``"probe"``)
    also gives ``counts``, ``[text, 2]`` (the summed log-likelihood of each evaluation text's
    masked tokens, and how many), and ``interval``, the 95% bootstrap interval of ``value`` over
    the evaluation texts (:func:`attnlens.evaluation.probing.intervals.bootstrap_counts`).

    A :class:`~attnlens.core.result.Result`: :attr:`table` is the score in one row
    (:attr:`COLUMNS`), :meth:`figure` a bar with its interval, :meth:`to_json` all of it.
    """

    COLUMNS: ClassVar[dict[str, str]] = {
        "kind": "causal, mlm, pll (the model's own head) or probe (the MLM probe)",
        "name": "the kind in words, as every view of the score names it",
        "value": "minus the mean negative log-likelihood per predicted token (nats; higher is better)",
        "low": "95% bootstrap interval of value over the evaluation texts: lower end (the MLM probe only)",
        "high": "95% bootstrap interval of value: upper end",
        "perplexity": "exp(-value) (a pseudo-perplexity for pll)",
        "n_tokens": "predicted tokens",
        "n_examples": "texts",
        "n_truncated": "texts cut by max_len",
        "model_id": "the model scored",
    }
    FORMAT: ClassVar[str] = "attnlens.LMScore/1"

    value: float
    kind: str
    n_tokens: int
    n_examples: int
    perplexity: float
    model_id: str
    settings: dict[str, Any] = field(default_factory=dict, hash=False)
    interval: Interval | None = field(default=None, hash=False, compare=False)
    counts: Any = field(default=None, hash=False, compare=False, repr=False)

    @property
    def name(self) -> str:
        """The kind in words: ``"causal LM"``, ``"MLM (fixed masks)"``, ``"pseudo-log-likelihood"``."""
        return NAMES[self.kind]

    @property
    def pseudo_perplexity(self) -> float:
        """``exp(-value)`` of a ``"pll"`` score (Salazar et al. 2020's PPPL); ``ValueError`` for
        another kind, whose :attr:`perplexity` is not a pseudo-perplexity."""
        if self.kind != "pll":
            raise InputError(
                f"a {self.name} score has a perplexity ({self.perplexity:.4g}), not a "
                "pseudo-perplexity; use kind='pll' for one."
            )
        return self.perplexity

    def __str__(self) -> str:
        ppl = "pseudo-perplexity" if self.kind == "pll" else "perplexity"
        return (
            f"{self.name} score {self.value:.4f} nats/token ({ppl} {self.perplexity:.4g}) over "
            f"{self.n_tokens} tokens of {self.n_examples} texts, {self.model_id}"
        )

    def __repr__(self) -> str:
        return f"LMScore({self})"

    @property
    def n_truncated(self) -> int:
        """Texts cut by ``max_len`` (``settings["n_truncated"]``; 0 where not recorded)."""
        return int(self.settings.get("n_truncated", 0))

    @property
    def table(self) -> Any:
        """The score as one row of :attr:`COLUMNS`."""
        nan = float("nan")
        return frame([{
            "kind": self.kind, "name": self.name, "value": self.value,
            "low": self.interval.low if self.interval else nan, "high": self.interval.high if self.interval else nan,
            "perplexity": self.perplexity, "n_tokens": self.n_tokens, "n_examples": self.n_examples,
            "n_truncated": self.n_truncated, "model_id": self.model_id,
        }], self.COLUMNS)

    def figure(self) -> Any:
        """The score as a bar with its 95% interval, where it has one (:func:`attnlens.core.plots.score_bars`)."""

        row = self.table.iloc[0]
        return score_bars([self.name], [self.value], [row["low"]], [row["high"]], yaxis="nats per token",
                          title=f"{self.name} score of {self.model_id} ({self.n_tokens} tokens)")

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "kind": self.kind, "n_tokens": self.n_tokens, "n_examples": self.n_examples,
                "perplexity": self.perplexity, "model_id": self.model_id, "settings": plain(self.settings),
                "interval": None if self.interval is None else plain(vars(self.interval)),
                "counts": None if self.counts is None else plain(self.counts)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LMScore:
        interval, counts = data.get("interval"), data.get("counts")
        if data["kind"] not in NAMES:
            raise ValueError(f"kind {data['kind']!r} is none of {', '.join(NAMES)}")
        return cls(value=float(data["value"]), kind=data["kind"], n_tokens=int(data["n_tokens"]),
                   n_examples=int(data["n_examples"]), perplexity=float(data["perplexity"]),
                   model_id=str(data["model_id"]), settings=dict(data.get("settings") or {}),
                   interval=None if interval is None else Interval(**interval),
                   counts=None if counts is None else np.asarray(counts, dtype=np.float64).reshape(-1, 2))
