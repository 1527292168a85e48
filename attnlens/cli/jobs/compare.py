"""The job of ``attnlens compare``: compare views of attention head by head; write an HTML report."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlens.cli import summary
from attnlens.cli.jobs import common
from attnlens.comparison.run import compare
from attnlens.methods.papa import PapaConstants, fitting


def run(args: argparse.Namespace) -> int:
    """``attnlens compare`` with the parsed ``args``; returns the exit status."""
    views = common.view_names(args.views)
    inputs = [common.corpus_file(args), ("--constants", args.constants), ("--lm-texts", args.lm_texts)]
    out = common.output(args.out, "--out", (".html", ".htm"), inputs, force=args.force)
    json_out = None
    if args.json is not None:
        json_out = common.output(args.json, "--json", (".json",), [*inputs, ("--out", out)], force=args.force)
    if args.constants is not None and not common.constant_views(views):
        raise common.UsageError(
            f"--constants {args.constants} would be unused: --views {args.views} has no papa "
            "view; add papa to --views (e.g. --views standard,papa) or drop --constants"
        )
    texts = common.corpus_texts(args)
    if args.example is not None:
        common.check_example(args.example, len(texts))
    if args.constants is not None and not Path(args.constants).is_file():
        raise common.UsageError(f"constants file not found: {args.constants}")
    measures = common.measures(args)
    common.task_data(args.task, args.data_dir)
    device = common.resolve_device(args.device)
    model = common.load(args.model, quiet=args.quiet, device=device)
    if args.focus is not None:
        common.check_focus(args.focus, model)
    constants = None
    if args.constants is not None:
        constants = PapaConstants.load(args.constants, model)
    if args.max_len is not None:
        if constants is not None:
            layout = constants.layout
        else:
            layout = fitting.default_layout(model) if common.constant_views(views) else "padded"
        common.check_max_len(model, texts, args.max_len, layout)
    comparison = compare(
        model, *views, corpus=texts, max_len=args.max_len,
        batch_size=args.batch_size, constants=constants, progress=not args.quiet,
        example=args.example, focus=args.focus, **measures,
    )
    path = comparison.save_html(out, overwrite_read_only=args.force)
    print(summary(comparison))
    if json_out is not None:
        comparison.to_json(json_out, overwrite_read_only=args.force)
        print(f"wrote {args.json}")
    print(f"wrote report: {path.resolve()}")
    return 0
