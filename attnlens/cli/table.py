"""``attnlens table``: PAPA's Table 1: original, average constants and data-free matrices per task."""

from __future__ import annotations

import argparse
from typing import Any

from attnlens.cli import options


def add(commands: Any) -> None:
    """The ``table`` command and its options."""
    parser = commands.add_parser(
        "table", help="PAPA's Table 1: original, average constants and data-free matrices per task",
        description="Probe tasks with the original attention, PAPA's average constants in every "
        "head, the data-free identity, Toeplitz, zeros and uniform matrices and the two trained with "
        "the task's labels (toeplitz_init, average_init) in every head (Hassid et al. 2022, Table 1; "
        "--baselines chooses them); write the table (CSV, Markdown) and its figure (HTML).",
    )
    options.model_options(parser)
    parser.add_argument("--constants", required=True, help="PAPA constants from 'attnlens fit-papa'")
    parser.add_argument("--out", default="table.html", help="HTML figure to write (CSV and .md beside it)")
    parser.add_argument(
        "--baselines", default="all",
        help="the rows of matrices replacing every head, comma-separated: data-free (identity, toeplitz, zeros, "
        "uniform) or trained with the task's labels (toeplitz_init, average_init); 'all' (default: Table 1's "
        "six) or 'none' (the original and average rows only)",
    )
    options.probe_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """``attnlens table`` with the parsed ``args``: :func:`attnlens.cli.jobs.table.run`, imported
    here, as the command runs (it imports torch); returns the exit status."""
    from attnlens.cli.jobs import table

    return table.run(args)
