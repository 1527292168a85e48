"""Old spellings that keep working for a release, each with a warning naming the new one.

:func:`renamed` is a deprecated attribute that reads (and sets) its new name;
:func:`renamed_fields` renames fields of a dataclass, keeping the old names as such attributes
and as constructor keywords. The warning is an
:class:`~attnlens.errors.AttnlensDeprecationWarning` pointing at the caller's line.
(Old module paths are :mod:`attnlens._aliases`.)
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

from attnlens.errors import AttnlensDeprecationWarning

__all__ = ["renamed", "renamed_fields", "warn_renamed"]


def warn_renamed(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that ``old`` is deprecated and ``new`` is its spelling now."""
    warnings.warn(f"{old} is deprecated: write {new} instead", AttnlensDeprecationWarning,
                  stacklevel=stacklevel)


def renamed(old: str, new: str, *, owner: str = "", settable: bool = False) -> property:
    """A property ``old`` that warns and reads attribute ``new`` (and sets it, ``settable``).
    ``owner``: the class name shown in the warning."""
    prefix = f"{owner}." if owner else "."

    def get(self: Any) -> Any:
        warn_renamed(f"{prefix}{old}", f"{prefix}{new}")
        return getattr(self, new)

    def put(self: Any, value: Any) -> None:
        warn_renamed(f"{prefix}{old}", f"{prefix}{new}")
        setattr(self, new, value)

    return property(get, put if settable else None, doc=f"Deprecated: :attr:`{new}`.")


def renamed_fields(**names: str) -> Any:
    """Class decorator (above ``@dataclass``): fields renamed ``old=new`` keep their old names as
    :func:`renamed` attributes and as constructor keywords (the old keyword wins when both are
    given, as :func:`dataclasses.replace` gives every field)."""

    def decorate(cls: type) -> type:
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            for old, new in names.items():
                if old in kwargs:
                    warn_renamed(f"{cls.__name__}({old}=)", f"{cls.__name__}({new}=)")
                    kwargs[new] = kwargs.pop(old)
            init(self, *args, **kwargs)

        cls.__init__ = __init__  # type: ignore[misc]
        for old, new in names.items():
            setattr(cls, old, renamed(old, new, owner=cls.__name__, settable=True))
        return cls

    return decorate
