"""``attnlens importance``: head importance (Michel et al. 2019); write CSV and HTML."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from attnlens import cli


def add(commands: Any) -> None:
    """The ``importance`` command and its options."""
    parser = commands.add_parser(
        "importance", help="head importance (Michel et al. 2019); write CSV and HTML",
        description="Michel et al.'s head importance E|dL/dxi_h| from a gate on every head: with "
        "--task, the loss of a PAPA probe trained on that task; else the model's own LM loss on "
        "--corpus (refused for a model whose LM head is untrained). Writes the importance per head "
        "(CSV) and its head grid (HTML).",
    )
    cli._common(parser, out_help="HTML figure to write (the CSV goes beside it; default importance.html)",
            out_default="importance.html")
    parser.add_argument(
        "--task", default=None, choices=("sst2", "cola", "mrpc", "mnli", "ner", "pos"),
        help="the task whose probe's loss is differentiated (default: the model's LM loss on --corpus)",
    )
    parser.add_argument("--data-dir", default=None, help="folder of the task files (default: the hub)")
    parser.add_argument("--train-limit", type=cli._positive, default=4000,
                            help="training examples of the probe (default 4000)")
    parser.add_argument("--limit", type=cli._positive, default=512,
                            help="dev examples the importance is averaged over (default 512)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """``attnlens importance`` with the parsed ``args``; returns the exit status."""
    if args.task is None and args.data_dir is not None:
        raise cli.UsageError("--data-dir is for --task; without --task the corpus is --corpus")
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        raise cli.UsageError(f"--data-dir {args.data_dir} is not a folder (of the --task {args.task} files)")
    inputs = [cli._corpus_file(args)]
    out, csv = cli._outputs(args, inputs)
    corpus: Any = args.task if args.task is not None else cli._texts(args)
    model = cli._load(args.model, quiet=args.quiet, device=cli._resolve_device(args.device))
    import pandas as pd

    from attnlens.core import plots
    from attnlens.evaluation.importance import importance

    result = importance(
        model, corpus, max_len=args.max_len or 128, batch_size=args.batch_size,
        progress=not args.quiet, data_dir=args.data_dir, train_limit=args.train_limit, limit=args.limit,
    )
    n_layers, n_heads = result.shape
    table = pd.DataFrame({
        "layer": [layer for layer in range(n_layers) for _ in range(n_heads)],
        "head": [head for _ in range(n_layers) for head in range(n_heads)],
        "importance": result.scores.reshape(-1).tolist(),
        "raw": result.raw.reshape(-1).tolist(),
    })
    what = f"the {args.task} probe's loss" if args.task else "the LM loss"
    figure = plots.head_grid(result.scores.numpy(), name="importance",
                             title=f"Head importance (Michel et al. 2019), {what}, normalised per layer")
    cli._write_table_and_figure(table, figure, csv, out, args.force)
    ranked = ", ".join(f"L{layer}H{head}" for layer, head in result.heads_ranked("descending")[:8])
    print(f"{result!r}\nmost important: {ranked}\nwrote {csv} and {out}")
    return 0
