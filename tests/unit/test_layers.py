"""attnlens' package tree is one-way layers, and each module has one name.

Layers, lowest first (:data:`LAYERS`): ``core`` (inputs, loading, seam, models, checks, files,
heads, plots), ``engine`` (the pass: accumulators, ``run``, checkpoints, distributed, hooks),
``methods`` (papa, effective, stats, patterns, clustering, ablation, syntax), ``evaluation``
(tasks, probing, lm, the PAPA curve and table, head importance), ``present`` (figures, report,
explorer, export), ``comparison`` (result, accumulator, run: :func:`attnlens.compare`), ``cli``,
and ``api`` (the package's
facade: ``attnlens/__init__.py`` and the public modules ``attnlens.papa`` and
``attnlens.ablation`` that gather names of several layers). A module's layer is its folder
(``attnlens/<layer>/...``), or :data:`OUTSIDE` for the modules at the package's root.

The check is an AST walk over every module of ``attnlens/``: every ``import`` and ``from ...
import`` (at the top of the file, inside a function, under ``if TYPE_CHECKING``, relative or
not) and every ``importlib.import_module("attnlens....")`` with a literal name. Each import is
resolved to the module it loads (``from attnlens import x`` to the submodule ``attnlens.x``, and
any other name of the package, its lazy names and dunders such as ``__version__`` included, to
the package itself, ``api``: importing it runs ``attnlens/__init__.py``); a module may import
its own layer and lower ones only. An ``import_module`` whose name is not a literal is refused
below ``api``: the check could not see where it goes.
"""

from __future__ import annotations

import ast
import importlib
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "attnlens"

#: the layers, lowest first
LAYERS = ("core", "engine", "methods", "evaluation", "present", "comparison", "cli", "api")
#: the layer of each module outside the layer folders
OUTSIDE = {
    "attnlens.errors": "core",  # the error family: a leaf every layer imports
    "attnlens": "api",  # the package: lazy names and submodules
    "attnlens.__main__": "api",
    "attnlens.papa": "api",  # PAPA's public names: methods.papa, evaluation.curve and .table
    "attnlens.ablation": "api",  # methods.ablation and evaluation.importance
}
#: the layer folders are the layers below api
FOLDERS = LAYERS[:-1]


@dataclass(frozen=True)
class Import:
    path: str  # the file, relative to the repository
    line: int
    source: str  # the importing module
    target: str  # the module it loads
    local: bool  # inside a function

    def __str__(self) -> str:
        where = "inside a function " if self.local else ""
        return (f"{self.path}:{self.line} {where}imports {self.target} ({layer_of(self.target)}) "
                f"from {layer_of(self.source)}")


def module_name(file: Path, package: Path) -> str:
    parts = list(file.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_of(package: Path) -> dict[str, Path]:
    return {module_name(file, package): file for file in sorted(package.rglob("*.py"))}


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in FOLDERS:
        return parts[1]
    if module in OUTSIDE:
        return OUTSIDE[module]
    raise KeyError(f"{module} has no layer: put it in a layer folder or in OUTSIDE")


def canonical(name: str, modules: set[str]) -> str | None:
    """The module ``name`` loads: the longest prefix of ``name`` that is a module of the tree
    (``attnlens.core.inputs.Batch`` -> ``attnlens.core.inputs``)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _is_package(file: Path) -> bool:
    return file.name == "__init__.py"


def local_nodes(tree: ast.AST) -> set[int]:
    """The ``id`` of every node of ``tree`` inside a function or lambda."""
    local: set[int] = set()
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            local.update(id(node) for node in ast.walk(function) if node is not function)
    return local


def imports_of(source: str, module: str, path: str, modules: set[str], *,
               is_package: bool = False) -> tuple[list[Import], list[str]]:
    """Every import of attnlens in ``source`` (module ``module``), resolved; and the problems
    the walk could not resolve (a dynamic ``import_module``, a path that names no module)."""
    tree = ast.parse(source)
    local = local_nodes(tree)
    found: list[Import] = []
    problems: list[str] = []

    def add(node: ast.AST, name: str) -> None:
        target = canonical(name, modules)
        if target is None:
            problems.append(f"{path}:{node.lineno} imports {name}, which is no module of attnlens")
        else:
            item = Import(path, node.lineno, module, target, id(node) in local)
            if item not in found:
                found.append(item)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "attnlens":
                    add(node, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            if origin.split(".")[0] != "attnlens":
                continue
            for alias in node.names:
                name = f"{origin}.{alias.name}"
                if name in modules:
                    add(node, name)  # a submodule
                else:
                    add(node, origin)  # a name defined in ``origin`` (``attnlens``: the facade)
        elif isinstance(node, ast.Call):
            function = node.func
            called = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
            if called not in ("import_module", "__import__") or not node.args:
                continue
            argument = node.args[0]
            if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                if argument.value.split(".")[0] == "attnlens":
                    add(node, argument.value)
            elif layer_of(module) != "api":
                problems.append(f"{path}:{node.lineno} calls {called} with a name the check cannot read")
    return found, problems


def all_imports(package: Path = PACKAGE) -> tuple[list[Import], list[str]]:
    modules = modules_of(package)
    found: list[Import] = []
    problems: list[str] = []
    for module, file in modules.items():
        path = str(file.relative_to(package.parent))
        more, trouble = imports_of(file.read_text(encoding="utf-8"), module, path, set(modules),
                                   is_package=_is_package(file))
        found += more
        problems += trouble
    return found, problems


def upward(imports: list[Import]) -> list[Import]:
    return [item for item in imports
            if LAYERS.index(layer_of(item.target)) > LAYERS.index(layer_of(item.source))]


def violations(package: Path = PACKAGE) -> list[str]:
    imports, problems = all_imports(package)
    return problems + [str(item) for item in upward(imports)]


# -- the layers -----------------------------------------------------------------------------------


def test_every_module_has_a_layer():
    missing = []
    for module in modules_of(PACKAGE):
        try:
            layer_of(module)
        except KeyError as error:
            missing.append(str(error))
    assert not missing, "\n".join(missing)


def test_no_module_imports_a_higher_layer():
    found = violations()
    assert not found, "imports of a higher layer:\n" + "\n".join(found)


def test_the_check_reads_every_kind_of_import():
    imports, _ = all_imports()
    assert len(imports) > 300
    assert any(item.local for item in imports) and any(not item.local for item in imports)
    assert any(item.source == "attnlens" and item.target == "attnlens.core.notebook" for item in imports)


def cycles(imports: list[Import], *, top_level_only: bool) -> list[set[str]]:
    """The strongly connected components (of two modules or more) of the import graph. A module
    that imports its own package (``attnlens.cli.compare`` reading ``attnlens.cli``) closes no
    cycle: Python imports the package before the module."""
    edges: dict[str, set[str]] = {}
    for item in imports:
        if item.source == item.target or item.source.startswith(item.target + "."):
            continue
        if not (top_level_only and item.local):
            edges.setdefault(item.source, set()).add(item.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while True:
                other = stack.pop()
                component.add(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles():
    imports, _ = all_imports()
    assert cycles(imports, top_level_only=True) == []
    assert cycles(imports, top_level_only=False) == []  # none hidden inside a function either


#: What an import inside a function may wait for: a module that loads a heavy library (plotly,
#: ``datasets``) which the importing module does not load otherwise. Every other import of
#: attnlens sits at the top of its file, where a reader sees what the module stands on.
DEFERRED_TARGETS = {
    "attnlens.present.report": "plotly, for the HTML report",
}
#: Modules whose imports of attnlens may all wait for a call, and why.
DEFERRING_MODULES = {
    "attnlens.core.result": "a result's table is read and written with pandas alone, without torch",
    "attnlens.methods.views": "the command line's parser reads the views' names without torch",
    "attnlens.core.models.gguf": "attnlens.core.models imports every architecture's file for its registry",
    "attnlens.core.models.llama": "attnlens.core.models imports every architecture's file for its registry",
}
#: Single imports that wait for a call, and why.
DEFERRED_PAIRS: dict[tuple[str, str], str] = {}
#: Layers that defer on purpose: the command line (``attnlens --help`` stays fast) and the
#: package's lazy facade.
DEFERRING_LAYERS = ("cli", "api")


def needless_deferrals(imports: list[Import]) -> list[str]:
    """Imports inside a function that none of the reasons above explains."""
    return [str(item) for item in imports
            if item.local and item.target not in DEFERRED_TARGETS and item.source not in DEFERRING_MODULES
            and (item.source, item.target) not in DEFERRED_PAIRS and layer_of(item.source) not in DEFERRING_LAYERS]


def test_imports_wait_inside_a_function_only_for_a_reason():
    imports, _ = all_imports()
    found = needless_deferrals(imports)
    assert not found, "imports inside a function with no reason to wait (move them to the top):\n" + "\n".join(found)


def test_the_deferral_check_catches_a_planted_import():
    modules = set(modules_of(PACKAGE))
    source = "def later():\n    from attnlens.core import checks, plots\n    return checks, plots\n"
    found, _ = imports_of(source, "attnlens.engine.planted", "attnlens/engine/planted.py", modules)
    assert needless_deferrals(found) == [
        "attnlens/engine/planted.py:2 inside a function imports attnlens.core.checks (core) from engine",
        "attnlens/engine/planted.py:2 inside a function imports attnlens.core.plots (core) from engine"]
    found, _ = imports_of(source, "attnlens.cli.planted", "attnlens/cli/planted.py", modules)
    assert needless_deferrals(found) == []


#: standard-library modules a function may import, and why; every other one sits at the top of
#: its file (importing it costs nothing a reader should wait to see)
DEFERRED_STANDARD = {
    "pydoc_data.topics": "a megabyte of Python's help texts, read only for the fallback corpus",
}


def deferred_standard_imports(source: str, path: str) -> list[str]:
    """The standard library's modules imported inside a function of ``source`` (:func:`local_nodes`),
    but those of :data:`DEFERRED_STANDARD`."""
    tree = ast.parse(source)
    local = local_nodes(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) not in local:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        else:
            continue
        found += [f"{path}:{node.lineno} imports {name} inside a function" for name in names
                  if name.split(".")[0] in sys.stdlib_module_names and name not in DEFERRED_STANDARD]
    return found


def test_the_standard_library_is_imported_at_the_top():
    found = [line for file in modules_of(PACKAGE).values()
             for line in deferred_standard_imports(file.read_text(encoding="utf-8"), str(file.relative_to(ROOT)))]
    assert not found, "standard-library imports inside a function (move them to the top):\n" + "\n".join(found)
    planted = "import os\n\ndef later():\n    import json\n    from pydoc_data.topics import topics\n    return json\n"
    assert deferred_standard_imports(planted, "planted.py") == ["planted.py:4 imports json inside a function"]


# -- the check itself fails ---------------------------------------------------------------------------


PLANTED = '''
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from attnlens.core import checks                 # down: fine
from attnlens.present import report              # up: present
from ..evaluation import tasks                   # up: evaluation (relative)
import attnlens.evaluation.probing.features      # up: evaluation
from attnlens import __version__, comparison     # the package (api) itself; comparison is up

if TYPE_CHECKING:
    from attnlens.cli import main                # up: cli, even for type checkers


def later(name):
    from attnlens.core import plots              # down (core)
    from attnlens.methods.papa import fitting    # up: methods, inside a function
    importlib.import_module("attnlens.evaluation.lm")  # up: evaluation, by name
    return importlib.import_module(name)         # unreadable
'''


def test_the_check_catches_planted_upward_imports():
    modules = set(modules_of(PACKAGE))
    found, problems = imports_of(PLANTED, "attnlens.engine.planted", "attnlens/engine/planted.py", modules)
    caught = {(item.line, item.target, item.local) for item in upward(found)}
    assert caught == {
        (8, "attnlens.present.report", False),
        (9, "attnlens.evaluation.tasks", False),
        (10, "attnlens.evaluation.probing.features", False),
        (11, "attnlens", False),
        (11, "attnlens.comparison", False),
        (14, "attnlens.cli", False),
        (19, "attnlens.methods.papa.fitting", True),
        (20, "attnlens.evaluation.lm", True),
    }
    assert {item.target for item in found} >= {"attnlens.core.checks", "attnlens.core.plots"}
    assert problems == ["attnlens/engine/planted.py:21 calls import_module with a name the check cannot read"]
    message = str(next(item for item in upward(found) if item.line == 19))
    assert message == ("attnlens/engine/planted.py:19 inside a function imports "
                       "attnlens.methods.papa.fitting (methods) from engine")


def test_the_check_fails_on_a_tree_with_an_upward_import(tmp_path):
    """A copy of the package with one import planted inside a function of a core module."""
    copy = tmp_path / "attnlens"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert violations(copy) == []
    checks = copy / "core" / "checks.py"
    lines = checks.read_text(encoding="utf-8").splitlines()
    lines += ["", "", "def _planted():", "    from attnlens.present.report import render", "    return render"]
    checks.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert violations(copy) == [
        f"attnlens/core/checks.py:{len(lines) - 1} inside a function imports attnlens.present.report "
        "(present) from core"
    ]


def test_the_check_finds_a_cycle_planted_inside_a_function(tmp_path):
    """A copy of the package with the cycle it had until 2026-11-26 planted back: head selection
    imports the hooks at its top, and the hooks' module imports head selection inside a function.
    The cycle is found among all imports, and not among the top-level ones."""
    copy = tmp_path / "attnlens"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    intervene = copy / "methods" / "papa" / "intervene.py"
    intervene.write_text(intervene.read_text(encoding="utf-8") + "\n\ndef _planted():\n"
                         "    from attnlens.methods.papa.selection import select_heads\n"
                         "    return select_heads\n", encoding="utf-8")
    imports, _ = all_imports(copy)
    assert cycles(imports, top_level_only=True) == []
    assert cycles(imports, top_level_only=False) == [
        {"attnlens.methods.papa.intervene", "attnlens.methods.papa.selection"}]


# -- readable parts -----------------------------------------------------------------------------------

#: the most lines a module of attnlens may have, and the pass engine's ``run``
MODULE_LINES, RUN_LINES = 600, 80
#: the most imports of attnlens inside functions (the command line's one per command among them)
LOCAL_IMPORTS = 30


def test_no_module_is_over_600_lines_and_run_is_short():
    long = {str(path.relative_to(ROOT)): n for path in sorted(PACKAGE.rglob("*.py"))
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MODULE_LINES}
    assert not long, f"modules over {MODULE_LINES} lines: {long}"
    tree = ast.parse((PACKAGE / "engine" / "passes.py").read_text(encoding="utf-8"))
    run = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "run")
    assert run.end_lineno - run.lineno + 1 <= RUN_LINES


def test_one_name_per_module_and_few_deferred_imports():
    assert not (PACKAGE / "_aliases.py").exists() and not (PACKAGE / "core" / "deprecation.py").exists()
    imports, _ = all_imports()
    local = [str(item) for item in imports if item.local]
    assert len(local) <= LOCAL_IMPORTS, "\n".join(local)


#: the packages whose ``__init__`` holds code, and why: the package's lazy import of its names,
#: the command line's parser and ``main`` (the console script's entry point), the registry of
#: the architectures' files (``models.of(model)``)
INIT_WITH_CODE = {"attnlens/__init__.py", "attnlens/cli/__init__.py", "attnlens/core/models/__init__.py"}


def test_a_package_gathers_names_and_its_modules_hold_the_code():
    """A package's ``__init__`` is its docstring, its imports, ``__all__`` and constants; what it
    computes lives in a module of its own (one idea per module: ``probing.run`` in
    ``probing/scoring.py``, its result in ``probing/result.py``), but for :data:`INIT_WITH_CODE`."""
    with_code = {}
    for path in sorted(PACKAGE.rglob("__init__.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined = [node.name for node in tree.body
                   if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
        if defined:
            with_code[str(path.relative_to(ROOT))] = defined
    assert set(with_code) == INIT_WITH_CODE, with_code


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_uses_another_modules_private_names():
    """A name another module uses is part of its module's interface, so it has no leading
    underscore (``from attnlens.engine.batches import stage_batch``, not ``_stage``;
    ``tasks.SPECS``, not ``tasks._SPECS``; ``label_targets(...)``, not
    ``PapaProbe._targets(PapaProbe(), ...)``): a private name is used only in its own module,
    neither imported nor read as an attribute of a module or class imported from attnlens. The
    benchmarks and examples count as modules too: what they read of attnlens is its interface."""
    private = []
    paths = [path for folder in (PACKAGE, ROOT / "benchmarks", ROOT / "examples") for path in folder.rglob("*.py")]
    for path in sorted(paths):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = set()  # the names this module binds to attnlens modules, classes and functions
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnlens"):
                private += [f"{path.relative_to(ROOT)}: {node.module}.{alias.name}" for alias in node.names
                            if _private(alias.name)]
                imported |= {alias.asname or alias.name for alias in node.names}
            elif isinstance(node, ast.Import):
                imported |= {alias.asname for alias in node.names if alias.asname and alias.name.startswith("attnlens")}
        private += [f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}" for node in ast.walk(tree)
                    if isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                    and node.value.id in imported]
    assert not private, "\n".join(private)


def test_the_public_facades_are_names_only():
    """``attnlens.papa`` and ``attnlens.ablation`` gather names; no module-level ``__getattr__``
    hands out modules of before the layers (one name per module), and a name they lack is an
    ``AttributeError``. The package's own ``__getattr__`` is its lazy import of ``__all__``."""
    for name, path in (("attnlens.papa", "papa/__init__.py"), ("attnlens.ablation", "ablation.py")):
        tree = ast.parse((PACKAGE / path).read_text(encoding="utf-8"))
        assert not [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "__getattr__"], name
        module = importlib.import_module(name)
        assert all(hasattr(module, public) for public in module.__all__)
        with pytest.raises(AttributeError):
            module.fitting  # noqa: B018 (a submodule of before the layers)


def test_a_module_imports_only_what_it_uses():
    """A name is imported from another attnlens module only where it is used (one name per
    module: no re-exports, such as ``attnlens.present.display.in_notebook`` for
    ``attnlens.core.notebook.in_notebook``, kept under ``# noqa: F401``). Packages' ``__init__``
    files gather names on purpose; a module's ``__all__`` names what it offers."""
    unused = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
                used |= {element.value for element in getattr(node.value, "elts", [])
                         if isinstance(element, ast.Constant)}
        unused += [f"{path.relative_to(ROOT)}:{node.lineno}: {alias.asname or alias.name}"
                   for node in ast.walk(tree)
                   if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnlens")
                   for alias in node.names if (alias.asname or alias.name) not in used]
    assert not unused, "\n".join(unused)
