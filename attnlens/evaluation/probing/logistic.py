"""Logistic regression in torch, on the rows' device: scikit-learn's ``StandardScaler`` and
``LogisticRegression(penalty="l2", solver="lbfgs")``: :func:`fit` returns a :class:`Logistic`
(``predict``, ``decision``).

Standardisation: the training rows' mean and population variance, accumulated in float64 (as
``StandardScaler``); a column indistinguishable from a constant (``var ≤ n·ε·var + (n·ε·mean)²``,
ε of float64: scikit-learn's ``_is_constant_feature``) gets the scale 1.

The objective, over ``W`` [class, feature] and ``b`` [class] on the standardised rows ``x_i``
with labels ``y_i`` (``n`` rows):

.. math::

    f(W, b) = \\frac{1}{n} \\Big( \\sum_i \\mathrm{CE}(W x_i + b,\\ y_i) + \\frac{\\lVert W \\rVert^2}{2C} \\Big)

the intercept not penalised. scikit-learn writes ``LogisticRegression``'s objective as
``C · Σ_i loss_i + ½‖W‖²``, which is ``C·n·f`` (the same minimiser), and its lbfgs solver
evaluates ``f`` itself (``sklearn/linear_model/_logistic.py``: ``l2_reg_strength = 1 / (C · n)``
with ``LinearModelLoss``'s mean loss), so the gradient tolerance below means what its ``tol``
means. Two classes, as scikit-learn: one weight row ``w`` and one intercept ``b``, the binary log
loss (the cross-entropy of the logits ``[0, w·x + b]``); a softmax over two free rows would not
be the same model (its penalty on ``w₁ − w₀`` is half as strong). With more classes, every
iterate's intercepts add up to zero (the gradient's do, from a zero or such a start); the fitted
ones are centred to remove rounding.

Stopping rule (scikit-learn's for lbfgs, which runs scipy's L-BFGS-B with ``gtol=tol``,
``ftol=64·ε``, ``maxcor=10``): :class:`torch.optim.LBFGS` (``line_search_fn="strong_wolfe"``,
history 10) stops at the first iterate where ``max |∇f| ≤ tol`` (default 1e-4, scikit-learn's
default), after ``max_iter`` iterations (default 1000), or when ``f`` or the step changes by less
than 64·ε (ε of float64) in an iteration. It computes in the rows' floating dtype (float32 rows:
float32, as scikit-learn keeps them), on the rows' device.
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor
from torch.nn import functional

from attnlens.core.modes import gradients

#: the gradient tolerance, max |∇f| (scikit-learn's ``LogisticRegression(tol=1e-4)``)
TOL = 1e-4
#: L-BFGS iterations at most (attnlens's ``LinearBaseline(max_iter=1000)``)
MAX_ITER = 1000
#: curvature pairs kept (scipy's L-BFGS-B ``maxcor``)
HISTORY = 10
#: the smallest change of ``f`` or of the step that continues (scipy's ``ftol`` in
#: scikit-learn's call)
CHANGE = 64 * torch.finfo(torch.float64).eps
#: rows per block when the scaler's float64 sums are accumulated (no float64 copy of all rows)
BLOCK = 4096


def standardise(rows: Float[Tensor, "row feature"]
                ) -> tuple[Float[Tensor, " feature"], Float[Tensor, " feature"], Float[Tensor, " feature"]]:
    """``StandardScaler().fit(rows)``'s ``mean_``, ``scale_`` and ``var_``, float64, on the rows'
    device: the mean, the population variance (two passes) and its square root, 1 where the
    column is indistinguishable from a constant."""
    n = rows.shape[0]
    total = torch.zeros(rows.shape[1], dtype=torch.float64, device=rows.device)
    for start in range(0, n, BLOCK):
        total += rows[start : start + BLOCK].double().sum(0)
    mean = total / n
    squares = torch.zeros_like(mean)
    for start in range(0, n, BLOCK):
        squares += (rows[start : start + BLOCK].double() - mean).square().sum(0)
    var = squares / n
    eps = torch.finfo(torch.float64).eps
    constant = var <= n * eps * var + (n * mean * eps).square()
    scale = torch.where(constant, torch.ones_like(var), var.sqrt())
    return mean, scale, var


@gradients()  # autograd on, whatever the caller's mode
def fit(rows: Float[Tensor, "row feature"], targets: Int[Tensor, " row"], C: float,
        start: Logistic | None = None, *, tol: float = TOL, max_iter: int = MAX_ITER) -> Logistic:
    """Standardise ``rows`` and minimise ``f`` with inverse regularisation ``C`` (the module
    docstring), on the rows' device, in their dtype; with ``start`` (a fitted :class:`Logistic`
    of the same classes), its coefficients and intercepts are the first point (warm start: the
    same optimum, fewer iterations). ``tol`` / ``max_iter``: the stopping rule's."""
    targets = targets.to(rows.device)
    classes = torch.unique(targets)
    mean, scale, var = standardise(rows)
    model = Logistic(mean=mean, scale=scale, var=var, classes=classes, C=float(C), n_samples_seen=int(rows.shape[0]))
    x = model.transform(rows)
    binary = len(classes) == 2
    y = torch.searchsorted(classes, targets)
    theta = torch.zeros((1 if binary else len(classes), x.shape[1] + 1), dtype=x.dtype, device=x.device)
    if (start is not None and len(start.classes) == len(classes)
            and torch.equal(start.classes.to(classes.device), classes)):
        theta[:, :-1] = start.coef.to(theta)
        theta[:, -1] = start.intercept.to(theta)
    n, scaled = x.shape[0], 1.0 / (float(C) * x.shape[0])
    rows_of = torch.arange(n, device=x.device)
    y_float = y.to(x.dtype)
    optimiser = torch.optim.LBFGS([theta], lr=1.0, max_iter=int(max_iter), max_eval=15000,
                                  tolerance_grad=float(tol), tolerance_change=CHANGE,
                                  history_size=HISTORY, line_search_fn="strong_wolfe")

    def objective() -> Tensor:
        """f at θ, its gradient written to θ.grad: (residualᵀ x) / n + W / (Cn) and the
        residuals' mean (two products; autograd's x.T @ residual is 10x slower on a CPU)."""
        weights = theta[:, :-1]
        logits = torch.addmm(theta[:, -1], x, weights.T)
        if binary:
            loss = functional.binary_cross_entropy_with_logits(logits[:, 0], y_float, reduction="sum")
            residual = torch.sigmoid(logits) - y_float[:, None]
        else:
            log_p = torch.log_softmax(logits, 1)
            loss = -log_p[rows_of, y].sum()
            residual = log_p.exp_()
            residual[rows_of, y] -= 1.0
        gradient = torch.empty_like(theta)
        gradient[:, :-1] = (residual.T @ x).div_(n).add_(weights, alpha=scaled)
        gradient[:, -1] = residual.sum(0).div_(n)
        theta.grad = gradient
        return loss / n + 0.5 * scaled * weights.square().sum()

    optimiser.step(objective)
    model.n_iter = int(optimiser.state[theta].get("n_iter", 0))
    model.coef, model.intercept = theta[:, :-1].clone(), theta[:, -1].clone()
    if not binary:
        model.intercept -= model.intercept.mean()
    return model


class Logistic:
    """A fitted standardised L2 logistic regression (:func:`fit` makes one; see the module
    docstring for the objective and the stopping rule): ``mean``, ``scale``, ``var`` (the
    scaler, float64), ``coef`` [class or 1, feature], ``intercept`` [class or 1], ``classes``
    (the sorted labels), ``C``, ``n_iter`` (L-BFGS iterations), ``n_samples_seen`` — the names
    of scikit-learn's attributes without their trailing underscore."""

    def __init__(self, *, mean: Tensor, scale: Tensor, var: Tensor, classes: Tensor, C: float,
                 coef: Tensor | None = None, intercept: Tensor | None = None, n_iter: int = 0,
                 n_samples_seen: int = 0) -> None:
        self.mean, self.scale, self.var, self.classes, self.C = mean, scale, var, classes, float(C)
        self.coef, self.intercept = coef, intercept
        self.n_iter, self.n_samples_seen = int(n_iter), int(n_samples_seen)

    def transform(self, rows: Float[Tensor, "row feature"]) -> Float[Tensor, "row feature"]:
        """The rows standardised by the fitted scaler, in their own dtype."""
        return (rows - self.mean.to(rows)) / self.scale.to(rows)

    def decision(self, rows: Float[Tensor, "row feature"]) -> Float[Tensor, "row score"]:
        """The logits of each row (two classes: one column, ``w·x + b``, the second class's
        log-odds, as scikit-learn's ``decision_function``)."""
        x = self.transform(rows)
        return torch.addmm(self.intercept.to(x), x, self.coef.to(x).T)

    def predict(self, rows: Float[Tensor, "row feature"]) -> Int[Tensor, " row"]:
        """The class of each row (two classes: the second where its log-odds are above 0)."""
        scores = self.decision(rows)
        chosen = (scores[:, 0] > 0).long() if scores.shape[1] == 1 else scores.argmax(1)
        return self.classes.to(rows.device)[chosen]

    def to(self, device: Any) -> Logistic:
        """This model with its tensors on ``device`` (``self``)."""
        for name in ("mean", "scale", "var", "coef", "intercept", "classes"):
            setattr(self, name, getattr(self, name).to(device))
        return self
