"""The job of ``attnlens curve``: the PAPA curve: task scores as heads are replaced; write CSV,
HTML and Table 1."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from attnlens.cli import build_parser
from attnlens.cli.jobs import common
from attnlens.core.files import write_atomic
from attnlens.engine.distributed import world
from attnlens.errors import InputError
from attnlens.evaluation import curve_inputs
from attnlens.evaluation.curve import Curve, curve
from attnlens.evaluation.table import PapaTable
from attnlens.methods.papa import STRATEGIES, PapaConstants, fitting


def run(args: argparse.Namespace) -> int:
    """``attnlens curve`` with the parsed ``args``; returns the exit status."""
    inputs = [("--constants", args.constants), ("--lm-texts", args.lm_texts),
              *(("--combine", path) for path in args.combine or ())]
    outputs = _outputs(args, inputs)
    baselines = common.baselines(args.baselines)
    if args.combine:
        return _combine(args, outputs)
    fractions = _fractions(args.fractions, table=args.table)
    _check(args)
    measures = common.measures(args)
    common.task_data(args.task, args.data_dir)
    model = common.load(args.model, quiet=args.quiet, device=common.resolve_device(args.device))
    if args.fit_wikitext:
        constants = fitting.fit(model, curve_inputs.constant_texts(args.data_dir), batch_size=args.batch_size,
                                progress=not args.quiet)
        if args.save_constants is not None and world().rank == 0:
            constants.save(outputs["constants"], overwrite_read_only=args.force)
    else:
        constants = PapaConstants.load(args.constants, model)
    tasks = measures.pop("tasks")
    by_task = curve_inputs.constants_by_task(
        model, constants, tasks, data_dir=measures["data_dir"], train_limit=measures["train_limit"],
        batch_size=args.batch_size, progress=not args.quiet)
    if args.lm_wikitext is not None:
        measures["lm_texts"] = curve_inputs.lm_texts(args.data_dir, args.lm_wikitext)
    result = curve(
        model, by_task, tasks, fractions=fractions, strategy=args.strategy, baselines=baselines,
        batch_size=args.batch_size, seeds=args.seeds, labelled_steps=args.labelled_steps,
        checkpoint=args.checkpoint, progress=not args.quiet,
        **measures,
    )
    if world().rank != 0:  # under torchrun every rank holds the curve; rank 0 writes it
        return 0
    _write(result, args, outputs)
    print(f"({result.seconds:.0f} s, {result.forward_seconds:.0f} s extracting features, "
          f"{result.probe_seconds:.0f} s training probes)")
    return 0


def _outputs(args: argparse.Namespace, inputs: list) -> dict[str, Path | None]:
    """The files to write, each checked before any work: ``csv`` and ``html`` (``--out``: a
    figure with its CSV beside it, or a CSV alone), ``table`` and ``markdown`` (Table 1),
    ``json`` and the saved constants."""
    out = common.output(args.out, "--out", (".html", ".htm", ".csv"), inputs, force=args.force)
    html = None if out.suffix.lower() == ".csv" else out
    csv = out if html is None else common.output(str(out.with_suffix(".csv")), "--out (its CSV)", (".csv",),
                                                 inputs, force=args.force)
    written = [("--out", out), ("--out (its CSV)", csv)]
    files: dict[str, Path | None] = {"html": html, "csv": csv, "table": None, "markdown": None, "relative": None,
                                     "versus_average": None, "json": None, "constants": None}
    if args.table is not None:
        files["table"] = common.output(args.table, "--table", (".csv",), [*inputs, *written], force=args.force)
        written.append(("--table", files["table"]))
        files["markdown"] = common.output(str(files["table"].with_suffix(".md")), "--table (its Markdown)",
                                          (".md",), [*inputs, *written], force=args.force)
        written.append(("--table (its Markdown)", files["markdown"]))
        relative = files["table"].with_name(files["table"].stem + "_relative.md")
        files["relative"] = common.output(str(relative), "--table (its relative view)", (".md",),
                                          [*inputs, *written], force=args.force)
        written.append(("--table (its relative view)", files["relative"]))
        versus = files["table"].with_name(files["table"].stem + "_versus_average.md")
        files["versus_average"] = common.output(str(versus), "--table (its baselines against average)", (".md",),
                                                [*inputs, *written], force=args.force)
        written.append(("--table (its baselines against average)", files["versus_average"]))
    if args.json is not None:
        files["json"] = common.output(args.json, "--json", (".json",), [*inputs, *written], force=args.force)
        written.append(("--json", files["json"]))
    if args.save_constants is not None:
        if not args.fit_wikitext:
            raise common.UsageError(f"--save-constants {args.save_constants} would be unused: it saves the "
                                    "constants of --fit-wikitext")
        files["constants"] = common.output(args.save_constants, "--save-constants", (".safetensors",),
                                           [*inputs, *written], force=args.force)
    return files


def _fractions(text: str, *, table: str | None) -> list[float]:
    """``--fractions``: shares of heads from 0 to 1, each once (a repeated one would be a repeated
    row of the curve, and one more test in the Holm adjustment of the others)."""
    try:
        fractions = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise common.UsageError(f"--fractions {text} should be numbers separated by commas") from None
    if not fractions:
        raise common.UsageError(f"--fractions {text!r} holds no fraction; give numbers separated by commas (e.g. 0,0.5,1)")
    outside = [fraction for fraction in fractions if not (math.isfinite(fraction) and 0 <= fraction <= 1)]
    if outside:
        raise common.UsageError(f"--fractions {text}: {outside[0]:g} is not a share of heads; give numbers "
                                "from 0 to 1 (0: no head replaced, 1: every head)")
    repeated = [fraction for index, fraction in enumerate(fractions) if fraction in fractions[:index]]
    if repeated:
        raise common.UsageError(f"--fractions {text} gives {repeated[0]:g} more than once; give each fraction once")
    if table is not None and 1.0 not in fractions:
        raise common.UsageError(f"--table {table} needs every head replaced: add 1 to --fractions {text}")
    return fractions


def _check(args: argparse.Namespace) -> None:
    """Refuse, before the model is loaded, what the curve cannot run."""
    if not args.task:
        raise common.UsageError("the following arguments are required: --task (or --combine CSV ...)")
    if args.strategy not in STRATEGIES:
        raise common.UsageError(f"--strategy {args.strategy} is unknown; use one of {', '.join(STRATEGIES)}")
    if args.constants is None and not args.fit_wikitext:
        raise common.UsageError("the constants are needed: --constants FILE (from 'attnlens fit-papa') or "
                                "--fit-wikitext")
    if args.constants is not None and not Path(args.constants).is_file():
        raise common.UsageError(f"constants file not found: {args.constants}")
    if args.lm_wikitext is not None and args.lm_texts is not None:
        raise common.UsageError("--lm-wikitext and --lm-texts both give the LM's texts; give one of them")
    for option, used, split in (("--fit-wikitext", args.fit_wikitext, "valid"),
                                ("--lm-wikitext", args.lm_wikitext is not None, "test")):
        if used and (args.data_dir is None or not (Path(args.data_dir) / "wikitext2" / f"{split}.txt").is_file()):
            raise common.UsageError(f"{option} reads --data-dir/wikitext2/{split}.txt: "
                                    + ("give --data-dir" if args.data_dir is None else
                                       f"{Path(args.data_dir) / 'wikitext2' / f'{split}.txt'} is not a file"))
    if args.checkpoint is not None:
        common.output_folder(args.checkpoint, "--checkpoint")


#: what ``--combine`` reads: the CSVs, the outputs, ``--data-dir`` (which tasks of Table 1 have no
#: data) and the options of every command
COMBINE_OPTIONS = frozenset({"combine", "out", "table", "json", "data_dir", "quiet", "force", "debug", "command",
                             "handler"})


def _combine(args: argparse.Namespace, outputs: dict[str, Path | None]) -> int:
    """``--combine``: one curve (and Table 1) from the CSVs of runs split by task. The options of
    a run (the model, the tasks, the constants, the fractions, ...: every one but
    :data:`COMBINE_OPTIONS`) given other than their defaults would be unused: refused."""
    defaults = vars(build_parser().parse_args(["curve"]))
    given = ["--" + name.replace("_", "-") for name, default in defaults.items()
             if name not in COMBINE_OPTIONS and getattr(args, name, default) != default]
    if given:
        raise common.UsageError(f"--combine runs nothing: {', '.join(given)} would be unused; "
                                f"drop {'it' if len(given) == 1 else 'them'}")

    for path in args.combine:
        if not Path(path).is_file():
            raise common.UsageError(f"--combine: file not found: {path}")
    try:
        result = Curve.combine([Curve.read_csv(path) for path in args.combine])
    except InputError as error:
        raise common.UsageError(f"--combine: {error}") from None
    _write(result, args, outputs)
    return 0


def _write(result: Any, args: argparse.Namespace, outputs: dict[str, Path | None]) -> None:
    """The curve's table, figure, JSON and Table 1, each written atomically, and the table printed."""
    print(result.table.to_string(index=False, float_format=lambda value: f"{value:.4f}"))
    result.to_csv(outputs["csv"], overwrite_read_only=args.force)
    written = [outputs["csv"]]
    if outputs["html"] is not None:
        html = result.figure().to_html(include_plotlyjs=True, full_html=True)
        write_atomic(outputs["html"], html.encode("utf-8"), overwrite_read_only=args.force)
        written.append(outputs["html"])
    if outputs["json"] is not None:
        result.to_json(outputs["json"], overwrite_read_only=args.force)
        written.append(outputs["json"])
    if outputs["table"] is not None:
        table = PapaTable.from_curve(result, unavailable=curve_inputs.missing_tasks(result, args.data_dir))
        write_atomic(outputs["table"], table.table.to_csv(index=False).encode("utf-8"),
                     overwrite_read_only=args.force)
        write_atomic(outputs["markdown"], (table.to_markdown() + "\n").encode("utf-8"),
                     overwrite_read_only=args.force)
        write_atomic(outputs["relative"], (table.to_markdown(relative=True) + "\n").encode("utf-8"),
                     overwrite_read_only=args.force)
        write_atomic(outputs["versus_average"], (table.to_markdown(versus_average=True) + "\n").encode("utf-8"),
                     overwrite_read_only=args.force)
        print(table.frame().to_string())
        written += [outputs["table"], outputs["markdown"], outputs["relative"], outputs["versus_average"]]
    if outputs["constants"] is not None:
        written.append(outputs["constants"])
    print(f"wrote {', '.join(map(str, written))}")
