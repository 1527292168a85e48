"""What Jupyter shows: compact ``_repr_html_`` / ``__repr__`` and quiet progress bars.

References: plain sizes (a display is small: under 20 kB, no ``<script``, so no plotly.js), the
values the summaries state (read back from the objects themselves), and Python's ``warnings``
record for the progress bars (tqdm's own ``tqdm.autonotebook`` import is shown to warn in the
same faked kernel, so the checks can fail).
"""

from __future__ import annotations

import dataclasses
import sys
import types
import warnings
from collections.abc import Mapping

import pandas as pd
import plotly.graph_objects as go
import pytest

import attnlens
from attnlens import ablation, papa
from attnlens.core import notebook
from attnlens.core.heads import HeadSet
from attnlens.engine.batches import progress_bar, tqdm_class
from attnlens.present import display
from tests import tiny

#: the most a compact display may weigh
SMALL = 20_000


def assert_compact(text: str) -> None:
    assert len(text.encode("utf-8")) < SMALL, len(text)
    assert "<script" not in text.lower()
    assert "plotly" not in text.lower() or "plotly.js" not in text.lower()


@pytest.fixture(scope="module")
def bert():
    return tiny.bert_bridge()


@pytest.fixture(scope="module")
def comparison(bert):
    return attnlens.compare(bert, "papa", "effective", corpus=tiny.CORPUS, max_len=16,
                            progress=False)


def test_comparison_html_is_a_small_summary(comparison):
    c = comparison
    text = c._repr_html_()
    assert_compact(text)
    for fact in (
        c.model_name, "standard, papa, effective", f"{c.n_layers} layers × {c.n_heads} heads",
        f"{c.n_examples} texts, {c.n_tokens} tokens", f"layer {c.focus[0]}, head {c.focus[1]}",
        f"text {c.example_index}:",
    ):
        assert fact in text, fact
    for name in c.figures:  # every figure is named, none is drawn
        assert f"<code>{name}</code>" in text
    assert 'c.figures["name"]' in text
    # the per-view means are the table's (reference: pandas on the table itself)
    mean = c.table[c.table["view"] == "papa"]["distance_from_standard"].mean()
    assert f"{mean:.4f}" in text
    top = c.table[c.table["view"] == "papa"].nlargest(1, "distance_from_standard").iloc[0]
    assert f"L{top['layer']}H{top['head']} ({top['distance_from_standard']:.3f})" in text
    assert repr(c).startswith("Comparison(") and len(repr(c)) < 300


def test_comparison_html_escapes_tokens_and_shows_scores(comparison):
    tokens = list(comparison.example_tokens)
    tokens[1] = "<script>alert(1)</script>"
    scores = pd.DataFrame([dict(view="standard", task="sst2", metric="accuracy", score=0.75,
                                majority=0.5, relative=1.0)])
    changed = dataclasses.replace(comparison, example_tokens=tokens, scores=scores)
    text = changed._repr_html_()
    assert_compact(text)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "sst2" in text and "0.7500" in text


def test_figures_is_a_small_mapping_by_name(comparison):
    figures = comparison.figures
    assert isinstance(figures, Mapping) and not isinstance(figures, dict)
    names = list(figures)
    assert names[:2] == ["distance_from_standard", "side_by_side"] and len(figures) == len(names)
    assert isinstance(figures["side_by_side"], go.Figure)
    assert dict(figures.items()).keys() == set(names) and "entropy" in figures
    assert figures.get("nothing") is None
    with pytest.raises(KeyError, match=r"no figure 'nothing'; the figures are 'distance_from_standard'"):
        figures["nothing"]
    text, html = repr(figures), figures._repr_html_()
    assert_compact(html)
    assert len(text) < 3000 and '"data"' not in text and '"z"' not in html
    titles = figures.titles()
    for name in names:
        assert name in text and f"<code>{name}</code>" in html
    assert titles["side_by_side"].startswith(f"Layer {comparison.focus[0]}, head {comparison.focus[1]}")
    assert "<b>" not in "".join(titles.values())


def test_constants_headset_and_curve_displays(bert):
    constants = papa.fit(bert, tiny.CORPUS, max_len=16, progress=False)
    trainable = papa.TrainableConstants.from_average(constants)
    heads = HeadSet.from_heads([(1, 2), (0, 3)], 2, 4)
    curve = papa.Curve(table=pd.DataFrame([
        dict(task="sst2", strategy="input_dependence", fraction_replaced=f, fraction_kept=1 - f,
             heads=round(8 * f), score=0.8 - f / 10, metric="accuracy", relative=1 - f / 8,
             majority=0.5)
        for f in (0.0, 0.5, 1.0)
    ]), seconds=3.0)
    for obj, facts in [
        (constants, ["PAPA constants", "2 layers × 4 heads × 16 × 16", f"{constants.n_examples} examples",
                     constants.model_id, "single sentences", "encoder"]),
        (trainable, ["trainable PAPA constants", "average", "2 layers × 4 heads × 16 × 16"]),
        (heads, ["2 of 8 heads", "L1H2, L0H3"]),
        (curve, ["sst2", "3", "0.7500"]),
    ]:
        text = obj._repr_html_()
        assert_compact(text)
        for fact in facts:
            assert fact in text, (type(obj).__name__, fact)
        assert len(repr(obj)) < 300
    grid = heads._repr_html_().split("<pre", 1)[1]  # the marks: layer 0 has head 3, layer 1 head 2
    assert "L0  ···■" in grid and "L1  ··■·" in grid


def test_hooks_say_what_they_do_in_one_short_line(bert):
    """An intervention's hooks print their mode, how many heads of how many, and how many hooks
    (their key, a checksum of the constants, is :meth:`key`, not the repr)."""
    constants = papa.uniform(bert, max_len=16)
    assert repr(papa.hooks(constants, heads=[(1, 2), (0, 3)])) == "PapaHooks('replace', 2 of 8 heads, 2 hooks)"
    assert repr(papa.hooks(constants, fast=True)) == "PapaHooks('replace', 8 of 8 heads, 2 hooks, fast)"
    assert repr(ablation.hooks([(1, 2)], "zero", model=bert)) == "AblationHooks('zero', 1 of 8 heads, 1 hooks)"


def test_a_big_headset_stays_small():
    heads = HeadSet.all(48, 64)  # a large model: 3072 heads
    assert_compact(heads._repr_html_())


# -- progress bars and the renderer in a (faked) Jupyter kernel ---------------------------------


@pytest.fixture()
def kernel(monkeypatch):
    """This process looks like a Jupyter kernel to ``tqdm.autonotebook`` and attnlens: an
    ``ipykernel.zmqshell`` module and ``IPython.get_ipython()`` returning a
    ``ZMQInteractiveShell``."""
    import plotly.io  # noqa: F401  (plotly picks its renderer on import: in the real setting)

    shell = type("ZMQInteractiveShell", (), {})()
    ipython = types.ModuleType("IPython")
    ipython.get_ipython = lambda: shell
    monkeypatch.setitem(sys.modules, "ipykernel.zmqshell", types.ModuleType("ipykernel.zmqshell"))
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    for name in ("QT_API", "SPYDER_ARGS"):
        monkeypatch.delenv(name, raising=False)
    assert notebook.in_notebook()


@pytest.fixture()
def no_ipywidgets(monkeypatch):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import ipywidgets -> ImportError


@pytest.fixture()
def fresh_tqdm_auto(monkeypatch):
    """``tqdm.auto`` / ``tqdm.autonotebook`` not imported yet (their choice is made on import);
    the modules found before are put back afterwards."""
    for name in ("tqdm.auto", "tqdm.autonotebook"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import tqdm

    for name in ("auto", "autonotebook"):
        monkeypatch.delattr(tqdm, name, raising=False)


def test_progress_bars_in_a_notebook_without_ipywidgets_are_text_and_quiet(
    kernel, no_ipywidgets, fresh_tqdm_auto
):
    from tqdm.std import TqdmWarning
    from tqdm.std import tqdm as text_bar

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert tqdm_class() is text_bar
        bar = progress_bar(range(3), "test", True)
        bar.update(3)
        bar.close()
        notebook.quiet_tqdm_auto()  # what `import attnlens` does in a kernel
        import tqdm.auto  # what transformers does afterwards
    assert [str(w.message) for w in caught] == []
    chosen = sys.modules["tqdm.autonotebook"].tqdm  # what tqdm.auto settled on: the text bar
    assert chosen is text_bar
    # the reference: without quiet_tqdm_auto, tqdm.auto warns in this very setting
    sys.modules.pop("tqdm.auto"), sys.modules.pop("tqdm.autonotebook")
    with pytest.warns(TqdmWarning, match="IProgress not found"):
        import tqdm.autonotebook  # noqa: F401


def test_progress_bars_in_a_notebook_with_ipywidgets_are_widgets(kernel, monkeypatch):
    """With ipywidgets importable (the real one if installed, else a stand-in module with the
    three widgets tqdm.notebook imports), the bar in a kernel is tqdm's widget bar, silently."""
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        fake = types.ModuleType("ipywidgets")
        fake.FloatProgress, fake.HBox, fake.HTML = type("FloatProgress", (), {}), object, object
        monkeypatch.setitem(sys.modules, "ipywidgets", fake)
        monkeypatch.delitem(sys.modules, "tqdm.notebook", raising=False)  # re-import: IProgress found
    from tqdm.notebook import tqdm

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert tqdm_class() is tqdm
    assert caught == []


def test_progress_bars_outside_a_notebook_are_text():
    from tqdm.std import tqdm

    assert not notebook.in_notebook() and tqdm_class() is tqdm
    assert progress_bar([1, 2], "x", False).disable


def test_figures_carry_html_in_a_kernel_unless_the_user_chose(kernel, comparison, monkeypatch):
    """plotly's automatic renderer in a kernel is JSON only (lost by nbconvert): fetching a
    figure adds the notebook renderer (plotly.js once); a renderer the user set is kept."""
    import plotly.io as pio

    monkeypatch.delenv("PLOTLY_RENDERER", raising=False)
    before = pio.renderers.default
    try:
        for chosen, expected in [("plotly_mimetype", "plotly_mimetype+notebook"),
                                 ("notebook_connected", "notebook_connected")]:
            pio.renderers.default = chosen
            monkeypatch.setattr(display, "_RENDERER_CHECKED", False)
            comparison.figures["entropy"]
            assert pio.renderers.default == expected
    finally:
        pio.renderers.default = before
