"""``attnlens compare``: compare views of attention head by head; write an HTML report."""

from __future__ import annotations

import argparse
from typing import Any

from attnlens.cli import options
from attnlens.methods import views


def add(commands: Any) -> None:
    """The ``compare`` command and its options."""
    parser = commands.add_parser(
        "compare", help="compare views of attention head by head; write an HTML report",
        description="Compare views of attention (every registered one by default: "
        f"{', '.join(views.names())}) head by head over a corpus and write a self-contained HTML report.",
    )
    options.corpus_options(parser, out_help="HTML report to write (default report.html)", out_default="report.html")
    parser.add_argument(
        "--views", default=None,
        help=f"comma-separated views among {', '.join(views.names())} (default: all)",
    )
    parser.add_argument(
        "--constants", default=None, help="PAPA constants from 'attnlens fit-papa' (else fitted)",
    )
    parser.add_argument(
        "--example", type=options.example_index, default=None, metavar="N",
        help="corpus text whose maps the report shows, from 0 (default: the first, or with the "
        "effective view the first longer than the head dimension)",
    )
    parser.add_argument(
        "--focus", type=options.head, default=None, metavar="L,H",
        help="head shown side by side, as layer,head from 0 (default: the one farthest from "
        "standard attention)",
    )
    parser.add_argument(
        "--json", default=None, help="also write the comparison as JSON to this .json file"
    )
    options.measure_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """``attnlens compare`` with the parsed ``args``: :func:`attnlens.cli.jobs.compare.run`, imported
    here, as the command runs (it imports torch); returns the exit status."""
    from attnlens.cli.jobs import compare

    return compare.run(args)
