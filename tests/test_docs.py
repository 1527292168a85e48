"""The Python examples of the docs pages run as written, on the embedded default model.

Pages whose examples use placeholder names (``plots.md``) are not run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

DOCS = Path(__file__).resolve().parents[1] / "docs"


def run_examples(page: str) -> dict:
    """Execute every ```python block of ``docs/page`` in order, in one namespace."""
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), re.S)
    assert blocks, f"no python example in docs/{page}"
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, f"docs/{page}", "exec"), namespace)
    return namespace


def test_effective_page(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    names = run_examples("effective.md")
    pattern, a_perp, v = names["pattern"], names["a_perp"], names["v"]
    assert a_perp.shape == pattern.shape
    lengths = names["batch"].attention_mask.sum(-1)
    assert lengths[0] <= v.shape[-1] < lengths[1]  # one sequence on each side of d_head
    assert torch.equal(a_perp[0], pattern[0]) and (a_perp[1] - pattern[1]).abs().max() > 0.1
    torch.testing.assert_close(a_perp @ v, pattern @ v, atol=1e-5, rtol=1e-4)
    assert names["run"].effective.shape[0] == names["model"].cfg.n_layers
    assert set(names["stats"].to_frame()["attention"]) == {"standard", "effective"}


def test_compare_page(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    names = run_examples("compare.md")
    assert (tmp_path / "report.html").stat().st_size > 100_000
    assert len(names["comparison"].table) == 3 * 72


@pytest.mark.parametrize("page", ["index.md", "compare.md", "effective.md", "plots.md", "cli.md"])
def test_pages_are_in_the_site_navigation(page):
    assert f": {page}" in (DOCS.parent / "mkdocs.yml").read_text()


def test_gallery_page_is_generated_with_every_figure_and_its_caption(tmp_path):
    """``make docs`` runs docs/gallery.py; it must keep working with the report it copies."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gallery", DOCS / "gallery.py")
    gallery = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gallery)
    page = gallery.main(4, docs=tmp_path).read_text()
    assert (tmp_path / "assets" / "plotly.min.js").stat().st_size > 1_000_000
    headings = re.findall(r"^## (.+)$", page, re.M)
    assert "side by side" in headings and "patterns effective" in headings and len(headings) >= 10
    assert page.count('<div class="attnlens-figure">') == len(headings)
    assert "non-standard view is farthest from standard" in page


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
