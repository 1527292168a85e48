"""The job of ``attnlens types``: Kovaleva pattern types per head and view; write CSV and HTML."""

from __future__ import annotations

import argparse

import pandas as pd

from attnlens.cli.jobs import common
from attnlens.methods import patterns, views
from attnlens.methods.papa import PapaConstants


def run(args: argparse.Namespace) -> int:
    """``attnlens types`` with the parsed ``args``; returns the exit status."""
    names = [name.strip() for name in args.views.split(",") if name.strip()]
    unknown = [name for name in names if name not in views.REGISTRY]
    if not names or unknown:
        raise common.UsageError(f"--views {args.views}: choose among {', '.join(views.names())}")
    given = common.constant_views(names)  # views given by the constants
    common.constants_for(args, bool(given))
    out, csv = common.figure_outputs(args, [common.corpus_file(args), ("--constants", args.constants)])
    constants = PapaConstants.load(args.constants) if given else None  # read once, checked against the model below
    if constants is not None and args.max_len is not None:  # their pass takes their max_len: another is refused, as by compare
        fitted = constants.max_len
        if fitted != args.max_len:
            raise common.UsageError(
                f"--max-len {args.max_len}: the PAPA constants {args.constants} were fitted with max_len "
                f"{fitted}; give --max-len {fitted} or leave it out"
            )
    texts = common.corpus_texts(args)
    model = common.load(args.model, quiet=args.quiet, device=common.resolve_device(args.device))
    options = dict(batch_size=args.batch_size, progress=not args.quiet)
    tables = []
    named = [name for name in names if name not in given]
    if named:  # the views given by name: one pass, the maximum length asked for
        tables.append(patterns.types(model, texts, view=named, max_len=args.max_len, **options))
    if constants is not None:  # the constants' own pass, their own max_len and layout
        constants.check_compatible(model)
        tables.append(patterns.types(model, texts, view=constants, max_len=args.max_len, **options))
    table = pd.concat(tables, ignore_index=True)
    common.write_table_and_figure(table, patterns.figure(table), csv, out, args.force)
    print("share of maps per type, mean over heads")
    means = table.groupby("view", sort=False)[list(patterns.TYPES)].mean()
    print(means.to_string(float_format=lambda value: f"{value:.3f}"))
    print(f"wrote {csv} and {out}")
    return 0
