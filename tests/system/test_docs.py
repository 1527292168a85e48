"""The Python examples of the docs pages run as written, on the embedded default model.

Pages whose examples use placeholder names (``plots.md``) are not run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from tests.conftest import required

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
                                  "patterns.md", "probing.md", "heads.md", "plots.md", "cli.md"])
def test_pages_are_in_the_site_navigation(page):
    assert f": {page}" in (DOCS.parent / "mkdocs.yml").read_text()


def _gallery():
    """docs/gallery.py as a module (it needs nbformat, of the docs extra)."""
    import importlib.util

    if importlib.util.find_spec("nbformat") is None:
        required("the docs extra", "nbformat is not installed: pip install -e '.[docs]'")
    spec = importlib.util.spec_from_file_location("attnlens_docs_gallery", DOCS / "gallery.py")
    gallery = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gallery)
    return gallery


def test_gallery_renders_each_kind_of_output():
    """A notebook page keeps code, text, tables and figures; a figure's JSON comes back intact and
    carries no plotly.js; docs links of a notebook (../docs/X.md) point at the site's pages."""
    import nbformat
    import plotly.graph_objects as go

    gallery = _gallery()
    figure = json.loads(go.Figure(go.Heatmap(z=[[0.0, 1.0], [0.5, 0.25]])).to_json())
    notebook = nbformat.from_dict({
        "nbformat": 4, "nbformat_minor": 5, "metadata": {"attnlens_gallery": {"seconds": 1.5}},
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": "# A title\n\nSee [PAPA](../docs/papa.md)."},
            {"cell_type": "code", "metadata": {}, "execution_count": 1, "source": "x = 1\nx", "outputs": [
                {"output_type": "stream", "name": "stdout", "text": "printed ```fence```\n"},
                {"output_type": "stream", "name": "stderr", "text": "\x1b[31mwarned\x1b[0m\n"},
                {"output_type": "execute_result", "execution_count": 1, "metadata": {},
                 "data": {"text/html": "<table>\n\n<tr><td>1</td></tr></table>", "text/plain": "1"}},
                {"output_type": "display_data", "metadata": {},
                 "data": {"application/vnd.plotly.v1+json": figure, "text/plain": "Figure"}},
            ]},
        ],
    })
    page = gallery.render(notebook, "demo", ran=True)
    assert page.startswith("# A title") and "(../papa.md)" in page and "../docs/" not in page
    assert "executed by the docs build in 1.5 s" in page and "[Download the executed notebook](demo.ipynb)" in page
    assert "```` { .text }\nprinted ```fence```\n````" in page  # a longer fence than the text's
    assert "warned" in page and "\x1b" not in page and "attnlens-stderr" in page
    assert "<table>\n<tr><td>1</td></tr></table>" in page  # no blank line inside raw HTML
    data = re.search(r'<script type="application/json" id="demo-figure-0-data">(.*?)</script>', page, re.S)
    assert data and json.loads(data.group(1)) == figure
    assert '<div class="attnlens-plotly" id="demo-figure-0"' in page and "plotly.min.js" not in page
    assert gallery.figures_of(notebook) == [figure]
    unexecuted = gallery.render(notebook, "demo", ran=False, reason="Because.")
    assert "Not executed in this build" in unexecuted and "attnlens-plotly" not in unexecuted


def test_thumbnails_draw_the_figure_data():
    """Heatmap cells take the colour scale's colours at their values (plotly's own
    ``sample_colorscale`` is the reference), top row first for a reversed y axis; a line's
    end points reach the corners of the plot area."""
    import plotly.graph_objects as go
    from plotly.colors import sample_colorscale

    gallery = _gallery()
    scale = [[0.0, "rgb(0, 0, 0)"], [1.0, "rgb(255, 255, 255)"]]
    heatmap = go.Figure(go.Heatmap(z=[[0.0, 1.0], [0.25, 0.75]], colorscale=scale))
    heatmap.update_yaxes(autorange="reversed")
    svg = gallery.thumbnail(json.loads(heatmap.to_json()))
    cells = re.findall(r'<rect x="([\d.]+)" y="([\d.]+)" width="[\d.]+" height="[\d.]+" fill="([^"]+)"/>', svg)
    assert len(cells) == 4
    expected = sample_colorscale(scale, [0.0, 1.0, 0.25, 0.75])
    order = sorted(cells, key=lambda c: (float(c[1]), float(c[0])))  # row by row from the top
    assert [c[2] for c in order] == expected
    line = go.Figure(go.Scatter(x=[0, 1], y=[0, 1], mode="lines"))
    svg = gallery.thumbnail(json.loads(line.to_json()))
    points = re.search(r'<polyline points="([^"]+)"', svg).group(1).split()
    (x0, y0), (x1, y1) = (tuple(map(float, p.split(","))) for p in points)
    w, h, pad, inner = gallery.WIDTH, gallery.HEIGHT, gallery.PAD, 4
    assert (x0, y0) == (pad + inner, h - pad - inner) and (x1, y1) == (w - pad - inner, pad + inner)
    assert "not executed" in gallery.thumbnail(None, "not executed")


def test_every_gallery_notebook_is_executed():
    """mkdocs.yml's list of notebooks the build does not run is empty: the gallery runs them all."""
    gallery = _gallery()
    assert gallery.not_executed() == []
    assert gallery.selected() == [path.stem for path in gallery.notebooks()]


def test_probing_page_tables_are_the_stored_measurements():
    """docs/probing.md holds what the benchmarks wrote: the curve table is docs/papa_curve.csv
    (benchmarks/curve.py) as docs/tables.py formats it, and Table 1 and the probe baselines are
    docs/papa_table.md and docs/probe_baselines.md; every curve row has its interval and
    baselines, and Table 1 covers the curve's tasks with its six rows."""
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
    assert block("curve table") == tables.curve_markdown(curve).strip()
    assert block("papa table") == (DOCS / "papa_table.md").read_text().strip()
    assert block("probe baselines") == (DOCS / "probe_baselines.md").read_text().strip()
    tasks = curve[curve["task"] != "lm"]
    assert ((tasks["low"] <= tasks["score"]) & (tasks["score"] <= tasks["high"])).all()
    assert tasks["baseline"].notna().all() and tasks["majority"].notna().all()
    table = pd.read_csv(DOCS / "papa_table.csv")  # Table 1 is read from the same curve run
    assert set(table["task"]) == set(curve["task"]) and len(set(tasks["task"])) >= 1
    assert list(dict.fromkeys(table["row"])) == ["original", "average", "identity", "toeplitz", "zeros", "uniform"]


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
