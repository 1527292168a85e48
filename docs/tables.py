"""Write the measured tables into docs/probing.md from the files the benchmarks wrote.

- ``docs/probe_baselines.md`` (``benchmarks/probe_baselines.py``): the probe against its linear
  baseline, between the ``probe baselines`` markers;
- ``docs/papa_table.md`` (``benchmarks/curve.py``): PAPA's Table 1 of MiniLM, between the
  ``papa table`` markers;
- ``docs/papa_curve.csv`` (``benchmarks/curve.py``): the curve, between the ``curve table``
  markers, as :func:`curve_markdown` formats it.

Run: ``python docs/tables.py`` after the benchmarks (``tests/system/test_docs.py`` checks the page
holds what the files say).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

DOCS = Path(__file__).resolve().parent
PAGE = DOCS / "probing.md"
MARKERS = {
    "probe baselines": ("<!-- probe baselines: benchmarks/probe_baselines.py writes docs/probe_baselines.md -->",
                        "<!-- end of the probe baselines -->"),
    "papa table": ("<!-- papa table: benchmarks/curve.py writes docs/papa_table.md -->",
                   "<!-- end of the papa table -->"),
    "curve table": ("<!-- curve table: docs/tables.py writes it from docs/papa_curve.csv -->",
                    "<!-- end of the curve table -->"),
}
#: The columns of the curve table on the page, in order.
CURVE_COLUMNS = ("task", "strategy", "kept", "heads", "score", "95% interval", "relative",
                 "drop [paired 95%]", "significant", "linear", "majority")


def _number(value: float) -> str:
    return "–" if pd.isna(value) else f"{value:.4f}"


def curve_markdown(table: pd.DataFrame) -> str:
    """The curve as a Markdown table: one row per (task, strategy, fraction), score with its
    interval, the paired drop against no head replaced, and the two baselines."""
    lines = ["| " + " | ".join(CURVE_COLUMNS) + " |", "|" + " --- |" * len(CURVE_COLUMNS)]
    for row in table.itertuples(index=False):
        interval = "–" if pd.isna(row.low) else f"[{row.low:.4f}, {row.high:.4f}]"
        drop = ("–" if pd.isna(row.difference_low) else
                f"{row.difference:+.4f} [{row.difference_low:+.4f}, {row.difference_high:+.4f}]")
        significant = "–" if pd.isna(row.significant) else ("yes" if bool(row.significant) else "no")
        cells = [row.task, row.strategy, f"{row.fraction_kept:.4f}", str(int(row.heads)), _number(row.score),
                 interval, _number(row.relative), drop, significant, _number(row.baseline), _number(row.majority)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fill(text: str, name: str, block: str) -> str:
    """``text`` with the lines between the markers of ``name`` replaced by ``block``."""
    start, end = MARKERS[name]
    if start not in text or end not in text:
        raise SystemExit(f"docs/probing.md lacks the {name!r} markers: {start} ... {end}")
    before, rest = text.split(start, 1)
    _, after = rest.split(end, 1)
    return f"{before}{start}\n{block.strip()}\n{end}{after}"


def main() -> None:
    text = PAGE.read_text(encoding="utf-8")
    text = fill(text, "probe baselines", (DOCS / "probe_baselines.md").read_text(encoding="utf-8"))
    text = fill(text, "papa table", (DOCS / "papa_table.md").read_text(encoding="utf-8"))
    text = fill(text, "curve table", curve_markdown(pd.read_csv(DOCS / "papa_curve.csv")))
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote the tables into {PAGE}")


if __name__ == "__main__":
    main()
