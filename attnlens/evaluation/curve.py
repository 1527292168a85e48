"""The PAPA curve: task scores as input-dependent heads are replaced by constants.

Hassid et al. 2022 (Fig. 2, Table 1) replace a growing share of a frozen model's heads by their
constant (corpus-mean) attention and probe what is left, at fractions {1, 1/2, 1/8, 1/16, 0} of
the input-dependent heads *kept*: replaced fractions ``(0, 0.5, 0.875, 0.9375, 1)``. Data-free
constants (identity, Toeplitz, zeros) replacing every head are the baselines, and so are the
paper's labelled rows: matrices trained with the task's labels from a Toeplitz or an average start
(:func:`attnlens.evaluation.curve_inputs.labelled_constants`). Each baseline row is also tested
against the average constants in every head (``versus_average``: does PAPA's average beat it?).

:func:`curve` probes every (task, fraction) with :func:`attnlens.evaluation.probing.run` (features cached,
so a repeated or interrupted curve reuses every finished point) and, with ``lm_texts``, adds the
language-model score of each point (:func:`attnlens.evaluation.lm.scorer.evaluate`: the model's own trained head,
or the MLM probe when its head is untrained), named by its kind.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pandas as pd

from attnlens.core import fast_heads
from attnlens.core.checks import finite, optional_count, whole_number
from attnlens.core.files import write_atomic
from attnlens.core.fingerprints import fingerprints_kept
from attnlens.core.heads import n_selected
from attnlens.core.notebook import curve_html
from attnlens.core.plots import papa_curve
from attnlens.core.result import Result, frame_from_json, frame_to_json, plain
from attnlens.engine.distributed import world
from attnlens.errors import InputError, InputTypeError, MismatchError
from attnlens.evaluation import conventions, points, probing
from attnlens.evaluation.claims import curve_claims
from attnlens.evaluation.curve_inputs import (
    LABELLED,
    LABELLED_LR,
    LABELLED_STEPS,
    checked_constants,
    labelled_constants,
    lambda_order,
)
from attnlens.evaluation.lm import scorer
from attnlens.evaluation.probing.features import hooks_key
from attnlens.evaluation.probing.scoring import as_seeds, task_examples
from attnlens.methods import interventions
from attnlens.methods.papa import baselines as data_free
from attnlens.methods.papa.constants import PapaConstants
from attnlens.methods.papa.selection import STRATEGIES, select_heads

#: Replaced fractions of the paper's curve (kept: 1, 1/2, 1/8, 1/16, 0).
FRACTIONS: tuple[float, ...] = (0.0, 0.5, 0.875, 0.9375, 1.0)
BASELINES: tuple[str, ...] = ("identity", "toeplitz", "zeros")
#: Every data-free matrix a curve or a table can show (:mod:`attnlens.methods.papa.baselines`).
DATA_FREE: tuple[str, ...] = ("identity", "toeplitz", "zeros", "uniform")
#: Every baseline of a curve or a table: the data-free matrices, then those trained with labels.
ALL_BASELINES: tuple[str, ...] = (*DATA_FREE, *LABELLED)
#: Probe seeds per point by default (PAPA §4.1: three seeds).
SEEDS = 3

#: Columns of :attr:`Curve.table`.
COLUMNS = {
    "task": "task name (or 'lm' for the language-model score)",
    "strategy": "how heads were chosen (a select_heads strategy) or the data-free baseline",
    "fraction_replaced": "share of all heads replaced by constants",
    "fraction_kept": "share of input-dependent heads kept (1 - fraction_replaced)",
    "heads": "number of heads replaced",
    "score": "the task's metric on the evaluation split, mean over probe seeds (LM: negative log-perplexity)",
    "low": "95% bootstrap interval of score over the evaluation examples and the probe seeds: lower end",
    "high": "95% bootstrap interval of score: upper end",
    "seed_std": "standard deviation of the score over probe seeds",
    "metric": "which metric (or LM score kind)",
    "relative": "score / score with no head replaced (the same task and strategy); empty where the metric can be "
                "negative (Matthews correlation, the LM's log-likelihood): read difference there",
    "difference": "score minus the score with no head replaced, on the same examples",
    "difference_low": "95% paired bootstrap interval of difference (examples and probe seeds): lower end",
    "difference_high": "95% paired bootstrap interval of difference: upper end",
    "p_value": "paired bootstrap, two-sided: 2 min(P*(d <= 0), P*(d >= 0)) over the resampled differences "
               "(empty for the reference point itself)",
    "p_adjusted": "p_value adjusted by Holm's step-down method across the tests of the table",
    "significant": "whether p_adjusted < 0.05",
    "detectable": "the difference this dev set detects with 80% power at two-sided 0.05, at the observed spread",
    "margin": "the equivalence margin: conventions.EQUIVALENCE_MARGIN (2%) of the absolute score with no head replaced",
    "equivalent": "paired TOST at 0.05: whether the 90% interval of difference lies inside (-margin, margin)",
    "versus_linear": "score minus the linear baseline's, on the same examples (the probe above linear: > 0)",
    "versus_linear_low": "95% paired bootstrap interval of versus_linear: lower end",
    "versus_linear_high": "95% paired bootstrap interval of versus_linear: upper end",
    "baseline": "linear baseline (logistic regression on the same features) under the same hooks",
    "baseline_low": "95% bootstrap interval of baseline: lower end",
    "baseline_high": "95% bootstrap interval of baseline: upper end",
    "majority": "score of always predicting the most frequent training label",
    "majority_low": "95% bootstrap interval of majority: lower end",
    "majority_high": "95% bootstrap interval of majority: upper end",
    "versus_average": "a baseline row's score minus the score with every head replaced by the curve's "
                      "constants (PAPA's average), on the same examples and seeds (PAPA's average above it: < 0)",
    "versus_average_low": "95% paired bootstrap interval of versus_average: lower end",
    "versus_average_high": "95% paired bootstrap interval of versus_average: upper end",
    "versus_average_p": "two-sided paired bootstrap p-value of versus_average",
    "versus_average_p_adjusted": "versus_average_p adjusted by Holm's method across the table's versus_average tests",
}


#: The columns of :meth:`Curve.to_markdown`, in order.
MARKDOWN_COLUMNS: tuple[str, ...] = (
    "task", "strategy", "kept", "heads", "score [95%]", "relative", "difference [paired 95%]", "p (Holm)",
    "significant", "detectable", "equivalent (± margin)", "probe − linear [paired 95%]", "linear [95%]",
    "majority [95%]")


def _number(value: float) -> str:
    return "–" if pd.isna(value) else f"{value:.4f}"


def _yes_no(value: Any) -> str:
    return "–" if value is None or pd.isna(value) else ("yes" if bool(value) else "no")


def _with_interval(value: float, low: float, high: float, *, signed: bool = False) -> str:
    """``0.8120 [0.7890, 0.8340]`` (``signed``: with its sign), ``–`` for no number."""
    if pd.isna(value):
        return "–"
    form = "+.4f" if signed else ".4f"
    return format(value, form) + ("" if pd.isna(low) else f" [{format(low, form)}, {format(high, form)}]")


@dataclass
class Curve(Result):
    """The table of :data:`COLUMNS` (one row per task, strategy and fraction), the seconds spent
    (``seconds``: wall time; ``forward_seconds``: extracting features, i.e. forward passes or
    cache reads; ``probe_seconds``: training and running the probes and their linear baselines,
    whose share of the time of all :attr:`processes` is :attr:`probe_share`; the last two are
    summed over the processes that shared the points), ``timings`` (per task point computed: ``task``,
    ``strategy``, ``fraction``, ``features``, ``probe`` and ``baseline`` seconds (a later
    point's ``probe``: its share of the stacked fit of its task's later points), the ``rank``
    that ran it, 0 without ``torch.distributed``, and ``resumed``: read back from a
    ``checkpoint`` folder, its seconds those of the run that computed it; a point whose
    hooks another point already ran is not computed again), and :meth:`figure`. A
    :class:`~attnlens.core.result.Result`: :meth:`to_json` / :meth:`from_json` keep all of it
    (``settings`` values that are not JSON as their ``str``), :meth:`to_csv` the table."""

    COLUMNS: ClassVar[dict[str, str]] = COLUMNS
    FORMAT: ClassVar[str] = "attnlens.Curve/1"

    table: pd.DataFrame
    seconds: float = 0.0
    forward_seconds: float = 0.0
    settings: dict = field(default_factory=dict, repr=False)
    timings: list = field(default_factory=list, repr=False)
    probe_seconds: float = 0.0

    @property
    def processes(self) -> int:
        """How many processes shared the curve's points (``torch.distributed`` ranks; 1 without)."""
        return int(self.settings.get("processes", 1))

    @property
    def probe_share(self) -> float:
        """Probe (and linear baseline) training's share of the time of all processes,
        :attr:`seconds` × :attr:`processes` (0 when none)."""
        return self.probe_seconds / (self.seconds * self.processes) if self.seconds > 0 else 0.0

    def figure(self) -> Any:
        """Score against the share of input-dependent heads kept, one line per task and
        strategy, the baselines as marks at 0 kept (:func:`attnlens.core.plots.papa_curve`)."""

        return papa_curve(self.table)

    def __repr__(self) -> str:
        tasks = ", ".join(dict.fromkeys(self.table["task"]))
        return f"Curve({tasks}; {len(self.table)} points, {self.seconds:.0f} s)"

    def _repr_html_(self) -> str:
        """Jupyter's view: tasks, the first rows of the table (:func:`attnlens.present.display.curve_html`)."""
        return curve_html(self)

    def to_csv(self, path: Any, *, overwrite_read_only: bool = False) -> Any:
        """Write the table as CSV, atomically (:func:`attnlens.core.files.write_atomic`)."""
        return write_atomic(path, self.table.to_csv(index=False).encode("utf-8"),
                            overwrite_read_only=overwrite_read_only)

    def to_markdown(self) -> str:
        """The table as the docs show it (``docs/probing.md``), in Markdown: one row per task,
        strategy and fraction (:data:`MARKDOWN_COLUMNS`): the share of heads kept, the heads
        replaced, the score and every baseline with its 95% interval, the relative score, the
        paired difference against no head replaced with its 95% interval, its Holm-adjusted
        p-value and whether it is significant, the difference its dev set detects, whether the
        paired TOST shows it equivalent within its margin, and the probe against its linear
        baseline; ``–`` where a row has no such number (the reference point's own test, the LM's
        model head)."""
        lines = ["| " + " | ".join(MARKDOWN_COLUMNS) + " |", "|" + " --- |" * len(MARKDOWN_COLUMNS)]
        for row in self.table.reindex(columns=list(COLUMNS)).itertuples(index=False):
            cells = [row.task, row.strategy, f"{row.fraction_kept:.4f}", str(int(row.heads)),
                     _with_interval(row.score, row.low, row.high), _number(row.relative),
                     _with_interval(row.difference, row.difference_low, row.difference_high, signed=True),
                     _number(row.p_adjusted), _yes_no(row.significant), _number(row.detectable),
                     "–" if pd.isna(row.margin) else f"{_yes_no(row.equivalent)} (± {row.margin:.4f})",
                     _with_interval(row.versus_linear, row.versus_linear_low, row.versus_linear_high, signed=True),
                     _with_interval(row.baseline, row.baseline_low, row.baseline_high),
                     _with_interval(row.majority, row.majority_low, row.majority_high)]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def claims(self) -> str:
        """What the curve lets one claim, task by task, from its test columns only
        (:func:`attnlens.evaluation.claims.curve_claims`): a Markdown list."""
        return curve_claims(self.table, str(self.settings.get("strategy", self.table["strategy"].iloc[0])))

    @classmethod
    def read_csv(cls, path: str | os.PathLike) -> Curve:
        """A curve from the CSV of its table (:meth:`to_csv`), seconds 0. Its ``settings``:
        the ``strategy`` (the first row's: a curve starts with no head replaced, in its
        strategy's order), the ``fractions`` of that strategy and the other strategies as
        ``baselines``."""
        table = pd.read_csv(path)
        missing = [name for name in ("task", "strategy", "fraction_replaced", "score") if name not in table]
        if missing or table.empty:
            raise InputError(f"{path} is not the CSV of a curve (Curve.to_csv): "
                             f"{f'it has no {missing[0]!r} column' if missing else 'it has no row'}.")
        strategy = str(table["strategy"].iloc[0])
        ordered = table["strategy"] == strategy
        settings = {"strategy": strategy,
                    "fractions": [float(f) for f in dict.fromkeys(table.loc[ordered, "fraction_replaced"])],
                    "baselines": list(dict.fromkeys(table.loc[~ordered, "strategy"]))}
        # a table made before a column existed keeps the columns it has (docs/papa_curve.csv
        # predates the two-sided tests: its p_value is one-sided, and it has no p_adjusted)
        return cls(table.reindex(columns=[name for name in COLUMNS if name in table]), settings=settings)

    @classmethod
    def combine(cls, curves: Sequence[Curve]) -> Curve:
        """One curve from the curves of runs split by task (a task's rows depend on its own
        probes only, so they join as those of one run would): their tables in order, the LM's
        rows last; their seconds summed (the cold time of the whole is the sum of the runs'),
        their ``timings`` joined, and the ``fractions`` and ``baselines`` of any of them in
        ``settings``; ``p_adjusted`` and ``significant`` are Holm's across the joined table, as one
        run's (:func:`attnlens.evaluation.conventions.apply`). Refused: a task in more than one curve, or curves of different
        strategies."""
        curves = list(curves)
        if not curves or not all(isinstance(one, Curve) for one in curves):
            raise InputTypeError("Curve.combine takes a list of curves (e.g. [Curve.read_csv(path), ...]).")
        seen: dict[str, int] = {}
        for index, one in enumerate(curves):
            for task in dict.fromkeys(one.table["task"]):
                if task in seen:
                    raise InputError(f"task {task!r} is in curves {seen[task]} and {index}; give each task once.")
                seen[task] = index
        strategies = list(dict.fromkeys(str(one.settings.get("strategy")) for one in curves))
        if len(strategies) > 1:
            raise MismatchError(f"the curves replace heads in different orders ({', '.join(strategies)}); "
                                "combine curves of one strategy.")
        table = pd.concat([one.table for one in curves], ignore_index=True)
        table = pd.concat([table[table["task"] != "lm"], table[table["task"] == "lm"]], ignore_index=True)
        if "detectable" in table:  # two-sided tests: the joined table is one family (Holm across it)
            table = conventions.apply(table)
        settings = {**curves[0].settings,
                    "fractions": sorted({float(f) for one in curves for f in one.settings.get("fractions", ())}),
                    "baselines": list(dict.fromkeys(b for one in curves for b in one.settings.get("baselines", ())))}
        return cls(table, sum(one.seconds for one in curves), sum(one.forward_seconds for one in curves),
                   settings, [timing for one in curves for timing in one.timings],
                   sum(one.probe_seconds for one in curves))

    def to_dict(self) -> dict[str, Any]:
        return {"table": frame_to_json(self.table), "seconds": self.seconds,
                "forward_seconds": self.forward_seconds, "probe_seconds": self.probe_seconds,
                "settings": plain(self.settings), "timings": plain(self.timings)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Curve:
        return cls(frame_from_json(data["table"]), float(data["seconds"]), float(data["forward_seconds"]),
                   dict(data.get("settings") or {}), list(data.get("timings") or []),
                   float(data.get("probe_seconds", 0.0)))


@fingerprints_kept()  # the weights do not change during a curve: fingerprinted once
def curve(
    model: Any,
    constants: Any,
    tasks: Sequence[Any],
    *,
    fractions: Sequence[float | int] = FRACTIONS,
    strategy: str = "input_dependence",
    baselines: Sequence[str] = BASELINES,
    lm_texts: Sequence[str] | None = None,
    data_dir: Any = None,
    train_limit: int | None = 4000,
    eval_limit: int | None = None,
    seed: int = 0,
    seeds: int | Sequence[int] = SEEDS,
    baseline: bool = True,
    batch_size: int = 32,
    probe: dict | None = None,
    lambda_steps: int = 100,
    lambda_examples: int = 512,
    labelled_steps: int = LABELLED_STEPS,
    fast: bool | None = None,
    checkpoint: str | os.PathLike | None = None,
    progress: bool = True,
) -> Curve:
    """Probe ``tasks`` with a growing share of heads replaced by ``constants`` (replace mode).

    ``constants``: fitted :class:`PapaConstants` (their ``max_len`` and layout are used for
    every pass), or a mapping from each task's name (and ``"lm"`` for ``lm_texts``) to its own
    (PAPA §4 fits them on each task's unlabelled training inputs; a pair task needs constants
    fitted on pairs: refused up front otherwise;
    :func:`attnlens.evaluation.curve_inputs.constants_by_task` gives it some). ``fractions``: replaced shares of all heads. ``strategy``: the order heads are
    replaced in (:func:`attnlens.papa.select_heads`; ``"input_dependence"``, label-free, by
    default; ``"lambda"`` learns λ with the first task's probe loss, see :func:`lambda_order`;
    its cost and the Spearman correlation of λ with the input dependence are in ``settings``).
    ``baselines``: constants replacing every head: data-free ones (:data:`DATA_FREE`) and those
    trained with each task's labels (:data:`attnlens.evaluation.curve_inputs.LABELLED`, from a
    Toeplitz or the average start; not for the LM), each also tested against the average constants
    in every head (``versus_average``) when ``fractions`` hold 1. ``lm_texts``: also score the
    language model on these texts at every point. ``lambda_steps`` / ``lambda_examples``: the
    recipe of ``strategy="lambda"``. ``labelled_steps``: the training steps of the labelled
    baselines (:func:`attnlens.evaluation.curve_inputs.labelled_constants`). ``seeds``: probe seeds per point (a count or a list; the
    score is their mean, ``seed_std`` their spread). ``baseline``: fit the linear baseline at
    every point. Every score carries its 95% bootstrap interval, and every point a paired
    bootstrap test against the same task with no head replaced, on the same examples; both
    resample the probe seeds too, paired by seed (:func:`attnlens.evaluation.probing.paired`). The other
    arguments go to :func:`attnlens.evaluation.probing.run`.

    The probe's epochs and the linear baseline's ``C`` are chosen once per task, on held-out
    training examples with no head replaced (:func:`attnlens.evaluation.probing.choose_epochs`,
    :class:`attnlens.evaluation.probing.LinearBaseline`), and every point of that task trains that long
    with that ``C``: the points differ in their features only. The linear baseline of every
    later point starts from the solution with no head replaced (a warm start: the same optimum
    to the solver's tolerance, a third of the iterations on POS).

    The points run in order: every task's first point (no head replaced), then each task's
    later points together, given its first point's result (the epochs, ``C`` and the warm start
    above): :func:`attnlens.evaluation.probing.run_many` trains their probes, every seed, as one
    stacked model (as many points at once as their features fit in a quarter of the free
    memory of the model's device; each probe the same fit as alone). Under ``torch.distributed`` (``torchrun``) every rank runs every point, each
    feature pass shared by the ranks (:func:`attnlens.engine.passes.run`), and returns the whole
    curve.

    Nothing is computed twice: points whose hooks are the same (a fraction that replaces no
    head is the model itself, as fraction 0; repeated fractions) share one probing run per task,
    and the features of the model itself, which ``strategy="lambda"`` reads too, come from the
    feature cache after their first extraction. Features run in compact PAPA batches
    (:func:`attnlens.core.inputs.compact_batch`). ``fast``: the replaced heads skip their query, key,
    ``QKᵀ`` and softmax (``papa.hooks(..., fast=True)``, :func:`attnlens.core.fast_heads.constant_heads`);
    the same features up to float32 rounding (the same cache entries). ``None`` (default):
    wherever the model allows it (:func:`attnlens.core.fast_heads.skips_constant_heads`: encoders loaded
    by :func:`attnlens.load`); ``True`` refuses a model that does not.

    ``checkpoint``: a folder where every finished point of a task is written, atomically
    (:mod:`attnlens.evaluation.points`); the same call again reads the points it finds there
    instead of training them, so an interrupted curve loses only the points that were running
    and gives the same table as an uninterrupted one (``timings`` marks the points read back:
    ``resumed``; the points trained again form a smaller stack, whose probes are each the same
    fit as in the whole stack up to the order of float32 sums, measured ≤ 2e-8 on their
    weights: the same predictions unless an example lies that close to a decision boundary, so
    in practice the same table in every digit), and so are the labelled baselines' trained constants
    (:func:`attnlens.evaluation.points.labelled_path`), which it reads instead of training them
    again. The LM's points are computed again. Without it, an
    interrupted curve still reads its features from the feature cache, but trains every probe
    again.
    """
    tasks = [tasks] if isinstance(tasks, str) else tasks  # one task's name: that task
    tasks = list(tasks)
    if not tasks and lm_texts is None:
        raise InputError("tasks is empty (and no lm_texts): give at least one task, e.g. tasks=['sst2'].")
    named = [_task_name(task) for task in tasks]
    twice = sorted({name for name in named if named.count(name) > 1})
    if twice:
        raise InputError(f"task {twice[0]!r} is given more than once; give each task once.")
    train_limit = optional_count(train_limit, "train_limit", " of training examples (or None for all)")
    eval_limit = optional_count(eval_limit, "eval_limit", " of evaluated examples (or None for all)")
    as_seeds(seeds, seed)  # seed and seeds: whole numbers, refused here rather than after a task
    batch_size = whole_number(batch_size, "batch_size", " of examples per batch (e.g. 32)", minimum=1)
    lambda_steps = whole_number(lambda_steps, "lambda_steps", " of λ training steps", minimum=1)
    lambda_examples = whole_number(lambda_examples, "lambda_examples", " of λ training examples", minimum=1)
    labelled_steps = whole_number(labelled_steps, "labelled_steps", " of training steps", minimum=1)
    if isinstance(fractions, str | float | int):
        raise InputTypeError("tasks and fractions are lists: pass e.g. tasks=['sst2'], fractions=[0.0, 0.5].")
    fractions = [finite(f, f"fractions[{i}]", low=0.0, high=1.0) for i, f in enumerate(fractions)]
    if not fractions:
        raise InputError("fractions is empty; give the replaced shares to probe, e.g. [0.0, 0.5, 1.0].")
    repeated = [f for i, f in enumerate(fractions) if f in fractions[:i]]
    if repeated:  # a second row of the same point would also count twice in Holm's adjustment
        raise InputError(f"fraction {repeated[0]} is given more than once; give each fraction once.")
    # no head replaced comes first: every point is compared with it (added when not asked for)
    fractions = [0.0, *(f for f in fractions if f != 0.0)]
    unknown = [name for name in baselines if name not in ALL_BASELINES]
    if unknown:
        raise InputError(f"Unknown baseline {unknown[0]!r}; use any of {', '.join(ALL_BASELINES)}.")
    if strategy not in STRATEGIES:
        raise InputError(f"Unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}.")
    if fast is None:
        fast = fast_heads.skips_constant_heads(model)
    elif not isinstance(fast, bool):
        raise InputTypeError(f"fast must be True, False or None, not {fast!r}.")
    elif fast and not fast_heads.skips_constant_heads(model):
        raise InputError("fast=True: this model's heads cannot skip their work (a decoder, or a model "
                         "not loaded with attnlens.load()); pass fast=False or leave it None.")
    if checkpoint is not None and os.path.exists(checkpoint) and not os.path.isdir(checkpoint):
        raise InputError(f"checkpoint {checkpoint} is a file; give a folder (made if missing) for the "
                         "curve's finished points.")
    by_task = checked_constants(model, constants, tasks, lm_texts)
    constants = by_task[_task_name(tasks[0])] if tasks else by_task["lm"]  # the settings' and λ's
    started = time.perf_counter()
    options = dict(data_dir=data_dir, train_limit=train_limit, eval_limit=eval_limit, seed=seed,
                   max_len=constants.max_len, layout=constants.layout, batch_size=batch_size,
                   probe=probe, progress=progress)
    point_options = dict(seeds=seeds, baseline=baseline)
    lam, lambda_seconds = None, None
    if strategy in ("lambda", "reversed_lambda"):
        if not tasks:
            raise InputError(f"strategy={strategy!r} learns λ with a task's probe: give at least one task.")
        start = time.perf_counter()
        lam = lambda_order(model, constants, tasks[0], steps=lambda_steps, examples=lambda_examples,
                           **options)
        lambda_seconds = time.perf_counter() - start

    def labelled(name: str, init: str, fitted: Any) -> Any:
        """Task ``name``'s constants trained from ``init``: read from the checkpoint folder when
        an earlier run of the same settings trained them, else trained (and kept there)."""
        if checkpoint is None:
            return labelled_constants(model, fitted, by_name[name], init, steps=labelled_steps, **options)
        train = task_examples(model, by_name[name], data_dir, None, train_limit, eval_limit, seed,
                              fitted.max_len, fitted.layout)[0]
        recipe = {key: value for key, value in options.items() if key not in ("data_dir", "progress")}
        path = points.labelled_path(checkpoint, model, train, init, fitted, {**recipe, "steps": labelled_steps,
                                                                            "lr": LABELLED_LR})
        if path.is_file():
            return PapaConstants.load(path, model)
        made = labelled_constants(model, fitted, by_name[name], init, steps=labelled_steps, **options)
        made.save(path)
        return made

    def points_of(name: str) -> list[tuple[str, str, float, Any]]:
        """The points of task ``name`` (or ``"lm"``): the fractions, then the baselines (the
        labelled ones trained here, on the task's training examples; none for the LM)."""
        fitted = by_task[name]
        listed: list[tuple[str, str, float, Any]] = []
        for fraction in fractions:
            heads = select_heads(strategy, fraction=fraction, constants=fitted, seed=seed, lam=lam)
            replaced = fraction and bool(heads.mask.any())  # no head replaced: the model itself
            hooks = interventions.build("papa", model, heads, constants=fitted, fast=fast) if replaced else ()
            listed.append((strategy, f"{fraction}", fraction, hooks))
        for baseline in baselines:
            if baseline in LABELLED:
                if name == "lm":
                    continue
                made = labelled(name, baseline, fitted)
            else:
                made = getattr(data_free, baseline)(fitted)
            hooks = interventions.build("papa", model, "all", constants=made, fast=fast)
            listed.append((baseline, "1.0", 1.0, hooks))
        return listed

    # Every point is one job (points with the same hooks, one job). A task's first point (no head
    # replaced) chooses the probe's epochs and the linear baseline's C, and its solution starts the
    # later points' baselines: they need its result, so they run after it, all of a task's later
    # points together (probing.run_many: their probes, every seed, as one stacked model).
    rank = world().rank
    by_name = {_task_name(task): task for task in tasks}
    names = [*by_name, *(["lm"] if lm_texts is not None else [])]
    plans: dict[str, list[tuple[str, float, str]]] = {}  # name -> (label, fraction, hooks' key) per point
    hooks_of: dict[tuple[str, str], Any] = {}  # (name, hooks' key) -> its hooks, one per job
    for name in names:
        plans[name] = []
        for label, _, fraction, hooks in points_of(name):
            key = hooks_key(hooks)
            hooks_of.setdefault((name, key), hooks)
            plans[name].append((label, fraction, key))

    def task_options(name: str) -> dict[str, Any]:
        return {**options, **point_options, "max_len": by_task[name].max_len, "layout": by_task[name].layout}

    def saved_key(job: tuple[str, str]) -> str | None:
        """Where a task's point is (or will be) in the checkpoint folder (``None`` without one)."""
        name = job[0]
        return (None if checkpoint is None else
                points.task_key(model, by_name[name], job[1], plans[name][0][2], task_options(name), fast))

    def finished(result: Any, first: Any) -> dict[str, Any]:
        """A task point's row columns and seconds (a first point's whole result too, for its later
        points)."""
        unchanged = result if first is None else first
        return {"task": result.task, "metric": result.metric, "seconds": dict(result.seconds), "rank": rank,
                "columns": points.columns(result, unchanged, seed), "result": result if first is None else None,
                "runs": result.runs, "resumed": False}

    done: dict[tuple[str, str], dict[str, Any]] = {}
    for name in by_name:  # every task's first point: no head replaced
        job = (name, plans[name][0][2])
        found = None if checkpoint is None else points.load(checkpoint, saved_key(job))
        if found is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", probing.ProbeWarning)  # the table shows the baselines
                found = finished(probing.run(model, by_name[name], hooks=hooks_of[job], **task_options(name)), None)
            if checkpoint is not None:
                points.save(checkpoint, saved_key(job), found)
        done[job] = found
    for name in names:  # then the later points
        jobs = list(dict.fromkeys((name, key) for _, _, key in plans[name]))
        if name == "lm":
            for job in jobs:
                started = time.perf_counter()
                score = scorer.evaluate(model, lm_texts, hooks=hooks_of[job], max_len=by_task[name].max_len,
                                        layout=by_task[name].layout, seed=seed, progress=progress)
                done[job] = {"score": score, "forward": time.perf_counter() - started}
            continue
        first = done[jobs[0]]
        later = []
        for job in jobs[1:]:
            found = None if checkpoint is None else points.load(checkpoint, saved_key(job))
            if found is None:
                later.append(job)
            else:
                done[job] = found

        def keep(index: int, result: Any, later: list = later, first: Any = first["result"]) -> None:
            done[later[index]] = finished(result, first)
            if checkpoint is not None:  # written as each point is ready
                points.save(checkpoint, saved_key(later[index]), done[later[index]])

        if later:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", probing.ProbeWarning)
                probing.run_many(model, by_name[name], [hooks_of[job] for job in later], done=keep,
                                 **points.later_options(task_options(name), first["result"], probe))
    rows, timings = [], []
    forward_seconds = probe_seconds = 0.0
    for name in names:
        first = done[(name, plans[name][0][2])]
        average = next((done[(name, key)] for label, fraction, key in plans[name]
                        if label == strategy and fraction == 1.0), None)  # every head: the constants
        evaluation = None
        seen: set[str] = set()
        for label, fraction, key in plans[name]:
            part = done[(name, key)]
            where = dict(strategy=label, fraction_replaced=fraction, fraction_kept=1.0 - fraction,
                         heads=n_selected(fraction, constants.n_layers, constants.n_heads))
            versus = {}
            if name == "lm":
                score = part["score"]
                if average is not None and label in baselines:
                    versus = points.lm_versus_average(average["score"], score, seed=seed)
                rows.append(dict(task="lm", **where, score=score.value, metric=score.name,
                                 **points.lm_columns(score, first["score"], seed), **versus))
            else:
                if average is not None and label in baselines:
                    if evaluation is None:  # the dev examples (a point read back has no result)
                        evaluation = task_examples(model, by_name[name], data_dir, None, train_limit,
                                                   eval_limit, seed, by_task[name].max_len,
                                                   by_task[name].layout)[1]
                    versus = points.versus_average(average["runs"], part["runs"], evaluation, seed=seed,
                                                   resamples=first["result"].settings["resamples"])
                rows.append(dict(task=part["task"], **where, metric=part["metric"], **part["columns"], **versus))
            if key in seen:
                continue
            seen.add(key)
            if name == "lm":
                forward_seconds += part["forward"]
                continue
            seconds = dict(part["seconds"])
            forward_seconds += seconds.get("features", 0.0)
            probe_seconds += seconds.get("probe", 0.0) + seconds.get("baseline", 0.0)
            timings.append(dict(task=part["task"], strategy=label, fraction=fraction, **seconds, rank=part["rank"],
                                resumed=part.get("resumed", False)))
    table = pd.DataFrame(rows).reindex(columns=list(COLUMNS))
    table = conventions.apply(table)
    settings = dict(strategy=strategy, fractions=list(fractions), baselines=list(baselines),
                    **({"labelled_steps": labelled_steps} if set(baselines) & set(LABELLED) else {}),
                    seeds=seeds, processes=world().size, fast=fast, **{
        key: value for key, value in options.items() if key != "data_dir"})
    if lam is not None:
        from scipy.stats import spearmanr

        settings["lambda_seconds"] = lambda_seconds
        settings["lambda_task"] = str(getattr(tasks[0], "name", tasks[0]))
        # does the label-free order agree? low λ and low input dependence both come first
        dependence = constants.input_dependence.flatten().double()
        settings["lambda_vs_input_dependence_spearman"] = float(
            spearmanr(lam.flatten().double().numpy(), dependence.numpy()).statistic)
    return Curve(table, time.perf_counter() - started, forward_seconds, settings, timings, probe_seconds)


def _task_name(task: Any) -> str:
    return task if isinstance(task, str) else str(getattr(task, "name", task))
