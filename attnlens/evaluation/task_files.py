"""A task's split read from its files under ``data_dir``, as columns: GLUE's TSV files (without
quote handling), MRPC's files split by ``dev_ids.tsv`` (``utf-8-sig``) and CoNLL-2003's columns.

:func:`read` returns ``{"text": [...], "label": [...]}`` (``"text_pair"`` too for pair tasks) or
``{"words": [...], "tags": [...]}`` for token tasks, labels as indices into the task's label
names; :func:`attnlens.evaluation.tasks.load` builds the task from them. A file that cannot be read
as its task is one :class:`Unreadable` line naming the file, the line and the fix, which
:func:`~attnlens.evaluation.tasks.load` raises as a :class:`~attnlens.evaluation.tasks.TaskError`.
The file of each task and split is in the table of :mod:`attnlens.evaluation.tasks`.
"""

from __future__ import annotations

import csv
import functools
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from attnlens.core.files import text_lines
from attnlens.errors import InputError

__all__ = ["Spec", "Unreadable", "empty_message", "read"]


class Unreadable(InputError):
    """A task's file that cannot be read as its task (missing, empty, another format, a label
    outside the task's); :func:`attnlens.evaluation.tasks.load` raises it as a ``TaskError``."""


@dataclass(frozen=True)
class Spec:
    """What a task is: its ``kind`` (``"sentence"``, ``"pair"`` or ``"token"``), ``label_names``,
    ``metric``, the file of each split under ``data_dir`` (``files``: split -> relative path) and
    its ``title``, the name in messages."""

    kind: str
    label_names: tuple[str, ...]
    metric: str
    files: dict[str, str] = field(hash=False)  # split -> the file looked for under data_dir (relative)
    title: str  # the name in messages


def empty_message(name: str, split: str, data_dir: Path, spec: Spec,
                  why: str = "it holds no labelled example") -> str:
    """The refusal of a split whose file holds no example: it names the task, the split and the
    file read, and what to pass instead."""
    path = data_dir / spec.files[split]
    if name == "mrpc" and split != "test":
        why += (f" {'listed' if split == 'dev' else 'outside those listed'} in "
                f"{data_dir / 'mrpc' / 'dev_ids.tsv'}")
    return (f"the {split} split of task {name!r} ({spec.title}) is empty: {path} was read and {why}; "
            f"pass a data_dir whose {spec.files[split]} holds the {split} examples (or data_dir=None "
            "for the Hugging Face hub).")


def read(name: str, split: str, data_dir: Path, spec: Spec) -> dict[str, list]:
    """The columns of one split read from its file; a file read before (same path, size and
    modification time) is parsed once per process (a curve loads each split at every point)."""
    path = data_dir / spec.files[split]
    if not path.is_file():
        hint = (" (the CoNLL-2003 test split may be held back; use split='dev')"
                if spec.kind == "token" and split == "test" else "")
        raise Unreadable(f"{spec.title} {split} file not found: {path}{hint} (the {split} split of task "
                        f"{name!r}); pass a data_dir that holds {spec.files[split]} (or "
                        "data_dir=None for the Hugging Face hub).")
    stat = path.stat()
    if stat.st_size == 0:
        raise Unreadable(empty_message(name, split, data_dir, spec, "it is an empty file (0 bytes)"))
    extra = data_dir / "mrpc" / "dev_ids.tsv" if name == "mrpc" else None
    signature = (stat.st_size, stat.st_mtime_ns, extra.stat().st_mtime_ns if extra and extra.is_file() else None)
    return _parsed(name, split, str(path), str(data_dir), signature, spec)  # errors name the path as given


@functools.lru_cache(maxsize=32)
def _parsed(name: str, split: str, path_name: str, data_dir_name: str, signature: tuple,
            spec: Spec) -> dict[str, list]:
    """:func:`read`'s parse, cached by path and ``signature`` (size and modification times):
    an edited file is read again. Callers never change the lists returned."""
    path, data_dir = Path(path_name), Path(data_dir_name)
    if name == "sst2":
        return _read_sst2(path, split)
    if name == "cola":
        return _read_cola(path, split)
    if name == "mrpc":
        return _read_mrpc(path, split, data_dir / "mrpc" / "dev_ids.tsv")
    if name == "mnli":
        return _read_mnli(path, split, spec)
    return _read_conll(path, column=3 if name == "ner" else 1, spec=spec)


def _read_tsv(path: Path) -> tuple[list[str], list[list[str]]]:
    """The header and rows of a GLUE TSV, read without quote handling (a byte-order mark at its
    start is not text). csv's cell limit (a process-wide setting) is raised for this read only,
    then put back."""
    previous = csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    try:
        with open(path, encoding="utf-8-sig", newline="") as handle:
            rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    except (OSError, UnicodeDecodeError) as error:
        raise Unreadable(f"Cannot read {path}: {error}; pass a data_dir with the original files.") from None
    finally:
        csv.field_size_limit(previous)
    if not rows:
        raise Unreadable(f"{path} is empty; pass a data_dir with the original files.")
    return rows[0], rows[1:]


#: GLUE's binary labels as written in its files
_BINARY: dict[str, int] = {"0": 0, "1": 1}


def _label(value: str, allowed: dict[str, int], path: Path, line: int, title: str) -> int:
    if value not in allowed:
        raise Unreadable(f"{path} line {line}: label {value!r} is not a {title} label "
                        f"({', '.join(allowed)}); pass a data_dir with the original files.")
    return allowed[value]


def _no_labels(path: Path, title: str) -> Unreadable:
    return Unreadable(f"{path} has no label column ({title} test labels are not public); "
                     f"use split='dev', or put a labelled file at {path}.")


def _columns(
    numbered: Iterable[tuple[int, list[str]]], path: Path, width: int, label: int,
    texts: tuple[int, ...], allowed: dict[str, int], title: str,
) -> dict[str, list]:
    """The ``text`` (and ``text_pair``) and ``label`` columns of GLUE rows, given with their line
    numbers; a row of another width or with a label outside ``allowed`` is an Unreadable error."""
    columns: list[list[str]] = [[] for _ in texts]
    labels: list[int] = []
    for line, row in numbered:
        if len(row) != width or row[label] not in allowed:  # checked inline: up to 67,349 rows
            _width(row, width, path, line)
            _label(row[label], allowed, path, line, title)
        labels.append(allowed[row[label]])
        for column, values in zip(texts, columns, strict=True):
            values.append(row[column])
    result = dict(zip(("text", "text_pair"), columns, strict=False))
    return {**result, "label": labels}


def _read_sst2(path: Path, split: str) -> dict[str, list]:
    header, rows = _read_tsv(path)
    if "label" not in header or "sentence" not in header:
        if "sentence" in header:
            raise _no_labels(path, "SST-2")
        raise Unreadable(f"{path} has header {header}, not 'sentence<TAB>label'; pass a data_dir "
                        "with GLUE's SST-2 files.")
    return _columns(enumerate(rows, start=2), path, len(header), header.index("label"),
                    (header.index("sentence"),), _BINARY, "SST-2")


def _width(row: list[str], width: int, path: Path, line: int) -> None:
    if len(row) != width:
        raise Unreadable(f"{path} line {line} has {len(row)} tab-separated columns, not {width}; "
                        "pass a data_dir with the original, unmodified files.")


def _read_cola(path: Path, split: str) -> dict[str, list]:
    first, rows = _read_tsv(path)  # no header: source, label, author_mark, sentence
    if first == ["index", "sentence"]:
        raise _no_labels(path, "CoLA")
    return _columns(enumerate([first, *rows], start=1), path, 4, 1, (3,), _BINARY, "CoLA")


def _read_mrpc(path: Path, split: str, dev_ids: Path) -> dict[str, list]:
    """GLUE's MRPC: dev = the rows of msr_paraphrase_train.txt whose (#1 ID, #2 ID) is listed in
    dev_ids.tsv, train = the others; test = msr_paraphrase_test.txt (which has labels)."""
    header, rows = _read_tsv(path)
    wanted = ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]
    if header != wanted:
        raise Unreadable(f"{path} has header {header}, not {wanted}; pass a data_dir with the MRPC "
                        "files GLUE uses (msr_paraphrase_train.txt / msr_paraphrase_test.txt).")
    numbered = list(enumerate(rows, start=2))
    if split != "test":
        if not dev_ids.is_file():
            raise Unreadable(f"MRPC dev ids not found: {dev_ids}; pass a data_dir that holds "
                            "mrpc/dev_ids.tsv (GLUE's mrpc_dev_ids.tsv), which splits train from dev.")
        if dev_ids.stat().st_size == 0:
            raise Unreadable(f"MRPC dev ids file {dev_ids} is empty (0 bytes), so the {split} split of "
                            "task 'mrpc' cannot be told apart; pass a data_dir that holds GLUE's "
                            "mrpc_dev_ids.tsv as mrpc/dev_ids.tsv.")
        first, id_rows = _read_tsv(dev_ids)  # no header: first is a pair
        dev = {(row[0], row[1]) for row in [first, *id_rows] if len(row) >= 2}
        # malformed rows are kept, for _columns to report
        numbered = [(line, row) for line, row in numbered
                    if len(row) != 5 or ((row[1], row[2]) in dev) == (split == "dev")]
    return _columns(numbered, path, 5, 0, (3, 4), _BINARY, "MRPC")


def _read_mnli(path: Path, split: str, spec: Spec) -> dict[str, list]:
    header, rows = _read_tsv(path)
    if "gold_label" not in header:
        raise _no_labels(path, "MNLI")
    for column in ("sentence1", "sentence2"):
        if column not in header:
            raise Unreadable(f"{path} has no {column!r} column; pass a data_dir with GLUE's MNLI files.")
    allowed = {label: i for i, label in enumerate(spec.label_names)}
    return _columns(enumerate(rows, start=2), path, len(header), header.index("gold_label"),
                    (header.index("sentence1"), header.index("sentence2")), allowed, "MNLI")


def _read_conll(path: Path, column: int, spec: Spec) -> dict[str, list]:
    """Sentences of a CoNLL-2003 file: ``TOKEN POS CHUNK NER`` lines, a blank line between
    sentences, ``-DOCSTART-`` lines skipped; ``column`` is the tag column read."""
    try:
        lines = text_lines(path.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError) as error:
        raise Unreadable(f"Cannot read {path}: {error}; pass a data_dir with the original files.") from None
    allowed = {tag: i for i, tag in enumerate(spec.label_names)}
    sentences: list[list[str]] = []
    tags: list[list[int]] = []
    words: list[str] = []
    labels: list[int] = []
    for number, line in enumerate([*lines, ""], start=1):
        fields = line.split()
        if not fields:
            if words:
                sentences.append(words)
                tags.append(labels)
                words, labels = [], []
            continue
        if fields[0] == "-DOCSTART-":
            continue
        if len(fields) != 4:
            raise Unreadable(f"{path} line {number} has {len(fields)} space-separated columns, not 4 "
                            "(TOKEN POS CHUNK NER); pass a data_dir with the original CoNLL-2003 files.")
        words.append(fields[0])
        tag = allowed.get(fields[column])  # inline: _label runs per tag only to report a bad one
        labels.append(tag if tag is not None else _label(fields[column], allowed, path, number, spec.title))
    return {"words": sentences, "tags": tags}
