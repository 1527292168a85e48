"""The linear baseline beside every probe score: logistic regression on the same features.

A probe's score means little unless it beats what anyone writes in ten lines on the same
features. :class:`LinearBaseline` is that: scikit-learn's ``LogisticRegression`` (L2, lbfgs) on
standardised features (``StandardScaler``), with its inverse regularisation ``C`` chosen on a
held-out part of the training examples (``holdout``, never the evaluation split), then refitted
on all of them.

Its features are the probe's (:class:`attnlens.probing.Features`), read without learning:

- sequence examples: the **mean** of the example's kept token vectors, per layer, the layers
  concatenated (``(L + 1) · d``);
- word examples: each word's first sub-token, its layers concatenated (as the probe).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jaxtyping import Float

from attnlens.core.checks import all_finite, finite, items, whole_number
from attnlens.core.estimator import Estimator
from attnlens.core.files import read_checked, safetensors_bytes, write_atomic
from attnlens.errors import InputError, NotFittedError
from attnlens.evaluation.probing.features import Features
from attnlens.evaluation.probing.probe import PapaProbe

#: File format of a saved linear baseline.
FORMAT = "attnlens.LinearBaseline/1"

#: The grid of ``C`` tried on the held-out split (strong to weak regularisation).
C_GRID: tuple[float, ...] = (1e-3, 1e-2, 1e-1)

#: sequence examples pooled at a time by :func:`design` (a float32 copy of their vectors that
#: stays in the processor's cache)
EXAMPLES_AT_A_TIME = 16


def design(features: Features) -> Float[np.ndarray, "row feature"]:
    """The baseline's inputs: one row per example (mean-pooled layers, concatenated) for
    sequence features, one per kept word for word features (see the module docstring).
    Sequence examples are pooled :data:`EXAMPLES_AT_A_TIME` at a time (the same sums, each
    example's tokens added in order, without a float32 copy of every vector: 6.5x faster on
    MRPC's 4,000 pairs at one thread, ``benchmarks/probe_rows.py``)."""
    if features.kind != "sequence":
        return features.vectors.float().flatten(1).numpy()
    n, offsets = len(features), features.offsets
    rows = torch.empty((n, features.vectors.shape[1] * features.vectors.shape[2]))
    for start in range(0, n, EXAMPLES_AT_A_TIME):
        end = min(n, start + EXAMPLES_AT_A_TIME)
        lengths = features.lengths[start:end]
        vectors = features.vectors[offsets[start] : offsets[end]].float()
        example = torch.repeat_interleave(torch.arange(end - start), lengths)
        sums = torch.zeros((end - start, *vectors.shape[1:])).index_add_(0, example, vectors)
        rows[start:end] = (sums / lengths.clamp_min(1)[:, None, None]).flatten(1)
    return rows.numpy()


class LinearBaseline(Estimator):
    """Logistic regression on standardised features, ``C`` chosen on ``holdout`` of the
    training examples (scikit-learn style: :meth:`fit`, :meth:`predict`, :meth:`score`,
    ``get_params`` / ``set_params``).

    ``scorer(indices, predictions)``: how a ``C`` is judged on the held-out examples at
    ``indices`` (by default accuracy; :func:`attnlens.probing.run` passes the task's metric).
    After :meth:`fit`: ``C`` (chosen), ``held_out`` (``{C: score}``). :meth:`save` / :meth:`load`
    keep a fitted baseline in one safetensors file (its scaler's and its model's arrays, exactly).
    """

    def __init__(self, *, grid: Sequence[float] = C_GRID, holdout: float = 0.2, seed: int = 0,
                 max_iter: int = 1000) -> None:
        self._grid = tuple(finite(c, f"grid[{i}]", low=0.0) for i, c in enumerate(items(grid, "grid", "(0.01, 0.1)")))
        if not self._grid or min(self._grid) <= 0:
            raise InputError("grid must hold at least one C above 0.")
        finite(holdout, "holdout", low=0.0, high=0.9)
        whole_number(seed, "seed")
        whole_number(max_iter, "max_iter", minimum=1)
        # scikit-learn's contract: every argument stored unchanged (checked above)
        self.grid, self.holdout, self.seed, self.max_iter = grid, holdout, seed, max_iter
        self.C: float | None = None
        self.held_out: dict[float, float] = {}
        self.model: Any = None

    def _fit(self, rows: np.ndarray, targets: np.ndarray, C: float, start: Any = None) -> Any:
        """A standardised logistic regression of inverse regularisation ``C`` on ``rows``; with
        ``start`` (a fitted one on the same labels), its solution is the solver's first point
        (warm start: the same optimum, fewer iterations)."""
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        model = LogisticRegression(C=C, max_iter=self.max_iter, warm_start=start is not None)
        if start is not None and np.array_equal(start.classes_, np.unique(targets)):
            model.coef_, model.intercept_ = start.coef_.copy(), start.intercept_.copy()
        scaler = StandardScaler().fit(rows)
        model.fit(scaler.transform(rows), targets)
        return make_pipeline(scaler, model)

    def fit(self, features: Features, labels: list,
            scorer: Callable[[np.ndarray, list], float] | None = None, *,
            start: LinearBaseline | None = None) -> LinearBaseline:
        """Choose ``C`` on the held-out examples (the grid from strong to weak regularisation,
        each fit starting from the previous one's solution), then fit on all (starting from the
        chosen ``C``'s held-out fit, or with a grid of one ``C`` from ``start``'s solution: a
        fitted baseline of the same labels, e.g. on other features of the same examples);
        returns ``self``.

        A warm start reaches the same optimum (the problem is strictly convex) to the solver's
        tolerance, in fewer iterations: on POS (47 labels, 4,000 sentences) with heads replaced,
        82-97 lbfgs iterations instead of 265, 99.9% of the predictions the same as a cold fit's."""
        import warnings

        from sklearn.exceptions import ConvergenceWarning

        rows, targets, owner = self._rows(features, labels)
        n = len(features)
        order = np.random.default_rng(self.seed).permutation(n)
        cut = int(round(n * self.holdout))
        fitted: dict[float, Any] = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            if len(self._grid) > 1 and cut >= 1 and n - cut >= 2:
                held, kept = np.sort(order[:cut]), np.sort(order[cut:])
                fit_rows, held_rows = np.isin(owner, kept), np.isin(owner, held)
                if len(np.unique(targets[fit_rows])) > 1:
                    previous = None
                    for C in sorted(self._grid):
                        model = self._fit(rows[fit_rows], targets[fit_rows], C, previous)
                        previous = fitted[C] = model[-1]
                        predicted = np.zeros(len(rows), dtype=np.int64)
                        predicted[held_rows] = model.predict(rows[held_rows])
                        predicted = self._per_example(features, predicted, targets, held)
                        self.held_out[C] = float((scorer or _accuracy(labels))(held, predicted))
            # the best held-out score; ties go to the stronger regularisation (the smaller C)
            self.C = (max(sorted(self.held_out), key=self.held_out.get) if self.held_out
                      else self._grid[0])
            if len(np.unique(targets)) < 2:
                raise InputError("the linear baseline needs at least two labels in the training examples.")
            first = fitted.get(self.C, start.model[-1] if start is not None and start.model is not None else None)
            self.model = self._fit(rows, targets, self.C, first)
        self._words = features.kind != "sequence"
        self.fallback = int(np.bincount(targets).argmax())
        return self

    def predict(self, features: Features) -> list:
        """Label ints per example (sequence) or per word (word features; the words without a
        vector get the most frequent training label), as :meth:`PapaProbe.predict`."""
        if self.model is None:
            raise NotFittedError("this LinearBaseline is not fitted yet; call fit(features, labels) first.")
        predicted = self.model.predict(design(features))
        return self._per_example(features, predicted, None, np.arange(len(features)))

    def score(self, features: Features, labels: list) -> float:
        """The share of correct predictions (of examples, or of words for word features), as
        scikit-learn's ``ClassifierMixin.score``."""
        predicted = self.predict(features)
        return _accuracy(labels)(np.arange(len(labels)), predicted)

    def _rows(self, features: Features, labels: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Inputs, targets and the example each row belongs to (every kept word is labelled)."""
        rows = design(features)
        targets = PapaProbe._targets(PapaProbe(), features, labels).numpy()
        owner = (np.arange(len(features)) if features.kind == "sequence"
                 else np.repeat(np.arange(len(features)), features.lengths.numpy()))
        return rows, targets, owner

    def _per_example(self, features: Features, predicted: np.ndarray, targets: np.ndarray | None,
                     examples: np.ndarray) -> list:
        """Predictions of every row, as the lists of :meth:`predict` for ``examples``."""
        if features.kind == "sequence":
            return [int(predicted[i]) for i in examples]
        offsets = features.offsets.numpy()
        fallback = int(np.bincount(targets).argmax()) if targets is not None else self.fallback
        out = []
        for i in examples:
            tags = [fallback] * int(features.n_words[i])
            words = features.positions[offsets[i] : offsets[i + 1]].tolist()
            for word, label in zip(words, predicted[offsets[i] : offsets[i + 1]].tolist(), strict=True):
                tags[word] = int(label)
            out.append(tags)
        return out

    # ---- files -------------------------------------------------------------------------------

    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """The fitted baseline as tensors and string metadata (what :meth:`save` writes and
        :meth:`from_state` reads back): the scaler's ``mean_``, ``scale_`` and ``var_``, the
        logistic regression's ``coef_``, ``intercept_`` and ``classes_``, every value exact."""
        if self.model is None:
            raise NotFittedError("this LinearBaseline is not fitted yet; nothing to save.")
        scaler, model = self.model[0], self.model[-1]
        tensors = {name: torch.from_numpy(np.ascontiguousarray(value)) for name, value in (
            ("mean", scaler.mean_), ("scale", scaler.scale_), ("var", scaler.var_), ("coef", model.coef_),
            ("intercept", model.intercept_), ("classes", model.classes_))}
        metadata = {"format": FORMAT, "params": json.dumps(self.get_params()), "C": repr(float(self.C)),
                    "held_out": json.dumps([[float(c), score] for c, score in self.held_out.items()]),
                    "fallback": str(self.fallback), "words": str(self._words),
                    "n_samples_seen": str(int(scaler.n_samples_seen_)), "n_iter": json.dumps(model.n_iter_.tolist())}
        return tensors, metadata

    @classmethod
    def from_state(cls, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> LinearBaseline:
        """The baseline of :meth:`state`'s tensors and metadata (``KeyError`` / ``ValueError``
        for a missing or mangled field)."""
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        params = json.loads(metadata["params"])
        baseline = cls(**params)
        baseline.C = float(metadata["C"])
        baseline.held_out = {float(c): float(score) for c, score in json.loads(metadata["held_out"])}
        baseline.fallback, baseline._words = int(metadata["fallback"]), metadata["words"] == "True"
        arrays = {name: tensors[name].numpy() for name in ("mean", "scale", "var", "coef", "intercept", "classes")}
        scaler = StandardScaler()
        scaler.mean_, scaler.scale_, scaler.var_ = arrays["mean"], arrays["scale"], arrays["var"]
        scaler.n_samples_seen_ = int(metadata["n_samples_seen"])
        scaler.n_features_in_ = len(arrays["mean"])
        model = LogisticRegression(C=baseline.C, max_iter=baseline.max_iter)
        model.coef_, model.intercept_, model.classes_ = arrays["coef"], arrays["intercept"], arrays["classes"]
        model.n_features_in_ = arrays["coef"].shape[1]
        model.n_iter_ = np.asarray(json.loads(metadata["n_iter"]), dtype=np.int32)
        baseline.model = make_pipeline(scaler, model)
        return baseline

    def save(self, path: str | os.PathLike) -> Path:
        """Write the fitted baseline to one safetensors file (atomically, with a checksum)."""
        tensors, metadata = self.state()
        return write_atomic(path, safetensors_bytes(tensors, metadata))

    @classmethod
    def load(cls, path: str | os.PathLike) -> LinearBaseline:
        """Read a baseline written by :meth:`save`: one error naming the file when it is missing,
        damaged, of another kind, or holds non-finite values."""
        metadata, tensors = read_checked(path, what="linear baseline", format=FORMAT)
        if not all(all_finite(value) for value in tensors.values()):
            raise InputError(f"linear baseline file {path} holds non-finite weights.")
        try:
            return cls.from_state(tensors, metadata)
        except (KeyError, TypeError, ValueError) as error:
            raise InputError(f"linear baseline file {path} does not describe a LinearBaseline ({error}); "
                             "fit and save it again.") from None


def _accuracy(labels: list) -> Callable[[np.ndarray, list], float]:
    def score(indices: np.ndarray, predicted: list) -> float:
        gold = [labels[i] for i in indices]
        if gold and isinstance(gold[0], list | tuple):
            pairs = [(p, g) for ps, gs in zip(predicted, gold, strict=True) for p, g in zip(ps, gs, strict=True)]
        else:
            pairs = list(zip(predicted, gold, strict=True))
        return sum(p == g for p, g in pairs) / max(1, len(pairs))

    return score
