"""The HTML report renders in headless Chromium, offline, with no console errors.

Needs Debian's ``chromium`` package (``.ci/run`` installs it); without it the tests skip locally and fail in CI.
Two runs of Chromium; the first on a copy of the report with a small probe script added at the
top of ``<head>`` (it records ``window.onerror``, unhandled rejections and ``console.error``):

- ``--dump-dom`` of the probed copy: every figure was drawn by plotly.js (an ``svg.main-svg``
  per figure), the probe recorded no error, Chromium's console log on stderr has no
  ``Uncaught`` either, and hovering a cell (``Plotly.Fx.hover``) of the tiled patterns and of the
  side-by-side figure shows the layer, head, query and key tokens and the value;
- ``--screenshot`` of the report itself: the pixels of the top of the page (the first figure is
  a head grid) are far from blank: many non-white pixels and many distinct colours;
- ``--dump-dom`` of a copy with :data:`EXPLORE`, which drives the explorer (attnlens.present.explorer) as a
  reader would: it picks another example, layer and head in the select boxes (``change``
  events), clicks a head-grid cell (``plotly_click`` emitted on the grid), ticks "minus
  standard", and records the explorer's figure after each step; and a sentence pair's report
  shows its segments (dotted lines, segment names in the hover).

Network access is disabled (``--host-resolver-rules``), so the report must be self-contained.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import required
from tests.small_comparison import small_comparison

# headless Chromium renders a full report in each test
pytestmark = pytest.mark.slow


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


CHROMIUM = _chromium()


@pytest.fixture(autouse=True)
def _chromium_installed():
    if CHROMIUM is None:
        required("headless Chromium", "apt-get install -y chromium (.ci/run does it)")

#: records window errors, unhandled rejections and console.error into __attnlensErrors
RECORD_ERRORS = """window.__attnlensErrors = [];
window.addEventListener("error", function (e) { __attnlensErrors.push("error: " + e.message); });
window.addEventListener("unhandledrejection", function (e) {
  __attnlensErrors.push("unhandled rejection: " + e.reason); });
(function () { var original = console.error; console.error = function () {
  __attnlensErrors.push("console.error: " + Array.prototype.join.call(arguments, " "));
  return original.apply(console, arguments); }; })();
"""

PROBE = """<script>
""" + RECORD_ERRORS + """function whenExplorerReady(then) {  // the explorer draws after inflating its maps
  var tries = 0;
  (function poll() {
    var root = document.querySelector(".explorer");
    if (!root || root.getAttribute("data-state") !== "loading" || ++tries > 200) { then(); return; }
    setTimeout(poll, 50);
  })();
}
window.addEventListener("load", function () { setTimeout(function () { whenExplorerReady(function () {
  var plots = document.querySelectorAll(".js-plotly-plot"), hover = {};
  plots.forEach(function (gd) {  // hover cell (query 3, key 2) of the first panel / tile
    if (!/(patterns_standard|side_by_side)$/.test(gd.id)) return;
    try {
      gd.scrollIntoView();
      Plotly.Fx.hover(gd, {xval: 2, yval: 3}, "xy");
      hover[gd.id.replace(/^.*-/, "")] = Array.prototype.map.call(
        gd.querySelectorAll(".hoverlayer text"), function (t) { return t.textContent; }).join(" ");
    } catch (e) { __attnlensErrors.push("hover: " + e); }
  });
  document.body.setAttribute("data-attnlens-hover", JSON.stringify(hover));
  document.body.setAttribute("data-attnlens-plots", String(plots.length));
  document.body.setAttribute("data-attnlens-errors", JSON.stringify(__attnlensErrors));
}); }, 500); });
</script>"""

#: drives the explorer: select boxes, a head-grid click, the difference checkbox (see the docstring)
EXPLORE = """<script>
""" + RECORD_ERRORS + """window.addEventListener("load", function () {
  var root = document.querySelector(".explorer"), plot = root.querySelector(".explorer-plot");
  var data = JSON.parse(document.querySelector('script[id$="-explorer-data"]').textContent);
  var steps = [];
  function pick(name) { return root.querySelector('[name="' + name + '"]'); }
  function wait(check, then) {
    var tries = 0;
    (function poll() {
      if ((root.getAttribute("data-state") === "ready" && check()) || ++tries > 200) { then(); return; }
      setTimeout(poll, 50);
    })();
  }
  function record(step) {
    var meta = plot.layout.meta || {};
    steps.push({
      step: step, state: root.getAttribute("data-state"), title: plot.layout.title.text,
      example: meta.example, layer: meta.layer, head: meta.head,
      selects: [pick("example").value, pick("layer").value, pick("head").value],
      names: plot.data.map(function (t) { return t.name; }),
      zmid: plot.data.map(function (t) { return t.zmid === undefined ? null : t.zmid; }),
      zmin: plot.data.map(function (t) { return t.zmin; }),
      n: plot.data[0].z.length,
      sums: plot.data.map(function (t) {
        return t.z.reduce(function (a, row) {
          return a + row.reduce(function (b, v) { return b + (v === null ? 0 : v); }, 0); }, 0); }),
      shapes: (plot.layout.shapes || []).length,
      hover: plot.data[0].text[plot.data[0].text.length - 1][0]
    });
  }
  function change(name, value) {
    var element = pick(name);
    if (element.type === "checkbox") { element.checked = value; } else { element.value = value; }
    element.dispatchEvent(new Event("change"));
  }
  function done() {
    document.body.setAttribute("data-attnlens-explore", JSON.stringify(steps));
    document.body.setAttribute("data-attnlens-errors", JSON.stringify(__attnlensErrors));
  }
  wait(function () { return true; }, function () {
    record("first");
    var options = pick("example").options, last = options[options.length - 1].value;
    change("example", last); change("layer", "0"); change("head", "1");
    wait(function () { return plot.layout.meta.head === 1 && plot.layout.meta.layer === 0; }, function () {
      record("selects");
      var grid = document.getElementById(data.grids[data.grids.length - 1]);
      grid.emit("plotly_click", {points: [{x: data.n_heads - 1, y: data.n_layers - 1}]});
      wait(function () { return plot.layout.meta.head === data.n_heads - 1; }, function () {
        record("click");
        change("difference", true);
        wait(function () { return plot.layout.meta.difference === true; }, function () {
          record("difference");
          done();
        });
      });
    });
  });
});
</script>"""

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # offline: any network fetch fails
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=15000",
]


def chromium(page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *extra, page.resolve().as_uri()],
        capture_output=True, text=True, timeout=180,
    )


def probed(html: str, probe: str = PROBE) -> str:
    return html.replace("<head>", "<head>\n" + probe, 1)


def attribute(dom: str, name: str) -> object:
    match = re.search(rf'data-attnlens-{name}="([^"]*)"', dom)
    assert match, f"the page did not finish loading (no data-attnlens-{name})"
    return json.loads(html.unescape(match.group(1)))


def console_errors(stderr: str) -> list[str]:
    return [
        line for line in stderr.splitlines()
        if "CONSOLE" in line and re.search(r"Uncaught|Error|error", line.split("]", 1)[-1])
    ]


def read_png(path: Path) -> np.ndarray:
    """Decode an 8-bit RGB/RGBA, non-interlaced PNG (what Chromium writes) to ``[y, x, channel]``."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, chunks, header = 8, [], None
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position : position + 8])
        body = data[position + 8 : position + 8 + length]
        position += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        elif kind == b"IEND":
            break
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and interlace == 0 and colour in (2, 6), f"unsupported PNG {header}"
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride = width * bpp
    image = np.zeros((height, stride), dtype=np.uint8)
    previous = np.zeros(stride, dtype=np.int64)
    for y in range(height):
        start = y * (stride + 1)
        kind = raw[start]
        line = np.frombuffer(raw, dtype=np.uint8, count=stride, offset=start + 1).astype(np.int64)
        if kind == 0:
            row = line
        elif kind == 1:  # Sub: running sum per channel
            row = (line.reshape(-1, bpp).cumsum(0) % 256).reshape(-1)
        elif kind == 2:  # Up
            row = (line + previous) % 256
        else:  # Average (3) and Paeth (4) depend on the pixel to the left: one byte at a time
            out = bytearray(stride)
            current, up = line.tolist(), previous.tolist()
            for x in range(stride):
                a = out[x - bpp] if x >= bpp else 0
                b = up[x]
                if kind == 3:
                    out[x] = (current[x] + ((a + b) >> 1)) & 255
                    continue
                c = up[x - bpp] if x >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                predictor = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                out[x] = (current[x] + predictor) & 255
            row = np.frombuffer(bytes(out), dtype=np.uint8).astype(np.int64)
        image[y] = row
        previous = row
    return image.reshape(height, width, bpp)[..., :3]


@pytest.fixture(scope="module")
def report(minilm, tmp_path_factory) -> tuple[Path, Path, int]:
    """(the report as saved, a copy with the probe, the number of figures)."""
    comparison = small_comparison(minilm)
    folder = tmp_path_factory.mktemp("report")
    path = comparison.save_html(folder / "report.html")
    page = folder / "probed.html"
    page.write_text(probed(path.read_text(encoding="utf-8")), encoding="utf-8")
    return path, page, len(comparison.figures)


def test_probe_catches_errors(tmp_path):
    """The checks below would see a broken page: a thrown error and a console.error."""
    page = tmp_path / "broken.html"
    page.write_text(probed(
        "<!DOCTYPE html><html><head></head><body><p>x</p>"
        "<script>console.error('bad'); null.f();</script></body></html>"
    ), encoding="utf-8")
    result = chromium(page, tmp_path / "profile", "--dump-dom")
    errors = attribute(result.stdout, "errors")
    assert any("console.error: bad" in e for e in errors) and any("TypeError" in e for e in errors)
    assert console_errors(result.stderr)


def test_report_renders_every_figure_without_console_errors(report, tmp_path):
    _, page, n_figures = report
    result = chromium(page, tmp_path / "profile", "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    assert attribute(dom, "errors") == []
    assert console_errors(result.stderr) == []
    assert attribute(dom, "plots") == n_figures
    assert dom.count('class="main-svg"') >= n_figures  # plotly drew every figure
    assert 'class="hm"' in dom or "heatmaplayer" in dom  # heatmaps, not empty axes
    # hovering names layer, head, tokens and value (example: [CLS] when the committee ...)
    hover = attribute(dom, "hover")
    assert re.fullmatch(r"L0 query 3 'committee'\s*H0 key 2 'the'\s*standard: \d\.\d{3}", hover["patterns_standard"])
    assert re.fullmatch(
        r"L\d+H\d+ query 3 'committee' → key 2 'the'\s*standard: \d\.\d{3}", hover["side_by_side"]
    )


def test_report_screenshot_is_not_blank(report, tmp_path):
    page, _, _ = report  # the report itself, as a user opens it
    shot = tmp_path / "report.png"
    result = chromium(page, tmp_path / "profile", "--window-size=1200,900", f"--screenshot={shot}")
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]
    image = read_png(shot)
    assert image.shape[:2] == (900, 1200)
    figure = image[200:900]  # below the summary: the first head grid and more
    non_white = (figure < 235).any(-1)
    assert non_white.mean() > 0.10, f"only {non_white.mean():.1%} of pixels are not white"
    colours = np.unique(figure.reshape(-1, 3), axis=0)
    assert len(colours) > 100, f"only {len(colours)} distinct colours"
    # a heatmap: many saturated pixels (colour, not just grey text)
    saturation = figure.max(-1).astype(int) - figure.min(-1).astype(int)
    assert (saturation > 60).mean() > 0.05


def explore(html_text: str, folder: Path) -> tuple[list[dict], subprocess.CompletedProcess]:
    """The explorer's figure after each step of :data:`EXPLORE`, and Chromium's result."""
    page = folder / "explore.html"
    page.write_text(probed(html_text, EXPLORE), encoding="utf-8")
    result = chromium(page, folder / "profile", "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    assert attribute(result.stdout, "errors") == []
    assert console_errors(result.stderr) == []
    return attribute(result.stdout, "explore"), result


def test_explorer_redraws_for_another_example_head_and_clicked_grid_cell(minilm, report, tmp_path):
    """Reference: the comparison's kept maps (Comparison.patterns_of), summed per panel."""
    comparison = small_comparison(minilm)
    path, _, _ = report
    steps, _ = explore(path.read_text(encoding="utf-8"), tmp_path)
    assert [step["step"] for step in steps] == ["first", "selects", "click", "difference"]
    assert all(step["state"] == "ready" for step in steps)
    store = comparison.kept_patterns
    views = list(comparison.views)

    def sums(example, layer, head):
        return [float(store.pattern(example, view)[layer, head].sum()) for view in views]

    first, selects, click, difference = steps
    layer, head = comparison.focus
    shown = comparison.example_index
    assert (first["example"], first["layer"], first["head"]) == (shown, layer, head)
    assert first["title"] == f"Layer {layer}, head {head}: standard vs papa vs effective (example {shown})"
    assert first["names"] == views and first["n"] == len(comparison.example_tokens)
    assert first["zmid"] == [None, None, 0] and first["zmin"][:2] == [0, 0]  # sequential, diverging
    np.testing.assert_allclose(first["sums"], sums(shown, layer, head), rtol=1e-5, atol=1e-5)

    last = store.indices[-1]
    assert last != shown
    assert (selects["example"], selects["layer"], selects["head"]) == (last, 0, 1)
    assert selects["title"].startswith("Layer 0, head 1:") and selects["title"].endswith(f"(example {last})")
    assert selects["n"] == len(store.example(last).tokens)
    np.testing.assert_allclose(selects["sums"], sums(last, 0, 1), rtol=1e-5, atol=1e-5)

    top_layer, top_head = comparison.n_layers - 1, comparison.n_heads - 1
    assert (click["example"], click["layer"], click["head"]) == (last, top_layer, top_head)
    assert click["selects"][1:] == [str(top_layer), str(top_head)]  # the select boxes follow
    np.testing.assert_allclose(click["sums"], sums(last, top_layer, top_head), rtol=1e-5, atol=1e-5)

    # minus standard: the other views' differences, on diverging scales
    standard, papa, effective = sums(last, top_layer, top_head)
    assert "minus standard" in difference["title"] and difference["zmid"] == [None, 0, 0]
    np.testing.assert_allclose(
        difference["sums"], [standard, papa - standard, effective - standard], rtol=1e-4, atol=1e-4
    )


@pytest.fixture(scope="module")
def pair_report(tmp_path_factory) -> Path:
    import attnlens
    from tests.tiny import CORPUS, bert_tokenizer, tiny_bert

    model = attnlens.load(tiny_bert(), tokenizer=bert_tokenizer())
    pairs = list(zip(CORPUS[0:4], CORPUS[4:8], strict=True))
    comparison = attnlens.compare(model, "papa", corpus=pairs, max_len=32, progress=False)
    return comparison.save_html(tmp_path_factory.mktemp("pairs") / "report.html")


def test_explorer_shows_the_segments_of_a_sentence_pair(pair_report, tmp_path):
    steps, _ = explore(pair_report.read_text(encoding="utf-8"), tmp_path)
    first = steps[0]
    assert first["state"] == "ready" and first["names"] == ["standard", "papa"]
    assert first["shapes"] == 2 * 2  # one boundary: a vertical and a horizontal line per panel
    # the hover of the last query ([SEP] of the second sentence) on key 0 ([CLS])
    assert re.fullmatch(
        r"L\d+H\d+ query \d+ '\[SEP\]' \(second sentence\) → key 0 '\[CLS\]' \(first sentence\)",
        first["hover"],
    )
