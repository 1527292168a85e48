"""``attnlens types``: Kovaleva pattern types per head and view; write CSV and HTML."""

from __future__ import annotations

import argparse
from typing import Any

from attnlens.cli import options
from attnlens.methods import views


def add(commands: Any) -> None:
    """The ``types`` command and its options."""
    parser = commands.add_parser(
        "types", help="Kovaleva pattern types per head and view; write CSV and HTML",
        description="Classify every head's map on every text into Kovaleva et al.'s five types "
        "(vertical, diagonal, vertical+diagonal, block, heterogeneous) and write the shares per "
        "head (CSV) and per layer (HTML figure, a panel per view).",
    )
    options.corpus_options(
        parser, out_help="HTML figure to write (the CSV goes beside it; default types.html)",
        out_default="types.html",
    )
    parser.add_argument(
        "--views", default="standard,effective",
        help=f"comma-separated views among {', '.join(views.names())} (papa needs --constants)",
    )
    parser.add_argument("--constants", default=None, help="PAPA constants for the papa view")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """``attnlens types`` with the parsed ``args``: :func:`attnlens.cli.jobs.pattern_types.run`, imported
    here, as the command runs (it imports torch); returns the exit status."""
    from attnlens.cli.jobs import pattern_types

    return pattern_types.run(args)
