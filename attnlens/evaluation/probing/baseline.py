"""The linear baseline beside every probe score: logistic regression on the same features.

A probe's score means little unless it beats what anyone writes in ten lines on the same
features. :class:`LinearBaseline` is that: scikit-learn's ``LogisticRegression`` (L2, lbfgs) on
standardised features (``StandardScaler``), with its inverse regularisation ``C`` chosen on a
held-out part of the training examples (``holdout``, never the evaluation split), then refitted
on all of them.

Two solvers fit it (``LinearBaseline(solver=...)``): ``"sklearn"`` (those classes, on the
host) and ``"torch"`` (:class:`attnlens.evaluation.probing.logistic.Logistic`: the same scaler and
objective, minimised by ``torch.optim.LBFGS`` to the same gradient tolerance, on the features'
device). By default the features' device decides: scikit-learn for features on the CPU (what
the committed results measured), torch for features anywhere else (no copy to the host).

Its features are the probe's (:class:`attnlens.evaluation.probing.Features`), read without learning:

- sequence examples: the **mean** of the example's kept token vectors, per layer, the layers
  concatenated (``(L + 1) · d``);
- word examples: each word's first sub-token, its layers concatenated (as the probe).
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jaxtyping import Float

from attnlens.core.checks import all_finite, finite, flag, items, whole_number
from attnlens.core.estimator import Estimator
from attnlens.core.files import read_checked, safetensors_bytes, write_atomic
from attnlens.errors import InputError, MismatchError, NotFittedError
from attnlens.evaluation.probing.features import Features
from attnlens.evaluation.probing.logistic import Logistic
from attnlens.evaluation.probing.logistic import fit as fit_logistic
from attnlens.evaluation.probing.probe import label_targets

#: File format of a saved linear baseline.
FORMAT = "attnlens.LinearBaseline/1"

#: The grid of ``C`` tried on the held-out split first (strong to weak regularisation); with
#: ``extend`` it grows by factors of 10 past the edge where the best ``C`` lies until that ``C`` is
#: interior, within :data:`C_LIMITS`.
C_GRID: tuple[float, ...] = (1e-3, 1e-2, 1e-1)
C_LIMITS: tuple[float, float] = (1e-7, 1e3)

#: sequence examples pooled at a time by :func:`design` (a float32 copy of their vectors that
#: stays in the processor's cache)
EXAMPLES_AT_A_TIME = 16
#: the same off the CPU (fewer, larger kernels; a float32 copy of 1,024 examples' vectors)
EXAMPLES_AT_A_TIME_OFF_CPU = 1024

#: the solvers of :class:`LinearBaseline` (``None``: chosen by the features' device)
SOLVERS = ("sklearn", "torch")


def design(features: Features, *, tensor: bool = False
           ) -> Float[np.ndarray, "row feature"] | Float[torch.Tensor, "row feature"]:
    """The baseline's inputs: one row per example (mean-pooled layers, concatenated) for
    sequence features, one per kept word for word features (see the module docstring), float32;
    a NumPy array on the host, or with ``tensor=True`` a tensor on the features' device (the
    torch solver's rows: nothing is copied to the host).
    Sequence examples are pooled :data:`EXAMPLES_AT_A_TIME` at a time on the CPU (the same sums,
    each example's tokens added in order, without a float32 copy of every vector: 6.5x faster on
    MRPC's 4,000 pairs at one thread, ``benchmarks/probe_rows.py``), and
    :data:`EXAMPLES_AT_A_TIME_OFF_CPU` at a time elsewhere (its offsets read from the host's
    lengths, so the loop waits for no kernel)."""
    vectors = features.vectors
    if features.kind != "sequence":
        rows = vectors.float().flatten(1)
    else:
        device, n = vectors.device, len(features)
        lengths = features.lengths.to(device)
        offsets = [0, *features.lengths.cpu().cumsum(0).tolist()]
        at_a_time = EXAMPLES_AT_A_TIME if device.type == "cpu" else EXAMPLES_AT_A_TIME_OFF_CPU
        rows = torch.empty((n, vectors.shape[1] * vectors.shape[2]), dtype=torch.float32, device=device)
        for start in range(0, n, at_a_time):
            end = min(n, start + at_a_time)
            block = vectors[offsets[start] : offsets[end]].float()
            example = torch.repeat_interleave(torch.arange(end - start, device=device), lengths[start:end],
                                              output_size=offsets[end] - offsets[start])
            sums = torch.zeros((end - start, *block.shape[1:]), dtype=block.dtype, device=device).index_add_(0, example, block)
            rows[start:end] = (sums / lengths[start:end].clamp_min(1)[:, None, None]).flatten(1)
    return rows if tensor else rows.numpy(force=True)


class LinearBaseline(Estimator):
    """Logistic regression on standardised features, ``C`` chosen on ``holdout`` of the
    training examples (scikit-learn style: :meth:`fit`, :meth:`predict`, :meth:`score`,
    ``get_params`` / ``set_params``).

    ``solver``: ``"sklearn"`` (scikit-learn's ``StandardScaler`` and ``LogisticRegression``, on
    the host), ``"torch"`` (:class:`~attnlens.evaluation.probing.logistic.Logistic`, the same scaler and
    objective by ``torch.optim.LBFGS`` to the same gradient tolerance, on the features' device)
    or ``None`` (the default): scikit-learn for features on the CPU, torch for features anywhere
    else. After :meth:`fit`, ``solver_`` names the one that fitted ``model`` (a scikit-learn
    pipeline, or a :class:`Logistic`).

    ``scorer(indices, predictions)``: how a ``C`` is judged on the held-out examples at
    ``indices`` (by default accuracy; :func:`attnlens.evaluation.probing.run` passes the task's metric).
    After :meth:`fit`: ``C`` (chosen), ``held_out`` (``{C: score}``, every ``C`` tried: the grid,
    and with ``extend`` (default) the factors of 10 past its edge until the best ``C`` is interior,
    within :data:`C_LIMITS`; a choice made on held-out *training* examples only). :meth:`save` / :meth:`load`
    keep a fitted baseline in one safetensors file (its scaler's and its model's arrays, exactly,
    and its solver's name; a file without one was scikit-learn's).
    """

    def __init__(self, *, grid: Sequence[float] = C_GRID, holdout: float = 0.2, seed: int = 0,
                 max_iter: int = 1000, solver: str | None = None, extend: bool = True) -> None:
        self._grid = tuple(finite(c, f"grid[{i}]", low=0.0) for i, c in enumerate(items(grid, "grid", "(0.01, 0.1)")))
        if not self._grid or min(self._grid) <= 0:
            raise InputError("grid must hold at least one C above 0.")
        finite(holdout, "holdout", low=0.0, high=0.9)
        whole_number(seed, "seed")
        whole_number(max_iter, "max_iter", minimum=1)
        if solver is not None and (not isinstance(solver, str) or solver not in SOLVERS):
            raise InputError(f"solver must be one of {', '.join(map(repr, SOLVERS))} or None (chosen by the "
                             f"features' device), not {solver!r}.")
        # scikit-learn's contract: every argument stored unchanged (checked above)
        self.grid, self.holdout, self.seed, self.max_iter = grid, holdout, seed, max_iter
        self.solver, self.extend = solver, flag(extend, "extend")
        self.C: float | None = None
        self.held_out: dict[float, float] = {}
        self.model: Any = None
        self.solver_: str | None = None
        #: the model whose features it was fitted on (:attr:`Features.model`; "" when unknown)
        self.fitted_on_ = ""

    def _after_set_params(self, fresh: Estimator) -> None:
        self._grid = fresh._grid

    def _solver_for(self, features: Features) -> str:
        """The solver that fits ``features``: the one given, else by the features' device."""
        if self.solver is not None:
            return self.solver
        return "sklearn" if features.vectors.device.type == "cpu" else "torch"

    def _fit(self, rows: np.ndarray | torch.Tensor, targets: np.ndarray | torch.Tensor, C: float,
             start: Any = None) -> Any:
        """A standardised logistic regression of inverse regularisation ``C`` on ``rows`` (a
        scikit-learn pipeline for NumPy rows, a :class:`Logistic` for a tensor); with ``start``
        (a fitted one on the same labels, of either solver), its solution is the solver's first
        point (warm start: the same optimum, fewer iterations)."""
        if isinstance(rows, torch.Tensor):
            return fit_logistic(rows, targets, C, _as_logistic(start), max_iter=self.max_iter)
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        model = LogisticRegression(C=C, max_iter=self.max_iter, warm_start=start is not None)
        if start is not None:
            coef, intercept, classes = _solution(start)
            if np.array_equal(classes, np.unique(targets)):
                model.coef_, model.intercept_ = coef.copy(), intercept.copy()
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
        from sklearn.exceptions import ConvergenceWarning

        features = _indexed_on_host(features.check_finite())
        solver = self._solver_for(features)
        rows, targets, owner = self._rows(features, labels, tensor=solver == "torch")
        self.held_out = {}  # this fit's choice alone: a refit is a fresh fit
        # the torch solver's targets, on its rows' device (NumPy's for the bookkeeping)
        fit_targets = torch.from_numpy(targets).to(rows.device) if solver == "torch" else targets
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

                    def judge(C: float, previous: Any) -> None:
                        model = self._fit(_take(rows, fit_rows), _take(fit_targets, fit_rows), C, previous)
                        fitted[C] = _last(model)
                        predicted = np.zeros(len(rows), dtype=np.int64)
                        predicted[held_rows] = _predict(model, _take(rows, held_rows))
                        predicted = self._per_example(features, predicted, targets, held)
                        self.held_out[C] = float((scorer or _accuracy(labels))(held, predicted))

                    previous = None
                    for C in sorted(self._grid):
                        judge(C, previous)
                        previous = fitted[C]
                    # widen the grid by a factor of 10 at the edge where the best C lies, until it
                    # is interior (or at C_LIMITS): a C on the grid's edge may be under-tuned. The
                    # best is always _best's (ties to the smaller C), so a tie past the lower edge
                    # looks further down, and one past the upper edge leaves the best interior
                    while self.extend:
                        best, tried = _best(self.held_out), sorted(self.held_out)
                        beyond = _decade(best, -1) if best == tried[0] else _decade(best, 1) if best == tried[-1] else None
                        if beyond is None or not C_LIMITS[0] <= beyond <= C_LIMITS[1]:
                            break
                        judge(beyond, fitted[best])
            # the best held-out score; ties go to the stronger regularisation (the smaller C)
            self.C = _best(self.held_out) if self.held_out else self._grid[0]
            if len(np.unique(targets)) < 2:
                raise InputError("the linear baseline needs at least two labels in the training examples.")
            first = fitted.get(self.C, _last(start.model) if start is not None and start.model is not None else None)
            self.model = self._fit(rows, fit_targets, self.C, first)
        self.solver_ = solver
        self.fitted_on_ = features.model
        self._words = features.kind != "sequence"
        self.fallback = int(np.bincount(targets).argmax())
        return self

    def predict(self, features: Features) -> list:
        """Label ints per example (sequence) or per word (word features; the words without a
        vector get the most frequent training label), as :meth:`PapaProbe.predict`."""
        if self.model is None:
            raise NotFittedError("this LinearBaseline is not fitted yet; call fit(features, labels) first.")
        features = _indexed_on_host(features.check_model(self.fitted_on_, "baseline").check_finite())
        kind = "word" if self._words else "sequence"
        rows = design(features, tensor=isinstance(self.model, Logistic))
        width = _solution(_last(self.model))[0].shape[1]
        if (features.kind != "sequence") != self._words or rows.shape[1] != width:
            raise MismatchError(
                f"this baseline was fitted on {kind} features of {width} values a row; these are "
                f"{features.kind!r} features of {rows.shape[1]}. Fit a baseline on features like these.")
        predicted = _predict(self.model, rows)
        return self._per_example(features, predicted, None, np.arange(len(features)))

    def score(self, features: Features, labels: list) -> float:
        """The share of correct predictions (of examples, or of words for word features), as
        scikit-learn's ``ClassifierMixin.score``."""
        predicted = self.predict(features)
        if len(labels) != len(predicted):
            raise InputError(f"{len(labels)} labels for {len(predicted)} examples; give one per example.")
        return _accuracy(labels)(np.arange(len(labels)), predicted)

    def _rows(self, features: Features, labels: list, *, tensor: bool = False
              ) -> tuple[np.ndarray | torch.Tensor, np.ndarray, np.ndarray]:
        """Inputs (``tensor``: on the features' device), targets and the example each row
        belongs to (every kept word is labelled)."""
        features = _indexed_on_host(features)
        rows = design(features, tensor=tensor)
        targets = label_targets(features, labels).numpy()
        owner = (np.arange(len(features)) if features.kind == "sequence"
                 else np.repeat(np.arange(len(features)), features.lengths.numpy()))
        return rows, targets, owner

    def _per_example(self, features: Features, predicted: np.ndarray, targets: np.ndarray | None,
                     examples: np.ndarray) -> list:
        """Predictions of every row, as the lists of :meth:`predict` for ``examples``."""
        if features.kind == "sequence":
            return [int(predicted[i]) for i in examples]
        features = _indexed_on_host(features)
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
        logistic regression's ``coef_``, ``intercept_`` and ``classes_``, every value exact, on
        the host, and the solver that fitted them (``"sklearn"`` or ``"torch"``: the same arrays
        of the same meaning)."""
        if self.model is None:
            raise NotFittedError("this LinearBaseline is not fitted yet; nothing to save.")
        if isinstance(self.model, Logistic):
            model = self.model
            values = (model.mean, model.scale, model.var, model.coef, model.intercept, model.classes)
            tensors = {name: value.detach().cpu().contiguous() for name, value in zip(_ARRAYS, values, strict=True)}
            seen, n_iter, solver = model.n_samples_seen, [int(model.n_iter)], "torch"
        else:
            scaler, model = self.model[0], self.model[-1]
            values = (scaler.mean_, scaler.scale_, scaler.var_, model.coef_, model.intercept_, model.classes_)
            tensors = {name: torch.from_numpy(np.ascontiguousarray(value))
                       for name, value in zip(_ARRAYS, values, strict=True)}
            seen, n_iter, solver = int(scaler.n_samples_seen_), model.n_iter_.tolist(), "sklearn"
        metadata = {"format": FORMAT, "params": json.dumps(self.get_params()), "C": repr(float(self.C)),
                    "held_out": json.dumps([[float(c), score] for c, score in self.held_out.items()]),
                    "fallback": str(self.fallback), "words": str(self._words),
                    "n_samples_seen": str(int(seen)), "n_iter": json.dumps(n_iter), "solver": solver,
                    "fitted_on": self.fitted_on_}
        return tensors, metadata

    @classmethod
    def from_state(cls, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> LinearBaseline:
        """The baseline of :meth:`state`'s tensors and metadata (``KeyError`` / ``ValueError``
        for a missing or mangled field; a file without ``solver`` is scikit-learn's)."""
        params = json.loads(metadata["params"])
        baseline = cls(**params)
        baseline.C = float(metadata["C"])
        baseline.held_out = {float(c): float(score) for c, score in json.loads(metadata["held_out"])}
        baseline.fallback, baseline._words = int(metadata["fallback"]), metadata["words"] == "True"
        baseline.fitted_on_ = metadata.get("fitted_on", "")  # older files: not recorded
        solver = metadata.get("solver", "sklearn")
        if solver not in SOLVERS:
            raise ValueError(f"unknown solver {solver!r}")
        n_iter = json.loads(metadata["n_iter"])
        if solver == "torch":
            model = Logistic(**{name: tensors[name] for name in _ARRAYS}, C=baseline.C,
                             n_iter=int(n_iter[0]), n_samples_seen=int(metadata["n_samples_seen"]))
            baseline.model, baseline.solver_ = model, solver
            return baseline
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        arrays = {name: tensors[name].numpy() for name in _ARRAYS}
        scaler = StandardScaler()
        scaler.mean_, scaler.scale_, scaler.var_ = arrays["mean"], arrays["scale"], arrays["var"]
        scaler.n_samples_seen_ = int(metadata["n_samples_seen"])
        scaler.n_features_in_ = len(arrays["mean"])
        model = LogisticRegression(C=baseline.C, max_iter=baseline.max_iter)
        model.coef_, model.intercept_, model.classes_ = arrays["coef"], arrays["intercept"], arrays["classes"]
        model.n_features_in_ = arrays["coef"].shape[1]
        model.n_iter_ = np.asarray(n_iter, dtype=np.int32)
        baseline.model, baseline.solver_ = make_pipeline(scaler, model), solver
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
        return sum(int(p) == int(g) for p, g in pairs) / max(1, len(pairs))  # "1" is class 1, as in fit

    return score


#: the arrays of a saved baseline: the scaler's, then the logistic regression's
_ARRAYS = ("mean", "scale", "var", "coef", "intercept", "classes")


def _indexed_on_host(features: Features) -> Features:
    """``features`` with its lengths, positions and word counts on the host (its vectors where
    they are): the bookkeeping of rows and labels reads them there."""
    index = (features.lengths, features.positions, features.n_words)
    if all(value.device.type == "cpu" for value in index):
        return features
    lengths, positions, n_words = (value.cpu() for value in index)
    return dataclasses.replace(features, lengths=lengths, positions=positions, n_words=n_words)


def _take(values: np.ndarray | torch.Tensor, mask: np.ndarray) -> np.ndarray | torch.Tensor:
    """The rows of ``values`` where the host's boolean ``mask`` is true (on their device)."""
    if isinstance(values, torch.Tensor):
        return values[torch.from_numpy(mask).to(values.device)]
    return values[mask]


def _last(model: Any) -> Any:
    """The logistic regression of a fitted model (a pipeline's last step, or a Logistic)."""
    return model if isinstance(model, Logistic) else model[-1]


def _predict(model: Any, rows: np.ndarray | torch.Tensor) -> np.ndarray:
    """A fitted model's labels of ``rows``, on the host (one copy for the torch solver)."""
    if isinstance(model, Logistic):
        return model.predict(rows).cpu().numpy()
    return model.predict(rows)


def _solution(model: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A fitted logistic regression's ``coef``, ``intercept`` and ``classes`` (either solver's)."""
    if isinstance(model, Logistic):
        return tuple(value.detach().cpu().numpy() for value in (model.coef, model.intercept, model.classes))
    return model.coef_, model.intercept_, model.classes_


def _as_logistic(model: Any) -> Logistic | None:
    """A warm start for the torch solver from a fitted model of either solver."""
    if model is None or isinstance(model, Logistic):
        return model
    coef, intercept, classes = (torch.from_numpy(np.asarray(value)) for value in _solution(model))
    return Logistic(mean=torch.zeros(0), scale=torch.ones(0), var=torch.ones(0), classes=classes, C=1.0,
                    coef=coef, intercept=intercept)


def _decade(C: float, step: int) -> float:
    """``C`` times ``10 ** step``, to 12 significant digits (``1e-3 / 10 ** 4`` is
    ``1.0000000000000002e-07`` in floating point, past which ``C_LIMITS`` would cut the walk)."""
    return float(f"{C * 10.0 ** step:.12g}")


def _best(scores: dict[float, float]) -> float:
    """The ``C`` of the best held-out score; ties go to the stronger regularisation (the smaller)."""
    return max(sorted(scores), key=scores.get)
