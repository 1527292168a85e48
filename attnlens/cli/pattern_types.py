"""``attnlens types``: Kovaleva pattern types per head and view; write CSV and HTML."""

from __future__ import annotations

import argparse
from typing import Any

from attnlens import cli


def add(commands: Any) -> None:
    """The ``types`` command and its options."""
    parser = commands.add_parser(
        "types", help="Kovaleva pattern types per head and view; write CSV and HTML",
        description="Classify every head's map on every text into Kovaleva et al.'s five types "
        "(vertical, diagonal, vertical+diagonal, block, heterogeneous) and write the shares per "
        "head (CSV) and per layer (HTML figure, a panel per view).",
    )
    cli._common(parser, out_help="HTML figure to write (the CSV goes beside it; default types.html)",
            out_default="types.html")
    parser.add_argument(
        "--views", default="standard,effective",
        help="comma-separated views among standard, effective, papa (papa needs --constants)",
    )
    parser.add_argument("--constants", default=None, help="PAPA constants for the papa view")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """``attnlens types`` with the parsed ``args``; returns the exit status."""
    names = [name.strip() for name in args.views.split(",") if name.strip()]
    from attnlens.methods import views

    unknown = [name for name in names if name not in views.REGISTRY]
    if not names or unknown:
        raise cli.UsageError(f"--views {args.views}: choose among {', '.join(views.names())}")
    cli._constants_for(args, "papa" in names)
    out, csv = cli._outputs(args, [cli._corpus_file(args), ("--constants", args.constants)])
    texts = cli._texts(args)
    model = cli._load(args.model, quiet=args.quiet, device=cli._resolve_device(args.device))
    import pandas as pd

    from attnlens.methods import patterns

    options = dict(batch_size=args.batch_size, progress=not args.quiet)
    tables = []
    named = [name for name in names if name != "papa"]
    if named:  # standard and effective: one pass, the maximum length asked for
        tables.append(patterns.types(model, texts, view=named, max_len=args.max_len, **options))
    if "papa" in names:  # the constants' own pass, their own max_len and layout
        from attnlens.methods.papa import PapaConstants

        constants = PapaConstants.load(args.constants, model)
        tables.append(patterns.types(model, texts, view=constants, **options))
    table = pd.concat(tables, ignore_index=True)
    cli._write_table_and_figure(table, patterns.figure(table), csv, out, args.force)
    print("share of maps per type, mean over heads")
    means = table.groupby("view", sort=False)[list(patterns.TYPES)].mean()
    print(means.to_string(float_format=lambda value: f"{value:.3f}"))
    print(f"wrote {csv} and {out}")
    return 0
