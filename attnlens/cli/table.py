"""``attnlens table``: PAPA's Table 1: original, average constants and data-free matrices per task."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from attnlens import cli


def add(commands: Any) -> None:
    """The ``table`` command and its options."""
    parser = commands.add_parser(
        "table", help="PAPA's Table 1: original, average constants and data-free matrices per task",
        description="Probe tasks with the original attention, PAPA's average constants in every "
        "head and the data-free identity, Toeplitz, zeros and uniform matrices in every head "
        "(Hassid et al. 2022, Table 1); write the table (CSV, Markdown) and its figure (HTML).",
    )
    cli._model_option(parser)
    parser.add_argument("--constants", required=True, help="PAPA constants from 'attnlens fit-papa'")
    parser.add_argument("--out", default="table.html", help="HTML figure to write (CSV and .md beside it)")
    cli._probe_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """``attnlens table`` with the parsed ``args``; returns the exit status."""
    inputs = [("--constants", args.constants), ("--lm-texts", args.lm_texts)]
    out, csv = cli._outputs(args, inputs)
    markdown = cli._out(str(out.with_suffix(".md")), "--out (its Markdown)", (".md",), inputs, force=args.force)
    if not Path(args.constants).is_file():
        raise cli.UsageError(f"constants file not found: {args.constants}")
    measures = cli._measures(args)
    model = cli._load(args.model, quiet=args.quiet, device=cli._resolve_device(args.device))
    from attnlens.core.files import write_atomic
    from attnlens.evaluation.table import table
    from attnlens.methods.papa import PapaConstants

    constants = PapaConstants.load(args.constants, model)
    result = table(model, constants, measures.pop("tasks"), batch_size=args.batch_size, seeds=args.seeds,
                   progress=not args.quiet, **measures)
    cli._write_table_and_figure(result.table, result.figure(), csv, out, args.force)
    write_atomic(markdown, (result.to_markdown() + "\n").encode("utf-8"), overwrite_read_only=args.force)
    print(result.frame().to_string())
    print(f"wrote {csv}, {markdown} and {out} ({result.seconds:.0f} s)")
    return 0
