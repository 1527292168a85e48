"""The job of ``attnlens syntax``: syntactic heads on a CoNLL-U treebank; write CSV and HTML."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from attnlens.cli.jobs import common
from attnlens.methods import syntax
from attnlens.methods.papa import PapaConstants


def run(args: argparse.Namespace) -> int:
    """``attnlens syntax`` with the parsed ``args``; returns the exit status."""
    given = bool(common.constant_views([args.view]))  # a view given by the constants
    common.constants_for(args, given)
    if not Path(args.conllu).is_file():
        raise common.UsageError(f"--conllu {args.conllu}: file not found")
    out, csv = common.figure_outputs(args, [("--conllu", args.conllu), ("--constants", args.constants)])
    model = common.load(args.model, quiet=args.quiet, device=common.resolve_device(args.device))
    view: Any = args.view
    if given:
        view = PapaConstants.load(args.constants, model)
    table = syntax.dependency_heads(
        model, args.conllu, view=view, max_len=args.max_len, batch_size=args.batch_size,
        limit=args.limit, progress=not args.quiet,
    )
    common.write_table_and_figure(table, syntax.figure(table), csv, out, args.force)
    print(table.head(12).to_string(index=False, float_format=lambda value: f"{value:.3f}"))
    print(f"{table.attrs['sentences']} sentences ({table.attrs['skipped']} skipped as longer than "
          f"max_len); wrote {csv} and {out}")
    return 0
