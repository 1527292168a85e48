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
header; see :func:`attnlens.core.corpus.read_corpus`) or ``default``, the embedded corpus. Passes over
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
(``types``), :mod:`~attnlens.cli.syntax` and :mod:`~attnlens.cli.importance`, built from the
shared options of :mod:`attnlens.cli.options`. A handler imports its job, the module of the same
name in :mod:`attnlens.cli.jobs`, which does the work; the jobs share
:mod:`attnlens.cli.jobs.common` (the checks of paths and devices, the corpus, loading the model)
and call it through the module (``common.load``), so that replacing one helper (a test's
``monkeypatch``) reaches every command. This package holds :func:`main` and
:func:`build_parser`.

The parser's modules import only the standard library (and the views' names): torch,
transformers, TransformerLens, plotly and pandas are imported by the jobs, once a command runs, so
``attnlens --help`` and ``--version`` answer at once (``benchmarks/cli_help.py`` measures it).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from attnlens.cli import (
    compare,
    curve,
    fit_papa,
    importance,
    merge,
    options,
    pattern_types,
    syntax,
    table,
)
from attnlens.core.version import __version__
from attnlens.errors import AttnlensError

#: the commands in the order ``attnlens --help`` lists them
COMMANDS = (compare, fit_papa, merge, curve, table, pattern_types, syntax, importance)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``attnlens`` command."""
    parser = options.Parser(
        prog=options.PROG,
        description="How much does a transformer use its input-dependent attention?",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    options.debug_option(parser)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=options.Parser)
    commands.required = True
    for command in COMMANDS:
        command.add(commands)
    return parser


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
    print(f"{options.PROG}: warning: {' '.join(str(message).split())}", file=file or sys.stderr)


def _start_distributed(device: str | None = None) -> bool:
    """Join the ``torch.distributed`` world ``torchrun`` describes (``WORLD_SIZE`` > 1): gloo on
    CPU (also with ``--device cpu`` on a GPU machine), NCCL on GPU. Returns whether this process
    started it (and so must end it)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False

    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    backend = "nccl" if torch.cuda.is_available() and device != "cpu" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30))
    return True


def _run(args: argparse.Namespace, debug: bool) -> int:
    """The command's handler, SIGTERM (``timeout``, Slurm, ``docker stop``) raising
    ``KeyboardInterrupt`` as Ctrl-C does for the whole run, so that an output being written
    removes its temporary file (:func:`attnlens.core.files.write_atomic`) and a fit saves its
    checkpoint; its errors are one line (:func:`main`)."""
    # here, not at the top: it imports torch, which --help and --version do without
    from attnlens.engine.checkpoints import InterruptingSignals

    started = False
    try:
        started = _start_distributed(getattr(args, "device", None))
        with InterruptingSignals():
            status = int(args.handler(args) or 0)
        if started:  # every rank done before any tears its group down (gloo's threads hold work)
            import torch.distributed as dist

            dist.barrier()
        return status
    except KeyboardInterrupt as interrupt:
        if debug:
            raise
        options.fail(f"interrupted; {interrupt}" if str(interrupt) else "interrupted",
                     options.EXIT_INTERRUPTED)
    except (AttnlensError, ValueError, TypeError, OSError, KeyError) as error:
        if debug:
            raise
        options.fail(_reason(error))
    except Exception as error:  # a bug: one line, the traceback under --debug
        if debug:
            raise
        options.fail(
            f"unexpected {type(error).__name__}: {_reason(error)[:300]} (run the same command "
            "with --debug for the traceback, and please report it)", options.EXIT_FAILURE,
        )
    finally:
        if started:
            import torch.distributed as dist

            dist.destroy_process_group()
            gc.collect()  # what still holds the group's work goes now, not at the interpreter's exit


def _reason(error: BaseException) -> str:
    if isinstance(error, KeyError) and error.args:
        return str(error.args[0])
    text = str(error).strip()
    return text or type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
