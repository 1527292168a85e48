"""A view defined outside attnlens, in one file of the tests (:mod:`tests.outside_view`: the
transposed pattern, rows normalised), registered there, works in ``attnlens.compare``, pattern
types and head clustering with no edit to attnlens: each reads the registry when it is called.

References, computed here without attnlens' passes: the tiny BERT's patterns from
``run_with_cache``, transposed by :func:`tests.outside_view.transposed`, then

- compare's ``to_self`` and ``distance_from_standard`` from their definitions (float64 loops
  over valid query rows), to 1e-5 (float32 maps);
- the pattern-type shares from :func:`attnlens.methods.patterns.classify` of those maps, exactly
  (the same labels of the same maps: counts);
- the head distances from SciPy's ``jensenshannon`` per token and pair, to 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon

import attnlens
from attnlens.core.inputs import tokenize
from attnlens.methods import clustering, patterns, views
from attnlens.methods.patterns.templates import TYPES, classify
from tests import outside_view, tiny

MAX_LEN = 20
TEXTS = tiny.CORPUS[:4]


@pytest.fixture(scope="module")
def bert():
    return tiny.bert_bridge()


@pytest.fixture
def view():
    with outside_view.registered() as registered:
        yield registered
    assert outside_view.NAME not in views.REGISTRY


@pytest.fixture(scope="module")
def reference(bert):
    """``(batch, standard, transposed)``: the inputs and every layer's maps ``[layer, batch,
    head, query, key]``, from one ``run_with_cache`` of the whole corpus (padded layout)."""
    batch = tokenize(bert, TEXTS, max_len=MAX_LEN, layout="padded")
    with torch.inference_mode():
        _, cache = bert.run_with_cache(batch.input_ids, **batch.model_kwargs(),
                                       names_filter=lambda name: name.endswith("hook_pattern"))
    standard = torch.stack([cache[f"blocks.{layer}.attn.hook_pattern"] for layer in range(bert.cfg.n_layers)])
    mask = batch.attention_mask.bool()
    flipped = torch.stack([outside_view.transposed(layer, mask, causal=False) for layer in standard])
    return batch, standard.double(), flipped.double()


def test_the_view_is_registered_only_inside_the_block(view):
    assert views.get_view(outside_view.NAME) is view
    assert outside_view.NAME in views.names() and outside_view.NAME in views.names(constants=False)


def test_compare_reads_it(bert, view, reference):
    batch, standard, flipped = reference
    comparison = attnlens.compare(bert, outside_view.NAME, corpus=TEXTS, max_len=MAX_LEN, batch_size=2,
                                  progress=False, report_examples=2)
    assert comparison.views == ("standard", outside_view.NAME)
    rows = comparison.table[comparison.table["view"] == outside_view.NAME].sort_values(["layer", "head"])
    n_layers, n_heads = bert.cfg.n_layers, bert.cfg.n_heads
    assert len(rows) == n_layers * n_heads
    mask = batch.attention_mask.bool()
    n_tokens = int(mask.sum())
    to_self = np.zeros((n_layers, n_heads))
    distance = np.zeros((n_layers, n_heads))
    for example in range(len(TEXTS)):
        valid = mask[example].nonzero().squeeze(-1).tolist()
        for layer in range(n_layers):
            for head in range(n_heads):
                for query in valid:
                    mine = flipped[layer, example, head, query, valid]
                    theirs = standard[layer, example, head, query, valid]
                    to_self[layer, head] += float(flipped[layer, example, head, query, query])
                    distance[layer, head] += 0.5 * float((mine - theirs).abs().sum())
    np.testing.assert_allclose(rows["to_self"].to_numpy(), (to_self / n_tokens).ravel(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(rows["distance_from_standard"].to_numpy(), (distance / n_tokens).ravel(),
                               rtol=0, atol=1e-5)
    # the figures, the report's explorer and the JSON carry the view too
    assert outside_view.NAME in comparison.example_patterns and outside_view.NAME in comparison.kept_patterns.views
    assert outside_view.NAME in comparison.to_html()
    again = attnlens.Comparison.from_json(comparison.to_json())
    assert again.views == comparison.views


def test_pattern_types_read_it(bert, view, reference):
    batch, _, flipped = reference
    table = patterns.types(bert, TEXTS, view=outside_view.NAME, max_len=MAX_LEN, layout="padded",
                           batch_size=2, progress=False)
    assert set(table["view"]) == {outside_view.NAME}
    n_layers, n_heads = bert.cfg.n_layers, bert.cfg.n_heads
    counts = np.zeros((n_layers, n_heads, len(TYPES)))
    for layer in range(n_layers):
        labels = classify(flipped[layer].float(), batch=batch, tokenizer=bert.tokenizer, view=outside_view.NAME).labels
        for example in range(len(TEXTS)):
            for head in range(n_heads):
                counts[layer, head, int(labels[example, head])] += 1
    shares = counts / len(TEXTS)
    table = table.sort_values(["layer", "head"])
    np.testing.assert_array_equal(table[list(TYPES)].to_numpy(), shares.reshape(-1, len(TYPES)))


def test_clustering_reads_it(bert, view, reference):
    batch, _, flipped = reference
    result = clustering.cluster(bert, TEXTS, view=outside_view.NAME, max_len=MAX_LEN, layout="padded",
                                batch_size=2, progress=False)
    n_layers, n_heads = bert.cfg.n_layers, bert.cfg.n_heads
    n = n_layers * n_heads
    mask = batch.attention_mask.bool()
    total, tokens = np.zeros((n, n)), 0
    for example in range(len(TEXTS)):
        valid = mask[example].nonzero().squeeze(-1).tolist()
        rows = flipped[:, example][:, :, valid][:, :, :, valid].reshape(n, len(valid), len(valid)).numpy()
        for token in range(len(valid)):
            for i in range(n):
                for j in range(i + 1, n):
                    total[i, j] += jensenshannon(rows[i, token], rows[j, token])
            tokens += 1
    expected = (total + total.T) / tokens
    np.testing.assert_allclose(result.distances, expected, rtol=0, atol=1e-5)
