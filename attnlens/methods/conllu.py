"""Reading a CoNLL-U treebank (Universal Dependencies) into :class:`Sentence`\ s: the FORM, HEAD and
DEPREL of every word. Multiword-token ranges (``3-4``) and empty nodes (``5.1``) are skipped, and
a relation's subtype is dropped (``nmod:poss`` counts as ``nmod``). Torch-free: the sentences
that :func:`attnlens.methods.syntax.dependency_heads` scores heads on."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attnlens.core.checks import describe, whole_number
from attnlens.core.files import text_lines
from attnlens.errors import InputError, InputTypeError, MissingFileError

__all__ = ["Sentence", "read_conllu", "relations_of"]

_PLAIN_ID = re.compile(r"[1-9][0-9]*")
_RANGE_ID = re.compile(r"[1-9][0-9]*-[1-9][0-9]*")
_EMPTY_ID = re.compile(r"[0-9]+\.[1-9][0-9]*")
_HEAD = re.compile(r"[0-9]+")
_FIELDS = "ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC"


@dataclass(frozen=True)
class Sentence:
    """One dependency tree: ``words`` (FORM), ``heads`` (the 0-based index of each word's
    syntactic head, -1 for the root), ``relations`` (DEPREL without subtype: ``nmod:poss`` ->
    ``nmod``) and ``line``, where the sentence starts in its file (1-based)."""

    words: tuple[str, ...]
    heads: tuple[int, ...]
    relations: tuple[str, ...]
    line: int = 0

    def __len__(self) -> int:
        return len(self.words)

    def arcs(self) -> list[tuple[int, int, str]]:
        """``(dependent, head, relation)`` for every word but the root (0-based word indices)."""
        return [(i, h, r) for i, (h, r) in enumerate(zip(self.heads, self.relations, strict=True)) if h >= 0]


def _source(conllu: str | os.PathLike) -> tuple[str, str]:
    """(text, name for messages) of a path or of CoNLL-U text itself."""
    if isinstance(conllu, str) and ("\n" in conllu or "\t" in conllu):
        return conllu, "the CoNLL-U text"
    if not isinstance(conllu, str | os.PathLike):
        raise InputTypeError(
            f"conllu must be the path of a CoNLL-U file or its text, got {describe(conllu)}."
        )
    path = Path(conllu)
    if not path.is_file():
        raise MissingFileError(
            f"CoNLL-U file {path} not found: give the path of a treebank file (e.g. "
            "en_ewt-ud-dev.conllu from Universal Dependencies) or its text."
        )
    try:
        return path.read_text(encoding="utf-8-sig"), str(path)
    except UnicodeDecodeError as error:
        raise InputError(
            f"{path} is not a CoNLL-U file: it is not UTF-8 text ({error.reason} at byte "
            f"{error.start}). Give a CoNLL-U treebank (UTF-8, one word per line, 10 tab-separated columns)."
        ) from None


def _check_line(name: str, number: int, line: str) -> tuple[str, str, str] | None:
    """``(id, head, deprel)`` of a CoNLL-U word line (None for a range or an empty node);
    ``ValueError`` naming the file and line for anything else."""
    fields = line.split("\t")
    if len(fields) != 10:
        raise InputError(
            f"{name}, line {number}: not a CoNLL-U word line ({len(fields)} tab-separated "
            f"column{'s' if len(fields) != 1 else ''}; CoNLL-U has 10: {_FIELDS}). Give a "
            "CoNLL-U treebank, e.g. en_ewt-ud-dev.conllu from Universal Dependencies."
        )
    word_id, head, deprel = fields[0], fields[6], fields[7]
    if _RANGE_ID.fullmatch(word_id) or _EMPTY_ID.fullmatch(word_id):
        return None
    if not _PLAIN_ID.fullmatch(word_id):
        raise InputError(
            f"{name}, line {number}: {word_id!r} is not a CoNLL-U word ID (1, 2, ...; 3-4 for a "
            "multiword token, 5.1 for an empty node). Give a CoNLL-U treebank."
        )
    if not _HEAD.fullmatch(head) or deprel in ("", "_"):
        raise InputError(
            f"{name}, line {number}: word {word_id} has no dependency (HEAD={head!r}, "
            f"DEPREL={deprel!r}). dependency_heads needs gold trees in the HEAD and DEPREL "
            "columns, as in Universal Dependencies treebanks; give such a file."
        )
    return word_id, head, deprel


def _blocks(text: str, name: str, limit: int | None) -> list[tuple[int, list[str]]]:
    """The sentences of ``text`` as ``(first line, lines)``, every word line checked."""
    blocks: list[tuple[int, list[str]]] = []
    current: list[str] = []
    start, ids, heads = 0, 0, []

    def close() -> None:
        nonlocal current, ids, heads
        if ids:
            for number, head in heads:
                if head > ids:
                    raise InputError(
                        f"{name}, line {number}: HEAD {head} points past the sentence's last "
                        f"word ({ids}). Give a well-formed CoNLL-U treebank."
                    )
            blocks.append((start, current))
        current, ids, heads = [], 0, []

    for number, line in enumerate(text_lines(text), 1):
        if not line.strip():
            close()
            if limit is not None and len(blocks) >= limit:
                break
            continue
        if not current:
            start = number
        current.append(line)
        if line.startswith("#"):
            continue
        checked = _check_line(name, number, line)
        if checked is None:
            continue
        word_id, head = int(checked[0]), int(checked[1])
        if word_id != ids + 1:
            raise InputError(
                f"{name}, line {number}: word ID {word_id} where {ids + 1} was expected (IDs run "
                "1, 2, ... within a sentence, sentences end with a blank line). Give a "
                "well-formed CoNLL-U treebank."
            )
        ids = word_id
        heads.append((number, head))
    else:
        close()
    return blocks[:limit] if limit is not None else blocks


def read_conllu(conllu: str | os.PathLike, *, limit: int | None = None) -> list[Sentence]:
    """The dependency trees of a CoNLL-U treebank (a path, or the text itself): FORM, HEAD and
    DEPREL of every word (Clark et al. 2019, §4.2).

    Multiword-token ranges (IDs like ``3-4``) and empty nodes (``5.1``) are skipped: the words
    are the syntactic words ``1 .. n``. Relations lose their subtype after ``:``
    (``nmod:poss`` -> ``nmod``, ``obl:tmod`` -> ``obl``). ``limit``: the first ``limit``
    sentences only.

    A word line's columns are its 10 tab-separated fields, as the CoNLL-U format defines them
    (FORM and LEMMA may hold spaces). The ``conllu`` package is not used: it also splits a line
    at every run of two spaces, so a FORM such as ``New  York`` shifted the later columns (a
    TypeError, a valid file refused, or another column read as the relation).

    ``FileNotFoundError`` for a missing file; ``ValueError`` naming the file and line for
    anything that is not CoNLL-U with gold trees (wrong number of columns, a bad ID, no HEAD or
    DEPREL, a head outside the sentence).
    """
    if limit is not None:
        limit = whole_number(limit, "limit", " of sentences (e.g. limit=300)", minimum=1)
    text, name = _source(conllu)
    sentences = []
    for start, lines in _blocks(text, name, limit):
        words = [fields for fields in (line.split("\t") for line in lines if not line.startswith("#"))
                 if _PLAIN_ID.fullmatch(fields[0])]
        sentences.append(Sentence(
            words=tuple(fields[1] for fields in words),
            heads=tuple(int(fields[6]) - 1 for fields in words),
            relations=tuple(fields[7].split(":")[0] for fields in words),
            line=start,
        ))
    if not sentences:
        raise InputError(
            f"{name} has no sentence: a CoNLL-U treebank has one word per line (10 tab-separated "
            f"columns: {_FIELDS}) and a blank line after each sentence."
        )
    return sentences


def relations_of(sentences: Sequence[Sentence]) -> tuple[str, ...]:
    """The relations of the (non-root) arcs of ``sentences``, sorted."""
    return tuple(sorted({relation for sentence in sentences for _, _, relation in sentence.arcs()}))
