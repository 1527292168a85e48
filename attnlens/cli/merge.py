"""``attnlens merge``: merge PAPA constants fitted on parts of a corpus into one file."""

from __future__ import annotations

import argparse
from typing import Any

from attnlens.cli import options


def add(commands: Any) -> None:
    """The ``merge`` command and its options."""
    parser = commands.add_parser(
        "merge", help="merge PAPA constants fitted on parts of a corpus into one file",
        description="Add up constants (or fit checkpoints) fitted on shards of a corpus anywhere "
        "(a Slurm array, other machines, another day) into the constants of the whole corpus.",
    )
    parser.add_argument("inputs", nargs="+", help="constants files (.safetensors) to merge")
    parser.add_argument("--out", required=True, help="safetensors file to write")
    options.force_option(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """``attnlens merge`` with the parsed ``args``: :func:`attnlens.cli.jobs.merge.run`, imported
    here, as the command runs (it imports torch); returns the exit status."""
    from attnlens.cli.jobs import merge

    return merge.run(args)
