"""What the commands' jobs share: the checks of paths, devices and options, reading the corpus,
loading the model, writing a table and its figure.

The jobs call these through this module (``common.load(...)``), so that replacing one (a test's
``monkeypatch.setattr(common, "load", ...)``) reaches every command.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers.utils import logging as hf_logging

from attnlens.cli.options import PROG
from attnlens.comparison import result, run
from attnlens.core import inputs, loading
from attnlens.core.corpus import read_corpus, read_corpus_counted, resolve_corpus
from attnlens.core.files import write_atomic
from attnlens.errors import AttnlensError
from attnlens.evaluation import tasks
from attnlens.evaluation.curve import ALL_BASELINES
from attnlens.methods import views


class UsageError(AttnlensError):
    """Bad input on the command line: reported in one line, exit status 2."""


# -- inputs --------------------------------------------------------------------------------------


def corpus_texts(args: argparse.Namespace) -> list[str]:
    """The corpus's texts (the first ``--n-examples``); blank lines of a file are skipped and
    their number said on stderr, as the API refuses blank texts in a list."""
    if args.corpus == "default":
        texts = resolve_corpus(None)
    else:
        texts, blank = read_corpus_counted(args.corpus)
        if blank and not args.quiet:
            print(f"{PROG}: corpus {args.corpus}: {len(texts)} texts read, {blank} blank "
                  f"line{'s' if blank != 1 else ''} skipped", file=sys.stderr)
    return texts[: args.n_examples] if args.n_examples else texts


def corpus_file(args: argparse.Namespace) -> tuple[str, str | None]:
    """``("--corpus", path)`` for :func:`output`'s ``keep``; no path for the embedded corpus."""
    return "--corpus", None if args.corpus == "default" else args.corpus


def view_names(text: str | None) -> list[str]:
    """``--views``: the comma-separated names, each a registered view (``None``: every one,
    :data:`attnlens.methods.views.REGISTRY` read now)."""
    if text is None:
        return list(views.names())
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise UsageError(f"--views is empty; choose from {', '.join(views.names())}")
    run.validate_views(names)
    return names


def constant_views(names: list[str]) -> list[str]:
    """The views among ``names`` given by PAPA constants (:attr:`View.takes_constants`)."""
    return [name for name in names if views.get_view(name).takes_constants]


def constants_for(args: argparse.Namespace, wanted: bool) -> None:
    """Refuse ``--constants`` missing where the papa view is ``wanted``, given where it is not,
    or not a file."""
    if wanted and args.constants is None:
        raise UsageError("the papa view needs --constants (a file from 'attnlens fit-papa')")
    if not wanted and args.constants is not None:
        raise UsageError(f"--constants {args.constants} would be unused: no papa view was asked for")
    if args.constants is not None and not Path(args.constants).is_file():
        raise UsageError(f"constants file not found: {args.constants}")


def measures(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of :func:`attnlens.cli.options.measure_options`' options (task
    probes, LM texts)."""
    lm_texts = None if args.lm_texts is None else read_corpus(args.lm_texts)
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        raise UsageError(f"--data-dir {args.data_dir} is not a folder")
    return dict(tasks=list(args.task), lm_texts=lm_texts, data_dir=args.data_dir,
                train_limit=args.train_limit, eval_limit=args.eval_limit)


def task_data(names: Sequence[str], data_dir: str | None, splits: Sequence[str] = ("train", "dev")) -> None:
    """Refuse, before the model is loaded, a ``--task`` whose ``splits`` cannot be read: a
    ``--data-dir`` that is not a folder, a file missing, empty or unreadable under it, or, without
    it, a split the hub cannot give. Each split is loaded keeping one example
    (:func:`attnlens.evaluation.tasks.load`, whose parse of a file is cached: the run does not read
    it again); the refusal names ``--data-dir`` where the library names ``data_dir``."""
    if data_dir is not None and not Path(data_dir).is_dir():
        raise UsageError(f"--data-dir {data_dir} is not a folder")
    for name in dict.fromkeys(names):
        for split in splits:
            try:
                tasks.load(name, split, data_dir=data_dir, limit=1)
            except tasks.TaskError as error:
                raise UsageError(_data_dir_option(str(error))) from None


#: ``data_dir`` in the library's messages as its own word (not within a path), and the option
#: that gives it on the command line: ``data_dir=None`` is no ``--data-dir``, ``data_dir=...`` is
#: ``--data-dir DIR``
_DATA_DIR = ((re.compile(r"(?<![\w/.-])data_dir=None"), "no --data-dir"),
             (re.compile(r"(?<![\w/.-])data_dir=\.\.\."), "--data-dir DIR"),
             (re.compile(r"(?<![\w/.-])data_dir(?![\w/])"), "--data-dir"))


def _data_dir_option(message: str) -> str:
    """A message of :mod:`attnlens.evaluation.tasks` in the command line's terms: ``--data-dir``
    for the Python argument ``data_dir``."""
    for pattern, option in _DATA_DIR:
        message = pattern.sub(option, message)
    return message


# -- outputs -------------------------------------------------------------------------------------


def same_file(path: Path, other: str | Path) -> bool:
    """Whether ``path`` and ``other`` name one file (through links, ``..`` or another spelling)."""
    try:
        return os.path.samefile(path, other)
    except OSError:  # one of them does not exist (yet)
        return path.resolve() == Path(other).resolve()


def output(
    path: str,
    option: str,
    suffixes: tuple[str, ...] = (),
    keep: Sequence[tuple[str, str | Path | None]] = (),
    *,
    force: bool = False,
) -> Path:
    """An output path checked before any work: not a folder, no file where its folders go
    (missing folders are created when it is written), a file can be created in its nearest
    existing folder, ending in one of ``suffixes`` if given, and not the file of any
    ``(option, path)`` in ``keep`` (the inputs and other outputs; ``None`` paths are skipped)."""
    out = Path(path)
    if out.is_dir():
        raise UsageError(f"{option} {out} is a folder; give a file name")
    if suffixes and out.suffix.lower() not in suffixes:
        raise UsageError(f"{option} {out} should end in {' or '.join(suffixes)}")
    for other, kept in keep:
        if kept is not None and same_file(out, kept):
            raise UsageError(
                f"{option} {out} is the same file as {other} {kept} and would overwrite it; "
                f"give {option} another path"
            )
    _creatable(out, out.parents, option, "written")
    if not force and out.is_file() and not out.is_symlink() and not out.stat().st_mode & 0o222:
        raise UsageError(
            f"{option} {out} is read-only; choose another path or make it writable (chmod u+w)"
            + ("" if option == "--checkpoint" else ", or add --force to replace it")
        )
    return out


def output_folder(path: str, option: str) -> Path:
    """An output folder (made if missing) checked before any work, as :func:`output` checks a
    file: not a file, no file where its folders go, and a file can be created in its nearest
    existing folder."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{option} {out} is a file; give a folder (made if missing)")
    _creatable(out, (out, *out.parents), option, "made")
    return out


def _creatable(out: Path, folders: Sequence[Path], option: str, verb: str) -> None:
    """Refuse ``out`` unless the first existing one of ``folders`` (its own folders, nearest
    first) is a folder in which a file can be created."""
    folder = next(parent for parent in folders if parent.exists())
    if not folder.is_dir():
        raise UsageError(f"{option} {out} cannot be {verb}: {folder} is a file, not a folder; choose another path")
    try:  # os.access says yes to root even where nothing can be created (/proc, read-only mounts)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".attnlens-", suffix=".tmp"):
            pass
    except OSError as error:
        raise UsageError(
            f"{option} {out} cannot be {verb}: creating a file in {folder} failed "
            f"({error.strerror or error}); choose another path"
        ) from None


def figure_outputs(args: argparse.Namespace, keep: list) -> tuple[Path, Path]:
    """``--out`` (HTML) and the CSV beside it, both checked before any work (``keep``: as for
    :func:`output`)."""
    out = output(args.out, "--out", (".html", ".htm"), keep, force=args.force)
    csv = output(str(out.with_suffix(".csv")), "--out (its CSV)", (".csv",), keep, force=args.force)
    return out, csv


def write_table_and_figure(table: Any, figure: Any, csv: Path, out: Path, force: bool) -> None:
    """The CSV and the self-contained HTML figure of a command, each written atomically."""
    write_atomic(csv, table.to_csv(index=False).encode("utf-8"), overwrite_read_only=force)
    html = figure.to_html(include_plotlyjs=True, full_html=True)
    write_atomic(out, html.encode("utf-8"), overwrite_read_only=force)


# -- the model -----------------------------------------------------------------------------------


def resolve_device(name: str | None) -> str | None:
    """The torch device of ``--device`` (``None``: :func:`attnlens.load`'s default, a CUDA GPU
    when there is one, else the CPU);
    ``auto`` is a CUDA GPU, else MPS, else the CPU. A device this machine lacks is a
    :class:`UsageError` naming the devices it has."""
    if name is None or name == "cpu":
        return name
    cuda = torch.cuda.is_available()
    mps = bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()
    if name == "auto":
        return "cuda" if cuda else "mps" if mps else "cpu"
    have = ", ".join(["cpu", *(["cuda"] if cuda else []), *(["mps"] if mps else [])])
    if name == "mps" and not mps:
        raise UsageError(f"--device mps: Apple's MPS is not available here (devices: {have}); "
                         "use --device cpu or --device auto")
    if name.startswith("cuda"):
        if not cuda:
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "without CUDA"
            raise UsageError(
                f"--device {name}: no CUDA GPU is available here (torch {torch.__version__} is "
                f"built {build}; devices: {have}); use --device cpu or --device auto"
            )
        index = int(name.partition(":")[2] or 0)
        count = torch.cuda.device_count()
        if index >= count:
            raise UsageError(
                f"--device {name}: this machine has {count} CUDA GPU{'s' if count != 1 else ''} "
                f"(cuda:0 to cuda:{count - 1}); choose one of them"
            )
        if name == "cuda" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"  # torchrun: a GPU per rank
    return name


def load(model: str | None, *, quiet: bool = False, device: str | None = None) -> Any:
    """:func:`attnlens.load` on ``device`` (a :func:`resolve_device` result); ``quiet`` also
    hides transformers' weight-loading bar."""
    shown = hf_logging.is_progress_bar_enabled()
    if quiet:
        hf_logging.disable_progress_bar()
    try:
        return loading.load(model, device=device)
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def check_max_len(model: Any, texts: list, max_len: int, layout: str) -> None:
    """Refuse a ``--max-len`` the model cannot take before any pass over the corpus starts."""
    inputs.check_max_len(model, max_len, layout=layout, is_pair=isinstance(texts[0], tuple))


def check_example(example: int, n_texts: int) -> None:
    """Refuse ``--example`` outside the corpus (:func:`attnlens.comparison.result.check_example`'s
    test) in one line naming the valid range."""
    try:
        result.check_example(example, n_texts)
    except ValueError:
        raise UsageError(
            f"--example {example} is outside the corpus of {n_texts} text"
            f"{'s' if n_texts != 1 else ''}; use 0 to {n_texts - 1}"
        ) from None


def check_focus(focus: tuple[int, int], model: Any) -> None:
    """Refuse ``--focus`` outside the model's heads (:func:`attnlens.comparison.run.check_focus`'s
    test) in one line naming the valid range, before any pass over the corpus."""
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    try:
        run.check_focus(focus, n_layers, n_heads)
    except ValueError:
        raise UsageError(
            f"--focus {focus[0]},{focus[1]} is outside the model's {n_layers} layers x {n_heads} "
            f"heads; use a layer from 0 to {n_layers - 1} and a head from 0 to {n_heads - 1}"
        ) from None


def baselines(text: str) -> tuple[str, ...]:
    """``--baselines``: names of data-free or labelled matrices, ``all`` or ``none``."""
    if text.strip() == "all":
        return ALL_BASELINES
    if text.strip() == "none":
        return ()
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in ALL_BASELINES]
    if unknown or not names:
        raise UsageError(f"--baselines {text!r}: use names among {', '.join(ALL_BASELINES)} separated by "
                                "commas, 'all' or 'none'")
    return names
