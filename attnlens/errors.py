"""attnlens's errors: one family under :class:`AttnlensError`.

Every error attnlens raises on purpose is an :class:`AttnlensError`, so one ``except
AttnlensError`` catches what attnlens refuses (and nothing else). Each class also derives from
the built-in exception it resembles, so code written as ``except ValueError`` (or
``TypeError``, ``FileNotFoundError``, ``RuntimeError``) keeps working.

The family (see ``docs/refusals.md``), each with the built-in it also is:

- :class:`InputError` (``ValueError``): an argument has the right type, a wrong value;
- :class:`InputTypeError` (``TypeError``): an argument has a wrong type;
- :class:`FileFormatError` (``ValueError``): a file cannot be read as what it should be;
- :class:`DamagedFileError` (a ``FileFormatError``): a file changed after attnlens wrote it;
- :class:`MissingFileError` (``FileNotFoundError`` and ``ValueError``): a needed file is not there;
- :class:`MismatchError` (``ValueError``): two artifacts made for different things meet;
- :class:`NotFittedError` (``RuntimeError``): a fitted object is used before ``fit``;
- :class:`UnavailableError` (``RuntimeError``): a device or library this machine lacks;
- :class:`ModelBehaviourError` (``RuntimeError``): the model did not do what attnlens relies on.

This module imports nothing from attnlens (any module can import it without a cycle).
"""

from __future__ import annotations

__all__ = [
    "AttnlensError", "AttnlensWarning", "InputError", "InputTypeError", "FileFormatError",
    "DamagedFileError", "MissingFileError", "MismatchError", "NotFittedError", "UnavailableError",
    "ModelBehaviourError",
]


class AttnlensError(Exception):
    """The base of every error attnlens raises on purpose: its message names the argument or
    file at fault and what to do about it."""


class AttnlensWarning(UserWarning):
    """The base of attnlens's warnings: a result that is computed, but with a caveat."""


class InputError(AttnlensError, ValueError):
    """An argument (or a command-line option, or a row of input data) has an accepted type but a
    value attnlens refuses: out of range, NaN, empty, unknown name, inconsistent with another
    argument. The message names the argument."""


class InputTypeError(AttnlensError, TypeError):
    """An argument has a type attnlens does not accept (a float where a whole number is needed,
    a string where a number is needed, a NumPy array where a tensor is needed). The message names
    the argument and the accepted types."""


class FileFormatError(AttnlensError, ValueError):
    """A file cannot be read as what it should be: not attnlens's format, another kind of
    attnlens file, truncated, or not valid JSON / CSV. The message names the file and how to
    re-create it."""


class DamagedFileError(FileFormatError):
    """A file attnlens wrote was changed afterwards: a tensor or a metadata key no longer matches
    the checksum recorded when it was written. ``path`` is the file, ``keys`` the metadata keys
    (or ``"tensors"``) that do not match."""

    def __init__(self, message: str, *, path: object = None, keys: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.path, self.keys = path, tuple(keys)


class MissingFileError(AttnlensError, FileNotFoundError, ValueError):
    """A file or folder that is needed is not there (a corpus, a model folder, a checkpoint's
    file, a data set). The message names the path and how to get it. Also a ``ValueError``:
    several readers refused a missing file with one before this family existed."""


class MismatchError(AttnlensError, ValueError):
    """Two artifacts made for different things are combined: constants fitted on sentence pairs
    applied to single sentences, a probe for one task given another task's features, a cached
    feature file read under another cache key, a file made for another model."""


class NotFittedError(AttnlensError, RuntimeError):
    """An object that must be fitted first (a probe, a head, a classifier) is used, or saved,
    before ``fit``."""


class UnavailableError(AttnlensError, RuntimeError):
    """Something this machine does not have is asked for: a CUDA device without CUDA, an
    optional library that is not installed."""


class ModelBehaviourError(AttnlensError, RuntimeError):
    """The model did not behave as attnlens relies on: a hook that did not fire, an output of an
    unexpected shape. Usually an architecture attnlens does not support."""
