"""Benchmark: what a probe epoch and a linear-baseline iteration cost against their matrix
products alone, the floor that no change of code (only a change of recipe) can go below.

Probe training and the linear baselines are most of the default PAPA curve's time
(``benchmarks/curve.py``). This measures, on features of POS's shape (4,000 sentences of 5 to
25 words, MiniLM's 7 layers of 384 dimensions in float16, 47 labels, Table 3's batch of 8
sentences; random values: the work does not depend on them), in one run:

- **probe**: one epoch of :meth:`attnlens.evaluation.probing.PapaProbe.fit` (its standardisation included),
  against the products alone of as many steps of 8 random sentences: per step of ``m`` words,
  the first layer forward (``m × 2688 · 2688 × 384``) and its weights' gradient (``384 × m · m × 2688``), the output layer
  forward, its weights' gradient and the hidden layer's gradient, on tensors of the same shapes;
- **linear baseline**: scikit-learn's ``LogisticRegression`` (lbfgs, as
  :class:`attnlens.evaluation.probing.LinearBaseline`) on 58,787 standardised float32 rows of 2,688 features
  and 47 labels (POS's 4,000 training sentences), seconds per iteration, against its two
  products per loss-and-gradient evaluation alone (``X · Wᵀ`` and ``Gᵀ · X``; lbfgs's line search
  may evaluate more than once an iteration, so the ratio's limit is at least 1);
- the products' speed in GFLOP/s, beside one large product's
  (``1024 × 2688 · 2688 × 384``): the small products of a probe step run slower than that.

A ratio near 1 says the job is its products; what is above 1 is all that faster code could save
(and its products already run near the large product's speed).

Run: ``OMP_NUM_THREADS=1 python benchmarks/probe_cost.py [--threads 1] [--repeats 3]``
(``make bench``).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np
import torch
from common import add_arguments, alternate, setup

from attnlens.evaluation.probing import TABLE3, Features, PapaProbe

SENTENCES = 4000
LAYERS, D_MODEL, LABELS = 7, 384, 47
#: POS's training rows: the words of its 4,000 training sentences (``docs/probing.md``)
BASELINE_ROWS = 58787


def word_features(generator: torch.Generator, device: str = "cpu") -> tuple[Features, list]:
    """Random word features and labels of POS's shape (see the module docstring), the vectors
    on ``device`` (the probe trains where its features are)."""
    lengths = torch.randint(5, 26, (SENTENCES,), generator=generator)
    vectors = torch.randn(int(lengths.sum()), LAYERS, D_MODEL, generator=generator).half()
    positions = torch.cat([torch.arange(int(n)) for n in lengths])
    features = Features(vectors.to(device), lengths, positions, lengths.clone(), "words", 128)
    labels = [torch.randint(0, LABELS, (int(n),), generator=generator).tolist() for n in lengths]
    return features, labels


def products(rows_per_step: list[int], device: str = "cpu") -> None:
    """A probe epoch's products alone (see the module docstring), on ``device``."""
    width = LAYERS * D_MODEL
    biggest = max(rows_per_step)
    x = torch.randn(biggest, width, device=device)
    dense, out = torch.randn(D_MODEL, width, device=device), torch.randn(LABELS, D_MODEL, device=device)
    hidden, grad = torch.randn(biggest, D_MODEL, device=device), torch.randn(biggest, LABELS, device=device)
    for m in rows_per_step:
        torch.mm(x[:m], dense.T)  # first layer, forward
        torch.mm(hidden[:m], out.T)  # output layer, forward
        torch.mm(grad[:m].T, hidden[:m])  # output layer's weights' gradient
        torch.mm(grad[:m], out)  # the hidden layer's gradient
        torch.mm(hidden[:m].T, x[:m])  # first layer's weights' gradient


def probe_flops(rows_per_step: list[int]) -> float:
    words = sum(rows_per_step)
    return 2.0 * words * (2 * LAYERS * D_MODEL * D_MODEL + 3 * D_MODEL * LABELS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=10, help="lbfgs iterations timed")
    add_arguments(parser)
    args = parser.parse_args()
    device = setup(args)
    generator = torch.Generator().manual_seed(0)
    features, labels = word_features(generator, device)
    recipe = TABLE3["pos"]
    batch = recipe.batch_size
    order = torch.randperm(SENTENCES, generator=torch.Generator().manual_seed(0))
    steps = [int(features.lengths[order[start : start + batch]].sum()) for start in range(0, SENTENCES, batch)]
    print(f"probe features: {SENTENCES} sentences, {features.vectors.shape[0]:,} words, {LAYERS} x {D_MODEL} "
          f"(float16), {LABELS} labels, {len(steps)} steps of {batch} sentences; "
          f"{torch.get_num_threads()} torch thread(s)")

    fit = PapaProbe(epochs=1, batch_size=batch, lr=recipe.lr, progress=False).fit
    epoch, floor = alternate([lambda: fit(features, labels), lambda: products(steps, device)],
                             args.repeats, device)
    epoch_s, floor_s = statistics.median(epoch), statistics.median(floor)
    big_x = torch.randn(1024, LAYERS * D_MODEL, device=device)
    big_w = torch.randn(D_MODEL, LAYERS * D_MODEL, device=device)
    (big,) = alternate([lambda: torch.mm(big_x, big_w.T)], max(3, args.repeats), device)
    big_rate = 2.0 * 1024 * LAYERS * D_MODEL * D_MODEL / statistics.median(big) / 1e9
    rate = probe_flops(steps) / floor_s / 1e9
    print(f"PROBE epoch {epoch_s:.2f} s = {epoch_s / floor_s:.2f}x its products alone ({floor_s:.2f} s, "
          f"{rate:.0f} GFLOP/s; one 1024-row product runs at {big_rate:.0f} GFLOP/s): the rest (Adam, dropout, "
          f"gathering the rows, the loss) is {1 - floor_s / epoch_s:.0%} of the epoch")

    # scikit-learn's lbfgs runs on the CPU whatever --device says (as LinearBaseline does)
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    rows = rng.standard_normal((BASELINE_ROWS, LAYERS * D_MODEL), dtype=np.float32)
    targets = rng.integers(0, LABELS, BASELINE_ROWS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        started = time.perf_counter()
        model = LogisticRegression(C=0.01, max_iter=args.iterations).fit(rows, targets)
        fit_s = time.perf_counter() - started
    per_iteration = fit_s / max(1, int(model.n_iter_[0]))
    weights, gradient = model.coef_.astype(np.float32), rng.standard_normal((BASELINE_ROWS, LABELS), dtype=np.float32)
    (pair,) = alternate([lambda: (rows @ weights.T, gradient.T @ rows)], max(3, args.repeats))
    pair_s = statistics.median(pair)
    baseline_rate = 4.0 * BASELINE_ROWS * LAYERS * D_MODEL * LABELS / pair_s / 1e9
    print(f"LINEAR BASELINE {per_iteration:.3f} s an lbfgs iteration ({int(model.n_iter_[0])} iterations, "
          f"{fit_s:.1f} s) = {per_iteration / pair_s:.2f}x its two products per evaluation ({pair_s:.3f} s, "
          f"{baseline_rate:.0f} GFLOP/s): the rest (extra evaluations of the line search, the softmax, "
          f"lbfgs) is {max(0.0, 1 - pair_s / per_iteration):.0%} of an iteration")


if __name__ == "__main__":
    main()
