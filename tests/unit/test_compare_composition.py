"""compare's table is the methods' own accumulators, run on the same corpus: the head statistics
(attnlens.methods.stats.Statistics) and the pattern-type shares
(attnlens.methods.patterns.counts.PatternTypes) of each view and its distance from standard
(attnlens.methods.stats.Distance), each view's maps made as its View
says (PAPA: the patterns under papa.hooks(constants)). Equal to 1e-6."""

from __future__ import annotations

import numpy as np
import pytest

import attnlens
from attnlens.engine import passes
from attnlens.methods import papa, views
from attnlens.methods.patterns.counts import PatternTypes
from attnlens.methods.stats import STATISTICS, Distance, Statistics
from attnlens.present.columns import TYPE_COLUMNS
from tests import tiny

MAX_LEN = 24


@pytest.fixture(scope="module")
def bert():
    return tiny.bert_bridge()


@pytest.fixture(scope="module")
def constants(bert):
    return papa.fit(bert, tiny.CORPUS, max_len=MAX_LEN, layout="papa", progress=False)


def separately(model, texts, view, constants):
    """The statistics and type shares of ``view``, from the methods' accumulators in a pass of
    their own."""
    value = views.get_view(view)
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    hooks = papa.hooks(constants) if value.takes_constants else ()
    statistics = Statistics(n_layers, n_heads, "standard" if value.takes_constants else view)
    types = PatternTypes(n_layers, n_heads, view=view)
    summary = passes.run(model, texts, [statistics, types], max_len=constants.max_len,
                         layout=constants.layout, batch_size=4, hooks=hooks, progress=False)
    # the distance from standard reads both maps in one pass: PAPA's from the constants
    distance = Distance(n_layers, n_heads, view, constants=constants)
    passes.run(model, texts, [distance], max_len=constants.max_len, layout=constants.layout,
               batch_size=4, progress=False)
    return statistics.result(), types.shares(), distance.result() / summary.n_tokens


def test_compare_table_is_the_methods_accumulators(bert, constants, monkeypatch):
    texts = tiny.CORPUS[:8]
    calls = []
    real_run = passes.run

    def counted(*args, **kwargs):
        calls.append([type(a).__name__ for a in args[2]])
        return real_run(*args, **kwargs)

    monkeypatch.setattr(passes, "run", counted)
    comparison = attnlens.compare(bert, "papa", "effective", corpus=texts, constants=constants,
                                  batch_size=4, progress=False, report_examples=0)
    monkeypatch.undo()
    assert len(calls) == 1, f"compare (constants given) is one engine pass, not {calls}"
    table = comparison.table
    assert set(table["view"]) == {"standard", "papa", "effective"}
    for view in ("standard", "papa", "effective"):
        statistics, shares, distance = separately(bert, texts, view, constants)
        rows = table[table["view"] == view].sort_values(["layer", "head"])
        layer, head = rows["layer"].to_numpy(), rows["head"].to_numpy()
        for name in STATISTICS:
            np.testing.assert_allclose(rows[name].to_numpy(), statistics[name].double().numpy()[layer, head],
                                       rtol=0, atol=1e-6, err_msg=f"{view} {name}")
        np.testing.assert_allclose(rows["distance_from_standard"].to_numpy(),
                                   distance.numpy()[layer, head], rtol=0, atol=1e-6, err_msg=view)
        for index, column in enumerate(TYPE_COLUMNS):
            np.testing.assert_allclose(rows[column].to_numpy(), shares.numpy()[layer, head, index],
                                       rtol=0, atol=1e-6, err_msg=f"{view} {column}")
