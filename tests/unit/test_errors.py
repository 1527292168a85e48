"""One error family: every error class attnlens defines derives from AttnlensError (found by
walking every module, so a new class is covered), and deliberate refusals are caught as one."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import attnlens
from attnlens import errors
from attnlens.errors import AttnlensError, AttnlensWarning

ROOT = Path(__file__).resolve().parents[2]


def attnlens_modules() -> list:
    found = [attnlens]
    for info in pkgutil.walk_packages(attnlens.__path__, "attnlens."):
        if info.name.endswith("__main__"):
            continue
        found.append(importlib.import_module(info.name))
    return found


def defined_exceptions() -> dict[str, type]:
    classes = {}
    for module in attnlens_modules():
        for name, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, BaseException)
                    and value.__module__.startswith("attnlens") and value.__module__ == module.__name__):
                classes[f"{module.__name__}.{name}"] = value
    return classes


def test_import_attnlens_then_attnlens_error():
    result = subprocess.run([sys.executable, "-c", "import attnlens; print(attnlens.AttnlensError)"],
                            capture_output=True, text=True, cwd=ROOT,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "<class 'attnlens.errors.AttnlensError'>"
    assert "AttnlensError" in attnlens.__all__


def test_every_error_class_attnlens_defines_derives_from_attnlens_error():
    classes = defined_exceptions()
    assert {"attnlens.cli.jobs.common.UsageError", "attnlens.core.corpus.CorpusError",
            "attnlens.evaluation.tasks.TaskError", "attnlens.core.loading.ModelFilesError",
            "attnlens.core.models.UnsupportedArchitecture", "attnlens.evaluation.lm.scorer.UntrainedHead",
            "attnlens.core.layouts.BlankText", "attnlens.evaluation.importance.GatesUnused",
            "attnlens.errors.InputError"} <= set(classes)
    outside = [
        name for name, cls in classes.items()
        if not issubclass(cls, Warning) and not name.rsplit(".", 1)[1].startswith("_")
        and not issubclass(cls, AttnlensError)
    ]
    assert not outside, f"error classes outside the AttnlensError family: {outside}"
    warnings_outside = [name for name, cls in classes.items()
                        if issubclass(cls, Warning) and not issubclass(cls, AttnlensWarning)]
    assert not warnings_outside, warnings_outside


def test_each_family_member_is_also_the_builtin_it_resembles():
    assert issubclass(errors.InputError, ValueError) and issubclass(errors.InputTypeError, TypeError)
    assert issubclass(errors.FileFormatError, ValueError) and issubclass(errors.DamagedFileError, errors.FileFormatError)
    assert issubclass(errors.MissingFileError, FileNotFoundError) and issubclass(errors.MissingFileError, ValueError)
    assert issubclass(errors.MismatchError, ValueError)
    for name in ("NotFittedError", "UnavailableError", "ModelBehaviourError"):
        assert issubclass(getattr(errors, name), RuntimeError)
    for name in errors.__all__:
        assert getattr(errors, name).__doc__, name  # each says when it is raised


def test_the_errors_module_is_a_leaf():
    import ast

    tree = ast.parse((ROOT / "attnlens" / "errors.py").read_text(encoding="utf-8"))
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    imported += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert not [name for name in imported if name.startswith("attnlens")], imported


@pytest.mark.parametrize("refusal", [
    lambda: attnlens.core.checks.whole_number(1.5, "seed"),
    lambda: attnlens.core.checks.finite(float("nan"), "fraction"),
    lambda: attnlens.core.corpus.read_corpus("/nonexistent/corpus.txt"),
    lambda: attnlens.evaluation.tasks.load("no-such-task"),
    lambda: attnlens.papa.select_heads("no-such-strategy", n=1, n_layers=1, n_heads=1),
    lambda: attnlens.evaluation.probing.probe.PapaProbe().save("/tmp/never.safetensors"),
    lambda: attnlens.core.loading.checked_device("bogus"),
    lambda: attnlens.cli.main(["fit-papa", "--checkpoint-every", "3", "--out", "/tmp/x.safetensors"]),
])
def test_deliberate_refusals_are_caught_as_attnlens_error(refusal):
    try:
        refusal()
    except AttnlensError as error:
        assert str(error)
    except SystemExit as exit_info:  # the CLI turns them into one line and status 2
        assert exit_info.code == 2
    else:
        pytest.fail("not refused")
