"""``attnlens importance``: head importance (Michel et al. 2019); write CSV and HTML."""

from __future__ import annotations

import argparse
from typing import Any

from attnlens.cli import options


def add(commands: Any) -> None:
    """The ``importance`` command and its options."""
    parser = commands.add_parser(
        "importance", help="head importance (Michel et al. 2019); write CSV and HTML",
        description="Michel et al.'s head importance E|dL/dxi_h| from a gate on every head: with "
        "--task, the loss of a PAPA probe trained on that task; else the model's own LM loss on "
        "--corpus (refused for a model whose LM head is untrained). Writes the importance per head "
        "(CSV) and its head grid (HTML).",
    )
    options.corpus_options(
        parser, out_help="HTML figure to write (the CSV goes beside it; default importance.html)",
        out_default="importance.html",
    )
    parser.add_argument(
        "--task", default=None, choices=options.TASKS,
        help="the task whose probe's loss is differentiated (default: the model's LM loss on --corpus)",
    )
    parser.add_argument("--data-dir", default=None, help="folder of the task files (default: the hub)")
    parser.add_argument("--train-limit", type=options.positive, default=4000,
                        help="training examples of the probe (default 4000)")
    parser.add_argument("--limit", type=options.positive, default=512,
                        help="training examples the importance is averaged over, held out from the probe's (default 512)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """``attnlens importance`` with the parsed ``args``: :func:`attnlens.cli.jobs.importance.run`, imported
    here, as the command runs (it imports torch); returns the exit status."""
    from attnlens.cli.jobs import importance

    return importance.run(args)
