"""PAPA's Table 1 on any model: the probe's score with the original attention, with PAPA's
average constants in every head, and with data-free matrices in every head.

Hassid et al. 2022, Table 1 (RoBERTa-base, frozen, probed; regular attention): CoLA 0.47,
MRPC 0.85, SST-2 0.91, MNLI 0.78, NER 0.92, POS 0.93. Its rows replace *all* heads by identity,
Toeplitz or zeros matrices, by PAPA's average (corpus-mean) constants, or by matrices trained
with the task's labels from a Toeplitz or an average start ("Toeplitz init.", "average init.").

:func:`table` is :func:`attnlens.papa.curve` at fractions ``(0, 1)`` with every baseline, read
row by row: ``original`` (no head replaced), ``average`` (every head replaced by
``constants``), then ``identity``, ``toeplitz``, ``zeros`` and ``uniform``, then
``toeplitz_init`` and ``average_init``
(:func:`attnlens.evaluation.curve_inputs.labelled_constants`). Each cell carries the seed-mean
score, its 95% bootstrap interval, the relative score (over ``original``) and the paired
bootstrap test of its drop; each baseline row also the paired test against ``average``
(``versus_average``, :meth:`PapaTable.frame` with ``versus_average=True``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pandas as pd

from attnlens.core.fingerprints import fingerprints_kept
from attnlens.core.plots import papa_table
from attnlens.core.result import Result, frame_from_json, frame_to_json, plain
from attnlens.errors import InputError
from attnlens.evaluation import conventions
from attnlens.evaluation.claims import table_claims
from attnlens.evaluation.curve import ALL_BASELINES, curve
from attnlens.evaluation.curve import COLUMNS as CURVE_COLUMNS
from attnlens.evaluation.probing.intervals import ALPHA

#: The rows of Table 1, in order.
ROWS: tuple[str, ...] = ("original", "average", "identity", "toeplitz", "zeros", "uniform", "toeplitz_init",
                         "average_init")


@dataclass
class PapaTable(Result):
    """Table 1 of a model. ``table``: one row per (row, task) with :attr:`COLUMNS` (those of
    :data:`attnlens.evaluation.curve.COLUMNS`, then ``row``);
    :meth:`frame`: the paper's layout (rows × tasks, ``score [low, high]``); :meth:`figure`:
    bars with their intervals; :meth:`to_json` / :meth:`from_json` (a
    :class:`~attnlens.core.result.Result`)."""

    COLUMNS: ClassVar[dict[str, str]] = {
        **CURVE_COLUMNS,
        "row": "the row of Table 1: original (no head replaced), average (every head replaced by "
               "the constants), the data-free matrix replacing every head, or the matrices trained with the "
               "task's labels from a Toeplitz (toeplitz_init) or the average start (average_init)",
        "note": "why a task of the paper's Table 1 has no score here (empty for the tasks run)",
    }
    FORMAT: ClassVar[str] = "attnlens.PapaTable/1"

    table: pd.DataFrame
    seconds: float = 0.0
    settings: dict = field(default_factory=dict, repr=False)

    def frame(self, *, relative: bool = False, versus_average: bool = False) -> pd.DataFrame:
        """Rows × tasks: ``"0.812 [0.785, 0.835]"`` (``relative=True``: score / original's, or
        ``Δ`` score − original's where the metric can be negative (``relative`` is empty there),
        with ``*`` where the drop is significant, ``significant``: Holm-adjusted;
        ``versus_average=True``: each baseline row's score − average's ``[paired 95%]``, with
        ``*`` where ``versus_average_p_adjusted < 0.05``)."""
        if relative and versus_average:
            raise InputError("frame shows one view: pass relative=True or versus_average=True, not both.")
        cells = self.table.copy()
        if relative:
            cells["cell"] = [_relative_cell(row) for row in cells.itertuples()]
        elif versus_average:
            cells = cells[cells["row"].isin(ROWS[2:])].copy()
            cells["cell"] = [_versus_average_cell(row) for row in cells.itertuples()]
        else:
            cells["cell"] = [_cell(row) for row in cells.itertuples()]
        wide = cells.pivot(index="row", columns="task", values="cell").fillna("–")
        order = [row for row in ROWS if row in wide.index]
        return wide.loc[order, list(dict.fromkeys(cells["task"]))]

    def figure(self) -> Any:
        """One panel per task: a bar per row with its 95% interval (:func:`attnlens.core.plots.papa_table`)."""

        return papa_table(self.table)

    def __repr__(self) -> str:
        return f"PapaTable({', '.join(dict.fromkeys(self.table['task']))}; {self.seconds:.0f} s)\n{self.frame()}"

    def to_markdown(self, *, relative: bool = False, versus_average: bool = False) -> str:
        """The paper's layout as a Markdown table (for docs and notes); ``relative`` and
        ``versus_average``: those views of :meth:`frame`."""
        frame = self.frame(relative=relative, versus_average=versus_average)
        lines = ["| | " + " | ".join(frame.columns) + " |", "|---" * (len(frame.columns) + 1) + "|"]
        lines += [f"| {index} | " + " | ".join(frame.loc[index]) + " |" for index in frame.index]
        return "\n".join(lines)

    def claims(self) -> str:
        """What the table lets one claim, task by task, from its test columns only
        (:func:`attnlens.evaluation.claims.table_claims`): a Markdown list."""
        return table_claims(self.table)

    def to_dict(self) -> dict[str, Any]:
        return {"table": frame_to_json(self.table), "seconds": self.seconds, "settings": plain(self.settings)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PapaTable:
        return cls(frame_from_json(data["table"]), float(data["seconds"]), dict(data.get("settings") or {}))

    @classmethod
    def from_curve(cls, measured: Any, *, unavailable: dict[str, str] | None = None) -> PapaTable:
        """Table 1 read from a :class:`attnlens.papa.Curve` that has the points it needs: no head
        replaced (``original``), every head replaced by the constants (``average``), and any of the
        data-free baselines it measured. One curve run with ``baselines=DATA_FREE`` gives both the
        curve and the table. The table's tests are one family: ``p_adjusted`` and ``significant``
        are Holm's across its rows (:func:`attnlens.evaluation.conventions.apply`).
        ``unavailable``: tasks of the paper's Table 1 that were not run, each with the reason,
        shown as rows with no score and that ``note``
        (:func:`attnlens.evaluation.curve_inputs.missing_tasks`: MNLI, whose dev data is not in
        this environment), never silently absent."""
        long = measured.table.copy()
        strategy = measured.settings["strategy"]
        fractions = long["fraction_replaced"]
        if not ((fractions == 0.0).any() and ((long["strategy"] == strategy) & (fractions == 1.0)).any()):
            raise InputError("Table 1 needs the curve's points at fraction 0 and 1 (no head and every "
                             "head replaced); run papa.curve with fractions including 0.0 and 1.0.")
        kept = (long["strategy"] != strategy) | fractions.isin([0.0, 1.0])
        long = long[kept].copy()
        long["row"] = [
            ("original" if fraction == 0 else "average") if name == strategy else name
            for name, fraction in zip(long["strategy"], long["fraction_replaced"], strict=True)
        ]
        # each task's rows in Table 1's order, whatever order the baselines were given in
        tasks = {task: index for index, task in enumerate(dict.fromkeys(long["task"]))}
        order = {row: index for index, row in enumerate(ROWS)}
        long = long.iloc[sorted(range(len(long)), key=lambda i: (tasks[long["task"].iloc[i]],
                                                                 order[long["row"].iloc[i]]))]
        if "detectable" in long:  # a table of two-sided tests: its rows are one family (Holm)
            long = conventions.apply(long)
        long["note"] = None  # a task run has no note; one not run says why (below)
        rows = [row for row in ROWS if row in set(long["row"])]
        for task, why in (unavailable or {}).items():
            if task not in set(long["task"]):
                long = pd.concat([long, pd.DataFrame([{"task": task, "row": row, "note": why} for row in rows])],
                                 ignore_index=True)
        return cls(long.reset_index(drop=True), measured.seconds, measured.settings)


def _relative_cell(row: Any) -> str:
    if pd.isna(row.score):
        return _cell(row)
    mark = "*" if not pd.isna(row.significant) and bool(row.significant) else ""
    if pd.isna(row.relative):
        return f"Δ {row.difference:+.3f}{mark}" if not pd.isna(row.difference) else "–"
    return f"{row.relative:.3f}{mark}"


def _versus_average_cell(row: Any) -> str:
    value = getattr(row, "versus_average", float("nan"))
    if pd.isna(value):
        return _cell(row) if pd.isna(row.score) else "–"
    mark = "*" if not pd.isna(row.versus_average_p_adjusted) and row.versus_average_p_adjusted < ALPHA else ""
    return f"{value:+.3f} [{row.versus_average_low:+.3f}, {row.versus_average_high:+.3f}]{mark}"


def _cell(row: Any) -> str:
    if pd.isna(row.score):
        return str(row.note) if isinstance(getattr(row, "note", None), str) else "–"
    if pd.isna(row.low):
        return f"{row.score:.3f}"
    return f"{row.score:.3f} [{row.low:.3f}, {row.high:.3f}]"


@fingerprints_kept()  # the weights do not change during a table: fingerprinted once
def table(model: Any, constants: Any, tasks: Sequence[Any], *, lm_texts: Sequence[str] | None = None,
          **options: Any) -> PapaTable:
    """PAPA's Table 1 of ``model`` (see the module docstring): ``tasks`` (names or tasks),
    ``lm_texts`` (also the LM score: the MLM probe for an encoder with an untrained head), the
    other arguments as :func:`attnlens.papa.curve`'s (``seeds``, ``train_limit``, ``baselines``:
    by default every row, the labelled ones included, ...)."""
    options.pop("fractions", None)
    options.setdefault("baselines", ALL_BASELINES)
    measured = curve(model, constants, tasks, fractions=(0.0, 1.0), lm_texts=lm_texts, **options)
    return PapaTable.from_curve(measured)


