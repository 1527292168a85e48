"""attnlens.compare: the table, the figures, HTML/JSON output, and the function itself."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

import attnlens
from attnlens.comparison.result import Comparison
from attnlens.methods import views
from attnlens.methods.stats import AttentionStatistics, token_classes
from attnlens.present.columns import COLUMNS
from tests.small_comparison import MAX_LEN, small_comparison, texts
from tests.typechecks import unchecked

SHORT = [
    "The film is a charming, funny and moving portrait of a family.",
    "It rained all day, so the match was postponed until Sunday.",
    "Why would a head put all of its attention on one token?",
]


@pytest.fixture(scope="module")
def comparison(minilm) -> Comparison:
    return small_comparison(minilm)


# -- the table ----------------------------------------------------------------------------------


def test_table_has_two_times_72_rows_plus_standard(comparison):
    table = comparison.table
    assert isinstance(table, pd.DataFrame)
    assert list(table.columns) == list(COLUMNS)
    assert list(table.columns) == [
        "view", "layer", "head", "to_cls", "to_sep", "to_punct", "to_self", "to_prev",
        "to_next", "entropy", "sink", "distance_from_standard", "type_vertical", "type_diagonal",
        "type_vertical+diagonal", "type_block", "type_heterogeneous", "pattern_type",
    ]
    assert len(table) == 2 * 72 + 72
    assert table["view"].value_counts().to_dict() == {"standard": 72, "papa": 72, "effective": 72}
    assert comparison.views == ("standard", "papa", "effective")
    for _, rows in table.groupby("view"):
        assert sorted(zip(rows["layer"], rows["head"], strict=True)) == [
            (layer, head) for layer in range(6) for head in range(12)
        ]
    assert not table.isna().any().any()


@pytest.mark.parametrize("view", ["standard", "effective"])
def test_pattern_types_equal_patterns_types(comparison, minilm, view):
    """The type shares of the comparison's pass equal attnlens.methods.patterns.types' own pass over the
    same corpus, layout and max_len (counts of the same template rules: exact)."""
    from attnlens.methods import patterns

    expected = patterns.types(
        minilm, texts(), view=view, max_len=comparison.max_len, layout=comparison.layout, progress=False
    )
    shares = comparison.pattern_types
    got = shares[shares["view"] == view].reset_index(drop=True)
    np.testing.assert_array_equal(got[list(patterns.TYPES)].to_numpy(), expected[list(patterns.TYPES)].to_numpy())
    assert list(got["type"]) == list(expected["type"])
    grid = comparison.pattern_type(view)
    assert grid.shape == (6, 12) and set(grid.ravel()) <= set(patterns.TYPES)
    assert "pattern_type" in comparison.figures and "pattern_types" in comparison.figures


def test_pattern_types_round_trip_json_and_old_json(comparison):
    again = Comparison.from_json(comparison.to_json())
    pd.testing.assert_frame_equal(again.pattern_types, comparison.pattern_types, check_dtype=False)
    old = json.loads(comparison.to_json())
    old["table"] = [{k: v for k, v in row.items() if not k.startswith(("type_", "pattern_type"))} for row in old["table"]]
    older = Comparison.from_json(json.dumps(old))
    assert older.pattern_types is None and "pattern_type" not in older.figures


def test_table_values(comparison):
    table = comparison.table
    standard = table[table["view"] == "standard"]
    papa = table[table["view"] == "papa"]
    effective = table[table["view"] == "effective"]
    assert (standard["distance_from_standard"] == 0).all()
    assert papa["distance_from_standard"].between(0, 1).all()
    assert papa["distance_from_standard"].mean() > 0.05  # constant attention is not the model's
    assert (effective["distance_from_standard"] >= 0).all()
    assert effective["distance_from_standard"].max() > 1e-3  # two texts are longer than d_head
    for view in (standard, papa):  # distributions: shares in [0, 1]
        for column in ("to_cls", "to_sep", "to_punct", "to_self", "to_prev", "to_next"):
            assert view[column].between(-1e-6, 1 + 1e-6).all(), column
    assert (standard["entropy"] >= 0).all()


def test_standard_statistics_match_attention_statistics(minilm):
    result = attnlens.compare(minilm, "standard", corpus=SHORT, max_len=32, progress=False)
    batch = attnlens.tokenize(minilm, SHORT, max_len=32, layout="padded")
    with torch.no_grad():
        _, cache = minilm.run_with_cache(batch.input_ids, **batch.model_kwargs())
    statistics = AttentionStatistics(6, 12)
    classes = token_classes(minilm.tokenizer, batch.input_ids)
    valid = batch.attention_mask.bool()
    for layer in range(6):
        statistics.update(layer, cache[f"blocks.{layer}.attn.hook_pattern"], classes, valid)
    expected = statistics.means()
    for column in ("to_cls", "to_sep", "to_prev", "entropy"):
        np.testing.assert_allclose(result.grid(column), expected[column].numpy(), atol=1e-5)
    assert len(result.table) == 72 and result.layout == "padded"


def test_distance_is_total_variation(minilm):
    """With identity constants PAPA is one-hot on the query: TV(δ_q, a_q) = 1 − a_qq."""
    from attnlens import papa

    constants = papa.identity(minilm, max_len=32)
    result = attnlens.compare(minilm, "papa", corpus=SHORT, constants=constants, progress=False)
    assert result.max_len == 32 and result.layout == "papa"
    np.testing.assert_allclose(
        result.grid("distance_from_standard", "papa"), 1 - result.grid("to_self", "standard"),
        atol=1e-5,
    )
    np.testing.assert_allclose(result.grid("to_self", "papa"), 1.0, atol=1e-6)


def test_effective_equals_standard_on_short_texts(minilm, monkeypatch):
    """At most d_head (32) tokens: the values span every direction, so A⊥ = A, and attnlens
    says so (once per process: its memory is reset here)."""
    from attnlens.engine import effective as engine

    monkeypatch.setattr(engine, "_WARNED", set())
    with pytest.warns(UserWarning, match="No text has more than d_head = 32 tokens"):
        result = attnlens.compare(minilm, "effective", corpus=SHORT, max_len=24, progress=False)
    assert result.grid("distance_from_standard", "effective").max() < 1e-3


def test_unknown_view_is_a_value_error_naming_valid_views(minilm):
    with pytest.raises(ValueError, match=r"Unknown view 'attn'.*'standard', 'papa', 'effective'"):
        attnlens.compare(minilm, "papa", "attn", corpus=SHORT)
    with pytest.raises(TypeError, match="first argument is the model"):
        attnlens.compare("papa", "effective", corpus=SHORT)


def test_bad_corpus_and_options(minilm, tmp_path):
    from attnlens.core.corpus import CorpusError

    with pytest.raises(CorpusError, match="empty"):
        attnlens.compare(minilm, "standard", corpus=[])
    with pytest.raises(CorpusError, match="not found"):
        attnlens.compare(minilm, "standard", corpus=tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="n_examples"):
        attnlens.compare(minilm, "standard", corpus=SHORT, n_examples=0)
    for example in (1.0, "1", len(SHORT)):
        with unchecked(), pytest.raises(ValueError, match="example"):
            attnlens.compare(minilm, "standard", corpus=SHORT, example=example)
    from attnlens import papa

    with pytest.raises(ValueError, match="max_len"):
        attnlens.compare(
            minilm, "papa", corpus=SHORT, max_len=16, constants=papa.uniform(minilm, max_len=32)
        )
    # lm_texts as one string was scored as its characters (an LM score over one-letter texts),
    # after the whole pass; now refused by name first
    from attnlens.engine import passes
    from attnlens.errors import InputTypeError

    with unchecked(), pytest.raises(InputTypeError, match="lm_texts must be an iterable"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(passes, "run", lambda *a, **k: pytest.fail("the pass ran before lm_texts was checked"))
            attnlens.compare(minilm, "standard", corpus=SHORT, lm_texts="thefilm", max_len=16)


# -- attnlens.compare is a function, imported on first use ---------------------------------------


def test_compare_is_the_function_of_the_comparison_package(minilm):
    from attnlens.comparison.run import compare

    assert attnlens.compare is compare
    result = attnlens.compare(minilm, "standard", corpus=SHORT[:1], max_len=16, progress=False)
    assert isinstance(result, attnlens.Comparison) and len(result.table) == 72


def test_compare_is_callable_in_a_fresh_interpreter():
    code = (
        "import attnlens, sys, types; ok = isinstance(attnlens.compare, types.FunctionType); "
        "import attnlens.comparison.run as run; "
        "sys.exit(0 if ok and run.compare is attnlens.compare else 1)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


# -- figures, HTML, JSON -------------------------------------------------------------------------


def test_figures(comparison):
    figures = comparison.figures
    assert {
        "distance_from_standard", "side_by_side", "dominant_target", "to_cls", "to_sep",
        "to_punct", "to_self", "to_prev", "to_next", "entropy",
        "patterns_standard", "patterns_papa", "patterns_effective",
    } <= set(figures)
    grid = figures["distance_from_standard"]
    assert [trace.name for trace in grid.data] == ["papa", "effective"]  # no standard panel
    assert all(np.asarray(trace.z).shape == (6, 12) for trace in grid.data)
    assert [trace.name for trace in figures["to_sep"].data] == ["standard", "papa", "effective"]

    n = len(comparison.example_tokens)
    assert comparison.example_tokens[0] == "[CLS]" and comparison.example_tokens[-1] == "[SEP]"
    assert "[PAD]" not in comparison.example_tokens
    assert n > 32  # the default example is longer than d_head, so effective attention differs
    for view in comparison.views:
        fig = figures[f"patterns_{view}"]
        assert len(fig.data) == 1
        assert np.asarray(fig.data[0].z).shape == (6 * (n + 1) - 1, 12 * (n + 1) - 1)
        assert list(fig.layout.xaxis.ticktext) == [f"H{h}" for h in range(12)]
        assert list(fig.layout.yaxis.ticktext) == [f"L{layer}" for layer in range(6)]
    assert figures["patterns_effective"].data[0].zmid == 0.0  # diverging
    assert figures["patterns_standard"].data[0].zmid is None

    side = figures["side_by_side"]
    layer, head = comparison.focus
    assert [trace.name for trace in side.data] == ["standard", "papa", "effective"]
    assert f"Layer {layer}, head {head}" in side.layout.title.text
    papa_distance = comparison.grid("distance_from_standard", "papa")
    assert papa_distance[layer, head] == papa_distance.max()
    np.testing.assert_allclose(
        np.asarray(side.data[0].z), comparison.example_patterns["standard"][layer, head]
    )


def test_save_html_is_self_contained(comparison, tmp_path):
    path = comparison.save_html(tmp_path / "sub" / "report.html")
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    assert len(re.findall(r"plotly\.js v\d", text)) == 1  # plotly.js embedded exactly once
    assert not re.search(r"<script[^>]+src=", text)  # nothing to fetch: works offline
    assert text.count("Plotly.newPlot") == len(comparison.figures)
    assert "distance_from_standard" in text and "<table" in text
    fragment = comparison._repr_html_()  # Jupyter's view: a summary (tests/unit/test_reprs.py)
    assert "<html" not in fragment and "<script" not in fragment


def test_to_json_round_trip(comparison):
    data = json.loads(comparison.to_json())
    assert data["views"] == ["standard", "papa", "effective"]
    assert len(data["table"]) == 216
    assert set(data["table"][0]) == set(COLUMNS)
    assert "total-variation" in data["columns"]["distance_from_standard"]
    assert data["max_len"] == MAX_LEN and data["n_examples"] == len(texts())
    restored = Comparison.from_json(comparison.to_json())
    pd.testing.assert_frame_equal(restored.table, comparison.table, check_exact=True)
    assert restored.focus == comparison.focus
    assert set(restored.figures) == set(comparison.figures)


def test_decoder_patterns_are_masked_above_the_diagonal():
    """GPT-2 (no [CLS]/[SEP], no pad token) with every view: PAPA constants come from padded
    texts; every view's figures blank later keys, effective attention too (a decoder's rows are
    projected onto the values of the keys they read: 0 after the query, exactly, as the example
    patterns hold them)."""
    from tests.tiny import CORPUS, gpt2_tokenizer, tiny_gpt2

    model = attnlens.load(tiny_gpt2(), tokenizer=gpt2_tokenizer())
    result = attnlens.compare(model, corpus=CORPUS[:4], max_len=16, batch_size=2, progress=False)
    assert result.causal and result.views == views.names()  # every registered view, standard first
    assert result.layout == "padded"
    # token labels are the text of each token ('Ġthe' is ' the'): together, the example's text
    text = "".join(t for t in result.example_tokens if t not in model.tokenizer.all_special_tokens)
    assert text and CORPUS[result.example_index].startswith(text)
    n = len(result.example_tokens)
    upper, lower = np.triu_indices(n, k=1), np.tril_indices(n)
    for view in result.views:
        tile = np.asarray(result.figures[f"patterns_{view}"].data[0].z)[:n, :n]
        assert np.isnan(tile[upper]).all(), view
        assert not np.isnan(tile[lower]).any(), view
    expected = result.example_patterns["effective"][0, 0]
    assert np.all(expected[upper] == 0)
    tile = np.asarray(result.figures["patterns_effective"].data[0].z)[:n, :n]
    np.testing.assert_allclose(tile[lower], expected[lower], atol=1e-6)
    panels = {trace.name: np.asarray(trace.z) for trace in result.figures["side_by_side"].data}
    layer, head = result.focus
    np.testing.assert_allclose(
        panels["effective"][lower], result.example_patterns["effective"][layer, head][lower], atol=1e-6
    )
    assert np.isnan(panels["standard"][upper]).all() and np.isnan(panels["effective"][upper]).all()


def test_long_example_is_cropped_in_the_tiled_figure(comparison):
    """A long example's tiled figures show its first tokens, as many as TILED_BUDGET allows every
    view's figure together (their cells in base64 within it), at most MAX_TILED_TOKENS; the side
    by side figure (the explorer's, not in the report) keeps them all."""
    from attnlens.present.figures import MAX_TILED_TOKENS, TILED_BUDGET, tiled_tokens

    tokens = [f"w{i}" for i in range(MAX_TILED_TOKENS + 6)]
    n = len(tokens)
    long = Comparison.from_json(comparison.to_json())
    long.example_tokens = tokens
    long.example_patterns = {
        view: np.full((6, 12, n, n), 1.0 / n, dtype=np.float32) for view in long.views
    }
    figures = long.figures
    z = np.asarray(figures["patterns_papa"].data[0].z)
    m = tiled_tokens(n, len(long.views), 6, 12)
    assert 30 < m < MAX_TILED_TOKENS  # MiniLM's 72 heads under 4 views: the budget crops first
    assert tiled_tokens(10, len(long.views), 6, 12) == 10 and tiled_tokens(n, 1, 1, 1) == MAX_TILED_TOKENS
    assert z.shape == (6 * (m + 1) - 1, 12 * (m + 1) - 1)
    assert f"first {m} of {n} tokens" in figures["patterns_papa"].layout.title.text
    def cells(z: np.ndarray) -> int:  # the bytes of a heatmap's cells in a report: float32 in base64
        assert z.dtype == np.float32
        return len(base64.b64encode(z.tobytes()))

    taken = sum(cells(np.asarray(figures[f"patterns_{view}"].data[0].z)) for view in long.views)
    wider = np.random.default_rng(0).random((6 * (m + 2) - 1, 12 * (m + 2) - 1)).astype(np.float32)
    assert taken <= TILED_BUDGET < len(long.views) * cells(wider)  # one token more would not fit
    assert np.asarray(figures["side_by_side"].data[0].z).shape == (n, n)


# -- arguments checked before the pass; eval mode; the shared progress bar -------------------------


@pytest.fixture()
def tiny_bert():
    from tests.tiny import bert_tokenizer, tiny_bert

    return attnlens.load(tiny_bert(), tokenizer=bert_tokenizer())


def pairs_of(texts):
    return list(zip(texts[0::2], texts[1::2], strict=False))


def test_constants_fitted_on_pairs_are_refused_for_single_sentences(tiny_bert):
    """Reference: PapaConstants.check_compatible refuses a single-sentence batch for constants
    fitted on pairs; compare must refuse them too instead of applying them."""
    from attnlens import papa
    from tests.tiny import CORPUS

    constants = papa.fit(tiny_bert, pairs_of(CORPUS[:8]), max_len=16, progress=False)
    singles = attnlens.tokenize(tiny_bert, CORPUS[:4], max_len=16, layout="papa")
    with pytest.raises(ValueError, match="fitted on sentence pairs"):
        constants.check_compatible(tiny_bert, singles)
    with pytest.raises(ValueError, match="fitted on sentence pairs; the batch holds single"):
        attnlens.compare(tiny_bert, "papa", corpus=CORPUS[:4], constants=constants, progress=False)
    result = attnlens.compare(
        tiny_bert, "papa", corpus=pairs_of(CORPUS[:8]), constants=constants, progress=False
    )
    assert result.layout == "papa" and result.max_len == 16


def papa_real_tokens(tokenizer, first: str, second: str, max_len: int) -> int:
    """Real tokens of a pair in the PAPA layout, from its definition (attnlens.core.inputs docstring):
    [CLS], the middle and final [SEP], the first segment in max_len//2 - 1 positions, the second
    in max_len - max_len//2 - 2."""
    middle = max_len // 2
    a = len(tokenizer(first, add_special_tokens=False)["input_ids"])
    b = len(tokenizer(second, add_special_tokens=False)["input_ids"])
    return 3 + min(a, middle - 1) + min(b, max_len - middle - 2)


def test_default_example_of_pairs_counts_the_real_tokens_of_the_papa_layout(tiny_bert):
    """The first pair is longer than d_head in the tokenizer's own pair format, but not in the
    PAPA layout, where each segment has half of max_len: the default example is the second."""
    from tests.tiny import CORPUS

    max_len, d_head = 12, tiny_bert.cfg.d_head
    long = " ".join(CORPUS[:2])
    pairs = [("a", long), (long, long), ("a", "b")]
    tokenizer = tiny_bert.tokenizer
    own_format = [len(ids) for ids in tokenizer([a for a, _ in pairs], [b for _, b in pairs])["input_ids"]]
    assert min(own_format[0], max_len) > d_head  # the old count picked the first pair
    lengths = [papa_real_tokens(tokenizer, a, b, max_len) for a, b in pairs]
    expected = next(i for i, n in enumerate(lengths) if n > d_head)
    assert expected == 1
    result = attnlens.compare(tiny_bert, "papa", "effective", corpus=pairs, max_len=max_len, progress=False)
    assert result.example_index == expected
    assert len(result.example_tokens) == lengths[expected] > d_head
    assert not np.allclose(result.example_patterns["effective"], result.example_patterns["standard"], atol=1e-5)


def test_compare_runs_in_eval_mode_and_restores_the_mode(tiny_bert):
    """Reference: the same comparison of the model in eval mode (no dropout). The caller's
    training mode comes back, also when compare fails half-way."""
    from attnlens import papa
    from tests.tiny import CORPUS

    assert tiny_bert.original_model.config.attention_probs_dropout_prob > 0
    tiny_bert.eval()
    reference = attnlens.compare(tiny_bert, "standard", "papa", corpus=CORPUS, max_len=16, progress=False)
    assert not tiny_bert.training
    tiny_bert.train()
    result = attnlens.compare(tiny_bert, "standard", "papa", corpus=CORPUS, max_len=16, progress=False)
    pd.testing.assert_frame_equal(result.table, reference.table)
    assert tiny_bert.training and tiny_bert.original_model.training
    constants = papa.fit(tiny_bert, pairs_of(CORPUS[:8]), max_len=16, progress=False)
    with pytest.raises(ValueError, match="pairs"):
        attnlens.compare(tiny_bert, "papa", corpus=CORPUS[:4], constants=constants, progress=False)
    assert tiny_bert.training and tiny_bert.original_model.training


@pytest.mark.parametrize("focus", [(99, 0), (0, 4), (-1, 0), (0,), "ab", 3])
def test_bad_focus_is_refused_before_any_forward_pass(tiny_bert, focus):
    """The tiny model has 2 layers x 4 heads; a focus outside them (or not a (layer, head) pair)
    is refused before the PAPA fit and the pass over the corpus: no forward of the HF model."""
    from tests.tiny import CORPUS

    forwards = []
    handle = tiny_bert.original_model.register_forward_pre_hook(lambda *_: forwards.append(1))
    try:
        with unchecked(), pytest.raises(ValueError, match="focus"):
            attnlens.compare(tiny_bert, "papa", corpus=CORPUS, focus=focus, max_len=16, progress=False)
        assert forwards == []
        result = attnlens.compare(tiny_bert, "standard", corpus=CORPUS[:2], focus=(1, 3), max_len=16, progress=False)
        assert result.focus == (1, 3) and forwards == [1]
    finally:
        handle.remove()


def test_compare_shows_the_shared_progress_bar(tiny_bert, capsys):
    """Each pass over the corpus shows attnlens.engine.batches.progress_bar (as papa.fit's does):
    counting examples out of the corpus' length, under the same description as before."""
    from tests.tiny import CORPUS

    attnlens.compare(tiny_bert, "standard", "papa", corpus=CORPUS, max_len=16, batch_size=4)
    err = capsys.readouterr().err
    n = len(CORPUS)
    assert re.search(rf"papa\.fit: 100%.*{n}/{n} .*example/s", err), err
    assert re.search(rf"compare \(standard, papa\): 100%.*{n}/{n} .*example/s", err), err
    attnlens.compare(tiny_bert, "standard", corpus=CORPUS, max_len=16, progress=False)
    assert capsys.readouterr().err == ""


def test_side_by_side_caption_describes_the_views_shown(tiny_bert):
    """Standard alone shows the lowest-entropy head; the caption must not promise other views."""
    from attnlens.present.report import render
    from tests.tiny import CORPUS

    alone = attnlens.compare(tiny_bert, "standard", corpus=CORPUS[:3], max_len=16, progress=False)
    both = attnlens.compare(tiny_bert, "effective", corpus=CORPUS[:3], max_len=16, progress=False)
    assert "lowest entropy" in render(alone) and "non-standard" not in render(alone)
    assert "non-standard" in render(both) and "diverging colour scale" in render(both)
