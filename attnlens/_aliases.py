"""The module paths attnlens had before its layers, kept for one release.

attnlens' modules live in one-way layers (``core`` < ``engine`` < ``methods`` < ``evaluation`` <
``present`` < ``compare`` < ``cli``, see :mod:`attnlens.core`). The paths written before them,
``attnlens.passes``, ``attnlens.probing.features``, ``attnlens.models.gguf``, ..., still import:
a finder at the front of ``sys.meta_path`` answers an old path with the module already imported
under its new name, so both names are **one** module object (``attnlens.passes is
attnlens.engine.passes``; ``monkeypatch.setattr(attnlens.passes, "run", ...)`` reaches the
engine's own calls).

- :data:`PACKAGES`: the package's top-level names and where each lives now; submodules follow
  (``attnlens.probing.features`` is ``attnlens.evaluation.probing.features``). These are the
  public spellings: no warning.
- :data:`CHILDREN`: a public name that is itself a module gathering names of several layers
  (``attnlens.papa``), whose old submodules live in one package (``attnlens.papa.fitting`` is
  ``attnlens.methods.papa.fitting``).
- :data:`MOVED`: modules that left their package; the old path still imports, with an
  :class:`attnlens.errors.AttnlensDeprecationWarning` naming the new one.

This module imports nothing from attnlens but the errors: the package installs it on import.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

from attnlens.errors import AttnlensDeprecationWarning

#: old top-level name -> where it lives now (its submodules follow it)
PACKAGES: dict[str, str] = {
    "attnlens.checks": "attnlens.core.checks",
    "attnlens.corpus": "attnlens.core.corpus",
    "attnlens.files": "attnlens.core.files",
    "attnlens.heads": "attnlens.core.heads",
    "attnlens.inputs": "attnlens.core.inputs",
    "attnlens.loading": "attnlens.core.loading",
    "attnlens.models": "attnlens.core.models",
    "attnlens.plots": "attnlens.core.plots",
    "attnlens.seam": "attnlens.core.seam",
    "attnlens.passes": "attnlens.engine.passes",
    "attnlens.clustering": "attnlens.methods.clustering",
    "attnlens.effective": "attnlens.methods.effective",
    "attnlens.patterns": "attnlens.methods.patterns",
    "attnlens.stats": "attnlens.methods.stats",
    "attnlens.syntax": "attnlens.methods.syntax",
    "attnlens.views": "attnlens.methods.views",
    "attnlens.lm": "attnlens.evaluation.lm",
    "attnlens.probing": "attnlens.evaluation.probing",
    "attnlens.tasks": "attnlens.evaluation.tasks",
    "attnlens.display": "attnlens.present.display",
    "attnlens.explorer": "attnlens.present.explorer",
    "attnlens.export": "attnlens.present.export",
    "attnlens.kept": "attnlens.present.kept",
    "attnlens.report": "attnlens.present.report",
}
#: a public module of names from several layers -> the package its old submodules live in
CHILDREN: dict[str, str] = {
    "attnlens.papa": "attnlens.methods.papa",
}
#: old path of a module that left its package -> its new path (importing the old one warns)
MOVED: dict[str, str] = {
    "attnlens.streaming": "attnlens.engine.passes",
    "attnlens.papa.curves": "attnlens.evaluation.curve",
    "attnlens.papa.tables": "attnlens.evaluation.table",
    "attnlens.effective.core": "attnlens.engine.effective",
}


def resolve(name: str) -> tuple[str, bool] | None:
    """``(new path, deprecated)`` of the old module path ``name``; ``None`` when ``name`` is not
    an old path (a module that is where it always was, or a new path)."""
    if name in MOVED:
        return MOVED[name], True
    for old, new in PACKAGES.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old):], False
    for old, new in CHILDREN.items():
        if name.startswith(old + "."):
            return new + name[len(old):], False
    # ``from attnlens.effective import core`` asks the import system for the submodule under the
    # package's real name, ``attnlens.methods.effective.core``: an old submodule that moved out
    for old, new in (*PACKAGES.items(), *CHILDREN.items()):
        if name.startswith(new + ".") and old + name[len(new):] in MOVED:
            return MOVED[old + name[len(new):]], True
    return None


#: ``importlib.import_module``'s file (its frame is the import system's too)
_IMPORTLIB = str(Path(importlib.__file__).resolve().parent)


def _caller_level(frame: Any) -> int:
    """The ``stacklevel``, for a warning issued in ``frame``, of the first frame outside the
    import system and attnlens: the line that imported the old path (``warnings`` does not
    count the import system's own frames)."""
    package = str(Path(__file__).resolve().parent)
    level = 1
    while frame is not None:
        name = frame.f_code.co_filename
        if "importlib" in name and "_bootstrap" in name:
            frame = frame.f_back
            continue
        if not (name.startswith(package) or name.startswith(_IMPORTLIB) or "jaxtyping" in name
                or "beartype" in name or name.startswith("<@beartype")):
            return level
        frame, level = frame.f_back, level + 1
    return 2


class _AliasLoader(importlib.abc.Loader):
    """Loads an old path as the module of its new path (imported first if need be)."""

    def __init__(self, target: str, deprecated: bool) -> None:
        self.target, self.deprecated = target, deprecated
        self._spec: Any = None
        self._old_name = ""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        self._old_name = spec.name
        if self.deprecated:
            warnings.warn(
                f"{spec.name} is deprecated and will be removed in the next release; import "
                f"{self.target} instead.",
                AttnlensDeprecationWarning,
                stacklevel=_caller_level(sys._getframe()),
            )
        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system gave the module the old path's spec: give it back its own
        module.__spec__ = self._spec
        # A package's submodules already imported are its old path's too, from now on: else
        # importing one by its old path would set the package's attribute of that name to the
        # submodule, over the function the package exports under it (attnlens.patterns.synthetic)
        name, prefix = self._old_name, self.target + "."
        for loaded, submodule in list(sys.modules.items()):
            if loaded.startswith(prefix):
                sys.modules.setdefault(name + loaded[len(self.target):], submodule)


class AliasFinder(importlib.abc.MetaPathFinder):
    """Finds old module paths (:func:`resolve`); every other name is left to the next finder."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        found = resolve(fullname)
        if found is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(*found))


def install() -> None:
    """Put the finder first in ``sys.meta_path`` (once): ahead of the path finder, which would
    otherwise load a second copy of a module found through an old package's ``__path__``."""
    if not any(isinstance(finder, AliasFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, AliasFinder())
