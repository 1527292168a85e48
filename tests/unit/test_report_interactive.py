"""The data behind the report's explorer (attnlens.present.kept, Comparison.kept_patterns) and its HTML.

References: the 8-bit codes against their definition (attnlens.present.kept docstring) and the error
bound it states; kept maps against the model's own patterns (run_with_cache, one example at a
time) and effective attention's NumPy SVD loop (attnlens.methods.effective.reference); the choice of
examples against a plain loop over their sizes. The browser side is in test_report_browser.py.
"""

from __future__ import annotations

import json
import re
import zlib

import numpy as np
import pytest
import torch
from plotly.offline import get_plotlyjs

import attnlens
from attnlens.comparison import accumulator
from attnlens.comparison.result import Comparison
from attnlens.comparison.run import REPORT_BUDGET, REPORT_EXAMPLES
from attnlens.core import devices
from attnlens.present import kept
from tests.tiny import CORPUS, bert_tokenizer, tiny_bert
from tests.typechecks import unchecked


@pytest.fixture(scope="module")
def model():
    return attnlens.load(tiny_bert(), tokenizer=bert_tokenizer())


TEXTS = CORPUS[:8]
MAX_LEN = 24


@pytest.fixture(scope="module")
def comparison(model) -> Comparison:
    return attnlens.compare(model, "papa", "effective", corpus=TEXTS, max_len=MAX_LEN, progress=False)


# -- 8-bit codes ---------------------------------------------------------------------------------


def test_codes_follow_their_definition_and_error_bound():
    generator = torch.Generator().manual_seed(0)
    maps = torch.rand(3, 5, 7, 7, generator=generator).softmax(-1)
    codes, scales = kept.encode(maps, signed=False)
    assert codes.dtype == torch.uint8 and scales.shape == (3, 5)
    top = maps.amax(dim=(-2, -1))
    np.testing.assert_allclose(scales.numpy(), (top / 255).numpy(), rtol=1e-6)
    # the definition, written out as a loop over maps
    for i in range(3):
        for j in range(5):
            expected = np.rint(maps[i, j].double().numpy() / float(scales[i, j]))
            assert np.abs(codes[i, j].numpy().astype(int) - expected).max() <= 1  # float rounding
            assert codes[i, j].max() == 255
    decoded = kept.decode(codes.numpy(), scales.numpy(), signed=False)
    bound = (top / 510).numpy()[..., None, None] * (1 + 1e-5)
    assert (np.abs(decoded - maps.numpy()) <= bound).all()

    signed_maps = torch.randn(4, 6, 6, generator=generator)
    codes, scales = kept.encode(signed_maps, signed=True)
    magnitude = signed_maps.abs().amax(dim=(-2, -1))
    np.testing.assert_allclose(scales.numpy(), (magnitude / 127).numpy(), rtol=1e-6)
    assert codes.min() >= 1 and codes.max() <= 255
    decoded = kept.decode(codes.numpy(), scales.numpy(), signed=True)
    bound = (magnitude / 254).numpy()[..., None, None] * (1 + 1e-5)
    assert (np.abs(decoded - signed_maps.numpy()) <= bound).all()
    zero = torch.zeros(1, 3, 3)
    for signed in (False, True):
        codes, scales = kept.encode(zero, signed=signed)
        assert float(scales[0]) == 0.0
        assert (kept.decode(codes.numpy(), scales.numpy(), signed=signed) == 0).all()


def test_deflate_writes_the_zlib_format_that_zlib_inflates():
    """kept.deflate (ISA-L) must stay the format the report's DecompressionStream("deflate")
    reads: RFC 1950's zlib stream (a 0x78 header, an Adler-32 trailer), which zlib inflates to
    the same bytes; and it must compress 8-bit maps (the budget counts its bytes)."""
    rng = np.random.default_rng(0)
    maps = torch.softmax(torch.from_numpy(rng.standard_normal((12, 40, 40)) * 3), dim=-1)
    codes = kept.encode(maps, signed=False)[0].numpy().tobytes()
    for data in (codes, rng.integers(0, 256, 5000, dtype=np.uint8).tobytes(), b"", b"\x00" * 100_000):
        blob = kept.deflate(data)
        assert blob[0] == 0x78 and zlib.decompress(blob) == data
        assert int.from_bytes(blob[-4:], "big") == zlib.adler32(data)
    assert len(kept.deflate(codes)) < len(codes) / 2


def test_codes_refuse_bad_maps():
    with pytest.raises(ValueError, match="NaN"):
        kept.encode(torch.tensor([[[float("nan"), 0.0], [0.0, 1.0]]]), signed=False)
    with pytest.raises(ValueError, match="NaN or infinite"):
        kept.encode(torch.tensor([[[-float("inf"), 0.0], [0.0, 1.0]]]), signed=False)
    with pytest.raises(ValueError, match="NaN or infinite"):
        kept.encode(torch.tensor([[[float("inf"), 0.0], [0.0, -1.0]]]), signed=True)
    with pytest.raises(ValueError, match="negative"):
        kept.encode(torch.tensor([[[-0.5, 0.0], [0.0, 1.0]]]), signed=False)


@pytest.mark.parametrize("signed", [False, True])
def test_unchecked_codes_mark_each_refused_map_by_its_scale(signed):
    """``check=False`` (a pass on a device, which reads nothing per batch): every map the checked
    call refuses, and only those, gets a scale that is not finite, which :func:`kept.refused`
    finds on the host; the other maps' codes and scales are the checked call's."""
    nan, inf = float("nan"), float("inf")
    good = [[[0.2, 0.8], [0.5, 0.5]], [[0.0, 0.0], [0.0, 0.0]], [[-1e-7, 1.0], [0.3, 0.7]]]  # -1e-7: rounding
    bad = [[[nan, 0.0], [0.0, 1.0]], [[inf, 0.0], [0.0, 1.0]], [[-inf, 0.0], [0.0, 1.0]]]
    if not signed:
        bad.append([[-0.5, 0.0], [0.0, 1.0]])
    maps = torch.tensor(good + bad)
    codes, scales = kept.encode(maps, signed=signed, check=False)
    for i, scale in enumerate(scales.tolist()):
        assert np.isfinite(scale) == (i < len(good)), i
    assert not kept.refused(scales[: len(good)].numpy())
    assert all(kept.refused(scales[i : i + 1].numpy()) for i in range(len(good), len(maps)))
    checked_codes, checked_scales = kept.encode(maps[: len(good)], signed=signed)
    assert torch.equal(codes[: len(good)], checked_codes) and torch.equal(scales[: len(good)], checked_scales)


def test_a_pass_on_a_device_refuses_bad_kept_maps_when_it_reads_them(model, monkeypatch):
    """On a device's route (no read per batch) a kept map that encode refuses stops the
    comparison with one clear error when the kept maps are read, at the end of the pass."""
    monkeypatch.setattr(devices, "reads_are_free", lambda where: False)
    blocks = accumulator.ReportRows.blocks
    # the kept rows' maps made negative, as a view coded as non-negative must never be
    monkeypatch.setattr(accumulator.ReportRows, "blocks", lambda rows, pattern: blocks(rows, pattern) - 0.5)
    with pytest.raises(ValueError, match="maps to keep hold NaN or infinite values .or an unsigned view negative"):
        attnlens.compare(model, "papa", corpus=TEXTS, max_len=MAX_LEN, progress=False)


def test_segments_of_pairs():
    bert = [False, False, False, True, False, False, True]  # [CLS] a b [SEP] c d [SEP]
    assert kept.segments_of(bert, True) == [0, 0, 0, 0, 1, 1, 1]
    roberta = [False, False, True, True, False, True]  # <s> a </s></s> b </s>
    assert kept.segments_of(roberta, True) == [0, 0, 0, 0, 1, 1]
    assert kept.segments_of(bert, False) == [0] * 7


def test_label_of():
    assert kept.label_of("  a  b\nc ") == "a b c"
    assert kept.label_of(("first one", "second")) == "first one ‖ second"
    long = kept.label_of("word " * 40)
    assert len(long) == kept.LABEL_CHARS and long.endswith("…")


# -- what compare keeps --------------------------------------------------------------------------


def reference_maps(model, text, view) -> np.ndarray:
    """``[layer, head, n, n]`` of one text run alone: its softmax patterns (standard) or effective
    attention from the NumPy SVD loop (attnlens.methods.effective.reference), valid tokens only."""
    from attnlens.methods.effective.reference import effective_attention_loop

    batch = attnlens.tokenize(model, [text], max_len=MAX_LEN, layout="papa")
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.input_ids, **batch.model_kwargs())
    valid = batch.attention_mask.bool()
    keep = valid[0].nonzero().squeeze(-1).numpy()
    layers = []
    for layer in range(model.cfg.n_layers):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
        if view == "effective":
            v = cache[f"blocks.{layer}.attn.hook_v"].permute(0, 2, 1, 3)  # [batch, head, key, d_head]
            pattern = torch.from_numpy(effective_attention_loop(pattern, v, valid))
        layers.append(pattern[0].double().numpy()[:, keep][:, :, keep])
    return np.stack(layers)


def test_kept_maps_match_the_model_example_by_example(model, comparison):
    store = comparison.kept_patterns
    assert store.views == ("standard", "papa", "effective") and store.signed == ("effective",)
    assert store.indices == list(range(len(TEXTS)))  # 8 short texts of a tiny model fit
    assert comparison.example_index in store.indices
    for index in (0, 3, 7):
        for view in ("standard", "effective"):
            expected = reference_maps(model, TEXTS[index], view)
            got = comparison.patterns_of(index, view)
            top = np.abs(expected).max(axis=(-2, -1), keepdims=True)
            step = top / (254 if view == "effective" else 510)
            assert got.shape == expected.shape
            assert (np.abs(got - expected) <= step + 2e-5).all(), (index, view)
        example = store.example(index)
        assert example.tokens[0] == "[CLS]" and example.tokens[-1] == "[SEP]"
        assert len(example.tokens) == got.shape[-1] and example.segments == [0] * len(example.tokens)
        assert example.label == kept.label_of(TEXTS[index])
    # the shown example is exact (its float maps); the kept codes agree within a step
    shown = comparison.example_index
    for view in comparison.views:
        exact = comparison.example_patterns[view]
        assert comparison.patterns_of(shown, view) is exact
        approx = store.pattern(shown, view)
        top = np.abs(exact).max(axis=(-2, -1), keepdims=True)
        assert (np.abs(approx - exact) <= top / (254 if view == "effective" else 510) + 1e-6).all()
    # effective attention differs from standard on texts longer than d_head (8)
    assert not np.allclose(comparison.patterns_of(1, "effective"), comparison.patterns_of(1, "standard"), atol=1e-3)


def test_pairs_keep_their_segments(model):
    pairs = list(zip(CORPUS[0:4], CORPUS[4:8], strict=True))
    result = attnlens.compare(model, "standard", corpus=pairs, max_len=32, progress=False)
    for example in result.kept_patterns.examples:
        tokens, segments = example.tokens, example.segments
        first_sep = tokens.index("[SEP]")
        assert segments == [0] * (first_sep + 1) + [1] * (len(tokens) - first_sep - 1)
        assert "‖" in example.label


def test_examples_are_chosen_within_the_budget(model, comparison):
    """Reference: a plain loop over the sizes of every candidate (all kept with a huge budget)."""
    everything = attnlens.compare(
        model, "papa", "effective", corpus=TEXTS, max_len=MAX_LEN, progress=False,
        report_examples=len(TEXTS), report_budget=10**9,
    )
    sizes = {e.index: e.n_bytes for e in everything.kept_patterns.examples}
    assert sorted(sizes) == list(range(len(TEXTS)))
    budget = sum(sizes.values()) // 2
    limit = 6
    for always in (0, 7):
        result = attnlens.compare(
            model, "papa", "effective", corpus=TEXTS, max_len=MAX_LEN, progress=False,
            report_examples=limit, report_budget=budget, example=always,
        )
        left, expected = budget - sizes[always], [always]
        for index in range(limit):
            if index != always and sizes[index] <= left:
                expected.append(index)
                left -= sizes[index]
        assert result.kept_patterns.indices == sorted(expected)
        assert result.kept_patterns.n_bytes <= budget
        assert result.kept_patterns.n_considered == limit
    none = attnlens.compare(model, "standard", corpus=TEXTS[:2], max_len=MAX_LEN, progress=False, report_examples=0)
    assert none.kept_patterns is None
    with pytest.raises(ValueError, match="was not kept"):
        none.patterns_of(1 - none.example_index, "standard")
    assert none.patterns_of(none.example_index, "standard") is none.example_patterns["standard"]


def test_merged_shards_select_like_one_pass(comparison):
    """Shards of a corpus (torchrun) each keep their part; the union selects as one pass does."""
    store = comparison.kept_patterns
    first = kept.KeptPatterns(store.views, store.signed, store.n_layers, store.n_heads, store.examples[:3])
    second = kept.KeptPatterns(store.views, store.signed, store.n_layers, store.n_heads, store.examples[3:])
    union = second.merged([first])
    assert union.indices == store.indices
    budget = store.n_bytes // 3
    assert union.select(limit=8, budget=budget, always=5).indices == store.select(
        limit=8, budget=budget, always=5).indices


def test_bad_report_arguments_and_examples(model, comparison):
    for bad in ({"report_examples": -1}, {"report_budget": -5}, {"report_examples": 1.5}):
        with unchecked(), pytest.raises(ValueError, match="report_"):
            attnlens.compare(model, "standard", corpus=TEXTS[:2], max_len=MAX_LEN, progress=False, **bad)
    with pytest.raises(ValueError, match="outside the corpus of 8 texts"):
        comparison.patterns_of(8, "standard")
    with pytest.raises(ValueError, match="view 'attn'"):
        comparison.patterns_of(0, "attn")
    small = comparison.kept_patterns.select(limit=2, budget=10**9, always=None)
    with pytest.raises(ValueError, match=r"example 5 was not kept.*0-1.*report_examples"):
        small.example(5)


# -- JSON ----------------------------------------------------------------------------------------


def test_json_round_trips_the_kept_maps(comparison):
    data = json.loads(comparison.to_json())
    assert data["kept_patterns"]["views"] == ["standard", "papa", "effective"]
    restored = Comparison.from_json(comparison.to_json())
    a, b = comparison.kept_patterns, restored.kept_patterns
    assert (a.views, a.signed, a.indices, a.limit, a.budget, a.n_considered) == (
        b.views, b.signed, b.indices, b.limit, b.budget, b.n_considered)
    for x, y in zip(a.examples, b.examples, strict=True):
        assert (x.index, x.label, x.tokens, x.segments) == (y.index, y.label, y.tokens, y.segments)
        assert x.blobs == y.blobs
        for view in a.views:
            np.testing.assert_array_equal(x.scales[view], y.scales[view])
    np.testing.assert_array_equal(restored.patterns_of(2, "papa"), comparison.patterns_of(2, "papa"))


def test_older_json_without_kept_maps_still_loads_and_renders(comparison):
    data = json.loads(comparison.to_json())
    del data["kept_patterns"]
    old = Comparison.from_json(json.dumps(data))
    assert old.kept_patterns is None
    html = old.to_html()
    payload = re.search(r'id="attnlens-[0-9a-f]+-explorer-data">(.*?)</script>', html).group(1)
    examples = json.loads(payload)["examples"]
    assert [e["index"] for e in examples] == [comparison.example_index]  # the shown example only


def test_malformed_kept_maps_are_one_clear_error(comparison):
    data = json.loads(comparison.to_json())
    data["kept_patterns"]["examples"][0]["codes"]["papa"] = "AAAA"
    with pytest.raises(ValueError, match="kept_patterns of the comparison JSON is not valid"):
        Comparison.from_json(json.dumps(data))
    data = json.loads(comparison.to_json())
    blob = zlib.compress(b"\x00" * 10)
    import base64

    data["kept_patterns"]["examples"][0]["codes"]["papa"] = base64.b64encode(blob).decode()
    with pytest.raises(ValueError, match=r"expected 2 x 4 x"):
        Comparison.from_json(json.dumps(data))


# -- the HTML --------------------------------------------------------------------------------------


def explorer_payload(html: str) -> dict:
    return json.loads(re.search(r'id="attnlens-[0-9a-f]+-explorer-data">(.*?)</script>', html).group(1))


def test_report_holds_the_explorer_and_its_data(comparison):
    html = comparison.to_html()
    assert len(re.findall(r"plotly\.js v\d", html)) == 1
    assert not re.search(r"<script[^>]+src=", html)
    data = explorer_payload(html)
    assert data["views"] == ["standard", "papa", "effective"]
    assert data["signed"] == {"standard": False, "papa": False, "effective": True}
    assert [e["index"] for e in data["examples"]] == comparison.kept_patterns.indices
    # the grids a click can select a head from: every head grid, not the tiled patterns
    names = {re.sub(r"^attnlens-[0-9a-f]+-", "", grid) for grid in data["grids"]}
    assert names == {"distance_from_standard", "dominant_target", "to_cls", "to_sep", "to_punct",
                     "to_self", "to_prev", "to_next", "entropy", "sink", "pattern_type"}
    # select boxes: every kept example (its first words), every layer and head, the focus chosen
    options = re.findall(r'<option value="(\d+)"( selected)?>([^<]*)</option>', html)
    labels = [text for _, _, text in options if ":" in text]
    assert labels[0].startswith("0: the quick brown fox")
    layer, head = comparison.focus
    assert (str(layer), " selected", f"L{layer}") in options and (str(head), " selected", f"H{head}") in options
    assert "<" not in re.search(r'explorer-data">(.*?)</script>', html).group(1)  # tokens escaped


def test_pattern_types_render_when_present(comparison):
    import dataclasses

    from attnlens.present.columns import TYPE_COLUMNS
    from attnlens.present.report import pattern_types_html

    table = comparison.table.copy()
    table[list(TYPE_COLUMNS)] = float("nan")
    table["pattern_type"] = None
    assert pattern_types_html(dataclasses.replace(comparison, table=table)) == ""  # an older JSON's
    for view in comparison.views:  # 3 of every 4 heads diagonal (share 0.7), the others vertical
        rows = table["view"] == view
        diagonal = rows & (table["head"] < 3)
        table.loc[rows, list(TYPE_COLUMNS)] = 0.0
        table.loc[rows, "type_vertical"] = 0.2
        table.loc[diagonal, "type_diagonal"] = 0.7
        table.loc[rows & ~diagonal, "type_diagonal"] = 0.1
        table.loc[diagonal, "pattern_type"] = "diagonal"
        table.loc[rows & ~diagonal, "pattern_type"] = "vertical"
    changed = dataclasses.replace(comparison, table=table)
    html = pattern_types_html(changed)
    assert html.startswith('<h2 id="pattern_types">')
    header = re.findall(r"<th>([^<]*)</th>", html)
    assert header[:3] == ["view", "heads: diagonal", "heads: vertical"]
    assert header[3:] == [f"mean share: {name}" for name in ("vertical", "diagonal", "vertical+diagonal",
                                                              "block", "heterogeneous")]
    rows = [re.findall(r"<td>([^<]*)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", html, re.S)]
    rows = [row for row in rows if row]
    mean = (6 * 0.7 + 2 * 0.1) / 8  # 6 of the 8 heads are "diagonal"
    assert rows == [[view, "0.750", "0.250", "0.200", f"{mean:.3f}", "0.000", "0.000", "0.000"]
                    for view in comparison.views]
    assert 'id="pattern_types"' in changed.to_html()


def test_head_grids_use_sequential_scales_for_non_negative_panels():
    """A grid mixing non-negative views with a signed one: only the signed panel is diverging."""
    from attnlens.core import plots

    grid = plots.head_grid(
        {"standard": np.full((2, 4), 0.3), "papa": np.full((2, 4), 0.5),
         "effective": np.linspace(-0.2, 0.4, 8).reshape(2, 4)},
        name="to_sep",
    )
    axes = {trace.name: trace.coloraxis for trace in grid.data}
    assert axes == {"standard": "coloraxis", "papa": "coloraxis", "effective": "coloraxis2"}
    assert grid.layout.coloraxis.cmin == 0 and grid.layout.coloraxis.cmid is None
    assert grid.layout.coloraxis.colorscale[0][1] == "#440154"  # viridis
    assert grid.layout.coloraxis2.cmid == 0 and grid.layout.coloraxis2.cmin == pytest.approx(-0.4)


@pytest.mark.slow
def test_default_report_of_a_tiny_model_is_within_its_budget(model, tmp_path):
    """``attnlens compare`` defaults (embedded corpus, max_len 128, every view): the kept maps fit
    in REPORT_BUDGET, and the file is at most plotly.js + the budget in base64 + the rest of the
    report, bounded here by the tiny model's figures (2 x 4 heads: well under 1 MB).
    (MiniLM's default report: benchmarks/report_size.py.)"""
    result = attnlens.compare(model, progress=False)
    store = result.kept_patterns
    assert store.limit == REPORT_EXAMPLES and store.budget == REPORT_BUDGET
    assert store.n_bytes <= REPORT_BUDGET
    assert len(store.examples) >= 20  # a tiny model's maps are small: many examples fit
    size = result.save_html(tmp_path / "report.html").stat().st_size
    budget = len(get_plotlyjs()) + REPORT_BUDGET * 4 / 3 + 1_000_000
    assert size <= budget, f"{size / 1e6:.2f} MB > {budget / 1e6:.2f} MB"


def test_explorer_of_a_decoder_blanks_later_keys_of_every_view():
    from tests.tiny import gpt2_tokenizer, tiny_gpt2

    decoder = attnlens.load(tiny_gpt2(), tokenizer=gpt2_tokenizer())
    result = attnlens.compare(decoder, corpus=CORPUS[:4], max_len=16, batch_size=2, progress=False)
    data = explorer_payload(result.to_html())
    assert data["blank"] == {"standard": True, "papa": True, "effective": True, "norm": True}
    # the kept codes hold zeros above the diagonal for every view, effective attention included
    # (a decoder's rows are projected onto the values of the keys they read), and not below it
    for view in ("standard", "effective"):
        maps = result.patterns_of(2, view)
        upper, lower = np.triu_indices(maps.shape[-1], k=1), np.tril_indices(maps.shape[-1])
        assert np.abs(maps[..., upper[0], upper[1]]).max() == 0, view
        assert np.abs(maps[..., lower[0], lower[1]]).max() > 1e-3, view


def test_standard_alone_embeds_plotly_before_the_explorer(model):
    """Without other views the side-by-side section comes first: plotly.js must precede it."""
    alone = attnlens.compare(model, "standard", corpus=TEXTS[:3], max_len=MAX_LEN, progress=False)
    html = alone.to_html()
    assert list(alone.figures)[0] == "side_by_side"
    assert len(re.findall(r"plotly\.js v\d", html)) == 1
    library = html.index("plotly.js v")
    assert library < html.index('class="explorer"') < html.index("Plotly.newPlot")
    assert explorer_payload(html)["views"] == ["standard"]
    assert 'name="difference"' not in html  # nothing to subtract standard from
