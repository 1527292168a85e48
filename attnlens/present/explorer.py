"""The interactive part of the HTML report: any example, any head, every view side by side.

A reader picks one of the kept examples (:attr:`attnlens.comparison.result.Comparison.kept_patterns`, in a
select box listing each text's first words) and a layer and head (two select boxes, or a click on
a cell of any head-grid figure of the report), and sees that head's map under every view of the
comparison side by side, tokens on both axes (queries down, keys across). A checkbox shows each
non-standard view minus standard instead. A sentence pair's segments are separated by dotted
lines at the separator boundary and named in the hover.

Colour scales follow :mod:`attnlens.core.plots`: sequential from 0 (:data:`attnlens.core.plots.SEQUENTIAL`)
for non-negative maps (standard, PAPA), diverging and centred on 0
(:data:`attnlens.core.plots.DIVERGING`) for signed ones (effective attention, differences).

Everything is in the page, nothing is fetched: the maps are embedded as base64 of their deflated
8-bit codes (:mod:`attnlens.present.kept`) in a ``<script type="application/json">`` element and
inflated by the browser (``DecompressionStream("deflate")``) when an example is first shown; the
figure is drawn by the plotly.js the report embeds once. :func:`section` gives the controls and
the plot's ``<div>``, :func:`script` the data and code, to be placed after every figure of the
report (it binds the head grids' ``plotly_click``).
"""

from __future__ import annotations

import html
import json
from typing import Any

import numpy as np
import plotly.colors
import torch

from attnlens.core import plots
from attnlens.present import kept
from attnlens.present.columns import is_signed
from attnlens.present.figures import blank_later_keys

# a comparison (attnlens.comparison.result.Comparison) arrives as an argument: the comparison imports the
# presentation layer, never the other way round
Comparison = Any

#: names of a pair's segments in the hover (segment 0, segment 1)
SEGMENT_NAMES: tuple[str, str] = ("first sentence", "second sentence")

_JS = r"""
(function () {
  "use strict";
  var PREFIX = %(prefix)s;
  var root = document.getElementById(PREFIX + "-explorer");
  var source = document.getElementById(PREFIX + "-explorer-data");
  if (!root || !source || typeof Plotly === "undefined") { return; }
  var data = JSON.parse(source.textContent);
  var plot = document.getElementById(PREFIX + "-side_by_side");
  var status = root.querySelector(".explorer-status");
  var pick = {};
  ["example", "layer", "head", "difference"].forEach(function (name) {
    pick[name] = root.querySelector('[name="' + name + '"]');
  });
  var cache = {}, drawn = 0;

  function bytes(text) {
    var raw = atob(text), out = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) { out[i] = raw.charCodeAt(i); }
    return out;
  }
  function codes(e, view) {  // a promise of the example's inflated codes [layer, head, q, k]
    var key = e + "/" + view;
    if (!cache[key]) {
      if (typeof DecompressionStream === "undefined") {
        return Promise.reject(new Error("this browser cannot inflate the maps (no DecompressionStream)"));
      }
      var stream = new Blob([bytes(data.examples[e].codes[view])]).stream()
        .pipeThrough(new DecompressionStream("deflate"));
      cache[key] = new Response(stream).arrayBuffer().then(function (b) { return new Uint8Array(b); });
    }
    return cache[key];
  }
  function matrix(e, view, values, layer, head) {  // [q][k] values, null where blanked
    var ex = data.examples[e], n = ex.tokens.length, h = layer * data.n_heads + head;
    var scale = ex.scales[view][h], zero = data.signed[view] ? data.zero : 0, base = h * n * n;
    var blank = data.blank[view], z = [];
    for (var q = 0; q < n; q++) {
      var row = new Array(n);
      for (var k = 0; k < n; k++) {
        row[k] = blank && k > q ? null : (values[base + q * n + k] - zero) * scale;
      }
      z.push(row);
    }
    return z;
  }
  function minus(a, b) {
    return a.map(function (row, q) {
      return row.map(function (v, k) { return v === null || b[q][k] === null ? null : v - b[q][k]; });
    });
  }
  function escape(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }
  function colours(z, signed) {
    var top = 0, low = 0;
    z.forEach(function (row) { row.forEach(function (v) {
      if (v !== null) { top = Math.max(top, signed ? Math.abs(v) : v); low = Math.min(low, v); }
    }); });
    top = top || 1;
    return signed ? {colorscale: data.colourscales.diverging, zmin: -top, zmax: top, zmid: 0}
                  : {colorscale: data.colourscales.sequential, zmin: 0, zmax: top};
  }
  function figure(e, layer, head, maps, difference) {
    var ex = data.examples[e], n = ex.tokens.length, views = data.views, count = views.length;
    var labels = ex.tokens.map(escape), pair = ex.segments.some(function (s) { return s > 0; });
    var where = function (i) { return pair ? " (" + data.segment_names[ex.segments[i]] + ")" : ""; };
    var text = [], ticks = [], q, k;
    for (q = 0; q < n; q++) {
      var row = new Array(n);
      for (k = 0; k < n; k++) {
        row[k] = "L" + layer + "H" + head + " query " + q + " '" + labels[q] + "'" + where(q) +
          " → key " + k + " '" + labels[k] + "'" + where(k);
      }
      text.push(row);
    }
    var step = Math.max(1, Math.ceil(n / data.max_ticks));
    for (q = 0; q < n; q += step) { ticks.push(q); }
    var positions = ticks.map(function (i) { return labels[i]; });
    var boundaries = [];
    for (q = 1; q < n; q++) { if (ex.segments[q] !== ex.segments[q - 1]) { boundaries.push(q - 0.5); } }
    var spacing = 0.09, width = (1 - spacing * (count - 1)) / count, traces = [];
    var layout = {
      title: {text: "Layer " + layer + ", head " + head + ": " + views.join(" vs ") +
        (difference ? " (minus standard)" : "") + " (example " + ex.index + ")"},
      height: Math.round(190 + Math.min(540, 900 / count)),
      margin: {l: 90, r: 40, t: 80, b: 100}, plot_bgcolor: "white", annotations: [], shapes: [],
      meta: {kind: "explorer", example: ex.index, layer: layer, head: head, difference: difference}
    };
    var indices = [];
    for (q = 0; q < n; q++) { indices.push(q); }
    views.forEach(function (view, i) {
      var shifted = difference && view !== "standard";
      var name = shifted ? view + " − standard" : view, z = maps[view];
      var left = i * (width + spacing), right = left + width, axis = i ? String(i + 1) : "";
      var trace = {
        type: "heatmap", z: z, x: indices, y: indices, text: text, hoverongaps: false, name: view,
        hovertemplate: "%%{text}<br>" + escape(name) + ": %%{z:.3f}<extra></extra>",
        xaxis: "x" + axis, yaxis: "y" + axis,
        colorbar: {x: right + 0.005, thickness: 10, len: 0.8, title: {text: escape(name), side: "right"}}
      };
      var scale = colours(z, shifted || data.signed[view]);
      for (var key in scale) { trace[key] = scale[key]; }
      traces.push(trace);
      layout["xaxis" + axis] = {
        domain: [left, right], anchor: "y" + axis, tickmode: "array", tickvals: ticks,
        ticktext: positions, tickangle: -90, tickfont: {size: n <= 20 ? 11 : 9},
        title: {text: "key"}, showgrid: false, zeroline: false, constrain: "domain"
      };
      layout["yaxis" + axis] = {
        domain: [0, 1], anchor: "x" + axis, tickmode: "array", tickvals: ticks, ticktext: positions,
        tickfont: {size: n <= 20 ? 11 : 9}, autorange: "reversed", showticklabels: i === 0,
        title: {text: i === 0 ? "query" : ""}, showgrid: false, zeroline: false,
        scaleanchor: "x" + axis, constrain: "domain", constraintoward: "top"
      };
      layout.annotations.push({
        text: escape(name), x: (left + right) / 2, y: 1, xref: "paper", yref: "paper",
        xanchor: "center", yanchor: "bottom", showarrow: false, font: {size: 14}
      });
      boundaries.forEach(function (b) {
        var line = {color: "#1f2933", width: 1.5, dash: "dot"};
        layout.shapes.push({type: "line", xref: "x" + axis, yref: "y" + axis,
          x0: b, x1: b, y0: -0.5, y1: n - 0.5, line: line});
        layout.shapes.push({type: "line", xref: "x" + axis, yref: "y" + axis,
          x0: -0.5, x1: n - 0.5, y0: b, y1: b, line: line});
      });
    });
    return {data: traces, layout: layout};
  }
  function draw() {
    var e = +pick.example.value, layer = +pick.layer.value, head = +pick.head.value;
    var difference = !!(pick.difference && pick.difference.checked), token = ++drawn;
    root.setAttribute("data-state", "loading");
    return Promise.all(data.views.map(function (view) { return codes(e, view); }))
      .then(function (arrays) {
        if (token !== drawn) { return null; }  // a newer choice is being drawn
        var maps = {};
        data.views.forEach(function (view, i) { maps[view] = matrix(e, view, arrays[i], layer, head); });
        if (difference) {
          data.views.forEach(function (view) {
            if (view !== "standard") { maps[view] = minus(maps[view], maps.standard); }
          });
        }
        var built = figure(e, layer, head, maps, difference);
        return Plotly.newPlot(plot, built.data, built.layout, data.config);
      })
      .then(function () {
        if (token !== drawn) { return; }
        var ex = data.examples[e];
        status.textContent = "Example " + ex.index + " (" + ex.tokens.length + " tokens), layer " +
          layer + ", head " + head + ".";
        root.setAttribute("data-state", "ready");
      })
      .catch(function (error) {
        status.textContent = "Cannot draw the maps: " + error;
        root.setAttribute("data-state", "error");
        console.error("attnlens explorer: " + error);
      });
  }
  function select(layer, head) {
    if (!(layer >= 0 && layer < data.n_layers && head >= 0 && head < data.n_heads)) { return null; }
    pick.layer.value = String(layer);
    pick.head.value = String(head);
    return draw();
  }
  ["example", "layer", "head", "difference"].forEach(function (name) {
    if (pick[name]) { pick[name].addEventListener("change", draw); }
  });
  data.grids.forEach(function (id) {
    var gd = document.getElementById(id);
    if (!gd || typeof gd.on !== "function") { return; }
    gd.on("plotly_click", function (event) {
      var point = event && event.points && event.points[0];
      if (!point) { return; }
      select(Math.round(+point.y), Math.round(+point.x));
      if (root.scrollIntoView) { root.scrollIntoView({block: "start"}); }
    });
  });
  root.attnlensSelect = select;
  draw();
})();
"""


def _kept(c: Comparison) -> kept.KeptPatterns:
    """The comparison's kept examples, or (older comparisons, ``report_examples=0``) only the
    shown example, coded here from its exact maps (segments unknown: none drawn)."""
    if c.kept_patterns is not None and c.kept_patterns.examples:
        return c.kept_patterns

    signed = tuple(view for view in c.views if is_signed(view))
    codes, scales = {}, {}
    for view, array in c.example_patterns.items():
        code, scale = kept.encode(torch.from_numpy(np.asarray(array, dtype=np.float32)), signed=view in signed)
        codes[view], scales[view] = code.numpy(), scale.numpy()
    tokens = list(c.example_tokens)
    example = kept.KeptExample.from_codes(
        c.example_index, " ".join(tokens), tokens, [0] * len(tokens), codes, scales
    )
    return kept.KeptPatterns(tuple(c.example_patterns), signed, c.n_layers, c.n_heads, [example], 1, 0, 1)


def data(c: Comparison, grids: list[str]) -> dict[str, Any]:
    """What the explorer's script reads (JSON-ready): the kept examples (tokens, segments,
    base64 codes, scales), the views and how to colour and blank them, the head grids' ids."""
    store = _kept(c)
    views = [view for view in c.views if view in store.views]
    examples = store.to_dict()["examples"]
    shown = next((i for i, e in enumerate(examples) if e["index"] == c.example_index), 0)
    return {
        "views": views,
        "signed": {view: view in store.signed for view in views},
        "blank": {view: blank_later_keys(c, view) for view in views},
        "zero": kept.SIGNED_ZERO,
        "n_layers": c.n_layers,
        "n_heads": c.n_heads,
        "examples": examples,
        "shown": shown,
        "focus": list(c.focus),
        "segment_names": list(SEGMENT_NAMES),
        "max_ticks": plots.MAX_TICK_LABELS,
        "colourscales": {
            "sequential": plotly.colors.get_colorscale(plots.SEQUENTIAL),
            "diverging": plotly.colors.get_colorscale(plots.DIVERGING),
        },
        "grids": grids,
        "config": {"displaylogo": False, "responsive": True},
    }


def caption(c: Comparison) -> str:
    """What the explorer shows and how the examples were chosen."""
    store = _kept(c)
    count = len(store.examples)
    if c.kept_patterns is not None and c.kept_patterns.examples:
        chosen = (
            f"{count} example{'s' if count != 1 else ''} of the corpus: those among the first "
            f"{store.limit} whose maps fit in the report's budget of {store.budget / 1e6:.1f} MB, "
            "and the one shown first"
        )
    else:
        chosen = "the shown example only (this comparison kept no others)"
    text = (
        f"Pick an example ({chosen}) and a head, or click a cell of any head grid: that head's "
        "map under each view, side by side, queries down and keys across; \"minus standard\" "
        "shows each other view's difference from standard on a diverging scale. Maps are "
        "stored with 8-bit precision (within 1/510 of each map's largest value)."
    )
    if any(any(s) for s in (e.segments for e in store.examples)):
        text += " Dotted lines separate a sentence pair's segments (named in the hover)."
    return text


def section(c: Comparison, prefix: str) -> str:
    """The explorer's controls, status line and plot ``<div>`` (``{prefix}-side_by_side``)."""
    store = _kept(c)
    shown = next((e.index for e in store.examples if e.index == c.example_index), None)
    options = "".join(
        f'<option value="{i}"{" selected" if e.index == shown else ""}>'
        f"{e.index}: {html.escape(e.label)}</option>"
        for i, e in enumerate(store.examples)
    )
    layer, head = c.focus
    layers = "".join(
        f'<option value="{i}"{" selected" if i == layer else ""}>L{i}</option>' for i in range(c.n_layers)
    )
    heads = "".join(
        f'<option value="{i}"{" selected" if i == head else ""}>H{i}</option>' for i in range(c.n_heads)
    )
    difference = (
        '<label><input type="checkbox" name="difference"> minus standard</label>'
        if "standard" in c.views and len(c.views) > 1 else ""
    )
    height = round(190 + min(540, 900 / len(store.views)))  # as the script draws it
    return (
        f'<div class="explorer" id="{prefix}-explorer" data-state="loading">'
        f'<div class="explorer-controls"><label>example <select name="example">{options}</select></label>'
        f'<label>layer <select name="layer">{layers}</select></label>'
        f'<label>head <select name="head">{heads}</select></label>{difference}</div>'
        f'<div class="explorer-plot" id="{prefix}-side_by_side" style="height: {height}px; width: 100%;"></div>'
        '<p class="explorer-status caption"></p></div>'
    )


def script(c: Comparison, prefix: str, grids: list[str]) -> str:
    """The explorer's data (JSON, ``<`` escaped) and code; place it after every figure (the
    head grids ``grids``, by ``<div>`` id, must exist when it runs)."""
    payload = json.dumps(data(c, grids), separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    code = _JS % {"prefix": json.dumps(prefix)}
    return (
        f'<script type="application/json" id="{prefix}-explorer-data">{payload}</script>'
        f'<script type="text/javascript">{code}</script>'
    )


CSS = """
.attnlens-report .explorer-controls { display: flex; flex-wrap: wrap; gap: 8px 20px; margin: 8px 0;
       font-size: 0.9rem; align-items: center; }
.attnlens-report .explorer-controls select { max-width: 36rem; font-size: 0.9rem; }
"""
