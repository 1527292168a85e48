"""attnlens.methods.patterns: Kovaleva et al. 2019's pattern types (template classifier, types pass)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnlens
from attnlens import papa
from attnlens.core.inputs import tokenize
from attnlens.engine import passes
from attnlens.engine.forward import value_hook, values_per_kv_head
from attnlens.methods import clustering, patterns
from attnlens.methods.patterns.counts import COLUMNS
from attnlens.methods.patterns.templates import BAND, Positions
from tests import tiny

PAIRS = [
    ("A short premise.", "A hypothesis that follows it."),
    ("The cat sat on the mat, quietly.", "A cat was sitting."),
    ("Rain.", "It rained all day long in the city."),
]
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Attention heads look at separators, commas and periods.",
    "Short one.",
    "Yet another sentence, with a comma; and more words than the others have here.",
]


@pytest.fixture(scope="module")
def bert():
    return tiny.bert_bridge()


# ------------------------------------------------------------------------------------------------
# the template classifier


@pytest.mark.parametrize("length", [24, 32, 48])
def test_synthetic_maps_are_classified_correctly(length):
    """≥95% of held-out synthetic maps of each type get their type (issue 14)."""
    maps = patterns.synthetic("all", 100, length, seed=1000 + length)
    result = patterns.classify(maps.maps[:, None], tokens=maps.tokens)
    names = result.names[:, 0]
    labels = np.asarray(maps.labels)
    for kind in patterns.TYPES:
        accuracy = float(np.mean(names[labels == kind] == kind))
        assert accuracy >= 0.95, (kind, length, accuracy)


def test_synthetic_is_reproducible_and_rows_are_distributions():
    a, b = patterns.synthetic("block", 5, 20, seed=3), patterns.synthetic("block", 5, 20, seed=3)
    assert torch.equal(a.maps, b.maps) and a.tokens == b.tokens
    assert not torch.equal(a.maps, patterns.synthetic("block", 5, 20, seed=4).maps)
    torch.testing.assert_close(a.maps.sum(-1), torch.ones(5, 20), atol=1e-6, rtol=0)
    assert all(t.count("[SEP]") == 2 for t in a.tokens)  # block maps are pairs
    with pytest.raises(ValueError, match="Unknown pattern type"):
        patterns.synthetic("stripes", 2)
    with pytest.raises(ValueError, match="length must be at least 8"):
        patterns.synthetic("diagonal", 2, length=4)


def features_loop(pattern, tokens, causal=False, signed=False):
    """The chance-corrected region shares by hand, one map and one row at a time."""
    special = [bool(patterns.templates._SPECIAL.match(t)) for t in tokens]
    segment, seps = [], 0
    for t in tokens:
        segment.append(seps)
        seps += t in ("[SEP]", "</s>")
    words = [i for i, s in enumerate(special) if not s]
    pair = len({segment[i] for i in words}) > 1
    n = len(tokens)
    out = {}
    for name in ("special", "diagonal", "block"):
        share = chance = 0.0
        for q in range(n):
            keys = range(q + 1) if causal else range(n)
            row = np.array([float(pattern[q, k]) for k in keys])
            if signed:
                row = np.abs(row) / np.abs(row).sum()

            def region(k, q=q):
                if special[k]:
                    return "special"
                if k - q in BAND:
                    return "diagonal"
                if pair and segment[k] == segment[q]:
                    return "block"
                return None

            inside = [i for i, k in enumerate(keys) if region(k) == name]
            share += row[inside].sum()
            chance += len(inside) / len(keys)
        share, chance = share / n, chance / n
        out[name] = (share - chance) / (1 - chance)
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("signed", [False, True])
def test_features_match_a_plain_loop(causal, signed):
    """The vectorised shares equal the definition computed row by row (float64: 1e-9)."""
    generator = torch.Generator().manual_seed(0)
    tokens = [
        ["[CLS]", "a", "b", "[SEP]", "c", "d", "e", "[SEP]"],
        ["[CLS]", "x", "y", "z", "[SEP]", "pad", "pad", "pad"][:5],
    ]
    logits = torch.randn(2, 3, 8, 8, generator=generator, dtype=torch.float64)
    positions = Positions.from_tokens(tokens, causal=causal, length=8)
    visible = patterns.templates.visible_keys(positions)
    pattern = logits.masked_fill(~visible[:, None], -torch.inf).softmax(-1).nan_to_num(0.0)
    if signed:
        pattern = pattern - 0.1  # signed values, as effective attention has
    shares = patterns.features(pattern, positions, signed=signed)
    for b, example in enumerate(tokens):
        n = len(example)
        for h in range(3):
            expected = features_loop(pattern[b, h, :n, :n], example, causal, signed)
            for name, value in expected.items():
                assert abs(float(shares[name][b, h]) - value) < 1e-9, (b, h, name)


def rules_by_hand(special: float, diagonal: float, block: float, pair: bool) -> str:
    """The module docstring's rules, in order, on one (example, head)'s float32 shares."""
    t = patterns.templates.THRESHOLDS
    if special >= t["both_each"] and diagonal >= t["both_each"] and np.float32(special) + np.float32(diagonal) >= t["both_sum"]:
        return "vertical+diagonal"
    if special >= t["single"]:
        return "vertical"
    if diagonal >= t["single"]:
        return "diagonal"
    if pair and block >= t["single"]:
        return "block"
    return "heterogeneous"


def test_labels_apply_the_rules_in_order():
    """The labels (six threshold tests and a table of their outcomes) are the rules applied one
    after another, for every combination of shares at, just below and above each threshold, of
    a pair and of a single sentence."""
    levels = np.array([0.0, 0.19999, 0.2, 0.3, 0.49999, 0.5, 0.9, -0.3], dtype=np.float32)
    grid = np.stack(np.meshgrid(levels, levels, levels, indexing="ij"), -1).reshape(-1, 3)  # [combination, region]
    positions = Positions.from_tokens([["[CLS]", "a", "[SEP]", "b", "[SEP]"], ["[CLS]", "a", "b", "[SEP]"]], length=5)
    shares = torch.from_numpy(grid)[:, None, None, :].expand(-1, 2, 1, 3)  # [combination, example, head, region]
    labels = patterns.templates._labels(shares, positions)
    for i, (special, diagonal, block) in enumerate(grid):
        for example, pair in enumerate((True, False)):
            expected = rules_by_hand(float(special), float(diagonal), float(block), pair)
            assert patterns.TYPES[int(labels[i, example, 0])] == expected, (special, diagonal, block, pair)


@pytest.mark.parametrize("signed", [False, True])
def test_a_stack_of_maps_is_classified_map_by_map(signed):
    """Leading ``stack`` axes (a batch's layers and views, classified in one call): each map's
    shares and label are its own call's (float32 shares, to a few steps of float32 at 1: a sum
    of at most 8 keys' terms, grouped as the kernel likes for another batch size)."""
    generator = torch.Generator().manual_seed(1)
    tokens = [["[CLS]", "a", "b", "[SEP]", "c", "d", "e", "[SEP]"], ["[CLS]", "x", "y", "z", "[SEP]"]]
    positions = Positions.from_tokens(tokens, length=8)
    visible = patterns.templates.visible_keys(positions)
    pattern = torch.randn(2, 3, 2, 4, 8, 8, generator=generator).mul(3).masked_fill(
        ~visible[:, None], -torch.inf).softmax(-1).nan_to_num(0.0)  # [view, layer, example, head, q, k]
    pattern[0, 1, :, :2] = torch.eye(8)  # diagonal maps, and vertical ones: several labels
    pattern[1, 2, :, 1:] = torch.nn.functional.one_hot(torch.zeros(8, dtype=torch.long), 8).float()  # on [CLS]
    if signed:
        pattern = pattern - 0.05
    together = patterns.features(pattern, positions, signed=signed, entropy=True)
    labels = patterns.templates.template_labels(pattern, positions, signed=signed)
    assert labels.shape == (2, 3, 2, 4) and len(labels.unique()) >= 2
    for view in range(2):
        for layer in range(3):
            alone = patterns.features(pattern[view, layer], positions, signed=signed, entropy=True)
            for name, value in alone.items():
                torch.testing.assert_close(together[name][view, layer], value, rtol=0,
                                           atol=8 * torch.finfo(torch.float32).eps)
            assert torch.equal(labels[view, layer],
                               patterns.templates.template_labels(pattern[view, layer], positions, signed=signed))


def test_uniform_maps_score_zero_whatever_the_length():
    for n in (8, 30, 100):
        tokens = ["[CLS]", *["w"] * (n - 2), "[SEP]"]
        uniform = torch.full((1, 1, n, n), 1.0 / n)
        result = patterns.classify(uniform, tokens=tokens)
        for name in patterns.REGIONS:
            assert abs(float(result.features[name])) < 1e-6
        assert result.names[0, 0] == "heterogeneous"


def test_decoder_maps_use_visible_keys():
    """A causal map's chance is over the keys <= q: uniform causal rows score 0; attention on
    the first token (BOS) is vertical, on the previous token diagonal."""
    n = 20
    tokens = ["<s>", *[f"w{i}" for i in range(n - 1)]]
    causal = torch.tril(torch.ones(n, n))
    uniform = causal / causal.sum(-1, keepdim=True)
    first = torch.zeros(n, n)
    first[:, 0] = 1.0
    previous = torch.zeros(n, n)
    previous[0, 0] = 1.0
    previous[torch.arange(1, n), torch.arange(n - 1)] = 1.0
    result = patterns.classify(torch.stack([uniform, first, previous]), tokens=tokens, causal=True)
    assert list(result.names[0]) == ["heterogeneous", "vertical", "diagonal"]
    assert abs(float(result.features["special"][0, 0])) < 1e-6
    # a uniform causal map has the largest entropy: 1, its first row (one key: 0 / 0) left out
    assert float(result.features["entropy"][0, 0]) == pytest.approx(1.0, abs=1e-6)


def test_a_region_of_every_visible_key_scores_zero():
    """An empty text is [CLS] [SEP]: the special region holds every key (chance 1), so nothing
    is above chance there; a float16 softmax's rows (summing to 0.99976) scored -244 (their
    rounding divided by 1e-6)."""
    rows = torch.tensor([[0.5, 0.49976], [0.49976, 0.5]], dtype=torch.float16)
    result = patterns.classify(rows, tokens=["[CLS]", "[SEP]"])
    assert float(result.features["special"][0, 0]) == 0.0
    assert torch.isfinite(result.scores).all() and result.scores.abs().max() <= 1
    assert result.names[0, 0] == "heterogeneous"


def test_classification_table_and_repr():
    maps = patterns.synthetic("all", 2, 32, seed=5)
    result = patterns.classify(maps.maps[:, None], tokens=maps.tokens)
    table = result.table
    assert len(table) == 10 and list(table["type"]) == maps.labels
    assert {f"score_{t}" for t in patterns.TYPES} <= set(table.columns)
    assert "vertical 2" in repr(result)
    for _, row in table.iterrows():  # the type whose rule fired has evidence for it
        assert row[f"score_{row['type']}"] > 0
    assert result.scores.shape == (10, 1, len(patterns.TYPES))


def test_signed_maps_are_normalised_by_magnitude():
    """view='effective': rows are |a| / sum |a| (as stats.py's entropy): flipping signs and
    scaling rows changes nothing."""
    maps = patterns.synthetic("all", 3, 32, seed=9)
    signs = torch.where(torch.rand(maps.maps.shape, generator=torch.Generator().manual_seed(1)) < 0.5, -1.0, 1.0)
    signed = maps.maps * signs * 3.0
    a = patterns.classify(maps.maps[:, None], tokens=maps.tokens)
    b = patterns.classify(signed[:, None], tokens=maps.tokens, view="effective")
    assert torch.equal(a.labels, b.labels)
    for name in patterns.REGIONS:
        torch.testing.assert_close(a.features[name], b.features[name], atol=1e-5, rtol=0)


def test_bad_inputs_give_clear_errors():
    maps = patterns.synthetic("vertical", 2, 16, seed=0)
    with pytest.raises(ValueError, match=r"row \d+ of head 0 of example 1 sums to .* not 1"):
        broken = maps.maps.clone()
        broken[1, 3] *= 0.5
        patterns.classify(broken[:, None], tokens=maps.tokens)
    with pytest.raises(ValueError, match="view='effective'"):
        patterns.classify(maps.maps[:, None] - 0.05, tokens=maps.tokens)
    with pytest.raises(ValueError, match="exactly one of tokens="):
        patterns.classify(maps.maps[:, None])
    with pytest.raises(ValueError, match="give one token list per example"):
        patterns.classify(maps.maps[:, None], tokens=maps.tokens[:1])
    with pytest.raises(ValueError, match="as many keys as queries"):
        patterns.classify(torch.ones(2, 3, 4, 5), tokens=maps.tokens)
    with pytest.raises(ValueError, match="Unknown view"):
        patterns.classify(maps.maps[:, None], tokens=maps.tokens, view="papa-ish")
    with pytest.raises(ValueError, match="NaN"):
        patterns.classify(maps.maps[:, None] * torch.nan, tokens=maps.tokens, view="effective")
    with pytest.raises(ValueError, match="list of token strings"):
        patterns.classify(maps.maps[:, None], tokens="[CLS] a [SEP]")


# ------------------------------------------------------------------------------------------------
# the pass over a corpus


def classify_by_hand(model, texts, view="standard"):
    """Counts of each type per (layer, head) from run_with_cache patterns, one example at a
    time (no padding), classified with tokens= — an independent path to the same counts."""
    from attnlens.methods.effective import effective_attention

    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    counts = torch.zeros(n_layers, n_heads, len(patterns.TYPES), dtype=torch.int64)
    for text in texts:
        batch = tokenize(model, [text], max_len=64, layout="padded")  # the ordinary input, types' default
        cache = {}

        def keeper(name, cache=cache):
            def keep(tensor, hook):
                cache[name] = tensor.detach().clone()

            return keep

        names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(n_layers)]
        names += [value_hook(model, layer) for layer in range(n_layers)]
        attnlens.run_with_hooks(model, batch, [(name, keeper(name)) for name in names])
        tokens = model.tokenizer.convert_ids_to_tokens(batch.input_ids[0].tolist())
        for layer in range(n_layers):
            pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
            if view == "effective":
                values = values_per_kv_head(model, cache[value_hook(model, layer)])
                pattern = effective_attention(pattern, values, key_mask=batch.attention_mask.bool())
            labels = patterns.classify(pattern, tokens=tokens, view=view).labels[0]
            counts[layer, torch.arange(n_heads), labels] += 1
    return counts


@pytest.mark.parametrize("view, texts", [("standard", TEXTS), ("effective", TEXTS), ("standard", PAIRS)])
def test_types_equals_classifying_each_example(bert, view, texts):
    table = patterns.types(bert, texts, view=view, batch_size=2, progress=False)
    expected = classify_by_hand(bert, texts, view) / len(texts)
    got = torch.tensor(table[list(patterns.TYPES)].to_numpy()).reshape(expected.shape)
    torch.testing.assert_close(got, expected.double(), atol=1e-12, rtol=0)
    assert list(table.columns) == list(COLUMNS)
    np.testing.assert_allclose(table[list(patterns.TYPES)].sum(1), 1.0)
    assert table.attrs["view"] == view and table.attrs["n_examples"] == len(texts)
    assert (table["maps"] == len(texts)).all()


def test_types_merge_of_halves_equals_one_pass(bert):
    n_layers, n_heads = bert.cfg.n_layers, bert.cfg.n_heads
    parts = []
    for texts in (TEXTS[:2], TEXTS[2:]):
        counter = patterns.PatternTypes(n_layers, n_heads)
        passes.run(bert, texts, [counter], max_len=64, batch_size=2, progress=False)
        parts.append(counter)
    whole = patterns.PatternTypes(n_layers, n_heads)
    passes.run(bert, TEXTS, [whole], max_len=64, batch_size=3, progress=False)
    merged = parts[0].merge(parts[1])
    assert torch.equal(merged.counts, whole.counts) and int(merged.maps) == len(TEXTS)


def test_types_with_papa_constants_and_figure(bert):
    constants = papa.fit(bert, TEXTS, max_len=32, progress=False)
    constant = patterns.types(bert, TEXTS, view=constants, progress=False)
    assert constant.attrs["view"] == "papa" and constant.attrs["max_len"] == 32
    # a constant map does not depend on the input, but it is restricted to each example's tokens:
    # the shares are still a distribution over types
    np.testing.assert_allclose(constant[list(patterns.TYPES)].sum(1), 1.0)
    standard = patterns.types(bert, TEXTS, progress=False)
    fig = patterns.figure(standard, constant)
    assert len(fig.data) == 2 * len(patterns.TYPES)
    assert [a.text for a in fig.layout.annotations] == ["standard", "papa"]
    with pytest.raises(ValueError, match="max_len=32"):
        patterns.types(bert, TEXTS, view=constants, max_len=64, progress=False)


def test_the_inputs_are_the_ordinary_ones_unless_papa_constants_are_among_the_views(bert):
    """Without PAPA constants the maps are read on the model's ordinary input (the padded layout,
    as Kovaleva et al. and Clark et al. ran BERT, and as compare takes it), for every analysis of
    heads; with constants among the views every view reads the constants' inputs, as in
    compare."""
    import pandas as pd

    standard = patterns.types(bert, TEXTS, progress=False)
    assert standard.attrs["layout"] == "padded"
    pd.testing.assert_frame_equal(standard, patterns.types(bert, TEXTS, layout="padded", progress=False))
    assert clustering.cluster(bert, TEXTS, max_len=64, progress=False).table.attrs["layout"] == "padded"
    constants = papa.fit(bert, TEXTS, max_len=32, progress=False)
    both = patterns.types(bert, TEXTS, view=["standard", constants], progress=False)
    assert (both.attrs["layout"], both.attrs["max_len"]) == ("papa", 32)
    in_papa = patterns.types(bert, TEXTS, layout="papa", max_len=32, progress=False)
    pd.testing.assert_frame_equal(both[both["view"] == "standard"].reset_index(drop=True), in_papa)


def test_types_bad_inputs(bert):
    with pytest.raises(ValueError, match="Unknown view"):
        patterns.types(bert, TEXTS, view="papa", progress=False)
    with pytest.raises(ValueError, match="not a table of patterns.types"):
        patterns.figure(bert_table := patterns.types(bert, TEXTS[:1], progress=False).drop(columns="block"))
    del bert_table
    with pytest.raises(ValueError, match="at least one table"):
        patterns.figure()


def test_several_views_share_one_pass(bert, monkeypatch):
    """view=[standard, effective]: one pass over the corpus, and the rows of each view equal a
    call with that view alone."""
    import pandas as pd

    calls = []
    run = passes.run
    monkeypatch.setattr(passes, "run", lambda *a, **k: calls.append(1) or run(*a, **k))
    both = patterns.types(bert, TEXTS, view=["standard", "effective"], progress=False)
    assert len(calls) == 1 and both.attrs["view"] == ("standard", "effective")
    monkeypatch.undo()
    for view in ("standard", "effective"):
        alone = patterns.types(bert, TEXTS, view=view, progress=False)
        pd.testing.assert_frame_equal(both[both["view"] == view].reset_index(drop=True), alone)
    fig = patterns.figure(both)
    assert [a.text for a in fig.layout.annotations] == ["standard", "effective"]
    with pytest.raises(ValueError, match="empty list"):
        patterns.types(bert, TEXTS, view=[], progress=False)
