"""``attnlens merge``: merge PAPA constants fitted on parts of a corpus into one file."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from attnlens import cli


def add(commands: Any) -> None:
    """The ``merge`` command and its options."""
    parser = commands.add_parser(
        "merge", help="merge PAPA constants fitted on parts of a corpus into one file",
        description="Add up constants (or fit checkpoints) fitted on shards of a corpus anywhere "
        "(a Slurm array, other machines, another day) into the constants of the whole corpus.",
    )
    parser.add_argument("inputs", nargs="+", help="constants files (.safetensors) to merge")
    parser.add_argument("--out", required=True, help="safetensors file to write")
    cli._force(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """``attnlens merge`` with the parsed ``args``; returns the exit status."""
    inputs = [("input", path) for path in args.inputs]
    out = cli._out(args.out, "--out", (".safetensors",), inputs, force=args.force)
    for _, path in inputs:
        if not Path(path).is_file():
            raise cli.UsageError(f"constants file not found: {path}")
    from attnlens.methods.papa import PapaConstants

    parts = [PapaConstants.load(path) for path in args.inputs]
    merged = parts[0]
    for path, part in zip(args.inputs[1:], parts[1:], strict=True):
        try:
            merged = merged + part
        except ValueError as error:
            raise cli.UsageError(f"cannot merge {path}: {error}") from None
    path = merged.save(out, overwrite_read_only=args.force)
    print(repr(merged))
    print(f"wrote constants: {Path(path).resolve()}")
    return 0
