"""The job of ``attnlens table``: PAPA's Table 1: original, average constants and data-free
matrices per task."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlens.cli.jobs import common
from attnlens.core.files import write_atomic
from attnlens.evaluation import curve_inputs
from attnlens.evaluation.table import table
from attnlens.methods.papa import PapaConstants


def run(args: argparse.Namespace) -> int:
    """``attnlens table`` with the parsed ``args``; returns the exit status. A task whose inputs are
    not of the kind the constants were fitted on (MRPC's pairs, constants of single sentences) gets
    constants fitted on its own training inputs, as the curve's
    (:func:`attnlens.evaluation.curve_inputs.constants_by_task`)."""
    inputs = [("--constants", args.constants), ("--lm-texts", args.lm_texts)]
    out, csv = common.figure_outputs(args, inputs)
    markdown = common.output(str(out.with_suffix(".md")), "--out (its Markdown)", (".md",), inputs,
                             force=args.force)
    if not Path(args.constants).is_file():
        raise common.UsageError(f"constants file not found: {args.constants}")
    baselines = common.baselines(args.baselines)
    measures = common.measures(args)
    common.task_data(args.task, args.data_dir)
    model = common.load(args.model, quiet=args.quiet, device=common.resolve_device(args.device))
    constants = PapaConstants.load(args.constants, model)
    tasks = measures.pop("tasks")
    by_task = curve_inputs.constants_by_task(  # as the curve: a task of the other kind gets its own
        model, constants, tasks, data_dir=measures["data_dir"], train_limit=measures["train_limit"],
        batch_size=args.batch_size, progress=not args.quiet)
    result = table(model, by_task, tasks, baselines=baselines,
                   batch_size=args.batch_size, seeds=args.seeds, labelled_steps=args.labelled_steps,
                   progress=not args.quiet, **measures)
    common.write_table_and_figure(result.table, result.figure(), csv, out, args.force)
    write_atomic(markdown, (result.to_markdown() + "\n").encode("utf-8"), overwrite_read_only=args.force)
    print(result.frame().to_string())
    print(f"wrote {csv}, {markdown} and {out} ({result.seconds:.0f} s)")
    return 0
