"""The job of ``attnlens importance``: head importance (Michel et al. 2019); write CSV and HTML."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pandas as pd

from attnlens.cli.jobs import common
from attnlens.core import plots
from attnlens.evaluation.importance import importance


def run(args: argparse.Namespace) -> int:
    """``attnlens importance`` with the parsed ``args``; returns the exit status."""
    if args.task is None and args.data_dir is not None:
        raise common.UsageError("--data-dir is for --task; without --task the corpus is --corpus")
    if args.task is not None:  # the task's training examples are the corpus
        for option, value, fix in (("--corpus", None if args.corpus == "default" else args.corpus, "drop it"),
                                   ("--n-examples", args.n_examples, "--limit gives how many")):
            if value is not None:
                raise common.UsageError(f"{option} {value} would be unused: with --task {args.task} the importance "
                                        f"is measured on the task's training examples; {fix}")
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        raise common.UsageError(f"--data-dir {args.data_dir} is not a folder (of the --task {args.task} files)")
    if args.task is not None:  # its train split read before the model loads, refused in the CLI's terms
        common.task_data([args.task], args.data_dir, splits=("train",))
    out, csv = common.figure_outputs(args, [common.corpus_file(args)])
    corpus: Any = args.task if args.task is not None else common.corpus_texts(args)
    model = common.load(args.model, quiet=args.quiet, device=common.resolve_device(args.device))
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
    common.write_table_and_figure(table, figure, csv, out, args.force)
    ranked = ", ".join(f"L{layer}H{head}" for layer, head in result.heads_ranked("descending")[:8])
    print(f"{result!r}\nmost important: {ranked}\nwrote {csv} and {out}")
    return 0
