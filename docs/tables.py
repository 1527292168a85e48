"""Write the measured tables into docs/probing.md, between their markers, from the files the
benchmarks and ``attnlens curve`` wrote: ``docs/probe_choices.md``
(``benchmarks/probe_choices.py``), ``docs/epoch_choice.md`` (``benchmarks/epoch_choice.py``),
``docs/probe_baselines.md`` (``benchmarks/probe_baselines.py``), ``docs/papa_table.md`` (Table 1, ``attnlens curve --table``)
and ``docs/papa_curve.csv`` (``attnlens curve --out``, as :meth:`Curve.to_markdown` shows it), Table 1's
relative view and its baselines against the average (``docs/papa_table_relative.md``,
``docs/papa_table_versus_average.md``), and what the table and the curve let one claim
(:meth:`PapaTable.claims`, :meth:`Curve.claims`: the page's sentences about them follow these).

Run: ``python docs/tables.py`` after them (``tests/system/test_docs.py`` checks the page holds
what the files say).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from attnlens.evaluation.curve import Curve
from attnlens.evaluation.table import PapaTable

DOCS = Path(__file__).resolve().parent
PAGE = DOCS / "probing.md"
MARKERS = {
    "probe choices": ("<!-- probe choices: benchmarks/probe_choices.py writes docs/probe_choices.md -->",
                      "<!-- end of the probe choices -->"),
    "probe baselines": ("<!-- probe baselines: benchmarks/probe_baselines.py writes docs/probe_baselines.md -->",
                        "<!-- end of the probe baselines -->"),
    "papa table": ("<!-- papa table: attnlens curve --table writes docs/papa_table.md -->",
                   "<!-- end of the papa table -->"),
    "curve table": ("<!-- curve table: docs/tables.py writes it from docs/papa_curve.csv (Curve.to_markdown) -->",
                    "<!-- end of the curve table -->"),
    "lm check": ("<!-- lm check: benchmarks/lm_check.py writes docs/lm_check.md -->", "<!-- end of the lm check -->"),
    "epoch choice": ("<!-- epoch choice: benchmarks/epoch_choice.py writes docs/epoch_choice.md -->",
                     "<!-- end of the epoch choice -->"),
    "table claims": ("<!-- table claims: docs/tables.py writes them from docs/papa_table.csv (PapaTable.claims) -->",
                     "<!-- end of the table claims -->"),
    "versus average": ("<!-- versus average: attnlens curve --table writes docs/papa_table_versus_average.md -->",
                       "<!-- end of the versus average -->"),
    "relative table": ("<!-- relative table: attnlens curve --table writes docs/papa_table_relative.md -->",
                       "<!-- end of the relative table -->"),
    "curve claims": ("<!-- curve claims: docs/tables.py writes them from docs/papa_curve.csv (Curve.claims) -->",
                     "<!-- end of the curve claims -->"),
}


def blocks() -> dict[str, str]:
    """What goes between each pair of markers."""
    return {"probe choices": (DOCS / "probe_choices.md").read_text(encoding="utf-8"),
            "probe baselines": (DOCS / "probe_baselines.md").read_text(encoding="utf-8"),
            "papa table": (DOCS / "papa_table.md").read_text(encoding="utf-8"),
            "curve table": Curve.read_csv(DOCS / "papa_curve.csv").to_markdown(),
            "lm check": (DOCS / "lm_check.md").read_text(encoding="utf-8"),
            "epoch choice": (DOCS / "epoch_choice.md").read_text(encoding="utf-8"),
            "table claims": PapaTable(pd.read_csv(DOCS / "papa_table.csv")).claims(),
            "versus average": (DOCS / "papa_table_versus_average.md").read_text(encoding="utf-8"),
            "relative table": (DOCS / "papa_table_relative.md").read_text(encoding="utf-8"),
            "curve claims": Curve.read_csv(DOCS / "papa_curve.csv").claims()}


def fill(text: str, name: str, block: str) -> str:
    """``text`` with the lines between the markers of ``name`` replaced by ``block``."""
    start, end = MARKERS[name]
    if start not in text or end not in text:
        raise SystemExit(f"docs/probing.md lacks the {name!r} markers: {start} ... {end}")
    before, rest = text.split(start, 1)
    _, after = rest.split(end, 1)
    return f"{before}{start}\n{block.strip()}\n{end}{after}"


if __name__ == "__main__":
    text = PAGE.read_text(encoding="utf-8")
    for name, block in blocks().items():
        text = fill(text, name, block)
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote the tables into {PAGE}")
