"""The job of ``attnlens merge``: merge PAPA constants fitted on parts of a corpus into one file."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from attnlens.cli.jobs import common
from attnlens.methods.papa import PapaConstants


def run(args: argparse.Namespace) -> int:
    """``attnlens merge`` with the parsed ``args``; returns the exit status."""
    inputs = [("input", path) for path in args.inputs]
    out = common.output(args.out, "--out", (".safetensors",), inputs, force=args.force)
    for _, path in inputs:
        if not Path(path).is_file():
            raise common.UsageError(f"constants file not found: {path}")
    parts = [PapaConstants.load(path) for path in args.inputs]
    for index, path in enumerate(args.inputs):  # one file twice would count its examples twice
        earlier = next((other for other in args.inputs[:index] if os.path.samefile(other, path)), None)
        if earlier is not None:
            raise common.UsageError(f"input {path} is the same file as input {earlier}: its examples would be "
                                    "counted twice; give each file once")
    merged = parts[0]
    for path, part in zip(args.inputs[1:], parts[1:], strict=True):
        try:
            merged = merged + part
        except ValueError as error:
            raise common.UsageError(f"cannot merge {path}: {error}") from None
    path = merged.save(out, overwrite_read_only=args.force)
    print(repr(merged))
    print(f"wrote constants: {Path(path).resolve()}")
    return 0
