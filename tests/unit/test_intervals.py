"""Intervals and baselines are computed, not copied: bootstrap counts against scikit-learn and
seqeval on resamples, the paired test, and probing.run on duplicated and shuffled data."""

from __future__ import annotations

import random
import warnings

import numpy as np
import pandas as pd
import pytest

from attnlens.errors import InputError
from attnlens.evaluation import conventions, probing, tasks
from attnlens.evaluation.curve import Curve
from attnlens.evaluation.probing import intervals
from attnlens.evaluation.probing.result import warn_if_below
from tests.conftest import DATA
from tests.holm import holm_loop


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def _noisy(task, rng, flip):
    """The gold labels with a share ``flip`` replaced by random labels."""
    out = []
    for gold in task.labels():
        if task.kind == "token":
            out.append([rng.randrange(task.n_labels) if rng.random() < flip else t for t in gold])
        else:
            out.append(rng.randrange(task.n_labels) if rng.random() < flip else gold)
    return out


@pytest.mark.parametrize("name", ["sst2", "cola", "mrpc", "ner", "pos"])
def test_counts_give_the_metric_of_any_resample(name):
    """For every metric, the score of summed per-example counts equals the task's own metric
    (scikit-learn / seqeval) on the full split and on resamples drawn with replacement; exact up
    to float64 rounding (a few ulps: 1e-12)."""
    task = tasks.load(name, "dev", data_dir=DATA, limit=150, seed=1)
    rng = random.Random(0)
    predicted = _noisy(task, rng, 0.3)
    table = intervals.counts(task, predicted)
    assert intervals.from_counts(task.metric, table.sum(0)) == pytest.approx(task.score(predicted), abs=1e-12)
    for draw in range(3):
        chosen = np.random.default_rng(draw).integers(0, len(task), len(task))
        weights = np.bincount(chosen, minlength=len(task)).astype(float)
        resampled = task.select(chosen.tolist())
        expected = resampled.score([predicted[i] for i in chosen])
        assert intervals.from_counts(task.metric, weights @ table) == pytest.approx(expected, abs=1e-12)


def test_the_interval_narrows_with_more_examples_and_the_paired_test_sees_drops():
    """A duplicated evaluation set keeps the point score and narrows the interval (by about √2);
    a system compared with itself differs by exactly 0, not significantly; a much worse one
    drops significantly."""
    task = tasks.load("sst2", "dev", data_dir=DATA, limit=200)
    predicted = _noisy(task, random.Random(1), 0.4)
    once = intervals.bootstrap(task, predicted)
    doubled = tasks.Task(task.name, task.split, task.kind, task.label_names, task.metric,
                         task.examples.select(list(range(len(task))) * 2))
    twice = intervals.bootstrap(doubled, predicted * 2)
    assert twice.score == once.score and once.low <= once.score <= once.high
    assert 0.6 < twice.width / once.width < 0.8  # 1/√2 ≈ 0.71, with Monte-Carlo error
    same = intervals.paired(task, predicted, predicted)
    assert same.difference == 0 and same.low == same.high == 0 and not same.significant
    worse = intervals.paired(task, predicted, _noisy(task, random.Random(2), 0.9))
    assert worse.difference < 0 and worse.significant and worse.p_value < 0.05


def _sst2_folder(root, train_rows, dev_rows):
    (root / "sst2").mkdir(parents=True)
    for name, rows in (("train", train_rows), ("dev", dev_rows)):
        lines = ["sentence\tlabel"] + [f"{text}\t{label}" for text, label in rows]
        (root / "sst2" / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


@pytest.mark.slow
# the probe against its baseline is not the subject: a small train set may put it below, by chance
@pytest.mark.filterwarnings("ignore::attnlens.evaluation.probing.ProbeWarning")
def test_probing_run_computes_its_baselines_and_intervals(minilm, tmp_path):
    """On a duplicated dev set probing.run gives the same point scores (probe, linear baseline,
    majority) with narrower intervals; with shuffled training labels the probe and the linear
    baseline fall inside the majority interval, while with the true labels they beat it."""
    train = tasks.load("sst2", "train", data_dir=DATA, limit=300, seed=0)
    dev = tasks.load("sst2", "dev", data_dir=DATA, limit=120, seed=0)
    train_rows = list(zip(train.examples["text"], train.labels(), strict=True))
    dev_rows = list(zip(dev.examples["text"], dev.labels(), strict=True))
    options = dict(max_len=64, progress=False, probe=dict(epochs=8))
    plain_dir = _sst2_folder(tmp_path / "plain", train_rows, dev_rows)
    plain = probing.run(minilm, "sst2", data_dir=plain_dir, **options)
    # the same probe (plain's chosen epochs, trained as plain's final fit), evaluated on the doubled set
    doubled = probing.run(minilm, "sst2", data_dir=_sst2_folder(tmp_path / "twice", train_rows, dev_rows * 2),
                          **{**options, "probe": dict(epochs=plain.settings["epochs_chosen"])}, select_epochs=False)
    for name in ("interval", "baseline_interval", "majority_interval"):
        one, two = getattr(plain, name), getattr(doubled, name)
        assert two.score == pytest.approx(one.score, abs=1e-12) and two.width < one.width, name
    assert plain.interval.low > plain.majority_interval.high  # real labels: above the majority
    # a given C skips the held-out search and fits that C on all training examples: the same
    # optimum as the search's final fit (lbfgs from another start: predictions may differ on
    # an example that sits on the boundary, at most one of 120 here)
    fixed = probing.run(minilm, "sst2", data_dir=plain_dir, baseline_C=plain.settings["baseline_C"],
                        **{**options, "probe": dict(epochs=1)}, select_epochs=False)
    assert fixed.settings["baseline_C"] == plain.settings["baseline_C"]
    assert fixed.baseline == pytest.approx(plain.baseline, abs=1 / 120 + 1e-12)
    labels = [label for _, label in train_rows]
    random.Random(0).shuffle(labels)
    shuffled = [(text, label) for (text, _), label in zip(train_rows, labels, strict=True)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", probing.ProbeWarning)  # below a baseline by chance or not
        noise = probing.run(minilm, "sst2", data_dir=_sst2_folder(tmp_path / "shuffled", shuffled, dev_rows),
                            seeds=3, select_epochs=False, **options)
    assert noise.score in noise.majority_interval and noise.baseline in noise.majority_interval
    assert len(noise.scores) == 3 and noise.seed_std > 0
    # epochs: chosen on held-out training examples, from the recipe's 8 up to 3 × 8, and every
    # seed trained that long; select_epochs=False trains exactly the recipe's
    assert 8 <= plain.settings["epochs_chosen"] <= 24
    assert plain.settings["probe"]["epochs"] == plain.settings["epochs_chosen"]
    assert noise.settings["epochs_chosen"] is None and noise.settings["probe"]["epochs"] == 8
    # the paired test of probe − linear is computed on the same resamples: its point difference
    # is exactly the difference of the two point scores
    for result in (plain, noise):
        assert result.versus_baseline.difference == pytest.approx(result.score - result.baseline, abs=1e-12)


def _result(score, baseline, majority, low, high):
    return probing.ProbeResult(
        task="sst2", split="dev", metric="accuracy", score=score, majority=majority, predictions=[],
        baseline=baseline,
        versus_baseline=intervals.Paired(score - baseline, low, high, 0.001 if high < 0 or low > 0 else 0.5))


def test_a_probe_below_a_baseline_warns_and_says_whether_the_gap_is_noise():
    """Below the linear baseline within noise (the paired interval holds 0), significantly below
    it, below the majority class; above both: no warning."""
    with pytest.warns(probing.ProbeWarning, match=r"linear baseline \(0.8200, within noise"):
        warn_if_below(_result(0.81, 0.82, 0.5, -0.03, 0.01))
    with pytest.warns(probing.ProbeWarning, match=r"linear baseline \(0.9000, significantly"):
        warn_if_below(_result(0.81, 0.90, 0.5, -0.12, -0.06))
    with pytest.warns(probing.ProbeWarning, match="majority class"):
        warn_if_below(_result(0.40, 0.30, 0.5, 0.05, 0.15))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_below(_result(0.83, 0.82, 0.5, -0.01, 0.03))


def test_count_intervals_are_the_resampled_ratio_of_sums():
    """bootstrap_counts / paired_counts (the MLM probe's per-text [log-likelihood sum, tokens]):
    each resample's score is the ratio of the drawn rows' sums, checked against a plain NumPy
    loop over the same multinomial draws; doubling the rows keeps the point and narrows the
    interval; a table paired with itself differs by exactly 0."""
    rng = np.random.default_rng(0)
    n = rng.integers(1, 20, size=60).astype(float)
    table = np.stack([-rng.gamma(2.0, 1.5, size=60) * n, n], axis=1)
    once = intervals.bootstrap_counts(table, "accuracy", resamples=400, seed=3)
    drawn = intervals.weights(60, resamples=400, seed=3)
    loop = [sum(w * table[i, 0] for i, w in enumerate(row)) / sum(w * table[i, 1] for i, w in enumerate(row))
            for row in drawn]
    low, high = np.quantile(loop, [0.025, 0.975])
    assert once.low == pytest.approx(low, rel=1e-12) and once.high == pytest.approx(high, rel=1e-12)
    assert once.score == pytest.approx(table[:, 0].sum() / table[:, 1].sum(), rel=1e-12)
    twice = intervals.bootstrap_counts(np.concatenate([table, table]), "accuracy", resamples=400, seed=3)
    assert twice.score == pytest.approx(once.score, rel=1e-12) and twice.width < once.width
    same = intervals.paired_counts(table, table, "accuracy")
    assert same.difference == 0 and same.low == same.high == 0 and not same.significant
    worse = table.copy()
    worse[:, 0] -= worse[:, 1]  # one nat less per token
    drop = intervals.paired_counts(table, worse, "accuracy")
    assert drop.difference == pytest.approx(-1.0) and drop.significant


def _runs(task, flips, seed=0):
    """Runs (as probe seeds) of noisy predictions of ``task``: one per share in ``flips``."""
    return [_noisy(task, random.Random(seed + index), flip) for index, flip in enumerate(flips)]


def test_runs_are_drawn_as_a_plain_loop_draws_them():
    """With several runs, every resample draws the examples (multinomial weights) and k of the k
    runs (with replacement), and rescales the drawn runs' mean about all runs' mean by
    √(k/(k−1)): the interval and the paired test equal a plain Python loop over the same draws
    (float64, 1e-12)."""
    task = tasks.load("cola", "dev", data_dir=DATA, limit=120, seed=2)
    base, other = _runs(task, [0.2, 0.3, 0.25]), _runs(task, [0.4, 0.35, 0.5], seed=7)
    k, resamples = 3, 300
    drawn = intervals.weights(len(task), resamples=resamples, seed=5)
    picks = intervals.run_draws(k, resamples=resamples, seed=5)
    tables = {name: [intervals.counts(task, run) for run in runs] for name, runs in (("base", base), ("other", other))}
    scale = (k / (k - 1)) ** 0.5

    def drawn_mean(values, chosen):
        mean = sum(values) / k
        return mean + scale * (sum(values[j] for j in chosen) / k - mean)

    singles, differences = [], []
    for b in range(resamples):
        per = {name: [float(intervals.from_counts(task.metric, drawn[b] @ table)) for table in runs]
               for name, runs in tables.items()}
        singles.append(drawn_mean(per["other"], picks[b]))
        differences.append(drawn_mean([o - s for o, s in zip(per["other"], per["base"], strict=True)], picks[b]))
    interval = intervals.bootstrap(task, other, runs=True, resamples=resamples, seed=5)
    assert [interval.low, interval.high] == pytest.approx(list(np.quantile(singles, [0.025, 0.975])), abs=1e-12)
    assert interval.score == pytest.approx(np.mean([task.score(run) for run in other]), abs=1e-12)
    versus = intervals.paired(task, base, other, runs=True, resamples=resamples, seed=5)
    assert [versus.low, versus.high] == pytest.approx(list(np.quantile(differences, [0.025, 0.975])), abs=1e-12)
    d = np.array(differences)
    assert versus.p_value == min(1.0, 2 * min(np.mean(d <= 0), np.mean(d >= 0)))  # two-sided
    assert versus.spread == pytest.approx(np.std(d, ddof=1), abs=1e-12)
    assert [versus.tost_low, versus.tost_high] == pytest.approx(list(np.quantile(d, [0.05, 0.95])), abs=1e-12)


def test_the_drawn_runs_have_the_seed_means_variance():
    """Over many draws, the rescaled mean of k drawn runs has variance s²/k (s: the runs' standard
    deviation, ddof 1), not the plain draw's (k−1)/k · s²/k. 40,000 draws: the variance's
    relative Monte-Carlo error is about √(2/40,000) · √(kurtosis / 3), under 2%; 5% allowed."""
    values = np.array([0.80, 0.81, 0.83, 0.78, 0.79])[:, None].repeat(40_000, axis=1)  # [run, resample]
    for k in (2, 3, 5):
        draws = intervals.run_draws(k, resamples=40_000, seed=0)
        mean = intervals.run_mean(values[:k], draws)
        expected = np.var(values[:k, 0], ddof=1) / k
        assert mean.var() == pytest.approx(expected, rel=0.05)
        assert mean.mean() == pytest.approx(values[:k, 0].mean(), abs=3 * (expected / 40_000) ** 0.5)
    assert intervals.run_draws(1) is None  # one run: nothing to draw


def test_runs_widen_the_interval_only_by_their_spread():
    """Identical runs give the one run's interval (no seed spread; up to the rounding of a mean
    of three equal floats, 1e-12); runs that disagree
    give a wider interval and paired interval than the examples alone
    (``resample_runs=False``, attnlens's earlier test, whose numbers are unchanged); the linear
    baseline (one run) against a probe's k runs draws the probe's runs only."""
    task = tasks.load("sst2", "dev", data_dir=DATA, limit=200, seed=3)
    one = _noisy(task, random.Random(1), 0.3)
    same, single = intervals.bootstrap(task, [one] * 3, runs=True), intervals.bootstrap(task, one)
    assert [same.score, same.low, same.high] == pytest.approx([single.score, single.low, single.high], abs=1e-12)
    assert intervals.paired(task, [one] * 3, [one] * 3, runs=True).high == 0
    base, other = _runs(task, [0.1, 0.1, 0.1]), _runs(task, [0.2, 0.5, 0.3], seed=4)
    both = intervals.bootstrap(task, other, runs=True)
    examples = intervals.bootstrap(task, other, runs=True, resample_runs=False)
    assert both.score == examples.score and both.width > examples.width
    paired_both = intervals.paired(task, base, other, runs=True)
    paired_examples = intervals.paired(task, base, other, runs=True, resample_runs=False)
    assert paired_both.difference == paired_examples.difference
    assert paired_both.high - paired_both.low > paired_examples.high - paired_examples.low
    # examples only: the seed-mean of every resample, as a plain mean over the runs
    drawn = intervals.weights(len(task))
    means = np.mean([intervals.from_counts(task.metric, drawn @ intervals.counts(task, run)) for run in other], axis=0)
    assert [examples.low, examples.high] == pytest.approx(list(np.quantile(means, [0.025, 0.975])), abs=1e-12)
    linear = intervals.paired(task, [one], other, runs=True)
    alone = intervals.paired(task, [one], [other[0]] * 3, runs=True)  # no spread: the examples alone
    assert linear.high - linear.low > alone.high - alone.low


# -- one test convention: two-sided p, Holm, power, TOST ----------------------------------------------


def test_the_p_value_is_two_sided_and_agrees_with_the_interval():
    """p < 0.05 exactly when the 95% percentile interval excludes 0, for a drop and for a rise
    alike (the one-sided p of before flagged neither a rise nor matched the interval)."""
    rng = np.random.default_rng(0)
    for centre in (-0.03, -0.01, 0.0, 0.01, 0.03):
        differences = rng.normal(centre, 0.01, size=1000)
        p = intervals.two_sided_p(differences)
        low, high = np.quantile(differences, [0.025, 0.975])
        assert (p < 0.05) == (high < 0 or low > 0), (centre, p, low, high)
    rise = intervals._paired(0.03, rng.normal(0.03, 0.01, 1000), 0.95)
    drop = intervals._paired(-0.03, rng.normal(-0.03, 0.01, 1000), 0.95)
    assert rise.significant and drop.significant and rise.p_value < 0.05 and drop.p_value < 0.05


def test_one_threshold_at_p_005():
    """p = 0.05 exactly (25 of 1,000 resampled differences at or below 0) is not significant,
    for a comparison and for a table alike: ``1 - 0.95`` is 0.050000000000000044 in floating
    point, which counted it in for one and not the other."""
    differences = np.concatenate([np.full(25, -0.01), np.full(975, 0.02)])
    paired = intervals._paired(0.02, differences, 0.95)
    assert paired.p_value == 0.05 and not paired.significant
    assert intervals.alpha_of(0.95) == intervals.ALPHA == 0.05 and intervals.alpha_of(0.9) == 0.1
    table = conventions.apply(pd.DataFrame([dict(task="sst2", metric="accuracy", fraction_replaced=0.5,
                                                  score=0.8, p_value=0.05)]))
    assert table["significant"].tolist() == [False]


def _holm_by_definition(p, alpha):
    """Holm's procedure as written (Holm 1979): sort, reject while p_(i) ≤ α / (m − i + 1)."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    rejected = set()
    for rank, i in enumerate(order):
        if p[i] > alpha / (len(p) - rank):
            break
        rejected.add(i)
    return rejected


@pytest.mark.parametrize("seed", range(20))
def test_holm_rejects_what_the_procedure_rejects(seed):
    rng = np.random.default_rng(seed)
    p = list(rng.uniform(0, 0.08, size=int(rng.integers(1, 12))))
    adjusted = intervals.holm(p)
    for alpha in (0.01, 0.05, 0.1):
        assert {i for i, a in enumerate(adjusted) if a < alpha} <= _holm_by_definition(p, alpha)
        assert {i for i, a in enumerate(adjusted) if a <= alpha} == _holm_by_definition(p, alpha)
    assert np.all(adjusted >= np.array(p)) and np.all(adjusted <= 1)


def test_holm_leaves_missing_tests_out():
    adjusted = intervals.holm([0.01, float("nan"), 0.04])
    assert np.isnan(adjusted[1]) and adjusted[0] == pytest.approx(0.02) and adjusted[2] == pytest.approx(0.04)


def test_detectable_is_the_difference_found_with_80_percent_power():
    """Simulate: with true difference = detectable and the same spread, a two-sided test at 0.05
    rejects in about 80% of repetitions (normal differences; ±3 points of Monte-Carlo error)."""
    rng = np.random.default_rng(1)
    spread = 0.01
    detectable = intervals.Paired(0.0, -1.0, 1.0, 1.0, spread=spread).detectable
    assert detectable == pytest.approx((1.959964 + 0.841621) * spread, rel=1e-5)
    rejected = np.abs(rng.normal(detectable, spread, size=20000)) / spread > 1.959964
    assert abs(rejected.mean() - 0.8) < 0.03


def test_equivalence_is_a_tost_on_the_90_percent_interval():
    rng = np.random.default_rng(2)
    close = intervals._paired(0.001, rng.normal(0.001, 0.004, 2000), 0.95)
    assert close.equivalent(0.01) and not close.equivalent(0.005)
    wide = intervals._paired(0.0, rng.normal(0.0, 0.02, 2000), 0.95)
    assert not wide.significant and not wide.equivalent(0.01)  # neither a drop nor shown equal
    with pytest.raises(InputError, match="margin"):
        close.equivalent(float("nan"))


def test_curves_joined_are_one_family_again():
    """Curve.combine re-adjusts: two runs split by task, each adjusted on its own, join into the
    Holm adjustment of all their tests (and of their versus_average tests, a second family), as
    one run's table would be."""
    def part(task: str, p: list[float]) -> Curve:
        rows = [dict(task=task, strategy="input_dependence", fraction_replaced=0.0, score=0.8, metric="accuracy",
                     p_value=float("nan"), detectable=float("nan"), versus_average_p=float("nan"))]
        rows += [dict(task=task, strategy="toeplitz", fraction_replaced=1.0, score=0.7, metric="accuracy",
                      p_value=value, detectable=0.01, versus_average_p=value / 2) for value in p]
        return Curve(conventions.apply(pd.DataFrame(rows)), settings={"strategy": "input_dependence"})

    first, second = part("sst2", [0.01, 0.03]), part("cola", [0.02])
    joined = Curve.combine([first, second]).table
    p = [0.01, 0.03, 0.02]
    assert list(joined["p_adjusted"].dropna()) == pytest.approx([holm_loop(p)[i] for i in range(3)], abs=1e-15)
    assert list(joined["versus_average_p_adjusted"].dropna()) == pytest.approx(holm_loop([v / 2 for v in p]), abs=1e-15)
    assert list(first.table["p_adjusted"].dropna()) != list(joined["p_adjusted"].dropna())[:2]  # each alone differs
