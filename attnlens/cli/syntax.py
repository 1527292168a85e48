"""``attnlens syntax``: syntactic heads on a CoNLL-U treebank; write CSV and HTML."""

from __future__ import annotations

import argparse
from typing import Any

from attnlens.cli import options
from attnlens.methods import views


def add(commands: Any) -> None:
    """The ``syntax`` command and its options."""
    parser = commands.add_parser(
        "syntax", help="syntactic heads on a CoNLL-U treebank; write CSV and HTML",
        description="For every dependency relation, the single head that best finds it against "
        "the best fixed-offset baseline (Clark et al. 2019, §4); write the table (CSV) and a "
        "figure (HTML).",
    )
    parser.add_argument("--conllu", required=True, help="a CoNLL-U treebank (e.g. UD English EWT dev)")
    options.model_options(parser)
    parser.add_argument("--view", choices=views.names(), default="standard",
                        help="which attention (papa needs --constants; default standard)")
    parser.add_argument("--constants", default=None, help="PAPA constants for --view papa")
    parser.add_argument("--limit", type=options.positive, default=None, help="read the first N sentences")
    parser.add_argument("--max-len", type=options.positive, default=None,
                        help="skip sentences longer than this many tokens (default 128)")
    parser.add_argument("--batch-size", type=options.positive, default=32, help="sentences per forward pass")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--out", default="syntax.html", help="HTML figure to write (the CSV goes beside it)")
    options.force_option(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """``attnlens syntax`` with the parsed ``args``: :func:`attnlens.cli.jobs.syntax.run`, imported
    here, as the command runs (it imports torch); returns the exit status."""
    from attnlens.cli.jobs import syntax

    return syntax.run(args)
