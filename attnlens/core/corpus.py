"""Corpora for attnlens: an embedded default corpus that every install has offline, and files.

:func:`default_corpus` is English prose that needs no download:

1. fourteen sentences written for this project (varied length and punctuation, so that the first
   example of a report is a short, readable sentence);
2. the prose paragraphs of the Python reference documentation that ships with the standard
   library itself (``pydoc_data.topics``, what ``help("assignment")`` shows): code blocks, grammar
   rules, headings and lists are dropped, wrapped lines are joined, duplicates removed.

The order is deterministic (project sentences first, then topics in sorted order). The pydoc
paragraphs depend on the Python version (about 450 paragraphs on Python 3.11).

:func:`read_corpus` reads a corpus file for the command line; :func:`resolve_corpus` turns what a
user passes as ``corpus=`` (``None``, ``"default"``, a path, or a list of texts) into a list.
"""

from __future__ import annotations

import csv
import functools
import io
import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from attnlens.core.files import text_lines
from attnlens.errors import InputError, InputTypeError

#: sentences written for attnlens (public domain); short ones and two longer than 32 tokens
PROJECT_SENTENCES: tuple[str, ...] = (
    "The film is a charming, funny and moving portrait of a family.",
    "When the committee finally met on Thursday evening, after weeks of delays, its members "
    "agreed that the old library would stay open, although its hours would be shorter and two "
    "of its branches would close.",
    "It rained all day, so the match was postponed until Sunday.",
    "Researchers measured how much each attention head depends on its input.",
    "Does the model look at the previous word, or at the separator?",
    "She packed her bag, locked the door and walked to the station.",
    "Some heads attend to punctuation; others follow the syntax of the sentence.",
    "After the storm, the old bridge was closed for repairs.",
    "Why would a head put all of its attention on one token?",
    "The committee approved the budget (with two changes) on Friday.",
    "A constant matrix can replace many heads with little loss in accuracy.",
    "He said: \"I will be there by noon.\"",
    "Because the river had flooded the valley twice that spring, the farmers moved their "
    "animals to higher ground, repaired the fences, and waited; nobody knew when the water "
    "would fall again.",
    "Prices rose by 3% in March, then fell again in April.",
)

#: columns read from a TSV/CSV file with a header, in order of preference
TEXT_COLUMNS: tuple[str, ...] = ("text", "sentence", "sentence1", "#1 String", "question")

#: header cells of a sentence-pair table (GLUE's MRPC, RTE, ...): read as (first, second) pairs
PAIR_COLUMNS: tuple[tuple[str, str], ...] = (("sentence1", "sentence2"), ("#1 String", "#2 String"))

#: csv's cell size limit while a table is read (a C long: 32 bits on Windows)
_FIELD_LIMIT = min(sys.maxsize, 2**31 - 1)

_MIN_CHARS, _MAX_CHARS = 60, 700


class CorpusError(InputError):
    """A corpus could not be used: missing file, empty corpus, unreadable format."""


@functools.cache
def _pydoc_paragraphs() -> tuple[str, ...]:
    from pydoc_data.topics import topics

    seen: dict[str, None] = {}
    for key in sorted(topics):
        for block in re.split(r"\n\s*\n", topics[key]):
            lines = block.split("\n")
            if any(line.startswith((" ", "\t")) for line in lines):
                continue  # code, grammar, indented lists and tables
            text = re.sub(r"\s+", " ", " ".join(line.strip() for line in lines)).strip()
            if not _MIN_CHARS <= len(text) <= _MAX_CHARS:
                continue
            if not text[0].isupper() or not text.endswith("."):
                continue
            if "::=" in text or ">>>" in text or text.startswith(("* ", "Note:", "See also")):
                continue
            seen.setdefault(text, None)
    return tuple(seen)


def default_corpus(n: int | None = None) -> list[str]:
    """The embedded corpus (see the module docstring); the first ``n`` texts if ``n`` is given."""
    texts = list(PROJECT_SENTENCES) + list(_pydoc_paragraphs())
    if n is not None:
        if n < 1:
            raise CorpusError(f"n must be at least 1, got {n}.")
        texts = texts[:n]
    return texts


def read_corpus(path: str | os.PathLike) -> list[str | tuple[str, str]]:
    """The texts of a corpus file; see :func:`read_corpus_counted`, which also says how many
    blank lines were skipped."""
    return read_corpus_counted(path)[0]


def read_corpus_counted(path: str | os.PathLike) -> tuple[list[str | tuple[str, str]], int]:
    """Read a corpus file: one text per line, or a table.

    - ``.tsv`` / ``.csv``: row 1 is a header if one of its cells names a text column
      (:data:`TEXT_COLUMNS`, any case); the texts are then that column (the first name of
      :data:`TEXT_COLUMNS` that exists), one per row. A header with ``sentence1`` and
      ``sentence2``, or ``#1 String`` and ``#2 String`` (GLUE's sentence-pair tasks, e.g.
      MRPC), gives (first, second) sentence pairs instead. A table whose row 1 names no text
      column is read as one text per row if it has one column, and refused otherwise (which
      column holds the texts is unknown: CoLA's TSVs, for instance, have four columns and no
      header). TSV cells are read without quote handling (as GLUE's files need);
    - any other file: plain text, one text per non-blank line, unless its first line has tabs
      and names a text or pair column (MRPC's ``msr_paraphrase_train.txt``): a TSV table then.
      Every row of a table with a header must be as wide as it (a missing cell or a stray
      delimiter is refused with the row's number). Lines end at ``\\n``,
      ``\\r\\n`` or ``\\r`` only: the other breaks :meth:`str.splitlines` knows (form feed,
      ``\\u2028``, ...) stay inside a text.

    A quoted CSV cell may span lines: its line breaks are kept in the text.

    Texts are stripped and blank ones dropped (a pair only when both of its sentences are
    blank); the second value returned is how many were dropped (a plain file's final line break
    does not count), which the CLI reports. Raises :class:`CorpusError` with a one-line reason if the file is missing, is a
    folder, is not UTF-8, is a table that cannot be read as said above, or holds no text.
    """
    path = Path(path)
    if not path.exists():
        raise CorpusError(f"corpus file not found: {path}")
    if path.is_dir():
        raise CorpusError(f"corpus path is a folder, not a file: {path}")
    try:
        raw = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        raise CorpusError(f"corpus file {path} is not UTF-8 text ({error.reason})") from None
    suffix = path.suffix.lower()
    table = suffix in (".tsv", ".csv") or _names_columns(raw)
    if table:
        texts = _table_texts(raw, delimiter="," if suffix == ".csv" else "\t", path=path)
    else:
        texts = text_lines(raw)
    kept = [text for text in map(_stripped, texts) if text not in ("", ("", ""))]
    if not kept:
        raise CorpusError(f"corpus file {path} is empty: it holds no non-blank text")
    # a plain text file's last line break does not end a blank text
    blank = len(texts) - len(kept) - (not table and texts[-1] == "")
    return kept, blank


def _names_columns(raw: str) -> bool:
    """Whether a file of another suffix is a TSV table all the same: its first line has tabs and
    names a text column or a pair's (MRPC's ``msr_paraphrase_train.txt``), so that its lines
    are rows, not texts."""
    first = text_lines(raw)[0]
    if "\t" not in first:
        return False
    header = {cell.strip().casefold() for cell in first.split("\t")}
    names = [*TEXT_COLUMNS, *(name for pair in PAIR_COLUMNS for name in pair)]
    return any(name.casefold() in header for name in names)


def _stripped(text: str | tuple[str, str]) -> str | tuple[str, str]:
    return tuple(part.strip() for part in text) if isinstance(text, tuple) else text.strip()


def _table_texts(raw: str, *, delimiter: str, path: Path) -> list[str | tuple[str, str]]:
    rows = _table_rows(raw, delimiter=delimiter, path=path)
    if not rows:
        return []
    header = [cell.strip().casefold() for cell in rows[0]]
    for first, second in PAIR_COLUMNS:
        if first.casefold() in header and second.casefold() in header:
            i, j = header.index(first.casefold()), header.index(second.casefold())
            return [(row[i], row[j]) for row in _body(rows, path)]
    names = [name.casefold() for name in TEXT_COLUMNS if name.casefold() in header]
    if names:
        column = header.index(names[0])
        return [row[column] for row in _body(rows, path)]
    if all(len(row) <= 1 for row in rows):
        return [row[0] for row in rows if row]
    width = max(len(row) for row in rows)
    raise CorpusError(
        f"corpus file {path} has {width} columns and no header naming the text column "
        f"(row 1: {delimiter.join(rows[0])[:80]!r}); add a header row that names it "
        f"(e.g. sentence), or pass a .txt file with one text per line"
    )


def _body(rows: list[list[str]], path: Path) -> list[list[str]]:
    """The rows after a table's header, each as wide as it (:class:`CorpusError` naming the
    first that is not: a missing cell or a stray delimiter would drop the row or cut its text);
    empty rows (blank lines) are left out."""
    width = len(rows[0])
    for number, row in enumerate(rows[1:], start=2):
        if row and len(row) != width:
            raise CorpusError(
                f"corpus file {path}, row {number} has {len(row)} cells where its header has {width} "
                f"(row {number}: {' | '.join(row)[:80]!r}); fix that row (a missing cell, or a "
                "delimiter inside a text), or pass a .txt file with one text per line"
            )
    return [row for row in rows[1:] if row]


def _table_rows(raw: str, *, delimiter: str, path: Path) -> list[list[str]]:
    """The rows of a TSV (no quote handling) or CSV; a csv error becomes a :class:`CorpusError`.

    The csv module refuses cells over 128 KiB by default: the limit is raised for this read and
    then put back (it is global to the process)."""
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    # strict: a quote never closed is an error (not a last cell that swallows the rest of the file)
    reader = csv.reader(io.StringIO(raw, newline=""), delimiter=delimiter, quoting=quoting, strict=True)
    rows: list[list[str]] = []
    previous = csv.field_size_limit(_FIELD_LIMIT)
    ended = 0  # the line on which the last row read ended
    try:
        for row in reader:
            rows.append(row)
            ended = reader.line_num
    except csv.Error as error:
        reason = (
            "it opens a quote (\") that is never closed" if "unexpected end of data" in str(error)
            else str(error)
        )
        raise CorpusError(
            f"corpus file {path}, row {len(rows) + 1} (line {ended + 1}) cannot be read: "
            f"{reason}; fix that row, or pass a .txt file with one text per line"
        ) from None
    finally:
        csv.field_size_limit(previous)
    return rows


def resolve_corpus(
    corpus: str | os.PathLike | Iterable[str] | Iterable[tuple[str, str]] | None,
) -> list[str | tuple[str, str]]:
    """Texts for ``corpus=``: ``None`` or ``"default"`` → :func:`default_corpus`; a path →
    :func:`read_corpus`; an iterable of strings or of (str, str) pairs → that list. Empty →
    :class:`CorpusError`."""
    if corpus is None or (isinstance(corpus, str) and corpus == "default"):
        return default_corpus()
    if isinstance(corpus, str | os.PathLike):
        path = Path(corpus)
        if isinstance(corpus, str) and not path.exists() and (" " in corpus or not path.suffix):
            raise CorpusError(
                f"corpus file not found: {corpus!r}. To analyse this string as a text, pass a "
                f"list: corpus=[{corpus[:40]!r}]"
            )
        return read_corpus(corpus)
    texts = list(corpus_iterator(corpus))
    if not texts:
        raise CorpusError("the corpus is empty: pass at least one text")
    bad = next((t for t in texts if not isinstance(t, str | tuple | list)), None)
    if bad is not None:
        raise CorpusError(f"a corpus holds strings (or sentence pairs), got {type(bad).__name__}")
    return texts


def corpus_iterator(corpus: Any, *, name: str = "corpus") -> Iterator:
    """An iterator over ``corpus`` (strings or (str, str) pairs, a list, a generator, a
    ``datasets`` column), refusing things that are not one: a single string, or a whole table
    (``datasets.Dataset``, ``pandas.DataFrame``, a dict of columns), whose iteration would give
    its column names, instead of one of its columns. ``name``: the argument's, for the errors."""
    if isinstance(corpus, str | bytes):
        raise InputTypeError(
            f"{name} must be an iterable of strings or (str, str) pairs, not one string; "
            "pass [text] for one text, or a file path to attnlens.compare / the CLI."
        )
    datasets, pandas = sys.modules.get("datasets"), sys.modules.get("pandas")
    tables = (datasets.Dataset, datasets.IterableDataset) if datasets is not None else ()
    tables += (pandas.DataFrame,) if pandas is not None else ()
    if isinstance(corpus, Mapping) or (tables and isinstance(corpus, tables)):
        columns = corpus.column_names if hasattr(corpus, "column_names") else list(corpus.keys())
        names = ", ".join(repr(name) for name in (columns or []))
        raise InputTypeError(
            f"Pass one column of the {type(corpus).__name__} (e.g. {name}[{names.split(', ')[0] or 'text'}]), "
            f"not the whole table (columns: {names})."
        )
    try:
        return iter(corpus)
    except TypeError as error:
        raise InputTypeError(
            f"{name} must be an iterable of strings or (str, str) pairs, got {type(corpus).__name__}."
        ) from error
