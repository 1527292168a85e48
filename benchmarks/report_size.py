"""Measure: the size of the default ``attnlens compare`` report (budget: at most 10 MB).

Runs the command with its defaults (the embedded MiniLM, the embedded corpus, max_len 128, every
registered view: standard, papa, effective and norm) through :func:`attnlens.cli.main`, and
prints the report's size and what it is made of: plotly.js (embedded once), the explorer's data
(the kept examples' 8-bit, deflated maps in base64, :mod:`attnlens.present.kept`), the figures
and the rest. With ``--overhead`` it also runs the comparison with ``report_examples=0``
(nothing kept) and prints the ratio of the two run times (whole runs, each once: a rough figure
on a shared machine).

Measured (2 shared CPU cores, torch CPU, one thread, REPORT_EXAMPLES = 50):

- REPORT_BUDGET = 1.5 MB, three default views: 9.28 MB: plotly.js 4.82 MB, the explorer's data
  2.07 MB (22 of the first 50 texts kept: 0-13, 15, 16, 18, 19, 24, 25, 27, 47; the others, of up
  to 128 tokens, take up to 1.8 MB each and did not fit), the three tiled pattern figures 2.23 MB,
  the rest 0.16 MB. Keeping the maps costs compare 1.04x (112 s / 107 s).
- The same budget once the norm view had joined the defaults (a fourth tiled figure): **10.14 MB,
  over the limit** (18 kept, explorer 2.06 MB).
- REPORT_BUDGET = 1.25 MB (2026-11-29): **9.75 MB**: plotly.js 4.82 MB, the explorer's data
  1.67 MB (15 kept: 0-13, 15), the four tiled pattern figures 0.74-0.75 MB each, the rest about
  0.3 MB.

Rerun after changing the figures, the default views or the budget. The limit holds for the
default run: a longer example (``--example``, tiled up to 64 tokens) makes the tiled figures
larger (a 157-token example, cropped to 64, among 64 texts with the 1.5 MB budget: 14.9 MB).

Run: ``HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 python benchmarks/report_size.py [--overhead]``.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path

from common import add_arguments, setup
from plotly.offline import get_plotlyjs

LIMIT = 10_000_000


def breakdown(html: str) -> dict[str, int]:
    """Bytes of plotly.js, of the explorer's data and of each section (from one ``<h2>`` to the
    next: a figure with its caption, the explorer, the tables) of ``html``."""
    plotly_js = len(get_plotlyjs().encode("utf-8"))
    data = re.search(r'<script type="application/json" id="[^"]+-explorer-data">(.*?)</script>', html, re.S)
    parts = {"plotly.js": plotly_js, "explorer data": len(data.group(1).encode("utf-8")) if data else 0}
    sections = re.split(r'(?=<h2 id=")', html)
    for section in sections[1:]:
        name = re.match(r'<h2 id="([^"]+)"', section).group(1)
        size = len(section.encode("utf-8"))
        for part in ("plotly.js", "explorer data"):  # counted above
            if part == "plotly.js" and "plotly.js v" in section:
                size -= plotly_js
            if part == "explorer data" and data and data.group(1) in section:
                size -= parts["explorer data"]
        parts[f"section {name}"] = size
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--overhead", action="store_true", help="also time a run that keeps nothing")
    add_arguments(parser)
    args = parser.parse_args()
    device = setup(args)

    from attnlens import cli
    from attnlens.comparison.result import Comparison

    with tempfile.TemporaryDirectory() as folder:
        report, table = Path(folder) / "report.html", Path(folder) / "comparison.json"
        start = time.perf_counter()
        cli.main(["compare", "--quiet", "--device", device, "--out", str(report), "--json", str(table)])
        seconds = time.perf_counter() - start
        html = report.read_text(encoding="utf-8")
        comparison = Comparison.from_json(table)
    size = len(html.encode("utf-8"))
    kept = comparison.kept_patterns
    print(f"default report: {size / 1e6:.2f} MB (limit {LIMIT / 1e6:.0f} MB): "
          f"{'OK' if size <= LIMIT else 'OVER'}; compare took {seconds:.0f} s")
    print(f"kept {len(kept.examples)} of the first {kept.limit} examples: {kept.indices}; "
          f"{kept.n_bytes / 1e6:.2f} MB compressed (budget {kept.budget / 1e6:.2f} MB)")
    for name, bytes_ in breakdown(html).items():
        print(f"  {name:32s} {bytes_ / 1e6:6.2f} MB")
    if args.overhead:
        import attnlens

        model = attnlens.load(device=device)
        timings = {}
        for keep in (0, kept.limit):
            start = time.perf_counter()
            attnlens.compare(model, "papa", "effective", progress=False, report_examples=keep)
            timings[keep] = time.perf_counter() - start
        print(f"compare keeping {kept.limit} examples / keeping none: "
              f"{timings[kept.limit] / timings[0]:.2f}x ({timings[kept.limit]:.0f} s / {timings[0]:.0f} s)")


if __name__ == "__main__":
    main()
