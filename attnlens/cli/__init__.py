"""The ``attnlens`` command line.

::

    attnlens compare [--model M] [--device D] [--corpus FILE|default]
                     [--views standard,papa,effective] [--max-len N] [--n-examples N]
                     [--batch-size N] [--constants FILE] [--example N] [--focus L,H]
                     [--json FILE] [--task T ...] [--data-dir DIR] [--lm-texts FILE]
                     [--quiet] --out report.html
    attnlens fit-papa [--model M] [--device D] [--corpus FILE|default] [--max-len N]
                      [--layout papa|padded]
                      [--n-examples N] [--batch-size N] [--checkpoint FILE [--checkpoint-every N]]
                      [--quiet] --out constants.safetensors
    attnlens merge a.safetensors b.safetensors ... --out all.safetensors
    attnlens curve --constants constants.safetensors --task sst2 [--task ner ...] [--device D] \
        [--data-dir DIR] [--lm-texts FILE] [--fractions 0,0.5,0.875,0.9375,1] --out curve.html
    attnlens table --constants constants.safetensors --task sst2 [--task cola ...] [--seeds 3] \
        [--data-dir DIR] [--lm-texts FILE] --out table.html
    attnlens --version

Every command also takes ``--force`` (replace read-only outputs) and ``--debug`` (tracebacks).

    torchrun --nproc_per_node N -m attnlens fit-papa ...        # N processes, one result
    torchrun --nnodes M --nproc_per_node N --rdzv_backend c10d --rdzv_endpoint HOST:PORT \
        -m attnlens fit-papa ...                                # M machines

Under ``torchrun`` (``WORLD_SIZE`` > 1) each rank fits its contiguous, batch-aligned shard of
the corpus (gloo on CPU, NCCL on GPU), the sums are all-reduced, and rank 0 writes ``--out``
(equal to a single-process fit); ``--checkpoint`` is then one file per rank
(``<name>.rank<r>-of-<n>.safetensors``). ``merge`` adds up constants fitted anywhere on parts of
a corpus (a Slurm array, Ray, Kubernetes, another day).

``--model`` is anything :func:`attnlens.load` accepts (a hub name or a local folder; default: the
embedded all-MiniLM-L6-v2); ``--device`` is where it runs: ``cpu``, ``cuda``
(``cuda:N``), ``mps`` or ``auto`` (a CUDA GPU, else Apple's MPS, else the CPU); by default a CUDA
GPU when there is one, else the CPU, as :func:`attnlens.load`; a device this
machine lacks is refused before the model is loaded. ``--corpus`` is a file (one text per line, or a TSV/CSV with a
header; see :func:`attnlens.corpus.read_corpus`) or ``default``, the embedded corpus. Passes over
the corpus (and the loading of the model's weights) show progress bars on stderr unless
``--quiet``. ``--constants`` needs the ``papa`` view in ``--views``; ``--example N`` is the
corpus text the report's maps show (an index from 0, after ``--n-examples``) and ``--focus L,H``
the head shown side by side (layer and head from 0); out of range, either is refused with the
valid range before the pass over the corpus; ``--max-len`` must fit the
model's position embeddings. ``--layout`` defaults to the model's: ``padded`` for a decoder
(GPT-2), ``papa`` otherwise, as ``compare`` fits them. ``--checkpoint`` saves a fit's progress
(every ``--checkpoint-every`` batches and when interrupted): the same command run again resumes
it. ``--out``, ``--json`` and ``--checkpoint`` may name folders that do not exist yet (they are
created). Bad input exits with status 2 and a one-line reason on stderr (``attnlens: error:
...``), before the model is loaded when possible, and before any pass over the corpus otherwise;
bad output paths (a folder, a file where a folder should be, a folder that cannot be written, a
read-only file without ``--force``, the file of an input (``--corpus``, ``--constants``,
``--lm-texts``) or of another output) are refused before the model is loaded. An unexpected error is one line too (exit status 1); ``--debug`` shows
tracebacks.

One module per command, each with its options (``add``) and its handler (``run``):
:mod:`attnlens.cli.compare`, :mod:`~attnlens.cli.fit_papa`, :mod:`~attnlens.cli.merge`,
:mod:`~attnlens.cli.curve`, :mod:`~attnlens.cli.table`, :mod:`~attnlens.cli.pattern_types`
(``types``), :mod:`~attnlens.cli.syntax` and :mod:`~attnlens.cli.importance`; this package holds
what they share (the options, the checks of paths and devices, loading the model) and
:func:`main`. The handlers call the shared helpers through the package (``cli._load``), so that
replacing one (a test's ``monkeypatch``) reaches every command.

The package imports only the standard library: torch, transformers, TransformerLens, plotly and
pandas are imported by the command's handler, so ``attnlens --help`` and ``--version`` answer at
once (``benchmarks/cli_help.py`` measures it).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from attnlens.errors import AttnlensError

PROG = "attnlens"
EXIT_USAGE = 2
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130


class UsageError(AttnlensError):
    """Bad input on the command line: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, no usage block
        _fail(f"{message} (see '{self.prog} --help')")


def _fail(message: str, status: int = EXIT_USAGE) -> NoReturn:
    line = " ".join(str(message).split()) or "failed"
    print(f"{PROG}: error: {line}", file=sys.stderr)
    raise SystemExit(status)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


#: values of ``--device`` (``cuda:N`` too)
DEVICES = ("cpu", "cuda", "mps", "auto")


def _device_name(text: str) -> str:
    """``--device``: one of :data:`DEVICES` or ``cuda:N`` (checked against the machine later, in
    :func:`_resolve_device`, which imports torch)."""
    name = text.strip().lower()
    kind, _, index = name.partition(":")
    if name in DEVICES or (kind == "cuda" and index.isdigit()):
        return name
    raise argparse.ArgumentTypeError(
        f"unknown device {text!r}; use one of {', '.join(DEVICES)} (or cuda:N)"
    )


def _model_option(parser: argparse.ArgumentParser) -> None:
    """``--model`` (as for compare) and ``--device``."""
    parser.add_argument("--model", default=None, help="as for compare (default: embedded MiniLM)")
    _add_device(parser)


def _add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device", type=_device_name, default=None, metavar="{cpu,cuda,mps,auto}",
        help="where the model runs: cpu, cuda or cuda:N, mps, or auto (a CUDA GPU, else MPS, "
        "else the CPU); default: a CUDA GPU when there is one, else the CPU",
    )


def _example_index(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected the index of a corpus text (0, 1, ...), got {text!r}"
        ) from None
    return value


def _head(text: str) -> tuple[int, int]:
    """``--focus L,H``: a (layer, head) pair of integers."""
    parts = text.replace(" ", "").split(",")
    try:
        layer, head = (int(part) for part in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected LAYER,HEAD such as 3,7 (both from 0), got {text!r}"
        ) from None
    return layer, head


def _common(parser: argparse.ArgumentParser, *, out_help: str, out_default: str | None) -> None:
    parser.add_argument(
        "--model", default=None,
        help="hub name, local folder or .gguf of a BERT/RoBERTa/GPT-2/Llama model, or smollm2-135m (default: embedded MiniLM)",
    )
    _add_device(parser)
    parser.add_argument(
        "--corpus", default="default",
        help="text file (one text per line; .tsv/.csv: a text column) or 'default' (embedded corpus)",
    )
    parser.add_argument(
        "--max-len", type=_positive, default=None,
        help="tokens per text (default 128; compare with --constants: the constants' max_len)",
    )
    parser.add_argument("--n-examples", type=_positive, default=None, help="use the first N texts")
    parser.add_argument("--batch-size", type=_positive, default=32, help="texts per forward pass")
    parser.add_argument(
        "--quiet", action="store_true", help="no progress bars (nor the model's weight loading)"
    )
    parser.add_argument(
        "--out", required=out_default is None, default=out_default, help=out_help,
    )
    _force(parser)


def _force(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--force", action="store_true",
        help="replace output files that are read-only (refused otherwise, before any work)",
    )
    _debug(parser, default=argparse.SUPPRESS)


def _debug(parser: argparse.ArgumentParser, *, default: Any = False) -> None:
    parser.add_argument(
        "--debug", action="store_true", default=default,
        help="show the full traceback of any error instead of one line",
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attnlens")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree without install
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``attnlens`` command."""
    parser = _Parser(
        prog=PROG,
        description="How much does a transformer use its input-dependent attention?",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    _debug(parser)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    from attnlens.cli import (  # one module per command (imported here: they import this package)
        compare,
        curve,
        fit_papa,
        importance,
        merge,
        pattern_types,
        syntax,
        table,
    )

    for command in (compare, fit_papa, merge, curve, table, pattern_types, syntax, importance):
        command.add(commands)
    return parser


def _probe_options(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """The options of the commands that probe tasks under PAPA constants (curve, table);
    ``required``: whether argparse requires ``--task`` (curve checks it itself: its ``--combine``
    runs no task)."""
    parser.add_argument("--seeds", type=_positive, default=3, help="probe seeds per point (default 3)")
    parser.add_argument("--batch-size", type=_positive, default=32, help="texts per forward pass")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    _measure(parser, required=required)
    _force(parser)


def _measure(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    """Options that measure what an intervention costs: task probes and LM scores."""
    parser.add_argument(
        "--task", action="append", default=[], choices=("sst2", "cola", "mrpc", "mnli", "ner", "pos"),
        required=required, help="probe this task per view (repeat for several)",
    )
    parser.add_argument(
        "--data-dir", default=None,
        help="folder of the GLUE / CoNLL-2003 files (sst2/dev.tsv, conll2003/valid.txt, ...); default: the hub",
    )
    parser.add_argument(
        "--train-limit", type=_positive, default=4000, help="training examples per probe (default 4000)",
    )
    parser.add_argument(
        "--eval-limit", type=_positive, default=None, help="evaluation examples (default: the whole dev split)",
    )
    parser.add_argument(
        "--lm-texts", default=None,
        help="a text file: also score the language model on it (own trained head, else the MLM probe)",
    )


def _texts(args: argparse.Namespace) -> list[str]:
    """The corpus's texts (the first ``--n-examples``); blank lines of a file are skipped and
    their number said on stderr, as the API refuses blank texts in a list."""
    from attnlens.core.corpus import read_corpus_counted, resolve_corpus

    if args.corpus == "default":
        texts = resolve_corpus(None)
    else:
        texts, blank = read_corpus_counted(args.corpus)
        if blank and not args.quiet:
            print(f"{PROG}: corpus {args.corpus}: {len(texts)} texts read, {blank} blank "
                  f"line{'s' if blank != 1 else ''} skipped", file=sys.stderr)
    return texts[: args.n_examples] if args.n_examples else texts


def _views(text: str) -> list[str]:
    from attnlens.comparison.run import validate_views

    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise UsageError("--views is empty; choose from standard, papa, effective")
    validate_views(names)
    return names


def _corpus_file(args: argparse.Namespace) -> tuple[str, str | None]:
    """``("--corpus", path)`` for :func:`_out`'s ``keep``; no path for the embedded corpus."""
    return "--corpus", None if args.corpus == "default" else args.corpus


def _same_file(path: Path, other: str | Path) -> bool:
    """Whether ``path`` and ``other`` name one file (through links, ``..`` or another spelling)."""
    try:
        return os.path.samefile(path, other)
    except OSError:  # one of them does not exist (yet)
        return path.resolve() == Path(other).resolve()


def _out(
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
    folder = next(parent for parent in out.parents if parent.exists())
    if not folder.is_dir():
        raise UsageError(
            f"{option} {out} cannot be written: {folder} is a file, not a folder; "
            "choose another path"
        )
    if suffixes and out.suffix.lower() not in suffixes:
        raise UsageError(f"{option} {out} should end in {' or '.join(suffixes)}")
    for other, kept in keep:
        if kept is not None and _same_file(out, kept):
            raise UsageError(
                f"{option} {out} is the same file as {other} {kept} and would overwrite it; "
                f"give {option} another path"
            )
    try:  # os.access says yes to root even where nothing can be created (/proc, read-only mounts)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".attnlens-", suffix=".tmp"):
            pass
    except OSError as error:
        raise UsageError(
            f"{option} {out} cannot be written: creating a file in {folder} failed "
            f"({error.strerror or error}); choose another path"
        ) from None
    if not force and out.is_file() and not out.is_symlink() and not out.stat().st_mode & 0o222:
        raise UsageError(
            f"{option} {out} is read-only; choose another path or make it writable (chmod u+w)"
            + ("" if option == "--checkpoint" else ", or add --force to replace it")
        )
    return out


def _resolve_device(name: str | None) -> str | None:
    """The torch device of ``--device`` (``None``: :func:`attnlens.load`'s default, a CUDA GPU
    when there is one, else the CPU);
    ``auto`` is a CUDA GPU, else MPS, else the CPU. A device this machine lacks is a
    :class:`UsageError` naming the devices it has."""
    if name is None or name == "cpu":
        return name
    import torch

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


def _load(model: str | None, *, quiet: bool = False, device: str | None = None) -> Any:
    """:func:`attnlens.load` on ``device`` (a :func:`_resolve_device` result); ``quiet`` also
    hides transformers' weight-loading bar."""
    from transformers.utils import logging as hf_logging

    from attnlens.core.loading import load

    shown = hf_logging.is_progress_bar_enabled()
    if quiet:
        hf_logging.disable_progress_bar()
    try:
        return load(model, device=device)
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def _fit_layout(model: Any) -> str:
    from attnlens.methods.papa.fitting import default_layout

    return default_layout(model)


def _check_max_len(model: Any, texts: list, max_len: int, layout: str) -> None:
    """Refuse a ``--max-len`` the model cannot take before any pass over the corpus starts."""
    from attnlens.core.inputs import check_max_len

    check_max_len(model, max_len, layout=layout, is_pair=isinstance(texts[0], tuple))


def _check_example(example: int, n_texts: int) -> None:
    """Refuse ``--example`` outside the corpus (:func:`attnlens.comparison.result.check_example`'s test)
    in one line naming the valid range."""
    from attnlens.comparison.result import check_example

    try:
        check_example(example, n_texts)
    except ValueError:
        raise UsageError(
            f"--example {example} is outside the corpus of {n_texts} text"
            f"{'s' if n_texts != 1 else ''}; use 0 to {n_texts - 1}"
        ) from None


def _check_focus(focus: tuple[int, int], model: Any) -> None:
    """Refuse ``--focus`` outside the model's heads (:func:`attnlens.comparison.run.check_focus`'s
    test) in one line naming the valid range, before any pass over the corpus."""
    from attnlens.comparison.run import check_focus

    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    try:
        check_focus(focus, n_layers, n_heads)
    except ValueError:
        raise UsageError(
            f"--focus {focus[0]},{focus[1]} is outside the model's {n_layers} layers x {n_heads} "
            f"heads; use a layer from 0 to {n_layers - 1} and a head from 0 to {n_heads - 1}"
        ) from None


def summary(comparison: Any) -> str:
    """A few lines for the terminal: per view, the mean distance and the farthest heads."""
    lines = [repr(comparison)]
    table = comparison.table
    for view in comparison.views:
        if view == "standard":
            continue
        rows = table[table["view"] == view].nlargest(3, "distance_from_standard")
        top = ", ".join(
            f"L{r.layer}H{r.head} {r.distance_from_standard:.3f}" for r in rows.itertuples()
        )
        mean = table.loc[table["view"] == view, "distance_from_standard"].mean()
        lines.append(f"  {view}: mean distance from standard {mean:.3f}; farthest heads {top}")
    if comparison.scores is not None:
        for row in comparison.scores.itertuples():
            lines.append(f"  {row.task} ({row.metric}) under {row.view}: {row.score:.4f}")
    return "\n".join(lines)


def _measures(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of :func:`_measure`'s options (task probes, LM texts)."""
    lm_texts = None
    if args.lm_texts is not None:
        from attnlens.core.corpus import read_corpus

        lm_texts = read_corpus(args.lm_texts)
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        raise UsageError(f"--data-dir {args.data_dir} is not a folder")
    return dict(tasks=list(args.task), lm_texts=lm_texts, data_dir=args.data_dir,
                train_limit=args.train_limit, eval_limit=args.eval_limit)


def _write_table_and_figure(table: Any, figure: Any, csv: Path, out: Path, force: bool) -> None:
    """The CSV and the self-contained HTML figure of a subcommand, each written atomically."""
    from attnlens.core.files import write_atomic

    write_atomic(csv, table.to_csv(index=False).encode("utf-8"), overwrite_read_only=force)
    html = figure.to_html(include_plotlyjs=True, full_html=True)
    write_atomic(out, html.encode("utf-8"), overwrite_read_only=force)


def _outputs(args: argparse.Namespace, inputs: list) -> tuple[Path, Path]:
    """``--out`` (HTML) and the CSV beside it, both checked before any work."""
    out = _out(args.out, "--out", (".html", ".htm"), inputs, force=args.force)
    csv = _out(str(out.with_suffix(".csv")), "--out (its CSV)", (".csv",), inputs, force=args.force)
    return out, csv


def _constants_for(args: argparse.Namespace, wanted: bool) -> None:
    if wanted and args.constants is None:
        raise UsageError("the papa view needs --constants (a file from 'attnlens fit-papa')")
    if not wanted and args.constants is not None:
        raise UsageError(f"--constants {args.constants} would be unused: no papa view was asked for")
    if args.constants is not None and not Path(args.constants).is_file():
        raise UsageError(f"constants file not found: {args.constants}")


def _rank() -> int:
    from attnlens.engine.distributed import world

    return world().rank


def _start_distributed(device: str | None = None) -> bool:
    """Join the ``torch.distributed`` world ``torchrun`` describes (``WORLD_SIZE`` > 1): gloo on
    CPU (also with ``--device cpu`` on a GPU machine), NCCL on GPU. Returns whether this process
    started it (and so must end it)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    import datetime

    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    backend = "nccl" if torch.cuda.is_available() and device != "cpu" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30))
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    Errors in the input (unknown view, missing or empty corpus, bad model name, damaged
    weights or constants, ...) print one line ``attnlens: error: <reason>`` on stderr and exit
    with status 2; an unexpected error (a bug) prints one line too and exits with status 1.
    ``--debug`` shows the full traceback of any error instead.
    """
    args = build_parser().parse_args(argv)
    debug = getattr(args, "debug", False)
    with warnings.catch_warnings():
        if not debug:
            warnings.showwarning = _show_warning
        return _run(args, debug)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one line on stderr (``attnlens: warning: ...``), without the source line."""
    print(f"{PROG}: warning: {' '.join(str(message).split())}", file=file or sys.stderr)


def _run(args: argparse.Namespace, debug: bool) -> int:
    started = False
    try:
        started = _start_distributed(getattr(args, "device", None))
        return int(args.handler(args) or 0)
    except KeyboardInterrupt as interrupt:
        if debug:
            raise
        _fail(f"interrupted; {interrupt}" if str(interrupt) else "interrupted", EXIT_INTERRUPTED)
    except (AttnlensError, ValueError, TypeError, OSError, KeyError) as error:
        if debug:
            raise
        _fail(_reason(error))
    except Exception as error:  # a bug: one line, the traceback under --debug
        if debug:
            raise
        _fail(
            f"unexpected {type(error).__name__}: {_reason(error)[:300]} (run the same command "
            "with --debug for the traceback, and please report it)", EXIT_FAILURE,
        )
    finally:
        if started:
            import torch.distributed as dist

            dist.destroy_process_group()


def _reason(error: BaseException) -> str:
    if isinstance(error, KeyError) and error.args:
        return str(error.args[0])
    text = str(error).strip()
    return text or type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
