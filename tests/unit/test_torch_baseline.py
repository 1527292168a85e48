"""The linear baseline's torch solver (issue 58): :func:`attnlens.evaluation.probing.logistic.fit` is
scikit-learn's ``StandardScaler`` + ``LogisticRegression(penalty="l2", solver="lbfgs")``, the
same objective minimised by ``torch.optim.LBFGS`` on the rows' device, and
``LinearBaseline(solver="torch")`` keeps the estimator's contract (fit, predict, score, clone,
save / load).

How close the two solvers' coefficients must be is derived from their common stopping rule,
``max |∇f| ≤ tol`` on the scaled objective ``f`` (the module docstring of
:mod:`attnlens.evaluation.probing.logistic`): ``f`` is μ-strongly convex near its optimum θ*, μ the
smallest eigenvalue of its Hessian there (on the intercepts' zero-sum subspace with more than
two classes: adding one constant to every intercept changes nothing), so a point θ with gradient
g lies within ``‖g‖₂ / μ`` of θ*, and the two solutions within the sum of theirs. The test
computes g at both solutions and μ at both (taking the smaller, halved for the Hessian's change
between them), and checks the bound is tight enough to mean something.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest
import sklearn.base
import torch
from torch.nn import functional

from attnlens.evaluation.probing import LinearBaseline, logistic
from attnlens.evaluation.probing.baseline import design
from attnlens.evaluation.probing.features import Features
from tests.conftest import DATA, data_file

#: the column of :func:`_problem` that is constant
CONSTANT = 7


def _problem(classes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """200 rows × 20 features (scales 0.5-3, offsets, one constant column), labels from a
    random linear model with Gumbel noise: well conditioned, not separable."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(200, 20)) * rng.uniform(0.5, 3.0, 20) + rng.normal(size=20)
    x[:, CONSTANT] = 2.5
    weights = rng.normal(size=(classes, 20))
    y = (x @ weights.T + rng.gumbel(size=(200, classes))).argmax(1)
    return x, y


def _objective(theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, C: float) -> torch.Tensor:
    """f(θ) = (Σ CE + ‖W‖² / (2C)) / n, θ = [W | b] (one row: the binary log loss)."""
    n = x.shape[0]
    logits = x @ theta[:, :-1].T + theta[:, -1]
    if theta.shape[0] == 1:
        loss = functional.binary_cross_entropy_with_logits(logits[:, 0], y.double(), reduction="sum")
    else:
        loss = functional.cross_entropy(logits, y, reduction="sum")
    return (loss + theta[:, :-1].square().sum() / (2 * C)) / n


def _gradient_and_curvature(theta: np.ndarray, x: torch.Tensor, y: torch.Tensor, C: float) -> tuple[np.ndarray, float]:
    """∇f(θ) and the smallest eigenvalue of f's Hessian at θ (multinomial: on the subspace
    of θ whose columns add up to 0 over the classes; the loss is flat along θ + 1 ⊗ u, only
    the penalty curves, by 1 / (Cn), and both solvers' iterates stay in that subspace)."""
    point = torch.from_numpy(theta).double().requires_grad_(True)
    (gradient,) = torch.autograd.grad(_objective(point, x, y, C), point)
    hessian = torch.autograd.functional.hessian(lambda t: _objective(t.view_as(point), x, y, C),
                                                point.detach().flatten())
    classes, width = point.shape
    if classes > 1:
        flat = torch.kron(torch.ones(classes, 1, dtype=torch.float64) / classes**0.5, torch.eye(width, dtype=torch.float64))
        projection = torch.eye(classes * width, dtype=torch.float64) - flat @ flat.T
        eigenvalues = torch.linalg.eigvalsh(projection @ hessian @ projection)[width:]  # the flat ones: 0
    else:
        eigenvalues = torch.linalg.eigvalsh(hessian)
    return gradient.numpy(), float(eigenvalues.min())


def _distance_and_bound(ours: np.ndarray, theirs: np.ndarray, x: torch.Tensor, y: torch.Tensor, C: float
                        ) -> tuple[float, float, float]:
    """‖θ_ours − θ_theirs‖₂, its bound (‖g_ours‖₂ + ‖g_theirs‖₂) / (μ / 2), and max |g_ours|.
    The constant column's weights are 0 in both (its standardised values are 0, so the
    gradient there is W / (Cn)): it is left out, as its curvature 1 / (Cn) would only loosen
    the bound."""
    assert not ours[:, CONSTANT].any() and not theirs[:, CONSTANT].any()
    if len(ours) > 1:  # both in the subspace of _gradient_and_curvature
        assert np.abs(ours.sum(0)).max() < 1e-12 and np.abs(theirs.sum(0)).max() < 1e-12
    kept = np.arange(ours.shape[1]) != CONSTANT
    x = x[:, torch.from_numpy(kept[:-1])]
    gradient_ours, curvature_ours = _gradient_and_curvature(ours[:, kept], x, y, C)
    gradient_theirs, curvature_theirs = _gradient_and_curvature(theirs[:, kept], x, y, C)
    norms = np.linalg.norm(gradient_ours) + np.linalg.norm(gradient_theirs)
    bound = norms / (0.5 * min(curvature_ours, curvature_theirs))
    return float(np.linalg.norm(ours - theirs)), float(bound), float(np.abs(gradient_ours).max())


def _theta(coef: Any, intercept: Any) -> np.ndarray:
    return np.concatenate([np.asarray(coef), np.asarray(intercept)[:, None]], 1)


@pytest.mark.parametrize("classes", [2, 3])
@pytest.mark.parametrize("C", [0.01, 0.1, 1.0, 10.0])
def test_the_torch_solver_reaches_scikit_learns_optimum(classes, C):
    """At the default tolerance (1e-4) the coefficients are within the bound derived in the
    module docstring (measured ‖Δθ‖₂: 6.5e-5 at C = 0.01 to 2.2e-2 at C = 10 with 3 classes,
    bounds 7e-4 to 1.75 for solutions of norm 0.8 to 14: the weaker the regularisation, the
    flatter f), and at tol 1e-10 within a bound under 1e-3 (measured ‖Δθ‖₂ ≤ 4.1e-5; both stop
    on the change of f, 64·ε, with max |∇f| near 1e-8)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    x, y = _problem(classes)
    scaler = StandardScaler().fit(x)
    reference = LogisticRegression(C=C, max_iter=1000).fit(scaler.transform(x), y)  # tol 1e-4
    model = logistic.fit(torch.from_numpy(x), torch.from_numpy(y), C)
    # the scaler: StandardScaler's arrays (population std; the constant column's scale 1)
    np.testing.assert_allclose(model.mean.numpy(), scaler.mean_, rtol=1e-12)
    np.testing.assert_allclose(model.var.numpy(), scaler.var_, rtol=1e-12, atol=1e-30)
    np.testing.assert_allclose(model.scale.numpy(), scaler.scale_, rtol=1e-12)
    assert model.scale[CONSTANT] == 1.0 and model.var[CONSTANT] == 0.0
    # the model's shape: scikit-learn's (two classes: one row)
    assert model.coef.shape == reference.coef_.shape and model.intercept.shape == reference.intercept_.shape
    assert model.classes.tolist() == reference.classes_.tolist()

    rows, targets = torch.from_numpy(scaler.transform(x)), torch.searchsorted(model.classes, torch.from_numpy(y))
    ours, theirs = _theta(model.coef, model.intercept), _theta(reference.coef_, reference.intercept_)
    distance, bound, largest = _distance_and_bound(ours, theirs, rows, targets, C)
    print(f"tol 1e-4: distance {distance:.2e}, bound {bound:.2e}, |theta| {np.linalg.norm(theirs):.2f}")
    assert model.n_iter < logistic.MAX_ITER and largest <= logistic.TOL  # the stopping rule held
    assert distance <= bound, (distance, bound)
    assert bound < 0.25 * np.linalg.norm(theirs)  # the bound says something
    # a tolerance 1e6 times tighter: both reach the same point
    tight = logistic.fit(torch.from_numpy(x), torch.from_numpy(y), C, tol=1e-10)
    reference = LogisticRegression(C=C, max_iter=1000, tol=1e-10).fit(scaler.transform(x), y)
    distance, bound, _ = _distance_and_bound(_theta(tight.coef, tight.intercept),
                                             _theta(reference.coef_, reference.intercept_), rows, targets, C)
    print(f"tol 1e-10: distance {distance:.2e}, bound {bound:.2e}")
    assert distance <= bound < 1e-3, (distance, bound)


def test_a_warm_start_reaches_the_same_optimum_in_fewer_iterations():
    x, y = _problem(3, seed=1)
    rows, targets = torch.from_numpy(x), torch.from_numpy(y)
    cold = logistic.fit(rows, targets, 1.0)
    warm = logistic.fit(rows, targets, 1.0, logistic.fit(rows, targets, 0.5))
    assert warm.n_iter < cold.n_iter
    torch.testing.assert_close(warm.coef, cold.coef, atol=5e-3, rtol=0)  # tol 1e-4 each, as above


def _features(kind: str, n: int = 60, classes: int = 3, seed: int = 0) -> tuple[Features, list]:
    """Random features with labels that their vectors predict (sequence: the mean of an
    example's tokens; words: each word's vector), 3 layers × 8 dimensions, float16."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 6, (n,), generator=generator)
    vectors = torch.randn(int(lengths.sum()), 3, 8, generator=generator)
    direction = torch.randn(classes, 3 * 8, generator=generator)
    positions = torch.cat([torch.arange(int(length)) for length in lengths])
    if kind == "sequence":
        pooled = torch.stack([part.mean(0).flatten() for part in vectors.split(lengths.tolist())])
        labels = (pooled @ direction.T + torch.randn(n, classes, generator=generator)).argmax(1).tolist()
        return Features(vectors.half(), lengths, positions, torch.zeros(0, dtype=torch.long), kind, 8), labels
    tags = (vectors.flatten(1) @ direction.T + torch.randn(len(vectors), classes, generator=generator)).argmax(1)
    labels = [part.tolist() for part in tags.split(lengths.tolist())]
    return Features(vectors.half(), lengths, positions, lengths.clone(), kind, 8), labels


def test_design_keeps_the_rows_as_a_tensor_on_the_features_device():
    for kind in ("sequence", "words"):
        features, _ = _features(kind)
        rows = design(features, tensor=True)
        assert isinstance(rows, torch.Tensor) and rows.device == features.vectors.device
        assert rows.dtype == torch.float32 and np.array_equal(rows.numpy(), design(features))
    features, _ = _features("sequence")
    expected = torch.stack([part.float().mean(0).flatten() for part in features.vectors.split(features.lengths.tolist())])
    torch.testing.assert_close(design(features, tensor=True), expected)


@pytest.mark.parametrize("kind", ["sequence", "words"])
def test_the_torch_linear_baseline_clones_saves_and_loads(kind, tmp_path):
    features, labels = _features(kind)
    baseline = LinearBaseline(grid=[0.01, 0.1, 1.0], solver="torch")
    copy = sklearn.base.clone(baseline)
    assert copy.get_params() == baseline.get_params() and copy.solver == "torch" and copy.model is None
    baseline.fit(features, labels)
    assert baseline.solver_ == "torch" and isinstance(baseline.model, logistic.Logistic)
    assert baseline.model.coef.device == features.vectors.device
    predicted = baseline.predict(features)
    assert baseline.score(features, labels) > 0.6
    loaded = LinearBaseline.load(baseline.save(tmp_path / "linear.safetensors"))
    assert loaded.solver_ == "torch" and loaded.get_params() == baseline.get_params()
    assert loaded.C == baseline.C and loaded.held_out == baseline.held_out
    for name in ("mean", "scale", "var", "coef", "intercept", "classes"):
        assert torch.equal(getattr(loaded.model, name), getattr(baseline.model, name)), name
    assert loaded.predict(features) == predicted
    # the same arrays as scikit-learn's: a file of either solver has the same tensors
    sklearn_fit = LinearBaseline(grid=[0.01, 0.1, 1.0], solver="sklearn").fit(features, labels)
    assert sklearn_fit.C == baseline.C and sklearn_fit.held_out == baseline.held_out
    ours, theirs = baseline.state()[0], sklearn_fit.state()[0]
    assert {k: (v.shape, v.dtype) for k, v in ours.items()} == {k: (v.shape, v.dtype) for k, v in theirs.items()}
    # a warm start from the other solver's fit
    warm = LinearBaseline(grid=[baseline.C], solver="torch").fit(features, labels, start=sklearn_fit)
    assert warm.predict(features) == predicted


def test_a_saved_file_without_a_solver_loads_as_scikit_learns(tmp_path):
    from attnlens.core.files import safetensors_bytes

    features, labels = _features("sequence")
    baseline = LinearBaseline(grid=[0.1]).fit(features, labels)
    assert baseline.solver_ == "sklearn"  # features on the CPU, no solver given
    tensors, metadata = baseline.state()
    params = {key: value for key, value in json.loads(metadata["params"]).items() if key != "solver"}
    metadata = {**{key: value for key, value in metadata.items() if key != "solver"},
                "params": json.dumps(params)}
    path = tmp_path / "old.safetensors"
    path.write_bytes(safetensors_bytes(tensors, metadata))  # as attnlens wrote it before the torch solver
    loaded = LinearBaseline.load(path)
    assert loaded.solver_ == "sklearn" and loaded.solver is None and not isinstance(loaded.model, logistic.Logistic)
    assert loaded.predict(features) == baseline.predict(features)


def test_an_unknown_solver_is_refused():
    from attnlens.errors import InputError

    with pytest.raises(InputError, match="solver must be one of 'sklearn', 'torch' or None"):
        LinearBaseline(solver="newton")


#: the held-out accuracies' largest gap between the two solvers in the real-task test: both stop at
#: the same gradient tolerance, not at the optimum, so a held-out word that close to a decision
#: boundary may go either way (measured: up to 2 of POS's 503 held-out words, 0.004, at C = 1;
#: on the other tasks none). The issue's criterion is the dev accuracy's gap, at most 0.002.
HELD_OUT_GAP = 0.005


def _assert_equivalent_choice(ours: dict[float, float], our_c: float, theirs: dict[float, float], their_c: float) -> None:
    """Both solvers' held-out accuracies agree within :data:`HELD_OUT_GAP` at every C both tried,
    and each chose a C whose held-out accuracy is within that gap of the other's best: the same
    choice up to a held-out word at a decision boundary. The C itself may differ where two C
    values tie to within a word: measured on an AVX-512 machine (1 thread), POS's held-out
    accuracy at C = 0.01 and 0.1 was 0.8549 for both with scikit-learn (the tie goes to 0.01) and
    0.8529 / 0.8549 with torch (one word of 503 apart; torch took 0.1, then tried 1.0); the dev
    gap then was 0.0013, inside the issue's 0.002."""
    common = sorted(set(ours) & set(theirs))
    assert their_c in common or our_c in common, (ours, theirs)
    for C in common:
        assert abs(ours[C] - theirs[C]) <= HELD_OUT_GAP, (C, ours, theirs)
    assert theirs.get(our_c, ours[our_c]) >= max(theirs.values()) - HELD_OUT_GAP, (our_c, theirs)
    assert ours.get(their_c, theirs[their_c]) >= max(ours.values()) - HELD_OUT_GAP, (their_c, ours)


def test_an_equivalent_choice_of_c_is_told_from_another():
    """The check above fails a choice whose held-out accuracy is further than the gap from the best,
    and accepts a tie broken the other way."""
    theirs = {0.001: 0.835, 0.01: 0.855, 0.1: 0.855}
    _assert_equivalent_choice({0.001: 0.835, 0.01: 0.853, 0.1: 0.855, 1.0: 0.853}, 0.1, theirs, 0.01)
    with pytest.raises(AssertionError):
        _assert_equivalent_choice({0.001: 0.835, 0.01: 0.84, 0.1: 0.85}, 0.1, {0.001: 0.835, 0.01: 0.87, 0.1: 0.85}, 0.01)
    with pytest.raises(AssertionError):
        _assert_equivalent_choice({0.001: 0.9, 0.01: 0.855}, 0.001, theirs, 0.01)


def _flat(predictions: list) -> list:
    return [tag for tags in predictions for tag in tags] if predictions and isinstance(predictions[0], list) else predictions


@pytest.fixture
def one_torch_thread():
    """L-BFGS on a few hundred rows is a chain of small products: with more torch threads than
    cores (OMP_NUM_THREADS=4 on 2 cores) each waits for the others (39 s instead of 11 s). The
    real-task test adds ``single_blas_thread`` for scikit-learn's lbfgs, whose BLAS does the same
    (its NER and POS fits 24 s and 34 s instead of 3 s and 5 s at 4 threads)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_the_torch_baseline_scores_as_scikit_learns_on_real_tasks(minilm, one_torch_thread, single_blas_thread):
    """Every task of the default curve with MiniLM's features: SST-2 and CoLA (sequences: 300
    train, 200 dev), MRPC (pairs: 200, 150), CoNLL-2003 NER and POS (words: 150 train
    sentences, 100 dev): the same held-out scores within :data:`HELD_OUT_GAP` and an equivalent
    choice of C (:func:`_assert_equivalent_choice`), dev accuracies within 0.002 (issue 58). On
    these sizes one prediction of a sentence task is 0.005 or more, so its accuracies must be
    equal; measured: no prediction differs on SST-2, CoLA, MRPC and NER, and POS's dev accuracies
    are 0.0007 apart on an AVX2 machine (1 thread; 2 of 2,321 words differ at 200 / 150
    sentences), 0.0013 on an AVX-512 one, where the solvers broke a held-out tie apart. The fit seconds of each solver are printed (``-s``)."""
    from attnlens.evaluation import probing, tasks

    data_file("sst2/train.tsv")
    data_file("conll2003/train.txt")
    for name, train_size, dev_size in (("sst2", 300, 200), ("cola", 300, 200), ("mrpc", 200, 150),
                                       ("ner", 150, 100), ("pos", 150, 100)):
        train = tasks.load(name, "train", data_dir=DATA, limit=train_size, seed=0)
        dev = tasks.load(name, "dev", data_dir=DATA, limit=dev_size, seed=0)
        # the session's feature cache: SST-2's are the pruning test's (tests/unit/test_ablation.py)
        train_features = probing.extract(minilm, train.inputs(), max_len=64, progress=False)
        dev_features = probing.extract(minilm, dev.inputs(), max_len=64, progress=False)
        fitted, seconds = {}, {}
        for solver in ("sklearn", "torch"):
            started = time.perf_counter()
            fitted[solver] = LinearBaseline(solver=solver).fit(train_features, train.labels())
            seconds[solver] = time.perf_counter() - started
        reference, ours = fitted["sklearn"], fitted["torch"]
        _assert_equivalent_choice(ours.held_out, ours.C, reference.held_out, reference.C)
        gap = ours.score(dev_features, dev.labels()) - reference.score(dev_features, dev.labels())
        differ = sum(a != b for a, b in zip(np.ravel(_flat(ours.predict(dev_features))),
                                            np.ravel(_flat(reference.predict(dev_features))), strict=True))
        print(f"{name}: accuracy gap {gap:+.4f}, {differ} predictions differ; fit seconds sklearn "
              f"{seconds['sklearn']:.2f}, torch {seconds['torch']:.2f}")
        assert abs(gap) <= 0.002, (name, gap)


# -- the grid of C grows until its choice is interior (issue 60) --------------------------------------


@pytest.mark.parametrize("solver", ["sklearn", "torch"])
def test_held_out_ties_go_to_the_smaller_c_past_the_grids_edge_too(solver):
    """Ties go to the stronger regularisation everywhere: held-out scores all equal (a scorer that
    cannot tell the Cs apart) put the best C on the grid's lower edge, and a tie one step below
    it looks further down, to C_LIMITS' lower end. The widening once stopped at the first tie and
    kept the edge, the larger C (1e-3 here), against the rule its docstring states."""
    from attnlens.evaluation.probing.baseline import C_GRID, C_LIMITS

    features, labels = _features("sequence", n=60, seed=1)
    flat = LinearBaseline(solver=solver).fit(features, labels, lambda indices, predicted: 0.5)
    assert flat.C == C_LIMITS[0] == min(flat.held_out)
    assert sorted(flat.held_out) == pytest.approx(sorted({*C_GRID, 1e-4, 1e-5, 1e-6, 1e-7}))


@pytest.mark.parametrize("grid", [(1e-3, 1e-2, 1e-1), (10.0, 100.0), (1e-7, 1e-6)])
def test_the_chosen_c_is_interior_to_the_grid_searched(grid):
    """Whatever grid it starts from, the C chosen on the held-out training examples has a tried
    C on both sides (or sits at C_LIMITS), and it is the best held-out score among those tried,
    each score equal to a plain scikit-learn fit of that C on the same split (the reference)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    from attnlens.evaluation.probing.baseline import C_LIMITS

    features, labels = _features("sequence", n=200, seed=3)
    baseline = LinearBaseline(grid=grid).fit(features, labels)
    tried = sorted(baseline.held_out)
    assert set(grid) <= set(tried)
    on_grid = max(sorted(grid), key=baseline.held_out.get)  # the choice the grid alone makes
    edge = on_grid / 10 if on_grid == min(grid) else on_grid * 10 if on_grid == max(grid) else None
    if edge is not None and C_LIMITS[0] <= edge <= C_LIMITS[1]:
        assert edge in baseline.held_out  # an edge choice was looked past
    assert tried[0] < baseline.C < tried[-1] or baseline.C in C_LIMITS, (baseline.C, baseline.held_out)
    assert baseline.held_out[baseline.C] == max(baseline.held_out.values())
    rows, y = design(features), np.asarray(labels)
    order = np.random.default_rng(0).permutation(len(labels))
    held, kept = np.sort(order[:40]), np.sort(order[40:])
    for C in tried:
        scaler = StandardScaler().fit(rows[kept])
        model = LogisticRegression(C=C, max_iter=1000).fit(scaler.transform(rows[kept]), y[kept])
        reference = float((model.predict(scaler.transform(rows[held])) == y[held]).mean())
        # at most one held-out example apart: a warm-started fit stops within lbfgs tolerance of the same optimum
        assert baseline.held_out[C] == pytest.approx(reference, abs=1.5 / len(held)), C
    assert not LinearBaseline(grid=grid, extend=False).fit(features, labels).held_out.keys() - set(grid)
