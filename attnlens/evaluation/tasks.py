"""Labelled tasks to probe and score on: GLUE sentence and pair classification, CoNLL-2003 tagging.

``tasks.load(name, split)`` returns a :class:`Task`: its examples as a ``datasets.Dataset``, its
label names, its metric, and helpers to feed a model (:meth:`Task.inputs`) and score predictions
(:meth:`Task.score`, :meth:`Task.majority_score`).

=========  ========  =========================================================  ==================
task       kind      source file (under ``data_dir``)                           metric
=========  ========  =========================================================  ==================
``sst2``   sentence  ``sst2/{train,dev}.tsv``: header ``sentence  label``       accuracy
``cola``   sentence  ``cola/glue/{train,dev}.tsv``: no header, 4 columns         Matthews corr.
                     ``source  label  author_mark  sentence``
``mrpc``   pair      ``mrpc/msr_paraphrase_train.txt`` split by                  F1 of the
                     ``mrpc/dev_ids.tsv`` (dev = the listed pairs, 408; train    positive class
                     = the others, 3,668); test: ``mrpc/msr_paraphrase_test.txt``  (equivalent)
``mnli``   pair      ``mnli/train.tsv``, ``mnli/dev_matched.tsv`` (GLUE columns  accuracy
                     ``sentence1  sentence2  gold_label``)
``ner``    token     ``conll2003/{train,valid,test}.txt``, 4th column (IOB2)    seqeval entity F1
``pos``    token     ``conll2003/{train,valid,test}.txt``, 2nd column (PTB)     accuracy over words
=========  ========  =========================================================  ==================

- **SST-2** (Socher et al. 2013): movie-review sentences, negative / positive.
- **CoLA** (Warstadt et al. 2019): is the sentence grammatically acceptable?
- **MRPC** (Dolan & Brockett 2005): are the two sentences paraphrases? Built the way GLUE and
  Hugging Face build it, since no faithful GLUE ``train.tsv`` is at hand.
- **MNLI** (Williams et al. 2018): does the premise entail, contradict or leave open the
  hypothesis? Labels in the hub's order: entailment, neutral, contradiction.
- **NER**: CoNLL-2003 English named entities, IOB2 tags with the names (and order) of the Hugging
  Face ``conll2003`` dataset; scored by ``seqeval``'s entity-level F1 (conlleval's rules).
- **POS**: the Penn Treebank part-of-speech tags of CoNLL-2003's second column, as PAPA uses
  them, with the names (and order) of Hugging Face ``conll2003``'s ``pos_tags``.

GLUE is Wang et al. (2019), "GLUE: A Multi-Task Benchmark and Analysis Platform for Natural
Language Understanding", ICLR. CoNLL-2003 is Tjong Kim Sang & De Meulder (2003), "Introduction to
the CoNLL-2003 Shared Task: Language-Independent Named Entity Recognition", CoNLL.

Token tasks give their inputs as :class:`attnlens.core.inputs.Words`: a probe labels the *first*
sub-token of each word and ignores the others (and the special tokens), as PAPA (Hassid et al.
2022) and BERT's NER fine-tuning do; predictions are therefore one label per word.

With ``data_dir`` the files above are read (:mod:`attnlens.evaluation.task_files`: GLUE TSVs
without quote handling, MRPC files as ``utf-8-sig``); without it, the Hugging Face hub (``datasets.load_dataset``), mapped to the same
columns. Metrics come from scikit-learn and seqeval. Every anticipated problem is one
:class:`TaskError` line that names the problem and the fix.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attnlens.core.checks import indices as checked
from attnlens.core.checks import whole_number
from attnlens.core.inputs import Words
from attnlens.errors import InputError
from attnlens.evaluation import task_files
from attnlens.evaluation.task_files import Spec, Unreadable, empty_message

if TYPE_CHECKING:  # datasets is imported where a task is loaded: importing this module stays light
    import datasets

#: the tasks :func:`load` knows
NAMES: tuple[str, ...] = ("sst2", "cola", "mrpc", "mnli", "ner", "pos")
#: the splits, in order; ``"validation"`` is accepted as an alias of ``"dev"``
SPLITS: tuple[str, ...] = ("train", "dev", "test")
#: kinds of task: one label per sentence, per sentence pair, or per word
KINDS: tuple[str, ...] = ("sentence", "pair", "token")
#: metrics :meth:`Task.score` computes
METRICS: tuple[str, ...] = ("accuracy", "matthews_corrcoef", "f1", "seqeval_f1")

#: NER tags (IOB2), the names and order of Hugging Face ``conll2003``'s ``ner_tags``
NER_TAGS: tuple[str, ...] = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
#: Penn Treebank tags, the names and order of Hugging Face ``conll2003``'s ``pos_tags``
POS_TAGS: tuple[str, ...] = (
    '"', "''", "#", "$", "(", ")", ",", ".", ":", "``", "CC", "CD", "DT", "EX", "FW", "IN", "JJ",
    "JJR", "JJS", "LS", "MD", "NN", "NNP", "NNPS", "NNS", "NN|SYM", "PDT", "POS", "PRP", "PRP$",
    "RB", "RBR", "RBS", "RP", "SYM", "TO", "UH", "VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "WDT",
    "WP", "WP$", "WRB",
)

#: where :func:`load` looks on the hub when ``data_dir`` is None: repository, config, keyword
#: arguments for ``datasets.load_dataset``, and the hub's name of each split. CoNLL-2003's hub
#: copy is a loading script, which ``datasets`` >= 4 no longer runs: its Parquet export is read.
HUB: dict[str, tuple[str, str | None, dict[str, str], dict[str, str]]] = {
    "sst2": ("nyu-mll/glue", "sst2", {}, {"train": "train", "dev": "validation", "test": "test"}),
    "cola": ("nyu-mll/glue", "cola", {}, {"train": "train", "dev": "validation", "test": "test"}),
    "mrpc": ("nyu-mll/glue", "mrpc", {}, {"train": "train", "dev": "validation", "test": "test"}),
    "mnli": (
        "nyu-mll/glue", "mnli", {},
        {"train": "train", "dev": "validation_matched", "test": "test_matched"},
    ),
    "ner": (
        "eriktks/conll2003", "conll2003", {"revision": "refs/convert/parquet"},
        {"train": "train", "dev": "validation", "test": "test"},
    ),
    "pos": (
        "eriktks/conll2003", "conll2003", {"revision": "refs/convert/parquet"},
        {"train": "train", "dev": "validation", "test": "test"},
    ),
}


class TaskError(InputError):
    """A task cannot be loaded or scored; the message names the problem and the fix."""


class _UnknownLabel(Exception):
    """Internal: a prediction names a label outside the task's set (:meth:`Task.score` then
    reports a few of them at once)."""


class Predictions(list):
    """Predictions that know their label set: a list (one label per example, or one list per
    example for token tasks) whose ints index ``label_names``, made for ``task``.

    :meth:`Task.score` reads ints of plain lists as indices into its own label set; with a
    ``Predictions`` it translates them through ``label_names`` first, so a probe fitted on NER
    whose predictions are scored on POS is refused (its labels ``'O'``, ``'B-PER'``, ... are no
    POS tags) instead of scoring a meaningless number. Make one with :func:`labelled`."""

    label_names: tuple[str, ...]
    task: str | None

    def __init__(self, values: Iterable[Any] = (), label_names: Iterable[str] = (), task: str | None = None) -> None:
        super().__init__(values)
        self.label_names = tuple(str(name) for name in label_names)
        self.task = task


def labelled(predictions: Iterable[Any], label_names: Iterable[str], task: str | None = None) -> Predictions:
    """``predictions`` with the label set their ints index (and the task they were made for):
    what :meth:`Task.score` needs to refuse predictions made for another task."""
    names = tuple(label_names)
    if not names or not all(isinstance(name, str) for name in names):
        raise TaskError(f"label_names must be a non-empty sequence of label names (str), not {names!r}.")
    return Predictions(predictions, names, task)


#: every task's facts (:class:`~attnlens.evaluation.task_files.Spec`: kind, labels, metric, files, title) by name
SPECS: dict[str, Spec] = {
    "sst2": Spec("sentence", ("negative", "positive"), "accuracy",
                 {s: f"sst2/{s}.tsv" for s in SPLITS}, "SST-2"),
    "cola": Spec("sentence", ("unacceptable", "acceptable"), "matthews_corrcoef",
                 {s: f"cola/glue/{s}.tsv" for s in SPLITS}, "CoLA"),
    "mrpc": Spec("pair", ("not_equivalent", "equivalent"), "f1",
                 {"train": "mrpc/msr_paraphrase_train.txt", "dev": "mrpc/msr_paraphrase_train.txt",
                  "test": "mrpc/msr_paraphrase_test.txt"}, "MRPC"),
    "mnli": Spec("pair", ("entailment", "neutral", "contradiction"), "accuracy",
                 {"train": "mnli/train.tsv", "dev": "mnli/dev_matched.tsv",
                  "test": "mnli/test_matched.tsv"}, "MNLI"),
    "ner": Spec("token", NER_TAGS, "seqeval_f1",
                {"train": "conll2003/train.txt", "dev": "conll2003/valid.txt",
                 "test": "conll2003/test.txt"}, "CoNLL-2003 NER"),
    "pos": Spec("token", POS_TAGS, "accuracy",
                {"train": "conll2003/train.txt", "dev": "conll2003/valid.txt",
                 "test": "conll2003/test.txt"}, "CoNLL-2003 POS"),
}


@dataclass(frozen=True, repr=False)
class Task:
    """One split of one task: its examples and how to score predictions on them.

    ``examples`` columns: sentence tasks ``text`` (str) and ``label`` (int); pair tasks ``text``,
    ``text_pair`` and ``label``; token tasks ``words`` (list of str) and ``tags`` (list of int).
    Labels are indices into ``label_names``.
    """

    name: str
    split: str
    kind: str
    label_names: tuple[str, ...]
    metric: str
    examples: datasets.Dataset

    def __post_init__(self) -> None:
        for field, value, allowed in (("name", self.name, NAMES), ("split", self.split, SPLITS),
                                      ("kind", self.kind, KINDS), ("metric", self.metric, METRICS)):
            if value not in allowed:
                raise TaskError(f"Task {field} {value!r} is not one of {', '.join(allowed)}.")
        columns = {"sentence": {"text", "label"}, "pair": {"text", "text_pair", "label"},
                   "token": {"words", "tags"}}[self.kind]
        if not columns <= set(self.examples.column_names):
            raise TaskError(f"A {self.kind} task's examples need the columns {sorted(columns)}; "
                            f"got {self.examples.column_names}.")

    def __len__(self) -> int:
        return len(self.examples)

    def __repr__(self) -> str:
        labels = (f"labels {'/'.join(self.label_names)}" if self.n_labels <= 9
                  else f"{self.n_labels} labels")
        return (f"Task({self.name!r}, {self.split!r}, {self.kind}, {len(self)} examples, {labels}, "
                f"metric {self.metric})")

    @property
    def title(self) -> str:
        """The task's name in messages (``"SST-2"``, ``"CoNLL-2003 POS"``)."""
        return SPECS[self.name].title

    @property
    def n_labels(self) -> int:
        """How many labels (classes, or tags for a token task) the task has."""
        return len(self.label_names)

    def inputs(self) -> list:
        """What a model reads, one per example: a ``str`` (sentence tasks), a ``(str, str)`` pair
        (pair tasks), or :class:`attnlens.core.inputs.Words` (token tasks)."""
        if self.kind == "sentence":
            return _column(self.examples, "text")
        if self.kind == "pair":
            return list(zip(_column(self.examples, "text"), _column(self.examples, "text_pair"), strict=True))
        return [Words(tuple(words)) for words in _column(self.examples, "words")]

    def labels(self) -> list:
        """The gold labels: one int per example, or a list of ints (one per word) for token tasks."""
        return _column(self.examples, "tags" if self.kind == "token" else "label")

    def score(self, predictions: Iterable[Any]) -> float:
        """The task's metric of ``predictions`` against the gold labels.

        ``predictions``: one label per example (an int index into ``label_names``, or the label's
        name); for token tasks, one sequence of labels per example, one per word. A metric that
        is undefined for these predictions (e.g. F1 when nothing is predicted positive) is 0.
        Predictions whose labels are not in this task's label set are refused, naming a few of
        them: label names of another task, and the ints of a :class:`Predictions` (see
        :func:`labelled`) whose label set is another task's.
        """
        gold = self.labels()
        predicted = self.as_indices(predictions, gold)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # undefined metrics (a constant prediction) score 0
            return float(_METRIC_FUNCTIONS[self.metric](self, gold, predicted))

    def select(self, indices: Iterable[int]) -> Task:
        """The task restricted to the examples at ``indices`` (in that order)."""
        return dataclasses.replace(self, examples=self.examples.select(checked(indices, "indices", len(self))))

    def majority_label(self) -> int:
        """The most frequent label of this split (for token tasks, of all words); ties go to the
        label listed first in ``label_names``."""
        labels = self.labels()
        flat = [tag for tags in labels for tag in tags] if self.kind == "token" else labels
        if not flat:
            raise TaskError(f"The {self.split!r} split of {self.name!r} has no labels to count; "
                            "pass a train task with examples.")
        return int(np.bincount(np.asarray(flat, dtype=np.int64), minlength=self.n_labels).argmax())

    def majority_score(self, train: Task | None = None) -> float:
        """The score of always predicting the most frequent label of ``train`` (default: of this
        task itself; :meth:`majority_label`)."""
        source = self if train is None else train
        if source.name != self.name:
            raise TaskError(f"majority_score of {self.name!r} was given the {source.name!r} task as "
                            f"train; pass a split of {self.name!r} (e.g. load({self.name!r}, 'train')).")
        majority = source.majority_label()
        if self.kind == "token":
            return self.score([[majority] * len(tags) for tags in self.labels()])
        return self.score([majority] * len(self))

    def as_indices(self, predictions: Iterable[Any], gold: list) -> list:
        """``predictions`` (label indices or names, or :class:`Predictions`) as label indices,
        checked against ``gold``'s shape (:meth:`score` and the intervals' counts read them)."""
        if isinstance(predictions, str):
            raise TaskError("score takes one prediction per example (a list), got a single string; "
                            "pass e.g. task.score(['positive', 'negative', ...]).")
        source = getattr(predictions, "label_names", None)  # Predictions: the names its ints index
        predicted = list(predictions)
        if len(predicted) != len(gold):
            raise TaskError(f"{len(predicted)} predictions for the {len(gold)} examples of "
                            f"{self.name!r} {self.split!r}; pass exactly one per example.")
        if source is not None and tuple(source) != self.label_names:
            predicted = self._named(predicted, tuple(source), getattr(predictions, "task", None))
        index: dict[Any, int] = {name: i for i, name in enumerate(self.label_names)}
        index.update({i: i for i in range(self.n_labels)})  # looked up for exact ints and strs only
        try:
            return self._indices_of(predicted, gold, index)
        except _UnknownLabel:
            strings = predicted if self.kind != "token" else [
                value for tags in predicted if not isinstance(tags, str) for value in tags]
            raise self._unknown([value for value in strings if isinstance(value, str) and value not in index],
                                getattr(predictions, "task", None)) from None

    def _indices_of(self, predicted: list, gold: list, index: dict[Any, int]) -> list:
        if self.kind != "token":
            return self._indices(predicted, index, None)
        result = []
        for i, (tags, words) in enumerate(zip(predicted, gold, strict=True)):
            if isinstance(tags, str):
                raise TaskError(f"prediction {i} of {self.name!r} is a single string; a token task "
                                "takes one list of labels per example, one label per word.")
            tags = list(tags)
            if len(tags) != len(words):
                raise TaskError(f"prediction {i} of {self.name!r} has {len(tags)} labels for "
                                f"{len(words)} words; pass one label per word.")
            result.append(self._indices(tags, index, i))
        return result

    def _indices(self, values: list, index: dict[Any, int], example: int | None) -> list[int]:
        """``values`` as label indices; ``example``: the example they belong to (token tasks)."""
        result = []
        for i, value in enumerate(values):
            kind = type(value)
            number = index.get(value, -1) if kind is int or kind is str else -1
            if number < 0:
                if isinstance(value, str) and value not in index:
                    raise _UnknownLabel  # as_indices names every unknown label
                number = self._index(value, index, i if example is None else example)
            result.append(number)
        return result

    def _named(self, predicted: list, source: tuple[str, ...], task: str | None) -> list:
        """``predicted`` (made with the label set ``source``, for ``task``) as label names; an
        int outside ``source`` is not a label, a name of ``source`` outside this task's set is
        refused by :meth:`_unknown`."""

        def name(value: Any) -> Any:
            if type(value) is int and 0 <= value < len(source):
                return source[value]
            return value  # a name, or something _index refuses

        if self.kind == "token":
            named = [[name(value) for value in tags] if not isinstance(tags, str) else tags for tags in predicted]
            flat = [value for tags in named if not isinstance(tags, str) for value in tags]
        else:
            named = [name(value) for value in predicted]
            flat = named
        known = set(self.label_names)
        unknown = [value for value in flat if isinstance(value, str) and value not in known]
        if unknown:
            raise self._unknown(unknown, task, source)
        return named

    def _unknown(self, unknown: list[str], task: str | None, source: tuple[str, ...] | None = None) -> TaskError:
        """The refusal of predictions whose labels (``unknown``: names, with repeats) are not in
        this task's label set; ``task`` / ``source``: the task and label set they were made for."""
        distinct = list(dict.fromkeys(unknown))
        shown = ", ".join(repr(value) for value in distinct[:3])
        more = f" and {len(distinct) - 3} more" if len(distinct) > 3 else ""
        made = ""
        if task is not None or source is not None:
            made = (f"; they were made for {task!r}" if task is not None else "; they were made") + (
                f" (labels {_shown(source, 5)})" if source is not None else "")
        count = (f"{len(distinct)} labels that are" if len(distinct) > 1 else "1 label that is")
        return TaskError(
            f"predictions for {self.name!r} ({self.title}) name {count} not a label of "
            f"{self.name!r}: {shown}{more}{made}. Pass predictions of a probe fitted on "
            f"{self.name!r} (labels {_shown(self.label_names, 5)}), as these names or ints in "
            f"0..{self.n_labels - 1}.")

    def _index(self, value: Any, index: dict[Any, int], example: int) -> int:
        if isinstance(value, str):
            if value in index:
                return index[value]
        elif not isinstance(value, bool | float):
            try:
                number = int(value.__index__())
            except (AttributeError, TypeError, ValueError, RuntimeError):
                number = -1
            if 0 <= number < self.n_labels:
                return number
        raise TaskError(f"prediction {example} of {self.name!r} is {value!r}, not a label: pass an "
                        f"int in 0..{self.n_labels - 1} or one of {_shown(self.label_names)}.")


def _shown(names: tuple[str, ...], most: int = 9) -> str:
    shown = ", ".join(repr(name) for name in names[:most])
    return shown + (f", ... ({len(names)} in all)" if len(names) > most else "")


def _accuracy(task: Task, gold: list, predicted: list) -> float:
    from sklearn.metrics import accuracy_score

    if task.kind == "token":  # accuracy over all words
        gold = [tag for tags in gold for tag in tags]
        predicted = [tag for tags in predicted for tag in tags]
    return float(accuracy_score(gold, predicted))


def _matthews(task: Task, gold: list, predicted: list) -> float:
    from sklearn.metrics import matthews_corrcoef

    return float(matthews_corrcoef(gold, predicted))


def _f1(task: Task, gold: list, predicted: list) -> float:
    from sklearn.metrics import f1_score

    return float(f1_score(gold, predicted, pos_label=1))


def _seqeval_f1(task: Task, gold: list, predicted: list) -> float:
    from seqeval.metrics import f1_score

    names = task.label_names
    return float(f1_score([[names[t] for t in tags] for tags in gold],
                          [[names[t] for t in tags] for tags in predicted]))


_METRIC_FUNCTIONS: dict[str, Callable[[Task, list, list], float]] = {
    "accuracy": _accuracy,
    "matthews_corrcoef": _matthews,
    "f1": _f1,
    "seqeval_f1": _seqeval_f1,
}


# -- loading ----------------------------------------------------------------------------------


def load(
    name: str,
    split: str = "train",
    *,
    data_dir: str | os.PathLike[str] | None = None,
    limit: int | None = None,
    seed: int = 0,
) -> Task:
    """One split of a task: ``name`` in :data:`NAMES`, ``split`` in :data:`SPLITS` (or
    ``"validation"`` for ``"dev"``).

    ``data_dir``: a folder with the GLUE / CoNLL files (see the module docstring); None reads the
    Hugging Face hub (or its local cache). ``limit``: keep a random subset of that many examples,
    drawn with ``numpy.random.default_rng(seed)`` and kept in file order (all when ``limit`` is at
    least the number of examples).
    """
    if not isinstance(name, str) or name.lower() not in NAMES:
        raise TaskError(f"Unknown task {name!r}; pass one of {', '.join(NAMES)}.")
    name = name.lower()
    if not isinstance(split, str) or split.lower() not in (*SPLITS, "validation"):
        raise TaskError(f"Unknown split {split!r} for {name!r}; pass one of {', '.join(SPLITS)} "
                        "('validation' is accepted for 'dev').")
    split = "dev" if split.lower() == "validation" else split.lower()
    try:
        limit = None if limit is None else whole_number(limit, "limit", minimum=1)
        seed = whole_number(seed, "seed", minimum=0)
    except (TypeError, ValueError) as error:
        raise TaskError(f"{error}; pass a positive whole number of examples, or limit=None for all.") from None
    spec = SPECS[name]
    if data_dir is None:
        columns = _from_hub(name, split)
    else:
        try:
            columns = task_files.read(name, split, Path(data_dir), spec)
        except Unreadable as error:  # the one error a caller of load catches
            raise TaskError(str(error)) from None
    size = len(columns["label" if "label" in columns else "tags"])
    if size == 0:
        raise _empty(name, split, None if data_dir is None else Path(data_dir))
    if limit is not None and limit < size:
        # the subset is chosen on the columns, before the Dataset is built (encoding all 67,349
        # SST-2 rows to keep 4,000 was most of a load)
        chosen = np.sort(np.random.default_rng(seed).choice(size, size=limit, replace=False)).tolist()
        columns = {key: [values[index] for index in chosen] for key, values in columns.items()}
    import datasets  # here, not at the top: importing tasks stays light (no pyarrow, no datasets)

    examples = datasets.Dataset.from_dict(columns, features=_features(spec))
    return Task(name, split, spec.kind, spec.label_names, spec.metric, examples)


def _features(spec: Spec) -> datasets.Features:
    import datasets

    label = datasets.ClassLabel(names=list(spec.label_names))
    if spec.kind == "token":
        return datasets.Features({"words": datasets.Sequence(datasets.Value("string")),
                                  "tags": datasets.Sequence(label)})
    text = {"text": datasets.Value("string")}
    if spec.kind == "pair":
        text["text_pair"] = datasets.Value("string")
    return datasets.Features({**text, "label": label})


def _empty(name: str, split: str, data_dir: Path | None, why: str = "it holds no labelled example") -> TaskError:
    """The refusal of a split with no example: it names the task, the split and the file read
    (or the hub's repository), and what to pass instead."""
    spec = SPECS[name]
    if data_dir is None:
        repo, config, _, splits = HUB[name]
        return TaskError(
            f"the {split} split of task {name!r} ({spec.title}) is empty: the Hugging Face hub's "
            f"{repo} ({config}, split {splits[split]!r}) has no example; pass data_dir=... with "
            f"{spec.files[split]}.")
    return TaskError(empty_message(name, split, data_dir, spec, why))


def _from_hub(name: str, split: str) -> dict[str, list]:
    """The split from the Hugging Face hub (or its cache), as the columns of the file readers."""
    import datasets

    spec = SPECS[name]
    repo, config, kwargs, splits = HUB[name]
    try:
        table = datasets.load_dataset(repo, config, split=splits[split], **kwargs)
    except Exception as error:  # the hub's and datasets' errors are many; report one line
        if getattr(datasets.config, "HF_HUB_OFFLINE", False):
            why = "offline here: HF_HUB_OFFLINE is set and it is not cached"
        else:
            first = (str(error).strip().splitlines() or ["no message"])[0]
            why = f"{type(error).__name__}: {first}"
        raise TaskError(f"{spec.title} needs the Hugging Face hub ({repo}; {why}) or data_dir with "
                        f"{spec.files[split]}; pass data_dir=...") from None
    return _hub_columns(name, split, table)


def _column(table: Any, name: str) -> list:
    """Column ``name`` of a ``datasets.Dataset`` as a list, read whole: iterating the column
    itself formats one row at a time (about 150x slower for a column of 20,000 ints)."""
    return list(table[name][:])


def _hub_columns(name: str, split: str, table: Any) -> dict[str, list]:
    spec = SPECS[name]
    repo = HUB[name][0]
    source = {"ner": "ner_tags", "pos": "pos_tags"}.get(name, "label")
    wanted = {"sentence": ["sentence", "label"], "pair": ["sentence1", "sentence2", "label"],
              "token": ["tokens", source]}[spec.kind]
    if name == "mnli":
        wanted = ["premise", "hypothesis", "label"]
    missing = [column for column in wanted if column not in getattr(table, "column_names", ())]
    if missing:
        raise TaskError(f"{repo} ({split}) has no column {', '.join(missing)}; pass data_dir=... "
                        "with the original files.")
    features = getattr(table, "features", {}) or {}
    hub_names = _class_names(features.get(source))
    remap: dict[int, int] | None = None
    if hub_names is not None:
        if set(hub_names) != set(spec.label_names):
            raise TaskError(f"{repo}'s {source} has labels {_shown(tuple(hub_names))}, not "
                            f"{_shown(spec.label_names)}; pass data_dir=... with the original files.")
        remap = {i: spec.label_names.index(label) for i, label in enumerate(hub_names)}

    def mapped(value: int) -> int:
        if value < 0:
            raise TaskError(f"{spec.title} {split} on the hub has label {value} (no label: GLUE keeps "
                            "test labels private); use split='dev', or pass data_dir=... with a "
                            "labelled file.")
        if value >= len(spec.label_names):
            raise TaskError(f"{spec.title} {split} on the hub ({repo}) has label {value}, outside "
                            f"0..{len(spec.label_names) - 1}; pass data_dir=... with the original files.")
        return remap[value] if remap is not None else value

    if spec.kind == "token":
        return {"words": [list(words) for words in _column(table, "tokens")],
                "tags": [[mapped(int(t)) for t in tags] for tags in _column(table, source)]}
    result: dict[str, list] = {"text": _column(table, wanted[0])}
    if spec.kind == "pair":
        result["text_pair"] = _column(table, wanted[1])
    result["label"] = [mapped(int(value)) for value in _column(table, "label")]
    return result


def _class_names(feature: Any) -> list[str] | None:
    """The names of a ``ClassLabel`` feature (or of a sequence of them), else None."""
    import datasets

    while feature is not None and not isinstance(feature, datasets.ClassLabel):
        feature = getattr(feature, "feature", None)
    return list(feature.names) if feature is not None else None
