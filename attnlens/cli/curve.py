"""``attnlens curve``: the PAPA curve: task scores as heads are replaced; write CSV and HTML."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from attnlens import cli


def add(commands: Any) -> None:
    """The ``curve`` command and its options."""
    parser = commands.add_parser(
        "curve", help="the PAPA curve: task scores as heads are replaced; write CSV and HTML",
        description="Probe tasks with a growing share of heads replaced by PAPA constants "
        "(Hassid et al. 2022) and write the table (CSV) and its figure (HTML).",
    )
    cli._model_option(parser)
    parser.add_argument("--constants", required=True, help="PAPA constants from 'attnlens fit-papa'")
    parser.add_argument(
        "--fractions", default="0,0.5,0.875,0.9375,1",
        help="replaced shares of heads, comma-separated (default: the paper's 0,0.5,0.875,0.9375,1)",
    )
    parser.add_argument(
        "--strategy", default="input_dependence",
        help="order in which heads are replaced (a papa.select_heads strategy; default input_dependence)",
    )
    parser.add_argument("--out", default="curve.html", help="HTML figure to write (the CSV goes beside it)")
    parser.add_argument(
        "--checkpoint", default=None, metavar="FOLDER",
        help="a folder for the finished points: run the same command again to resume an interrupted curve",
    )
    cli._probe_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """``attnlens curve`` with the parsed ``args``; returns the exit status."""
    inputs = [("--constants", args.constants), ("--lm-texts", args.lm_texts)]
    out = cli._out(args.out, "--out", (".html", ".htm"), inputs, force=args.force)
    table = cli._out(str(out.with_suffix(".csv")), "--out (its CSV)", (".csv",), inputs, force=args.force)
    try:
        fractions = [float(part) for part in args.fractions.split(",") if part.strip()]
    except ValueError:
        raise cli.UsageError(f"--fractions {args.fractions} should be numbers separated by commas") from None
    if not fractions:
        raise cli.UsageError(f"--fractions {args.fractions!r} holds no fraction; give numbers separated by commas (e.g. 0,0.5,1)")
    from attnlens.methods.papa import STRATEGIES

    if args.strategy not in STRATEGIES:
        raise cli.UsageError(f"--strategy {args.strategy} is unknown; use one of {', '.join(STRATEGIES)}")
    if not Path(args.constants).is_file():
        raise cli.UsageError(f"constants file not found: {args.constants}")
    if args.checkpoint is not None and Path(args.checkpoint).exists() and not Path(args.checkpoint).is_dir():
        raise cli.UsageError(f"--checkpoint {args.checkpoint} is a file; give a folder (made if missing)")
    measures = cli._measures(args)
    model = cli._load(args.model, quiet=args.quiet, device=cli._resolve_device(args.device))
    from attnlens.evaluation.curve import curve
    from attnlens.methods.papa import PapaConstants

    constants = PapaConstants.load(args.constants, model)
    result = curve(
        model, constants, measures["tasks"], fractions=fractions, strategy=args.strategy,
        lm_texts=measures["lm_texts"], data_dir=measures["data_dir"],
        train_limit=measures["train_limit"], eval_limit=measures["eval_limit"],
        batch_size=args.batch_size, seeds=args.seeds, checkpoint=args.checkpoint, progress=not args.quiet,
    )
    if cli._rank() != 0:  # under torchrun the ranks shared the tasks, and each holds the curve
        return 0
    result.to_csv(table, overwrite_read_only=args.force)
    from attnlens.core.files import write_atomic

    html = result.figure().to_html(include_plotlyjs=True, full_html=True)
    write_atomic(out, html.encode("utf-8"), overwrite_read_only=args.force)
    print(result.table.to_string(index=False, float_format=lambda value: f"{value:.4f}"))
    print(f"wrote {table} and {out} ({result.seconds:.0f} s, {result.forward_seconds:.0f} s in probes)")
    return 0
