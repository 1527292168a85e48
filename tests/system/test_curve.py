"""The cost of an intervention: the MLM probe, scorer.evaluate and the PAPA curve on real data.

Small training sets keep this file to a couple of minutes on 2 cores; the full curve (4,000
training examples per task, full dev sets) is measured by benchmarks/curve.py.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from attnlens import AttnlensError, papa
from attnlens.errors import InputError, MismatchError
from attnlens.evaluation import probing, tasks
from attnlens.evaluation.curve import Curve
from attnlens.evaluation.curve_inputs import lambda_order
from attnlens.evaluation.lm import scorer
from attnlens.evaluation.probing import mlm
from attnlens.evaluation.table import ROWS
from tests.conftest import DATA, data_file
from tests.holm import holm_loop

# every test here runs probes on real data, or needs the fit of the `constants` fixture
pytestmark = pytest.mark.slow


#: SST-2 examples of every curve and table here: one size, so that the tests share their cached
#: features (one feature file per intervention and split, written by the first test that needs it)
TRAIN, EVAL = 200, 100


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(scope="module")
def paragraphs():
    lines = data_file("wikitext2/valid.txt").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if len(line.strip()) > 50 and not line.strip().startswith("=")]


@pytest.fixture(scope="module")
def constants(minilm, paragraphs):
    return papa.fit(minilm, paragraphs[:100], max_len=64, progress=False)  # any constants will do


def test_the_mlm_probe_beats_the_unigram_distribution(minilm, paragraphs):
    """The MLM probe on WikiText-2 must do better than the unigram distribution of its own
    training targets (add-one smoothed) on the same masked evaluation tokens; the untrained
    head of the default model is refused by scorer.score, and scorer.evaluate picks the probe."""
    # 200 paragraphs (the head trains on 160, Table 3's MLM recipe): a margin of 1.00 nats over
    # the unigram (0.72 with 400, whose unigram is better), five times the 0.2 asked
    texts = paragraphs[:200]
    result = mlm.probe(minilm, texts, max_len=64, progress=False)
    states = mlm.MaskedStates(minilm, rate=0.15, seed=0, examples=texts[:160])
    train = probing.extract(minilm, texts[:160], max_len=64, states=states, progress=False,
                            variant=f"mlm-probe/0.15/0/{mlm.PROBE_MIX}")
    evaluation = probing.extract(minilm, texts[160:], max_len=64, progress=False,
                                 states=mlm.MaskedStates(minilm, rate=0.15, seed=0),
                                 variant=f"mlm-probe/0.15/0/{mlm.PROBE_MIX}")
    counts = torch.bincount(train.positions, minlength=minilm.cfg.d_vocab).double() + 1
    unigram = float((counts / counts.sum()).log()[evaluation.positions].mean())
    assert result.kind == "probe" and result.name == "MLM probe"
    assert result.n_tokens == evaluation.vectors.shape[0]
    assert result.value > unigram + 0.2, (result.value, unigram)
    assert math.isclose(result.perplexity, math.exp(-result.value))
    with pytest.raises(scorer.UntrainedHead):
        scorer.score(minilm, texts[:4], progress=False)
    again = scorer.evaluate(minilm, texts, max_len=64, progress=False)
    assert again.kind == "probe" and again.value == result.value  # cached features, same seed


# the probe against its baseline is not the subject: a small train set may put it below, by chance
@pytest.mark.filterwarnings("ignore::attnlens.evaluation.probing.ProbeWarning")
def test_the_curve_starts_at_the_unmodified_score_and_moves(minilm, constants, monkeypatch):
    """Fraction 0 equals probing.run with no hooks (the same call); replacing heads changes the
    score; every fraction and baseline has its row; the figure has a trace per line. The epochs
    and the linear baseline's C chosen at fraction 0 are reused by every later point. The later
    points run in one probing.run_many call (their probes stacked), and no features are
    extracted twice."""
    from attnlens.evaluation.probing import features as features_module

    calls, real_run = [], probing.run
    many, real_many = [], probing.run_many
    extracted, real_extract = [], features_module._extract

    def spy(*args, **kwargs):
        result = real_run(*args, **kwargs)
        calls.append((kwargs, result.settings, result))
        return result

    def spy_many(*args, **kwargs):
        results = real_many(*args, **kwargs)
        many.append((args[2], kwargs, [result.settings for result in results]))
        return results

    def spy_extract(*args):
        extracted.append(args[-1])  # the file it writes
        return real_extract(*args)

    monkeypatch.setattr(probing, "run", spy)
    monkeypatch.setattr(probing, "run_many", spy_many)
    monkeypatch.setattr(features_module, "_extract", spy_extract)
    # 0.5625 of 72 heads is 40.5: 41 replaced (halves up, heads.n_selected), which the table
    # called 40 (Python's round, halves to even)
    curve = papa.curve(minilm, constants, ["sst2"], fractions=(0, 0.5625, 1), baselines=("zeros",),
                       data_dir=DATA, train_limit=TRAIN, eval_limit=EVAL, seeds=1, progress=False)
    monkeypatch.setattr(probing, "run", real_run)
    monkeypatch.setattr(probing, "run_many", real_many)
    monkeypatch.setattr(features_module, "_extract", real_extract)
    assert None not in extracted and len(set(extracted)) == len(extracted)  # each file once, if at all
    later = [timing for timing in curve.timings if timing["fraction"] or timing["strategy"] == "zeros"]
    assert len(later) == 3 and all(timing["features"] > 0 and timing["rank"] == 0 for timing in later)
    first, chosen = calls[0][1]["epochs_chosen"], calls[0][1]["baseline_C"]
    linear = calls[0][2].linear
    assert len(calls) == 1 and first is not None and chosen in probing.LinearBaseline().grid
    # one call for the 3 later points (the first point's is probing.run's own, inside its module)
    assert [len(interventions) for interventions, _, _ in many] == [3]
    interventions, kwargs, settings = many[0]
    assert kwargs["select_epochs"] is False and kwargs["probe"]["epochs"] == first
    assert kwargs["baseline_C"] == chosen and all(one["baseline_C"] == chosen for one in settings)
    assert kwargs["baseline_start"] is linear and linear is not None  # warm-started from no head replaced
    assert [one["hooks"] for one in settings] == [hooks.key() for hooks in interventions]
    table = curve.table
    assert list(table["strategy"]) == ["input_dependence"] * 3 + ["zeros"]
    assert list(table["heads"]) == [0, 41, 72, 72]
    assert [int(hooks.heads.mask.sum()) for hooks in interventions] == [41, 72, 72]  # what was replaced
    plain = probing.run(minilm, "sst2", data_dir=DATA, train_limit=TRAIN, eval_limit=EVAL,
                        max_len=64, layout=constants.layout, progress=False)
    assert table["score"].iloc[0] == plain.score and table["relative"].iloc[0] == 1.0
    assert plain.score > plain.majority + 0.1
    assert table["score"].nunique() > 1
    assert (table["metric"] == "accuracy").all()
    figure = curve.figure()
    assert len(figure.data) == 2 and list(figure.data[0].x) == [0.0, 0.4375, 1.0]  # the share kept


@pytest.mark.filterwarnings("ignore::attnlens.evaluation.probing.ProbeWarning")
def test_run_many_gives_each_hook_set_its_own_run(minilm, constants):
    """probing.run_many: each hook set's result is probing.run's for it alone, in stacks of any
    size (``budget``: all hook sets in one stacked model, or one per stack), each given to
    ``done`` as it is ready. Reference: probing.run, whose seeds are their own stacked model.
    Every member of a stack is the same fit as alone up to float32 sums' order
    (tests/unit/test_stacked_probe.py: parameters and logits within 1e-5), so the predicted
    labels, and the scores and intervals computed from them, are compared exactly."""
    from attnlens.methods import interventions

    hooks = [interventions.build("papa", minilm, "all", constants=constants), ()]
    options = dict(data_dir=DATA, train_limit=TRAIN, eval_limit=EVAL, max_len=64, layout=constants.layout,
                   seeds=2, select_epochs=False, baseline=False, resamples=200, progress=False)
    alone = [probing.run(minilm, "sst2", hooks=one, **options) for one in hooks]
    for budget in (None, 1):
        done = []
        together = probing.run_many(minilm, "sst2", hooks, budget=budget,
                                    done=lambda index, result, done=done: done.append((index, result)), **options)
        assert [index for index, _ in done] == [0, 1] and [result for _, result in done] == together
        for mine, reference in zip(together, alone, strict=True):
            assert mine.runs == reference.runs and mine.scores == reference.scores
            assert (mine.interval, mine.settings) == (reference.interval, reference.settings)
    assert alone[0].score != alone[1].score  # the hook sets differ
    with pytest.raises(InputError, match="interventions is empty"):
        probing.run_many(minilm, "sst2", [], **options)
    with pytest.raises(InputError, match="1 cache keys for 2 hook sets"):
        probing.run_many(minilm, "sst2", hooks, cache_keys=["a"], **options)


def test_curve_arguments_are_checked(minilm, constants, monkeypatch):
    with pytest.raises(ValueError, match="Unknown baseline 'ones'"):
        papa.curve(minilm, constants, ["sst2"], baselines=("ones",), data_dir=DATA)
    with pytest.raises(ValueError, match=r"fractions\[1\] must lie in"):
        papa.curve(minilm, constants, ["sst2"], fractions=(0, 1.5), data_dir=DATA)
    with pytest.raises(ValueError, match=r"fractions\[0\] must be a finite number"):
        papa.curve(minilm, constants, ["sst2"], fractions=(float("nan"),), data_dir=DATA)
    # a repeated fraction made a second row of the same point, counted twice by Holm
    with pytest.raises(ValueError, match="fraction 0.5 is given more than once"):
        papa.curve(minilm, constants, ["sst2"], fractions=(0, 0.5, 0.5, 1), data_dir=DATA)
    with pytest.raises(ValueError, match="Unknown strategy"):
        papa.curve(minilm, constants, ["sst2"], strategy="best", data_dir=DATA)
    # constants are positional: sentence constants on a pair task are refused before any work,
    # naming the fix (a mapping with pair constants for it)
    def no_work(*args, **kwargs):
        raise AssertionError("a task was probed before the constants were checked")

    monkeypatch.setattr(probing, "run", no_work)
    with pytest.raises(MismatchError, match=r"fitted on single sentences, and 'mrpc' has sentence pairs.*mapping"):
        papa.curve(minilm, constants, ["sst2", "mrpc"], data_dir=DATA)
    with pytest.raises(InputError, match="constants has no entry for 'mrpc'"):
        papa.curve(minilm, {"sst2": constants}, ["sst2", "mrpc"], data_dir=DATA)


def test_cli_compare_with_a_task_reports_scores_per_view(tmp_path, capsys):
    """`attnlens compare --task sst2` writes a report whose table lists task scores per view,
    and its JSON keeps them."""
    import json

    from attnlens.cli import main

    corpus = tmp_path / "texts.txt"
    corpus.write_text("\n".join(f"a short text number {i} about a film" for i in range(12)) + "\n", encoding="utf-8")
    report, data = tmp_path / "report.html", tmp_path / "report.json"
    assert main(["compare", "--corpus", str(corpus), "--max-len", "32", "--task", "sst2",
                 "--data-dir", str(DATA), "--train-limit", "100", "--eval-limit", "50",
                 "--json", str(data), "--quiet", "--out", str(report)]) == 0
    html = report.read_text(encoding="utf-8")
    assert 'id="scores"' in html and "papa (all heads)" in html and "effective" in html
    scores = json.loads(data.read_text(encoding="utf-8"))["scores"]
    views = [row["view"] for row in scores]
    assert views == ["standard", "papa (all heads)", "papa (half of the heads)", "effective"]
    standard = scores[0]["score"]
    assert scores[-1]["score"] == pytest.approx(standard, abs=0.011)  # effective: the same output
    assert "sst2 (accuracy) under standard" in capsys.readouterr().out


def test_cli_curve_writes_csv_and_html(tmp_path, minilm, constants):
    from attnlens.cli import main

    path = constants.save(tmp_path / "constants.safetensors")
    out = tmp_path / "curve.html"
    assert main(["curve", "--constants", str(path), "--task", "sst2", "--data-dir", str(DATA),
                 "--fractions", "0,1", "--train-limit", str(TRAIN), "--eval-limit", str(EVAL), "--seeds", "1",
                 "--baselines", "zeros", "--quiet", "--out", str(out), "--checkpoint", str(tmp_path / "points")]) == 0

    table = pd.read_csv(out.with_suffix(".csv"))
    assert list(table["strategy"]) == ["input_dependence"] * 2 + ["zeros"]
    assert len(list((tmp_path / "points").glob("point-*.safetensors"))) == len(table)  # every point kept
    assert out.read_text(encoding="utf-8").count("<html") == 1


def test_the_curve_scores_the_language_model_named_by_its_kind(minilm, constants, paragraphs):
    """lm_texts add an 'lm' row per point: the MLM probe here (MiniLM's head is untrained), and
    replacing every head changes it."""
    curve = papa.curve(minilm, constants, [], fractions=(0, 1), baselines=(),
                       lm_texts=paragraphs[:60], progress=False)
    table = curve.table
    assert list(table["task"]) == ["lm", "lm"] and (table["metric"] == "MLM probe").all()
    assert table["score"].iloc[0] != table["score"].iloc[1]
    plain = mlm.probe(minilm, paragraphs[:60], max_len=64, layout=constants.layout, progress=False)
    assert table["score"].iloc[0] == plain.value
    # intervals over the evaluation texts and the paired test against no head replaced
    assert ((table["low"] <= table["score"]) & (table["score"] <= table["high"])).all()
    assert table["difference"].iloc[0] == 0 and pd.isna(table["p_value"].iloc[0])  # the reference: no test
    # one test, two-sided: Holm leaves it alone; a log-likelihood can be negative: no ratio
    assert 0 <= table["p_value"].iloc[1] <= 1 and table["p_adjusted"].iloc[1] == table["p_value"].iloc[1]
    assert table["significant"].iloc[1] == (table["p_adjusted"].iloc[1] < 0.05)
    assert table["relative"].isna().all() and table["margin"].iloc[1] == pytest.approx(0.02 * abs(table["score"].iloc[0]))
    assert table["difference"].iloc[1] == pytest.approx(table["score"].iloc[1] - table["score"].iloc[0], abs=1e-9)
    assert plain.counts.shape == (plain.n_examples, 2) and plain.counts[:, 1].sum() == plain.n_tokens
    assert plain.counts[:, 0].sum() / plain.n_tokens == pytest.approx(plain.value, abs=1e-9)


def test_the_lambda_strategy_learns_lambda_with_the_probe_and_reports_its_cost(minilm, constants, monkeypatch):
    """A few steps of the cheaper recipe: λ moves away from its start (0.5) for some heads, the
    curve follows the λ order (half of the heads at 0.5), and the cost and the rank
    correlation with the label-free order are recorded."""
    from attnlens.evaluation import curve as curve_module

    learned = []
    monkeypatch.setattr(curve_module, "lambda_order", lambda *a, **k: learned.append(lambda_order(*a, **k)) or learned[-1])
    curve = papa.curve(minilm, constants, ["sst2"], fractions=(0, 0.5), baselines=(),
                       strategy="lambda", data_dir=DATA, train_limit=TRAIN, eval_limit=EVAL,
                       lambda_steps=3, lambda_examples=32, seeds=1, progress=False)
    (lam,) = learned
    assert lam.shape == (6, 12) and (lam - 0.5).abs().max() > 1e-3
    assert list(curve.table["strategy"]) == ["lambda", "lambda"] and list(curve.table["heads"]) == [0, 36]
    assert curve.settings["lambda_seconds"] > 0
    assert -1 <= curve.settings["lambda_vs_input_dependence_spearman"] <= 1


def test_the_probe_beats_the_majority_on_pos_and_identity_hooks_change_nothing(minilm):
    """POS with 200 training sentences: far above always predicting the most frequent tag;
    identity pattern hooks give the very same features, hence the very same score."""
    # the probe alone (no linear baseline, the recipe's epochs): what this test is about
    options = dict(data_dir=DATA, train_limit=200, eval_limit=100, max_len=64, baseline=False,
                   select_epochs=False, progress=False)
    plain = probing.run(minilm, "pos", **options)
    assert plain.score > plain.majority + 0.4, plain
    evaluated = tasks.load("pos", "dev", data_dir=DATA, limit=100)
    assert [len(tags) for tags in plain.predictions] == [len(words) for words in evaluated.examples["words"]]
    identity = [(f"blocks.{layer}.attn.hook_pattern", lambda pattern, hook: pattern) for layer in range(6)]
    same = probing.run(minilm, "pos", hooks=identity, cache_key="identity", **options)
    assert same.score == plain.score and same.predictions == plain.predictions


def test_an_interrupted_curve_resumes_from_the_feature_cache(minilm, constants, monkeypatch):
    """Every finished point of a curve is cached: running it again does no forward pass."""
    from attnlens.engine import passes

    options = dict(fractions=(0, 1), baselines=(), data_dir=DATA, train_limit=100, eval_limit=50,
                   seeds=1, progress=False)
    first = papa.curve(minilm, constants, ["cola"], **options)
    monkeypatch.setattr(passes, "run", lambda *a, **k: pytest.fail("a forward pass ran again"))
    again = papa.curve(minilm, constants, ["cola"], **options)
    assert again.table["score"].tolist() == first.table["score"].tolist()


def test_a_curve_with_a_checkpoint_resumes_at_its_finished_points(minilm, constants, monkeypatch, tmp_path):
    """``checkpoint=``: a curve interrupted while its later points train (KeyboardInterrupt once
    the first of them is ready: their probes are one stacked fit, probing.run_many) runs again
    only the points it had not written, and its table equals an uninterrupted curve's in every
    column and digit: the later points start from the first point's epochs, C and linear
    solution read back from the folder (the warm start is bit for bit the same), and a stack of
    fewer points trains each as the whole stack did (each member the same fit as alone). The
    labelled baseline's constants are trained once and read back (the resumed curve finds its
    point by them). Run a third time, it trains nothing. A point file changed on disk is refused
    with one error naming it; a file given as the folder is refused before any work."""
    import numpy as np

    from attnlens.errors import DamagedFileError
    from attnlens.evaluation import curve as curve_module

    options = dict(fractions=(0, 1), baselines=("average_init",), labelled_steps=2, data_dir=DATA,
                   train_limit=100, eval_limit=50, seeds=1, progress=False)
    calls, real_run, real_many = [], probing.run, probing.run_many
    monkeypatch.setattr(probing, "run", lambda *a, **k: calls.append(real_run(*a, **k)) or calls[-1])
    whole = papa.curve(minilm, constants, ["cola"], **options)
    linear, epochs = calls[0].linear, calls[0].settings["epochs_chosen"]
    folder = tmp_path / "points"
    monkeypatch.setattr(probing, "run", real_run)

    def interrupted(*args, done, **kwargs):  # the later points' call (the first point's is probing.run's)
        def then_stop(index, result):
            done(index, result)  # the first later point, written
            raise KeyboardInterrupt

        return real_many(*args, done=then_stop, **kwargs)

    monkeypatch.setattr(probing, "run_many", interrupted)
    with pytest.raises(KeyboardInterrupt):
        papa.curve(minilm, constants, ["cola"], checkpoint=folder, **options)
    assert len(list(folder.glob("point-*.safetensors"))) == 2 and not list(folder.glob(".*"))
    assert len(list(folder.glob("labelled-*.safetensors"))) == 1  # trained before the points
    calls.clear()
    monkeypatch.setattr(probing, "run", lambda *a, **k: pytest.fail("the first point was trained again"))
    monkeypatch.setattr(probing, "run_many", lambda *a, **k: calls.append((a[2], k)) or real_many(*a, **k))
    monkeypatch.setattr(curve_module, "labelled_constants", lambda *a, **k: pytest.fail("trained again"))
    resumed = papa.curve(minilm, constants, ["cola"], checkpoint=folder, **options)
    assert len(calls) == 1 and len(calls[0][0]) == 1  # the later point not written
    kwargs = calls[0][1]  # the first point's choices and solution, read back exactly
    assert kwargs["probe"]["epochs"] == epochs and kwargs["baseline_C"] == linear.C
    start = kwargs["baseline_start"].model
    assert np.array_equal(start[-1].coef_, linear.model[-1].coef_)
    assert np.array_equal(start[-1].intercept_, linear.model[-1].intercept_)
    assert [timing["resumed"] for timing in resumed.timings] == [True, True, False]
    pd.testing.assert_frame_equal(resumed.table, whole.table, check_exact=True)
    monkeypatch.setattr(probing, "run_many", lambda *a, **k: pytest.fail("a probe was trained again"))
    again = papa.curve(minilm, constants, ["cola"], checkpoint=folder, **options)
    pd.testing.assert_frame_equal(again.table, whole.table, check_exact=True)
    assert [timing["resumed"] for timing in again.timings] == [True, True, True]
    damaged = sorted(folder.glob("point-*.safetensors"))[0]
    raw = bytearray(damaged.read_bytes())
    at = raw.index(b"seconds")
    at += next(i for i, byte in enumerate(raw[at:]) if chr(byte).isdigit())  # a digit of a recorded time
    raw[at] = ord("7") if raw[at] != ord("7") else ord("8")
    damaged.write_bytes(bytes(raw))
    with pytest.raises(DamagedFileError, match=str(damaged.name)):
        papa.curve(minilm, constants, ["cola"], checkpoint=folder, **options)
    with pytest.raises(InputError, match="is a file; give a folder"):
        papa.curve(minilm, constants, ["cola"], checkpoint=damaged, **options)


def test_papa_table_has_table_1s_rows_with_intervals(tmp_path, minilm, constants):
    """attnlens table: the rows of PAPA's Table 1 in its order (``--baselines``: a data-free and
    a labelled one, two training steps here; all six by default, whose names and order
    test_table_1_read_from_a_curve_equals_papa_table and the unit tests check), one column per
    task, each cell with its interval; the original row has relative score 1 and no drop; every
    baseline row is tested against average, its difference that of the seed means; CSV, Markdown
    and HTML."""
    from attnlens.cli import main

    path = constants.save(tmp_path / "constants.safetensors")
    out = tmp_path / "table.html"
    assert main(["table", "--constants", str(path), "--task", "sst2", "--data-dir", str(DATA),
                 "--train-limit", str(TRAIN), "--eval-limit", str(EVAL), "--seeds", "1", "--quiet",
                 "--labelled-steps", "2", "--baselines", "average_init,uniform", "--out", str(out)]) == 0

    long = pd.read_csv(out.with_suffix(".csv"))
    assert list(long["row"]) == [row for row in ROWS if row in ("original", "average", "uniform", "average_init")]
    assert ((long["low"] <= long["score"]) & (long["score"] <= long["high"])).all()
    original = long[long["row"] == "original"].iloc[0]
    assert original["relative"] == 1.0 and original["difference"] == 0
    assert pd.isna(original["p_value"]) and pd.isna(original["significant"])  # the reference: no test
    # the other rows are one family: Holm's step-down by its definition (a plain loop), and
    # significant is p_adjusted < 0.05
    tested = long[long["row"] != "original"]
    expected = holm_loop(list(tested["p_value"]))
    assert list(tested["p_adjusted"]) == pytest.approx(expected, abs=1e-12)
    assert list(tested["significant"]) == [a < 0.05 for a in expected]
    assert (tested["detectable"] > 0).all() and tested["equivalent"].isin([True, False]).all()
    assert (tested["versus_linear"] - (tested["score"] - tested["baseline"])).abs().max() < 1e-9
    versus = long[long["row"].isin(ROWS[2:])]
    average = long.loc[long["row"] == "average", "score"].iloc[0]
    assert (versus["versus_average"] - (versus["score"] - average)).abs().max() < 1e-9
    assert ((versus["versus_average_low"] <= versus["versus_average"])
            & (versus["versus_average"] <= versus["versus_average_high"])).all()
    assert versus["versus_average_p"].between(0, 1).all()
    assert list(versus["versus_average_p_adjusted"]) == pytest.approx(holm_loop(list(versus["versus_average_p"])),
                                                                      abs=1e-12)  # a second family
    assert long.loc[long["row"].isin(ROWS[:2]), "versus_average"].isna().all()
    markdown = out.with_suffix(".md").read_text(encoding="utf-8")
    assert markdown.count("\n") == 6 and "| average |" in markdown and "| average_init |" in markdown
    assert out.read_text(encoding="utf-8").count("<html") == 1


def test_table_1_read_from_a_curve_equals_papa_table(minilm, constants):
    """One curve with data-free baselines holds Table 1: PapaTable.from_curve keeps its
    points at fraction 0 and 1 and the baselines, and equals papa.table's on the same settings
    (the same cached features and seeds, so the same numbers to the last bit)."""
    options = dict(data_dir=DATA, train_limit=TRAIN, eval_limit=EVAL, seeds=1, progress=False)
    baselines = ("identity", "zeros")  # two of the data-free matrices
    measured = papa.curve(minilm, constants, ["sst2"], fractions=(0, 0.5, 1), baselines=baselines, **options)
    read = papa.PapaTable.from_curve(measured)
    direct = papa.table(minilm, constants, ["sst2"], baselines=baselines, **options)
    assert list(read.table["row"]) == ["original", "average", *baselines] == list(direct.table["row"])
    columns = ["row", "score", "low", "high", "difference", "baseline", "majority"]
    pd.testing.assert_frame_equal(read.table[columns], direct.table[columns])
    half = measured.table[measured.table["fraction_replaced"] == 0.5]
    with pytest.raises(AttnlensError, match="fraction 0 and 1"):
        papa.PapaTable.from_curve(Curve(half, settings=measured.settings))
