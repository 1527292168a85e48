"""The results' protocol (:mod:`attnlens.core.result`), run over every result attnlens has.

Every subclass of :class:`attnlens.core.result.Result` is found by a walk over the package's
modules and must have a case in :data:`CASES`: a small result built by hand from made-up
tensors and frames (no model, no data). A new result without one fails
:func:`test_every_result_has_a_case`. For each:

1. ``COLUMNS`` names and explains every column, and ``.table`` is a DataFrame with exactly
   those columns, in that order, and at least one row;
2. ``.figure()`` is a plotly figure with at least one trace;
3. ``to_json`` / ``from_json`` round-trip to an equal ``.table`` (through a file too), the JSON
   carries the class's ``"format"``, and ``from_json`` refuses JSON of another result, damaged
   JSON and JSON without the fields with :class:`~attnlens.errors.FileFormatError`.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import re

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import torch

import attnlens
from attnlens.core.result import Result, frame
from attnlens.errors import FileFormatError


def _results() -> set[type]:
    found = set()
    for info in pkgutil.walk_packages(attnlens.__path__, "attnlens."):
        if info.name.endswith("__main__") or info.name == "attnlens.engine.passes":
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (inspect.isclass(value) and value.__module__.startswith("attnlens")
                    and issubclass(value, Result) and value is not Result):
                found.add(value)
    return found


# -- one small result per class, by hand -------------------------------------------------------------


def _curve():
    from attnlens.evaluation.curve import COLUMNS, Curve

    rows = [dict(task="sst2", strategy="input_dependence", fraction_replaced=f, fraction_kept=1 - f,
                 heads=round(8 * f), score=0.8 - f / 10, low=0.75 - f / 10, high=0.85 - f / 10, seed_std=0.01,
                 metric="accuracy", relative=1 - f / 8, difference=-f / 10, difference_low=-f / 5,
                 difference_high=0.0, p_value=0.5 - f / 4, significant=bool(f), baseline=0.7,
                 baseline_low=0.65, baseline_high=0.75, majority=0.5, majority_low=0.45,
                 majority_high=0.55) for f in (0.0, 1.0)]
    rows.append(dict(task="sst2", strategy="identity", fraction_replaced=1.0, fraction_kept=0.0, heads=8,
                     score=0.6, metric="accuracy", majority=0.5))  # a point without intervals: NaN
    rows.append(dict(task="lm", strategy="input_dependence", fraction_replaced=0.0, fraction_kept=1.0,
                     heads=0, score=-2.5, metric="MLM probe"))
    return Curve(frame(rows, COLUMNS), seconds=3.0, forward_seconds=1.0,
                 settings={"strategy": "input_dependence", "fractions": (0.0, 1.0), "probe": None},
                 timings=[{"task": "sst2", "features": 0.5}], probe_seconds=1.5)


def _papa_table():
    from attnlens.evaluation.table import PapaTable

    return PapaTable.from_curve(_curve())


def _probe_result():
    from attnlens.evaluation.probing import Interval, Paired, ProbeResult

    return ProbeResult(task="sst2", split="validation", metric="accuracy", score=0.8, majority=0.5,
                       predictions=["positive", "negative"], n_train=20, n_eval=2,
                       settings={"seeds": [0, 1], "C": 1.0}, seconds={"features": 0.1, "probe": 0.2},
                       interval=Interval(0.8, 0.7, 0.9), scores=[0.79, 0.81], seed_std=0.01, baseline=0.75,
                       baseline_interval=Interval(0.75, 0.6, 0.85), majority_interval=Interval(0.5, 0.4, 0.6),
                       versus_baseline=Paired(0.05, -0.01, 0.1, 0.2))


def _lm_score():
    from attnlens.evaluation.lm.result import LMScore
    from attnlens.evaluation.probing import Interval

    return LMScore(value=-2.5, kind="probe", n_tokens=12, n_examples=3, perplexity=float(np.exp(2.5)),
                   model_id="tiny", settings={"mask_rate": 0.15, "n_truncated": 1},
                   interval=Interval(-2.5, -2.7, -2.3), counts=np.array([[-10.0, 4.0], [-8.0, 3.0], [-12.0, 5.0]]))


def _importance():
    from attnlens.methods.ablation import Importance, normalize_by_layer

    raw = torch.tensor([[0.3, 0.1, 0.2], [0.05, 0.4, 0.0]])
    return Importance(scores=normalize_by_layer(raw), raw=raw, n_examples=16, per="example",
                      settings={"loss": "given"})


def _head_clustering():
    from attnlens.methods.clustering import HeadClustering, stress1

    generator = np.random.default_rng(0)
    coords = generator.normal(size=(4, 2))
    distances = np.sqrt(((coords[:, None] - coords[None]) ** 2).sum(-1)) * 1.1
    table = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "x": coords[:, 0], "y": coords[:, 1],
                          "type": ["vertical", "unknown", "diagonal", "unknown"]})
    table.attrs.update(view="standard", layout="padded", max_len=16)
    return HeadClustering(distances=distances, coords=coords, table=table, view="standard",
                          stress=stress1(coords, distances), n_layers=2, n_heads=2, n_examples=5, n_tokens=40,
                          n_truncated=1)


def _effective_statistics():
    from attnlens.methods.effective.model import EffectiveStatistics
    from attnlens.methods.stats import STATISTICS

    generator = torch.Generator().manual_seed(0)
    means = {name: torch.rand(2, 3, generator=generator) for name in STATISTICS}
    signed = {name: value - 0.3 for name, value in means.items()}
    return EffectiveStatistics(standard=means, effective=signed, n_examples=4, n_tokens=30, n_truncated=0)


def _attention_statistics():
    from attnlens.methods.stats import AttentionStatistics

    statistics = AttentionStatistics(2, 3)
    pattern = torch.softmax(torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(1)), -1)
    valid = torch.tensor([[True] * 4, [True, True, True, False]])
    classes = {"cls": torch.tensor([[True, False, False, False]] * 2),
               "sep": torch.tensor([[False, False, False, True], [False, False, True, False]]),
               "punct": torch.zeros(2, 4, dtype=torch.bool)}
    for layer in range(2):
        statistics.update(layer, pattern, classes, valid)
    return statistics


def _classification():
    from attnlens.methods.patterns.templates import classify

    n = 5
    diagonal = torch.eye(n)
    vertical = torch.zeros(n, n)
    vertical[:, 0] = 1.0
    uniform = torch.full((n, n), 1.0 / n)
    maps = torch.stack([torch.stack([diagonal, vertical, uniform]), torch.stack([vertical, uniform, diagonal])])
    return classify(maps, tokens=[["[CLS]", "a", "b", "c", "[SEP]"]] * 2)


def _comparison():
    from attnlens.comparison.result import Comparison
    from attnlens.present.columns import COLUMNS

    rows = []
    for view in ("standard", "papa"):
        for layer in range(2):
            for head in range(2):
                row = {name: 0.1 * (1 + layer + head) for name in COLUMNS[3:]}
                row.update(view=view, layer=layer, head=head, pattern_type="vertical",
                           distance_from_standard=0.0 if view == "standard" else 0.2)
                rows.append(row)
    patterns = np.full((2, 2, 3, 3), 1 / 3, dtype=np.float32)
    return Comparison(
        table=frame(rows, COLUMNS), views=("standard", "papa"), model_name="tiny", n_layers=2, n_heads=2,
        n_examples=3, n_tokens=9, max_len=8, layout="papa", causal=False, example_index=0,
        example_tokens=["[CLS]", "a", "[SEP]"], example_patterns={"standard": patterns, "papa": patterns},
        focus=(1, 0), n_truncated=0,
    )


CASES = {
    "Curve": _curve, "PapaTable": _papa_table, "ProbeResult": _probe_result, "LMScore": _lm_score,
    "Importance": _importance, "HeadClustering": _head_clustering,
    "EffectiveStatistics": _effective_statistics, "AttentionStatistics": _attention_statistics,
    "Classification": _classification, "Comparison": _comparison,
}


def test_every_result_has_a_case():
    results = {cls.__name__: cls for cls in _results()}
    assert set(results) == set(CASES), f"results without a case: {set(results) - set(CASES)}"
    formats = [cls.FORMAT for cls in results.values()]
    # a version past 1 where a result's content changed meaning (Comparison/2: a decoder's
    # effective maps became causal)
    assert all(re.fullmatch(rf"attnlens\.{name}/[1-9][0-9]*", f) for name, f in zip(results, formats, strict=True)), formats


@pytest.mark.parametrize("name", sorted(CASES))
def test_table_has_exactly_its_documented_columns(name):
    result = CASES[name]()
    assert isinstance(result, Result)
    columns = type(result).COLUMNS
    assert columns and all(isinstance(meaning, str) and meaning for meaning in columns.values())
    table = result.table
    assert isinstance(table, pd.DataFrame) and len(table) >= 1
    assert list(table.columns) == list(columns)


@pytest.mark.parametrize("name", sorted(CASES))
def test_figure_is_a_plotly_figure(name):
    figure = CASES[name]().figure()
    assert isinstance(figure, go.Figure) and len(figure.data) >= 1


@pytest.mark.parametrize("name", sorted(CASES))
def test_json_round_trips_the_table(name, tmp_path):
    result = CASES[name]()
    cls = type(result)
    text = result.to_json()
    assert json.loads(text)["format"] == cls.FORMAT
    again = cls.from_json(text)
    assert type(again) is cls
    pd.testing.assert_frame_equal(again.table, result.table)
    path = tmp_path / "deeper" / f"{name}.json"
    assert result.to_json(path, indent=1) == path.read_text(encoding="utf-8")
    pd.testing.assert_frame_equal(cls.from_json(path).table, result.table)
    assert again.to_json() == text  # and once more: nothing drifts


@pytest.mark.parametrize("name", sorted(CASES))
def test_from_json_refuses_what_it_did_not_write(name, tmp_path):
    cls = type(CASES[name]())
    other = next(case for key, case in CASES.items() if key != name)().to_json()
    with pytest.raises(FileFormatError, match=rf"is not a {cls.__name__} written by .*its format is "):
        cls.from_json(other)
    text = CASES[name]().to_json()
    path = tmp_path / "damaged.json"
    path.write_text(text[: len(text) // 2], encoding="utf-8")
    with pytest.raises(FileFormatError, match=rf"file {path} is not a {cls.__name__}.*not valid JSON"):
        cls.from_json(path)
    with pytest.raises(FileFormatError, match="lacks or mangles the field"):
        cls.from_json(json.dumps({"format": cls.FORMAT}))
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(FileFormatError, match="not valid JSON"):
        cls.from_json(path)


def test_a_comparison_keeps_its_messages():
    """Comparison's own JSON (older than the protocol) reads and refuses as it did."""
    from attnlens.comparison.result import Comparison

    with pytest.raises(FileFormatError, match="lacks or mangles the field 'views'.*attnlens compare --json"):
        Comparison.from_json(json.dumps({"table": []}))
