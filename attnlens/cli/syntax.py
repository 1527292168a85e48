"""``attnlens syntax``: syntactic heads on a CoNLL-U treebank; write CSV and HTML."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from attnlens import cli
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
    cli._model_option(parser)
    parser.add_argument("--view", choices=views.names(), default="standard",
                        help="which attention (papa needs --constants; default standard)")
    parser.add_argument("--constants", default=None, help="PAPA constants for --view papa")
    parser.add_argument("--limit", type=cli._positive, default=None, help="read the first N sentences")
    parser.add_argument("--max-len", type=cli._positive, default=None,
                        help="skip sentences longer than this many tokens (default 128)")
    parser.add_argument("--batch-size", type=cli._positive, default=32, help="sentences per forward pass")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--out", default="syntax.html", help="HTML figure to write (the CSV goes beside it)")
    cli._force(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """``attnlens syntax`` with the parsed ``args``; returns the exit status."""
    cli._constants_for(args, args.view == "papa")
    if not Path(args.conllu).is_file():
        raise cli.UsageError(f"--conllu {args.conllu}: file not found")
    out, csv = cli._outputs(args, [("--conllu", args.conllu), ("--constants", args.constants)])
    model = cli._load(args.model, quiet=args.quiet, device=cli._resolve_device(args.device))
    from attnlens.methods import syntax

    view: Any = args.view
    if args.view == "papa":
        from attnlens.methods.papa import PapaConstants

        view = PapaConstants.load(args.constants, model)
    table = syntax.dependency_heads(
        model, args.conllu, view=view, max_len=args.max_len, batch_size=args.batch_size,
        limit=args.limit, progress=not args.quiet,
    )
    cli._write_table_and_figure(table, syntax.figure(table), csv, out, args.force)
    print(table.head(12).to_string(index=False, float_format=lambda value: f"{value:.3f}"))
    print(f"{table.attrs['sentences']} sentences ({table.attrs['skipped']} skipped as longer than "
          f"max_len); wrote {csv} and {out}")
    return 0
