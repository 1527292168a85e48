"""The protocol every analysis result shares: ``.table``, ``.figure()``, ``to_json`` / ``from_json``.

A result (a PAPA curve, a probe's score, head importance, a head clustering, a comparison, ...)
derives from :class:`Result` and gives:

- ``COLUMNS``: a class attribute, every column of ``.table`` and what it means, in order;
- ``.table``: a ``pandas.DataFrame`` whose columns are exactly ``COLUMNS``' keys in that order
  (a property, or a dataclass field the result was built with);
- ``.figure(**options)``: a ``plotly.graph_objects.Figure`` of the result;
- ``to_json(path=None)`` / ``from_json(text_or_path)``: the result as JSON text (written
  atomically to ``path`` when given, :func:`attnlens.core.files.write_atomic`), and back. The JSON
  is an object with a ``"format"`` field, ``FORMAT`` (e.g. ``"attnlens.Curve/1"``); reading a
  file of another format, or one that is damaged, raises
  :class:`~attnlens.errors.FileFormatError` saying what is wrong and how to write it again.

Counts are named alike in every result: ``n_examples`` (texts or sentence pairs), ``n_tokens``
(real tokens) and ``n_truncated`` (examples that lost tokens to ``max_len``).

A subclass writes :meth:`Result.to_dict` (the JSON object, without ``"format"``) and
:meth:`Result.from_dict` (its inverse); :func:`frame_to_json` and :func:`frame_from_json`
carry a table exactly (values and dtypes), :func:`plain` makes anything else JSON-ready.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd

from attnlens.errors import FileFormatError

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["Result", "frame", "frame_from_json", "frame_to_json", "plain"]


class Result:
    """The base of attnlens's results (see the module docstring). A mixin: subclasses are
    usually dataclasses, and set :attr:`COLUMNS` and :attr:`FORMAT`."""

    #: every column of :attr:`table` -> its meaning, in the table's order
    COLUMNS: ClassVar[dict[str, str]] = {}
    #: the ``"format"`` field of :meth:`to_json` (``"attnlens.<Class>/<version>"``)
    FORMAT: ClassVar[str] = ""
    #: how to write a file again, named by :meth:`from_json`'s errors (default ``<Class>.to_json``)
    WRITTEN_BY: ClassVar[str] = ""

    if TYPE_CHECKING:
        #: the result as a table: the columns of :attr:`COLUMNS`, in order
        table: pd.DataFrame

    def figure(self, **options: Any) -> go.Figure:
        """The result as a plotly figure."""
        raise NotImplementedError(f"{type(self).__name__} has no figure")

    # -- JSON ------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of :meth:`to_json` without its ``"format"``."""
        raise NotImplementedError(f"{type(self).__name__} is not written to JSON")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        """The result of a :meth:`to_dict` object: a missing field is a ``KeyError``, a mangled one a
        ``ValueError`` or ``TypeError`` (:meth:`from_json` names either in one
        :class:`~attnlens.errors.FileFormatError`)."""
        raise NotImplementedError(f"{cls.__name__} is not read from JSON")

    def to_json(self, path: str | os.PathLike | None = None, *, indent: int | None = None,
                overwrite_read_only: bool = False) -> str:
        """The result as JSON text (an object whose ``"format"`` is :attr:`FORMAT`); also written
        to ``path`` if given (atomically, missing folders created,
        :func:`attnlens.core.files.write_atomic`)."""
        from attnlens.core.checks import whole_number

        indent = None if indent is None else whole_number(indent, "indent", " of spaces", minimum=0)
        text = json.dumps({"format": self.FORMAT, **self.to_dict()}, indent=indent)
        if path is not None:
            from attnlens.core.files import write_atomic

            write_atomic(Path(path), text.encode("utf-8"), overwrite_read_only=overwrite_read_only)
        return text

    @classmethod
    def from_json(cls, text_or_path: str | os.PathLike) -> Any:
        """The result of :meth:`to_json`'s text, or of the file at ``text_or_path``.
        :class:`~attnlens.errors.FileFormatError` names what is wrong with a file that is not
        valid JSON, is of another format, or lacks or mangles a field (an object without
        ``"format"``, hand-written or older, is read by its fields)."""
        text = str(text_or_path)
        name = cls.__name__
        noun = re.sub(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", " ", name).lower()
        source = "the JSON text given"
        if not text.lstrip().startswith("{"):
            from attnlens.core.files import check_readable

            source = f"{noun} file {text_or_path}"
            try:
                text = check_readable(text_or_path, noun).read_text(encoding="utf-8")
            except UnicodeDecodeError:
                text = "\x00"  # not text: refused as not valid JSON below
        problem = None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            problem = (f"it is not valid JSON ({error.msg} at line {error.lineno}, column "
                       f"{error.colno}: truncated or edited?)")
        else:
            if not isinstance(data, dict):
                problem = f"it holds a JSON {type(data).__name__}, not an object"
            elif data.get("format", cls.FORMAT) != cls.FORMAT:  # no format: read by its fields
                problem = f"its format is {data['format']!r}, not {cls.FORMAT!r}"
        if problem is None:
            try:
                return cls.from_dict(data)
            except KeyError as error:
                problem = f"it lacks or mangles the field {error}"
            except (ValueError, TypeError, AttributeError, IndexError) as error:
                problem = f"a field has the wrong form ({error})"
        raise FileFormatError(
            f"{source} is not a {name} written by {name}.to_json: {problem}; write it again "
            f"with {cls.WRITTEN_BY or name + '.to_json'}."
        )


# -- tables ----------------------------------------------------------------------------------------


def frame(rows: Any, columns: dict[str, str] | Any) -> pd.DataFrame:
    """A DataFrame of ``rows`` (records, or a dict of columns) with exactly ``columns`` (a
    :attr:`Result.COLUMNS` or a list of names), in that order; a column ``rows`` lacks is NaN."""
    return pd.DataFrame(rows).reindex(columns=list(columns))


def plain(value: Any) -> Any:
    """``value`` as JSON-ready Python: containers as lists and dicts (keys as strings), NumPy
    and torch values as numbers and lists, NaN as ``None``; anything else as its ``str``."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(item) for item in value]
    if hasattr(value, "detach"):  # a tensor
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray | np.generic):
        return plain(value.tolist())
    return str(value)


def frame_to_json(table: pd.DataFrame) -> dict[str, Any]:
    """A table as JSON-ready ``{"columns", "dtypes", "rows", "nans", "attrs"}``: every float as
    Python writes it (exact), NaN as ``None`` (``nans``: where a column of objects held NaN
    rather than ``None``); :func:`frame_from_json` reads it back equal."""
    nans = {}
    for column, dtype in zip(table.columns, table.dtypes, strict=True):
        if dtype == np.dtype(object):
            rows = [i for i, value in enumerate(table[column]) if isinstance(value, float) and math.isnan(value)]
            if rows:
                nans[str(column)] = rows
    return {
        "columns": [str(column) for column in table.columns],
        "dtypes": [str(dtype) for dtype in table.dtypes],
        "rows": [[plain(value) for value in row] for row in table.itertuples(index=False, name=None)],
        "nans": nans,
        "attrs": plain(dict(table.attrs)),
    }


def frame_from_json(data: dict[str, Any]) -> pd.DataFrame:
    """The table of :func:`frame_to_json`."""
    columns, dtypes = list(data["columns"]), list(data["dtypes"])
    if len(columns) != len(dtypes):
        raise ValueError(f"the table has {len(columns)} columns but {len(dtypes)} dtypes")
    rows = [list(row) for row in data["rows"]]
    if any(len(row) != len(columns) for row in rows):
        raise ValueError(f"a row of the table does not have its {len(columns)} columns")
    table = pd.DataFrame({column: pd.Series([row[i] for row in rows], dtype=object)
                          for i, column in enumerate(columns)}, columns=columns)
    for column, dtype in zip(columns, dtypes, strict=True):
        if dtype == "object":
            values = table[column].copy()
            for row in data.get("nans", {}).get(column, []):
                values.iloc[row] = math.nan
            table[column] = values
        else:
            table[column] = table[column].astype("float64" if dtype.startswith("float") else object).astype(dtype)
    table.attrs.update(data.get("attrs") or {})
    return table
