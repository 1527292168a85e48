"""The options the commands share, their argparse types, and the one-line refusal of the parser.

Standard library only: the parser is built from this module and the command modules, so that
``attnlens --help`` and ``--version`` answer without importing torch. What a command does once
parsed lives in :mod:`attnlens.cli.jobs`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

PROG = "attnlens"
EXIT_USAGE = 2
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130

#: values of ``--device`` (``cuda:N`` too)
DEVICES = ("cpu", "cuda", "mps", "auto")

#: values of ``--task``
TASKS = ("sst2", "cola", "mrpc", "mnli", "ner", "pos")


def fail(message: str, status: int = EXIT_USAGE) -> NoReturn:
    """Print ``attnlens: error: <message>`` in one line on stderr and exit with ``status``."""
    line = " ".join(str(message).split()) or "failed"
    print(f"{PROG}: error: {line}", file=sys.stderr)
    raise SystemExit(status)


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (:func:`fail`), without the usage block."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see '{self.prog} --help')")


# -- argparse types ------------------------------------------------------------------------------


def positive(text: str) -> int:
    """A positive integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def device_name(text: str) -> str:
    """``--device``: one of :data:`DEVICES` or ``cuda:N`` (checked against the machine later, in
    :func:`attnlens.cli.jobs.common.resolve_device`, which imports torch)."""
    name = text.strip().lower()
    kind, _, index = name.partition(":")
    if name in DEVICES or (kind == "cuda" and index.isdigit()):
        return name
    raise argparse.ArgumentTypeError(
        f"unknown device {text!r}; use one of {', '.join(DEVICES)} (or cuda:N)"
    )


def example_index(text: str) -> int:
    """``--example N``: an integer (checked against the corpus once it is read)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected the index of a corpus text (0, 1, ...), got {text!r}"
        ) from None
    return value


def head(text: str) -> tuple[int, int]:
    """``--focus L,H``: a (layer, head) pair of integers."""
    parts = text.replace(" ", "").split(",")
    try:
        layer, head = (int(part) for part in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected LAYER,HEAD such as 3,7 (both from 0), got {text!r}"
        ) from None
    return layer, head


# -- groups of options ---------------------------------------------------------------------------


def model_options(parser: argparse.ArgumentParser) -> None:
    """``--model`` (as for compare) and ``--device``."""
    parser.add_argument("--model", default=None, help="as for compare (default: embedded MiniLM)")
    device_option(parser)


def device_option(parser: argparse.ArgumentParser) -> None:
    """``--device``."""
    parser.add_argument(
        "--device", type=device_name, default=None, metavar="{cpu,cuda,mps,auto}",
        help="where the model runs: cpu, cuda or cuda:N, mps, or auto (a CUDA GPU, else MPS, "
        "else the CPU); default: a CUDA GPU when there is one, else the CPU",
    )


def corpus_options(parser: argparse.ArgumentParser, *, out_help: str, out_default: str | None) -> None:
    """The options of the commands that run a model over a corpus: ``--model``, ``--device``,
    ``--corpus``, ``--max-len``, ``--n-examples``, ``--batch-size``, ``--quiet``, ``--out``
    (required when ``out_default`` is ``None``) and ``--force``."""
    parser.add_argument(
        "--model", default=None,
        help="hub name, local folder or .gguf of a BERT/RoBERTa/GPT-2/Llama model, or smollm2-135m (default: embedded MiniLM)",
    )
    device_option(parser)
    parser.add_argument(
        "--corpus", default="default",
        help="text file (one text per line; .tsv/.csv: a text column) or 'default' (embedded corpus)",
    )
    parser.add_argument(
        "--max-len", type=positive, default=None,
        help="tokens per text (default 128; compare with --constants: the constants' max_len)",
    )
    parser.add_argument("--n-examples", type=positive, default=None, help="use the first N texts")
    parser.add_argument("--batch-size", type=positive, default=32, help="texts per forward pass")
    parser.add_argument(
        "--quiet", action="store_true", help="no progress bars (nor the model's weight loading)"
    )
    parser.add_argument(
        "--out", required=out_default is None, default=out_default, help=out_help,
    )
    force_option(parser)


def force_option(parser: argparse.ArgumentParser) -> None:
    """``--force`` and, after the command's name too, ``--debug``."""
    parser.add_argument(
        "--force", action="store_true",
        help="replace output files that are read-only (refused otherwise, before any work)",
    )
    debug_option(parser, default=argparse.SUPPRESS)


def debug_option(parser: argparse.ArgumentParser, *, default: Any = False) -> None:
    """``--debug``."""
    parser.add_argument(
        "--debug", action="store_true", default=default,
        help="show the full traceback of any error instead of one line",
    )


def probe_options(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """The options of the commands that probe tasks under PAPA constants (curve, table);
    ``required``: whether argparse requires ``--task`` (curve checks it itself: its ``--combine``
    runs no task)."""
    parser.add_argument("--seeds", type=positive, default=3, help="probe seeds per point (default 3)")
    parser.add_argument("--labelled-steps", type=positive, default=250, metavar="N",
                        help="training steps of the labelled rows, toeplitz_init and average_init (default 250: "
                        "one pass over 4,000 training examples)")
    parser.add_argument("--batch-size", type=positive, default=32, help="texts per forward pass")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    measure_options(parser, required=required)
    force_option(parser)


def measure_options(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    """Options that measure what an intervention costs: task probes and LM scores (read by
    :func:`attnlens.cli.jobs.common.measures`)."""
    parser.add_argument(
        "--task", action="append", default=[], choices=TASKS,
        required=required, help="probe this task per view (repeat for several)",
    )
    parser.add_argument(
        "--data-dir", default=None,
        help="folder of the GLUE / CoNLL-2003 files (sst2/dev.tsv, conll2003/valid.txt, ...); default: the hub",
    )
    parser.add_argument(
        "--train-limit", type=positive, default=4000, help="training examples per probe (default 4000)",
    )
    parser.add_argument(
        "--eval-limit", type=positive, default=None, help="evaluation examples (default: the whole dev split)",
    )
    parser.add_argument(
        "--lm-texts", default=None,
        help="a text file: also score the language model on it (own trained head, else the MLM probe)",
    )
