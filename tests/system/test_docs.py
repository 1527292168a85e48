"""The Python examples of the docs pages run as written, on the embedded default model.

Pages whose examples use placeholder names (``plots.md``) are not run.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
import torch

from attnlens.evaluation.curve import Curve
from attnlens.evaluation.curve_inputs import missing_tasks
from attnlens.evaluation.table import ROWS, PapaTable
from tests.conftest import DATA, required

DOCS = Path(__file__).resolve().parents[2] / "docs"


def run_examples(page: str, skip: tuple[str, ...] = ()) -> dict:
    """Execute every ```python block of ``docs/page`` in order, in one namespace (but blocks
    containing any string of ``skip``)."""
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), re.S)
    assert blocks, f"no python example in docs/{page}"
    blocks = [block for block in blocks if not any(text in block for text in skip)]
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, f"docs/{page}", "exec"), namespace)
    return namespace


def run_without_short_text_warning(page: str, monkeypatch) -> dict:
    """:func:`run_examples`, failing on effective attention's short-text warning (texts of at
    most d_head tokens, where A⊥ = A): a page shows effective attention where it differs."""
    import warnings

    from attnlens.engine import effective as engine

    monkeypatch.setattr(engine, "_WARNED", set())  # warned once per process: maybe already here
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="No text has more than d_head")
        return run_examples(page)


def test_effective_page(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    names = run_without_short_text_warning("effective.md", monkeypatch)
    pattern, a_perp, v = names["pattern"], names["a_perp"], names["v"]
    assert a_perp.shape == pattern.shape
    lengths = names["batch"].attention_mask.sum(-1)
    assert lengths[0] <= v.shape[-1] < lengths[1]  # one sequence on each side of d_head
    assert torch.equal(a_perp[0], pattern[0]) and (a_perp[1] - pattern[1]).abs().max() > 0.1
    torch.testing.assert_close(a_perp @ v, pattern @ v, atol=1e-5, rtol=1e-4)
    assert names["run"].effective.shape[0] == names["model"].cfg.n_layers
    assert set(names["stats"].table["attention"]) == {"standard", "effective"}


@pytest.mark.slow
def test_compare_page(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    names = run_examples("compare.md")
    assert (tmp_path / "report.html").stat().st_size > 100_000
    assert len(names["comparison"].table) == 3 * 72


@pytest.mark.parametrize("page", ["index.md", "quickstart.md", "papa.md", "compare.md", "effective.md",
                                  "patterns.md", "probing.md", "heads.md", "plots.md", "cli.md",
                                  "development.md"])
def test_pages_are_in_the_site_navigation(page):
    assert f": {page}" in (DOCS.parent / "mkdocs.yml").read_text()


def _docs_module(name: str):
    """docs/NAME.py as a module (gallery.py needs nbformat and hooks.py mkdocs, of the docs extra)."""
    import importlib.util

    for needed in ("nbformat", "mkdocs"):
        if importlib.util.find_spec(needed) is None:
            required("the docs extra", f"{needed} is not installed: pip install -e '.[docs]'")
    spec = importlib.util.spec_from_file_location(f"attnlens_docs_{name}", DOCS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gallery_figures_get_a_placeholder_the_site_draws():
    """nbconvert, and so mkdocs-jupyter, cannot show plotly's JSON output: each figure of an
    executed notebook keeps it (for JupyterLab) and gains a text/html placeholder that
    docs/javascripts/figures.js draws, numbered in the notebook's order. The figure's JSON comes
    back intact, even with ``</script>`` in a string; other outputs are left as they were."""
    import nbformat
    import plotly.graph_objects as go

    gallery = _docs_module("gallery")
    first = json.loads(go.Figure(go.Heatmap(z=[[0.0, 1.0], [0.5, 0.25]]),
                                 layout={"height": 300, "title": {"text": "a </script> b"}}).to_json())
    second = json.loads(go.Figure(go.Scatter(x=[0, 1], y=[1, 0])).to_json())
    table = {"output_type": "execute_result", "execution_count": 1, "metadata": {},
             "data": {"text/html": "<table></table>", "text/plain": "table"}}
    notebook = nbformat.from_dict({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "code", "metadata": {}, "execution_count": 1, "source": "x", "outputs": [
            dict(table), {"output_type": "display_data", "metadata": {}, "data": {gallery.PLOTLY: first}}]},
        {"cell_type": "code", "metadata": {}, "execution_count": 2, "source": "y", "outputs": [
            {"output_type": "display_data", "metadata": {}, "data": {gallery.PLOTLY: second}}]},
    ]})
    gallery.add_figure_html(notebook, "demo")
    outputs = [output for cell in notebook.cells for output in cell.outputs]
    assert outputs[0] == table
    for index, (output, figure, height) in enumerate(zip(outputs[1:], (first, second), (300, 450), strict=True)):
        assert output["data"][gallery.PLOTLY] == figure
        page = output["data"]["text/html"]
        assert f'<div class="attnlens-plotly" id="demo-figure-{index}" style="height:{height}px"></div>' in page
        data = re.search(rf'<script type="application/json" id="demo-figure-{index}-data">(.*?)</script>', page, re.S)
        assert data and json.loads(data.group(1)) == figure
        assert "plotly.min.js" not in page


def test_gallery_reuses_an_executed_copy_only_while_notebook_and_attnlens_are_unchanged(tmp_path, monkeypatch):
    """The key of an executed copy covers the notebook's cells and attnlens' sources, not the
    notebook's stored outputs; a stale or damaged copy is executed again."""
    gallery = _docs_module("gallery")
    (tmp_path / "attnlens").mkdir()
    (tmp_path / "examples").mkdir()
    source = tmp_path / "attnlens" / "module.py"
    source.write_text("x = 1\n")
    path = tmp_path / "examples" / "demo.ipynb"

    def write_notebook(code: str, outputs: list) -> None:
        path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
            {"cell_type": "code", "metadata": {}, "execution_count": None, "source": code, "outputs": outputs}]}))

    monkeypatch.setattr(gallery, "ROOT", tmp_path)
    monkeypatch.setattr(gallery, "EXAMPLES", tmp_path / "examples")
    monkeypatch.setenv("ATTNLENS_GALLERY_CACHE", str(tmp_path / "cache"))
    write_notebook("print(1)", [])
    copy = tmp_path / "cache" / "demo.ipynb"
    copy.parent.mkdir()
    copy.write_text(json.dumps({"metadata": {"attnlens_gallery": {"key": gallery.source_key(path)}}}))
    assert gallery.executed(path) == copy
    write_notebook("print(1)", [{"output_type": "stream", "name": "stdout", "text": "1\n"}])
    assert gallery.executed(path) == copy                       # outputs are not the notebook's code
    source.write_text("x = 2\n")
    assert gallery.executed(path) is None                       # attnlens changed
    source.write_text("x = 1\n")
    write_notebook("print(2)", [])
    assert gallery.executed(path) is None                       # the notebook changed
    write_notebook("print(1)", [])
    assert gallery.executed(path) == copy
    copy.write_text("{not json")
    assert gallery.executed(path) is None                       # damaged
    monkeypatch.setenv("ATTNLENS_GALLERY_ONLY", "other")
    with pytest.raises(ValueError, match="No notebook"):
        gallery.selected()


def test_notebook_pages_link_the_site_pages():
    """A notebook links the docs as ../docs/X.md (right in the repository); on its page in the
    site the link is ../X.html. Other links and other pages are left alone."""
    from types import SimpleNamespace

    hooks = _docs_module("hooks")
    html = ('<a href="../docs/papa.md#the-curve">PAPA</a> <a href="../docs/heads.md">heads</a> '
            '<a href="https://example.org/docs/a.md">out</a>')
    notebook = SimpleNamespace(file=SimpleNamespace(src_uri="gallery/01_quickstart.ipynb"))
    assert hooks.on_page_content(html, notebook, None, None) == (
        '<a href="../papa.html#the-curve">PAPA</a> <a href="../heads.html">heads</a> '
        '<a href="https://example.org/docs/a.md">out</a>')
    page = SimpleNamespace(file=SimpleNamespace(src_uri="papa.md"))
    assert hooks.on_page_content(html, page, None, None) == html


def test_probing_page_tables_are_the_stored_measurements():
    """docs/probing.md holds what attnlens curve and the benchmarks wrote: the curve table is
    docs/papa_curve.csv as Curve.to_markdown shows it, and Table 1 and the probe baselines are
    docs/papa_table.md and docs/probe_baselines.md (docs/tables.py puts them there); every curve
    row has its interval and baselines, and Table 1 is the one read from the same curve, with
    its six rows."""
    import importlib.util

    import pandas as pd

    spec = importlib.util.spec_from_file_location("doc_tables", DOCS / "tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    text = (DOCS / "probing.md").read_text()

    def block(name):
        start, end = tables.MARKERS[name]
        return text.split(start)[1].split(end)[0].strip()

    curve = pd.read_csv(DOCS / "papa_curve.csv")
    assert block("curve table") == Curve.read_csv(DOCS / "papa_curve.csv").to_markdown().strip()
    assert {name: block(name) for name in tables.MARKERS} == {
        name: text.strip() for name, text in tables.blocks().items()}
    assert block("papa table") == (DOCS / "papa_table.md").read_text().strip()
    assert block("probe baselines") == (DOCS / "probe_baselines.md").read_text().strip()
    tasks = curve[curve["task"] != "lm"]
    assert ((tasks["low"] <= tasks["score"]) & (tasks["score"] <= tasks["high"])).all()
    assert tasks["baseline"].notna().all() and tasks["majority"].notna().all()
    table = pd.read_csv(DOCS / "papa_table.csv")  # Table 1 is read from the same curve run
    stored = Curve.read_csv(DOCS / "papa_curve.csv")
    expected = PapaTable.from_curve(stored, unavailable=missing_tasks(stored, DATA))
    assert set(table["task"]) == set(curve["task"]) | {"mnli"} and len(set(tasks["task"])) >= 1
    # MNLI is a row that says why it has no score, never silently absent
    assert set(table.loc[table["task"] == "mnli", "note"]) == {"not available: dev data not in this environment"}
    pd.testing.assert_frame_equal(table, pd.read_csv(io.StringIO(expected.table.to_csv(index=False))),
                                  check_dtype=False, rtol=0, atol=0)
    assert (DOCS / "papa_table.md").read_text() == expected.to_markdown() + "\n"
    assert (DOCS / "papa_table_relative.md").read_text() == expected.to_markdown(relative=True) + "\n"
    assert (DOCS / "papa_table_versus_average.md").read_text() == expected.to_markdown(versus_average=True) + "\n"
    assert list(dict.fromkeys(table["row"])) == list(ROWS)  # the labelled rows too
    tested = table["note"].isna() & (table["row"] != "original") & (table["task"] != "lm")
    for column in ("p_value", "p_adjusted", "significant", "detectable", "equivalent", "versus_linear",
                   "versus_linear_low", "versus_linear_high"):  # every tested task row has them
        assert table.loc[tested, column].notna().all(), column


def test_probing_page_cites_the_probe_choices_file_and_the_probe_has_the_chosen_default():
    """The numbers docs/probing.md cites from the held-out choice of pooling and standardisation
    are docs/probe_choices.csv's (rounded as printed), its claim "every paired interval holds 0"
    holds there, the decision written in docs/probe_choices.md is PapaProbe's default, and the
    choice read no dev example (fit + held out = the curve's training examples, 4,000 or MRPC's 3,668)."""
    import re

    import pandas as pd

    from attnlens.evaluation.probing import PapaProbe

    frame = pd.read_csv(DOCS / "probe_choices.csv")
    text = " ".join((DOCS / "probing.md").read_text().split())
    decision = (DOCS / "probe_choices.md").read_text()

    def row(task, pooling, standardize):
        found = frame[(frame["task"] == task) & (frame["pooling"] == pooling) & (frame["standardize"] == standardize)]
        assert len(found) == 1
        return found.iloc[0]

    def signed(value):
        return f"{value:+.3f}".replace("-", "−")

    totals = frame["n_fit"] + frame["n_held_out"]  # the curve's training examples (MRPC has 3,668)
    assert dict(zip(frame["task"], totals, strict=True)) == {"sst2": 4000, "cola": 4000, "mrpc": 3668, "ner": 4000,
                                                             "pos": 4000}
    assert (frame["n_held_out"] == (0.2 * totals).round()).all()
    assert set(frame["task"]) == {"sst2", "cola", "mrpc", "ner", "pos"} and (frame["seeds"] == 3).all()
    for column in ("versus_default", "versus_paper"):
        tested = frame[frame[f"{column}_low"].notna()]
        assert ((tested[f"{column}_low"] <= 0) & (0 <= tested[f"{column}_high"])).all()
    assert decision.count("beaten by none: not dominated.") == 4  # every pair tested, none beaten
    cola, cola_paper = row("cola", "mean", True), row("cola", "sum", False)
    assert (f"the former default {cola['score']:.3f} against the paper's probe {cola_paper['score']:.3f} "
            f"({signed(cola['versus_paper'])} [{signed(cola['versus_paper_low'])}, "
            f"{signed(cola['versus_paper_high'])}])") in text
    assert (f"({row('sst2', 'sum', False)['score']:.3f} and {row('sst2', 'mean', True)['score']:.3f}; "
            f"F1 {row('mrpc', 'sum', False)['score']:.3f} and {row('mrpc', 'mean', True)['score']:.3f})") in text
    words = frame[frame["task"].isin(["ner", "pos"])]
    assert "standardisation moves the score by less than 0.005" in text
    assert words["versus_paper"].abs().max() < 0.005 and words["versus_default"].abs().max() < 0.005
    chosen = re.search(r"^Chosen: (mean|sum) \+ (standardised|raw),", decision, re.M)
    settings = PapaProbe().settings
    assert (settings.pooling, settings.standardize) == (chosen[1], chosen[2] == "standardised") == ("sum", False)
    assert "**the default is now the paper's probe**" in text


def test_quickstart_page(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    names = run_without_short_text_warning("quickstart.md", monkeypatch)
    assert (tmp_path / "report.html").stat().st_size > 100_000
    assert len(names["comparison"].table) == 3 * 72
    assert names["run"].effective.shape[:3] == (6, 2, 12)
    assert names["logits"].shape[0] == 2


def test_papa_page(tmp_path, monkeypatch):
    """Every example of docs/papa.md but the curve (40 minutes on real tasks)."""
    monkeypatch.chdir(tmp_path)
    names = run_examples("papa.md", skip=("papa.curve(",))
    assert tuple(names["constants"].mean.shape) == (6, 12, 64, 64)
    assert names["blend"].lam.shape == (6, 12) and bool((names["blend"].lam == 0.5).all())
    assert len(names["heads"]) == 36


def test_passes_page(tmp_path, monkeypatch):
    """The custom accumulator of docs/passes.md equals a plain loop over the model's patterns."""
    import attnlens

    monkeypatch.chdir(tmp_path)
    names = run_examples("passes.md")
    model, texts = names["model"], names["texts"]
    got = names["entropy"].result()
    assert names["summary"].n_examples == 2
    batch = attnlens.tokenize(model, texts, max_len=32, layout="papa")
    totals = torch.zeros(model.cfg.n_layers, dtype=torch.float64)
    rows = 0
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.input_ids, **batch.model_kwargs())
    for example, mask in enumerate(batch.attention_mask.bool()):
        for layer in range(model.cfg.n_layers):
            pattern = cache[f"blocks.{layer}.attn.hook_pattern"][example].double()  # [head, q, k]
            for query in mask.nonzero().flatten().tolist():
                p = pattern[:, query]
                totals[layer] += float(-(p * p.clamp_min(1e-30).log()).sum())
        rows += int(mask.sum()) * model.cfg.n_heads
    torch.testing.assert_close(got, totals / rows, atol=1e-6, rtol=0)
    # the replayed pass: a live pass's statistics, bit for bit, and the recording freed
    from attnlens.engine import passes
    from attnlens.methods.stats import Statistics

    live = Statistics(6, 12, "effective")
    passes.run(model, texts, [live], progress=False)
    for mine, theirs in zip(names["replayed"].state_dict().values(), live.state_dict().values(), strict=True):
        assert torch.equal(mine, theirs)
    assert names["kept"].n_batches == 0 and names["kept"].n_bytes == 0


def test_the_epoch_rule_is_the_one_judged_on_held_out_training_examples():
    """docs/epoch_choice.csv (benchmarks/epoch_choice.py) read no dev example (fit + held out =
    the curve's training examples), the page's reading of it holds there (the rule helps on NER
    alone, hurts nowhere), and probing.run's default is what its decision says."""
    import inspect

    import pandas as pd

    from attnlens.evaluation import probing

    frame = pd.read_csv(DOCS / "epoch_choice.csv")
    totals = frame["n_fit"] + frame["n_held_out"]
    assert dict(zip(frame["task"], totals, strict=True)) == {"sst2": 4000, "cola": 4000, "mrpc": 3668, "ner": 4000,
                                                             "pos": 4000}
    assert list(frame.loc[frame["versus_low"] > 0, "task"]) == ["ner"] and not (frame["versus_high"] < 0).any()
    keep = "Decided: keep choosing the epochs (select_epochs=True)" in (DOCS / "epoch_choice.md").read_text()
    assert keep and inspect.signature(probing.run).parameters["select_epochs"].default is True
    text = " ".join((DOCS / "probing.md").read_text().split())
    assert "So the rule stays: it helps on NER" in text


def test_every_measured_number_on_the_probing_page_is_in_a_committed_file():
    """docs/probing.md claims nothing that a committed file does not show: every number printed
    with three or more decimals in its prose (the generated tables and code aside, which the test
    above checks) is a value of a CSV under docs/ at the printed precision. Measurements whose
    files were not kept live in the lab log of docs/development.md."""
    import re

    import pandas as pd

    text = (DOCS / "probing.md").read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!-- ([^:]*?): .*? -->.*?<!-- end of the \1 -->", "", text, flags=re.S)
    text = re.sub(r"arXiv:\d+\.\d+|https?://\S+", "", text)
    values = set()
    for path in DOCS.glob("*.csv"):
        frame = pd.read_csv(path)
        values.update(abs(float(value)) for column in frame.select_dtypes("number") for value in frame[column].dropna())
    printed = re.findall(r"(?<![\w.])[−-]?\d+\.\d{3,}", text)
    assert len(printed) > 50  # the page cites its files
    unbacked = [number for number in printed
                if not any(round(value, len(number.split(".")[1])) == abs(float(number.replace("−", "-")))
                           for value in values)]
    assert not unbacked, f"numbers on docs/probing.md that no docs/*.csv holds: {unbacked}"
