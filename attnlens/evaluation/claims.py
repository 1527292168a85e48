"""What a PAPA curve and Table 1 let one claim, read from their test columns and nothing else.

The one test convention (:mod:`attnlens.evaluation.conventions`) decides every sentence:

- a difference (a drop, or a rise) is claimed only where ``significant`` (Holm-adjusted
  two-sided ``p_adjusted < 0.05``);
- "no cost" is claimed only where ``equivalent`` (the paired TOST within the point's
  ``margin``); a point that is neither is "not resolved", and ``detectable`` says how large a
  difference its dev set could have found;
- the probe is above (below) its linear baseline only where the paired interval of
  ``versus_linear`` lies above (below) 0;
- PAPA's average beats a baseline matrix only where ``versus_average`` is below 0 with
  ``versus_average_p_adjusted < 0.05``.

:func:`curve_claims` and :func:`table_claims` write these sentences as Markdown lists
(:meth:`attnlens.papa.Curve.claims`, :meth:`attnlens.papa.PapaTable.claims`); ``docs/probing.md``
holds them, written by ``docs/tables.py`` from the committed CSVs.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from attnlens.evaluation.probing.intervals import ALPHA


def curve_claims(table: pd.DataFrame, strategy: str) -> str:
    """One Markdown item per task of a curve's ``table``: its score with no head replaced, the
    largest share of heads replaced up to which every point is shown equivalent, the first
    share with a significant difference, the points neither resolves (with the smallest difference
    their dev sets detect), and where the probe stands against its linear baseline."""
    items = []
    for task, rows in table.groupby("task", sort=False):
        ordered = rows[rows["strategy"] == strategy].sort_values("fraction_replaced")
        if ordered.empty:
            continue
        reference, later = ordered.iloc[0], ordered.iloc[1:]
        parts = [f"**{task}** ({reference['metric']}): {_scored(reference)} with no head replaced"]
        shown = 0.0
        for row in later.itertuples():
            if not _true(row.equivalent):
                break
            shown = row.fraction_replaced
        parts.append(f"shown equivalent (within ± its margin) up to {_share(shown)} of the heads replaced"
                     if shown else "shown equivalent at no share of heads replaced")
        drops = later[[_true(value) for value in later["significant"]]]  # the first significant point
        parts.append(f"significantly different from {_share(drops['fraction_replaced'].iloc[0])} replaced on "
                     f"({_signed(drops['difference'].iloc[0])} there)" if len(drops) else "no significant difference")
        open_rows = later[[not _true(e) and not _true(s) for e, s in zip(later["equivalent"], later["significant"],
                                                                      strict=True)]]
        if len(open_rows):
            parts.append(f"not resolved at {', '.join(_share(f) for f in open_rows['fraction_replaced'])} "
                         f"(detectable there: {_number(open_rows['detectable'].min())} to "
                         f"{_number(open_rows['detectable'].max())})")
        versus = _versus_linear(rows)
        if versus:
            parts.append(versus)
        items.append("- " + "; ".join(parts) + ".")
    return "\n".join(items)


def table_claims(table: pd.DataFrame) -> str:
    """One Markdown item per task of Table 1's long ``table``: every head replaced by the
    average constants against no head replaced, then the average against each baseline
    matrix (``versus_average``, Holm across those tests)."""
    items = []
    for task, rows in table.groupby("task", sort=False):
        if rows["score"].isna().all():
            continue
        by_row = {row["row"]: row for _, row in rows.iterrows()}
        if "original" not in by_row or "average" not in by_row:
            continue
        average = by_row["average"]
        verdict = ("significantly different" if _true(average["significant"])
                   else "shown equivalent" if _true(average["equivalent"]) else "not resolved")
        parts = [f"**{task}** ({average['metric']}): average {_scored(average)} against original "
                 f"{_scored(by_row['original'])}, {_signed(average['difference'])}: {verdict}"]
        above, below, unresolved = [], [], []
        for name, row in by_row.items():
            if name in ("original", "average") or pd.isna(row.get("versus_average", float("nan"))):
                continue
            significant = row["versus_average_p_adjusted"] < ALPHA
            difference = f"{name} {_signed(row['versus_average'])}"
            (above if significant and row["versus_average"] < 0 else below if significant else unresolved).append(
                difference)
        if above:
            parts.append(f"the average is significantly above {', '.join(above)}")
        if below:
            parts.append(f"significantly below {', '.join(below)}")
        if unresolved:
            parts.append(f"not resolved against {', '.join(unresolved)}")
        items.append("- " + "; ".join(parts) + ".")
    return "\n".join(items)


def _versus_linear(rows: pd.DataFrame) -> str:
    """Where a task's probe stands against its linear baseline over the task's points."""
    tested = rows[rows["versus_linear_low"].notna()] if "versus_linear_low" in rows else rows.iloc[:0]
    if tested.empty:
        return ""
    above = int((tested["versus_linear_low"] > 0).sum())
    below = int((tested["versus_linear_high"] < 0).sum())
    return (f"the probe above its linear baseline at {above} of {len(tested)} points, below at {below} "
            f"(paired 95% intervals)")


def _true(value: Any) -> bool:
    """A test column's cell as a claim: only a true value (not NaN, not missing) counts."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return False
    return str(value) in ("True", "true", "1", "1.0")


def _scored(row: Any) -> str:
    low, high = row.get("low", float("nan")), row.get("high", float("nan"))
    interval = "" if pd.isna(low) else f" [{_number(low)}, {_number(high)}]"
    return f"{_number(row['score'])}{interval}"


def _number(value: float) -> str:
    return f"{value:.3f}"


def _signed(value: float) -> str:
    return f"Δ {value:+.3f}"


def _share(fraction: float) -> str:
    return f"{fraction:.4g}"
