"""attnlens.present.export: CircuitsVis's attention_heads view (offline) and bertviz's head_view inputs.

References: the values CircuitsVis is given are read back out of the HTML (the props of its
``render`` call) and compared with the comparison's own maps; bertviz's input format is checked
against what its ``format_attention`` does (stack the layers, drop the batch of one) rebuilt
here with torch; the rendering is checked in headless Chromium, offline (``--host-resolver-rules``),
by a probe script that counts the coloured pixels of every canvas the widget drew.
"""

from __future__ import annotations

import dataclasses
import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import attnlens
from attnlens.methods import views
from attnlens.present import export
from tests import tiny
from tests.conftest import required
from tests.typechecks import unchecked


@pytest.fixture(scope="module")
def encoder_comparison():
    model = tiny.bert_bridge()
    return attnlens.compare(model, "papa", "effective", corpus=tiny.CORPUS, max_len=16,
                            progress=False)


@pytest.fixture(scope="module")
def decoder_comparison():
    model = tiny.gpt2_bridge()
    return attnlens.compare(model, "effective", corpus=tiny.CORPUS, max_len=16, progress=False)


@pytest.fixture()
def circuitsvis():
    try:
        import circuitsvis
    except ImportError:
        required("circuitsvis", 'pip install "attnlens[circuitsvis]" (the dev extra has it)')
    return circuitsvis


def props(view: export.OfflineHTML) -> dict:
    """The properties CircuitsVis renders, read back out of the HTML."""
    match = re.search(r"CircuitsVis\.AttentionHeads,\s*(\{.*\})\s*\)\s*</script>", view.html, re.S)
    assert match, "no CircuitsVis.render(..., AttentionHeads, {...}) call in the HTML"
    return json.loads(match.group(1))


def assert_offline(text: str) -> None:
    """No script loaded from elsewhere: no ``src=`` URL, no ``import ... from "https://..."``."""
    assert not re.search(r"<script[^>]*\ssrc\s*=", text, re.I)
    assert not re.search(r"""\b(from|import)\s*\(?\s*["']https?://""", text)
    assert "unpkg.com" not in text and "cdn.jsdelivr" not in text


def test_missing_extra_names_the_pip_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "circuitsvis", None)  # import circuitsvis -> ImportError
    with pytest.raises(ImportError, match=re.escape('pip install "attnlens[circuitsvis]"')):
        export.to_circuitsvis(np.eye(3), ["a", "b", "c"], causal=False)


def test_comparison_views_carry_the_maps_the_mask_and_a_symmetric_range(
    encoder_comparison, circuitsvis
):
    c = encoder_comparison
    for view in c.views:
        exported = c.to_circuitsvis(view=view)
        text = exported._repr_html_()
        assert_offline(text)
        data = props(exported)
        expected = c.example_patterns[view].reshape(-1, *c.example_patterns[view].shape[-2:])
        np.testing.assert_allclose(np.asarray(data["attention"]), expected, atol=5.1e-5, rtol=0)
        assert data["tokens"] == c.example_tokens
        for token in c.example_tokens:  # the tokens are in the page
            assert json.dumps(token) in text
        assert data["maskUpperTri"] is False  # an encoder: no key is blanked
        assert data["attentionHeadNames"][:2] == ["L0H0", "L0H1"]
        if view == "effective":  # signed: symmetric about 0, as wide as the largest |a|
            largest = float(np.abs(expected).max())
            assert data["minValue"] == pytest.approx(-largest) and data["maxValue"] == pytest.approx(largest)
        else:
            assert (data["minValue"], data["maxValue"]) == (0.0, 1.0)
    one_layer = props(c.to_circuitsvis(c.example_index, "standard", layer=1))
    assert one_layer["attentionHeadNames"] == [f"L1H{h}" for h in range(c.n_heads)]
    np.testing.assert_allclose(np.asarray(one_layer["attention"]), c.example_patterns["standard"][1],
                               atol=5.1e-5, rtol=0)


def test_a_decoder_blanks_later_keys_of_its_causal_views(decoder_comparison, circuitsvis, monkeypatch):
    """Every registered view is causal on a decoder (its effective attention too: each row is
    projected onto the values of the keys its query reads); a view registered as reaching later
    keys (``View.causal`` False) is shown in full."""
    c = decoder_comparison
    assert c.causal
    for view in ("standard", "effective"):
        assert props(c.to_circuitsvis(view=view))["maskUpperTri"] is True, view
    reaching = dataclasses.replace(views.REGISTRY["effective"], causal=False)
    monkeypatch.setitem(views.REGISTRY, "effective", reaching)
    assert props(c.to_circuitsvis(view="effective"))["maskUpperTri"] is False


def test_plain_function_and_its_errors(circuitsvis):
    pattern = torch.tensor([[1.0, 0.0], [-0.5, 1.5]])  # one signed [query, key] map
    data = props(export.to_circuitsvis(pattern, ["x", "y"], causal=True))
    assert np.asarray(data["attention"]).shape == (1, 2, 2)
    assert (data["minValue"], data["maxValue"], data["maskUpperTri"]) == (-1.5, 1.5, True)
    assert repr(export.to_circuitsvis(pattern, ["x", "y"], causal=True)).startswith(
        "<CircuitsVis attention_heads: 1 heads x 2 tokens, signed, causal: 1.")
    with pytest.raises(ValueError, match=r"3 tokens for a map of shape \[1, 2, 2\]"):
        export.to_circuitsvis(pattern, ["x", "y", "z"], causal=False)
    with pytest.raises(ValueError, match="NaN or infinite"):
        export.to_circuitsvis(torch.full((2, 2), float("nan")), ["x", "y"], causal=False)
    with pytest.raises(ValueError, match=r"as many keys as queries, got shape \[2, 3\]"):
        export.to_circuitsvis(np.ones((2, 3)), ["x", "y", "z"], causal=False)
    with pytest.raises(ValueError, match="2 head_names for 1 heads"):
        export.to_circuitsvis(pattern, ["x", "y"], causal=False, head_names=["a", "b"])
    with pytest.raises(TypeError, match="tokens must be a list of strings"):
        export.to_circuitsvis(pattern, "xy", causal=False)


def test_comparison_export_errors(encoder_comparison):
    c = encoder_comparison
    other = (c.example_index + 1) % c.n_examples
    with pytest.raises(ValueError, match=(
        rf"keeps the maps of example {c.example_index} only, not {other}: run "
        rf"attnlens.compare\(\.\.\., example={other}\) \(command line: --example {other}\)")):
        c.to_circuitsvis(other)
    with pytest.raises(ValueError, match=rf"example=99 is outside the corpus of {c.n_examples} texts; "
                                         rf"use an index from 0 to {c.n_examples - 1}"):
        c.to_circuitsvis(99)
    with pytest.raises(ValueError, match="view 'lens' is not in this comparison; use one of 'standard'"):
        c.to_circuitsvis(view="lens")
    with pytest.raises(ValueError, match=r"layer must be in 0..1 \(the model has 2 layers\), got 2"):
        c.to_circuitsvis(layer=2)


def test_bertviz_inputs(encoder_comparison):
    c = encoder_comparison
    attention, tokens = export.to_bertviz(c, view="papa")
    assert isinstance(attention, tuple) and len(attention) == c.n_layers and tokens == c.example_tokens
    n = len(tokens)
    for layer in attention:
        assert isinstance(layer, torch.Tensor) and layer.dtype == torch.float32
        assert layer.shape == (1, c.n_heads, n, n)  # (batch of one, head, query, key)
    formatted = torch.stack([layer.squeeze(0) for layer in attention])  # bertviz's format_attention
    np.testing.assert_allclose(formatted.numpy(), c.example_patterns["papa"], atol=1e-7, rtol=0)
    with pytest.raises(ValueError, match="cannot show negative values"):
        export.bertviz_attention(-np.ones((1, 1, 2, 2)), ["a", "b"])
    with unchecked(), pytest.raises(ValueError, match=r"must be \[layer, head, query, key\]"):
        export.bertviz_attention(np.ones((2, 2)), ["a", "b"])


# -- rendered in headless Chromium, offline -------------------------------------------------

PROBE = """<script>
window.__errors = [];
window.addEventListener("error", function (e) { __errors.push(String(e.message)); });
window.addEventListener("load", function () { setTimeout(function () {
  var drawn = [];
  document.querySelectorAll("canvas").forEach(function (c) {
    var d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data, coloured = 0;
    for (var i = 0; i < d.length; i += 4) {
      if (d[i + 3] > 0 && Math.max(d[i], d[i + 1], d[i + 2]) - Math.min(d[i], d[i + 1], d[i + 2]) > 30) coloured++;
    }
    drawn.push(coloured / Math.max(1, c.width * c.height));
  });
  document.body.setAttribute("data-drawn", JSON.stringify(drawn));
  document.body.setAttribute("data-errors", JSON.stringify(__errors));
}, 1000); });
</script>"""

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions", "--host-resolver-rules=MAP * ~NOTFOUND",  # offline
    "--enable-logging=stderr", "--v=0", "--virtual-time-budget=15000",
]


def test_the_widget_draws_offline_in_chromium(encoder_comparison, circuitsvis, tmp_path):
    chromium = next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)
    if chromium is None:
        required("headless Chromium", "apt-get install -y chromium (.ci/run does it)")
    c = encoder_comparison
    exported = c.to_circuitsvis(view="effective")
    page = exported.save(tmp_path / "view.html")
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and exported.html in text
    page.write_text(text.replace("<head>", "<head>\n" + PROBE, 1), encoding="utf-8")
    result = subprocess.run(
        [chromium, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    found = {
        name: json.loads(html.unescape(value))
        for name, value in re.findall(r'data-(drawn|errors)="([^"]*)"', result.stdout)
    }
    assert found.get("errors") == [], (found, result.stderr[-2000:])
    drawn = found["drawn"]
    # one small map per head and the zoomed one, each mostly coloured cells
    assert len(drawn) == c.n_layers * c.n_heads + 1, drawn
    assert min(drawn) > 0.3, drawn
    for name in ("L0H0", f"L{c.n_layers - 1}H{c.n_heads - 1}"):
        assert name in result.stdout
    console = [line for line in result.stderr.splitlines() if "CONSOLE" in line and "rror" in line]
    assert console == []
    assert Path(page).stat().st_size < 2_000_000  # one widget: ~1.3 MB of inline JavaScript
