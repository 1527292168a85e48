"""``attnlens compare``: compare views of attention head by head; write an HTML report."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from attnlens import cli


def add(commands: Any) -> None:
    """The ``compare`` command and its options."""
    parser = commands.add_parser(
        "compare", help="compare views of attention head by head; write an HTML report",
        description="Compare standard, PAPA and effective attention head by head over a corpus "
        "and write a self-contained HTML report.",
    )
    cli._common(parser, out_help="HTML report to write (default report.html)", out_default="report.html")
    parser.add_argument(
        "--views", default="standard,papa,effective",
        help="comma-separated views among standard, papa, effective (default: all)",
    )
    parser.add_argument(
        "--constants", default=None, help="PAPA constants from 'attnlens fit-papa' (else fitted)",
    )
    parser.add_argument(
        "--example", type=cli._example_index, default=None, metavar="N",
        help="corpus text whose maps the report shows, from 0 (default: the first, or with the "
        "effective view the first longer than the head dimension)",
    )
    parser.add_argument(
        "--focus", type=cli._head, default=None, metavar="L,H",
        help="head shown side by side, as layer,head from 0 (default: the one farthest from "
        "standard attention)",
    )
    parser.add_argument(
        "--json", default=None, help="also write the comparison as JSON to this .json file"
    )
    cli._measure(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """``attnlens compare`` with the parsed ``args``; returns the exit status."""
    views = cli._views(args.views)
    inputs = [cli._corpus_file(args), ("--constants", args.constants), ("--lm-texts", args.lm_texts)]
    out = cli._out(args.out, "--out", (".html", ".htm"), inputs, force=args.force)
    json_out = None
    if args.json is not None:
        json_out = cli._out(args.json, "--json", (".json",), [*inputs, ("--out", out)], force=args.force)
    if args.constants is not None and "papa" not in views:
        raise cli.UsageError(
            f"--constants {args.constants} would be unused: --views {args.views} has no papa "
            "view; add papa to --views (e.g. --views standard,papa) or drop --constants"
        )
    texts = cli._texts(args)
    if args.example is not None:
        cli._check_example(args.example, len(texts))
    if args.constants is not None and not Path(args.constants).is_file():
        raise cli.UsageError(f"constants file not found: {args.constants}")
    device = cli._resolve_device(args.device)
    model = cli._load(args.model, quiet=args.quiet, device=device)
    if args.focus is not None:
        cli._check_focus(args.focus, model)
    constants = None
    if args.constants is not None:
        from attnlens.methods.papa import PapaConstants

        constants = PapaConstants.load(args.constants, model)
    if args.max_len is not None:
        if constants is not None:
            layout = constants.layout
        else:
            layout = cli._fit_layout(model) if "papa" in views else "padded"
        cli._check_max_len(model, texts, args.max_len, layout)
    from attnlens.comparison.run import compare

    comparison = compare(
        model, *views, corpus=texts, max_len=args.max_len,
        batch_size=args.batch_size, constants=constants, progress=not args.quiet,
        example=args.example, focus=args.focus, **cli._measures(args),
    )
    path = comparison.save_html(out, overwrite_read_only=args.force)
    print(cli.summary(comparison))
    if json_out is not None:
        comparison.to_json(json_out, overwrite_read_only=args.force)
        print(f"wrote {args.json}")
    print(f"wrote report: {path.resolve()}")
    return 0
