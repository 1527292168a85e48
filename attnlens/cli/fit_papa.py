"""``attnlens fit-papa``: fit PAPA constant attention matrices; write a safetensors file."""

from __future__ import annotations

import argparse
from typing import Any

from attnlens.cli import options


def add(commands: Any) -> None:
    """The ``fit-papa`` command and its options."""
    parser = commands.add_parser(
        "fit-papa", help="fit PAPA constant attention matrices; write a safetensors file",
        description="Average every head's attention over a corpus (PAPA, Hassid et al. 2022) "
        "and save the constants.",
    )
    options.corpus_options(parser, out_help="safetensors file to write", out_default=None)
    parser.add_argument(
        "--layout", choices=("papa", "padded"), default=None,
        help="tokenization layout (default by model: papa, fixed [CLS]/[SEP] positions, for "
        "encoders; padded for decoders such as GPT-2)",
    )
    parser.add_argument(
        "--checkpoint", default=None,
        help="save the fit's progress here; the same command run again resumes an interrupted fit",
    )
    parser.add_argument(
        "--checkpoint-every", type=options.positive, default=None,
        help="batches between two saves of --checkpoint (default 20)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """``attnlens fit-papa`` with the parsed ``args``: :func:`attnlens.cli.jobs.fit_papa.run`, imported
    here, as the command runs (it imports torch); returns the exit status."""
    from attnlens.cli.jobs import fit_papa

    return fit_papa.run(args)
