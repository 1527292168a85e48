"""``attnlens curve``: the PAPA curve: task scores as heads are replaced; write CSV, HTML and Table 1.

With the options ``docs/probing.md`` gives, it rewrites ``docs/papa_curve.csv`` and PAPA's Table 1
(``docs/papa_table.csv`` and ``.md``): constants fitted on WikiText-2 (``--fit-wikitext``), each
task's of the other kind fitted on its own training inputs
(:func:`attnlens.evaluation.curve_inputs.constants_by_task`: MRPC's on its pairs), every data-free
baseline and PAPA's MLM probe (``--lm-wikitext``), in one process. ``--combine`` joins the CSVs
of runs split by task (:meth:`attnlens.evaluation.curve.Curve.combine`).
"""

from __future__ import annotations

import argparse
from typing import Any

from attnlens.cli import options


def add(commands: Any) -> None:
    """The ``curve`` command and its options."""
    parser = commands.add_parser(
        "curve", help="the PAPA curve: task scores as heads are replaced; write CSV, HTML and Table 1",
        description="Probe tasks with a growing share of heads replaced by PAPA constants "
        "(Hassid et al. 2022) and write the table (CSV), its figure (HTML) and, with --table, "
        "PAPA's Table 1 read from the same curve.",
    )
    options.model_options(parser)
    constants = parser.add_mutually_exclusive_group()
    constants.add_argument("--constants", default=None, help="PAPA constants from 'attnlens fit-papa'")
    constants.add_argument(
        "--fit-wikitext", action="store_true",
        help="fit the constants here on WikiText-2's validation paragraphs "
        "(--data-dir/wikitext2/valid.txt, disjoint from the LM's test paragraphs; headings dropped; max_len 128; "
        "--batch-size texts per forward pass)",
    )
    parser.add_argument("--save-constants", default=None, metavar="FILE",
                        help="with --fit-wikitext: also save the constants there (.safetensors)")
    parser.add_argument(
        "--fractions", default="0,0.5,0.875,0.9375,1",
        help="replaced shares of heads, comma-separated (default: the paper's 0,0.5,0.875,0.9375,1)",
    )
    parser.add_argument(
        "--strategy", default="input_dependence",
        help="order in which heads are replaced (a papa.select_heads strategy; default input_dependence)",
    )
    parser.add_argument(
        "--baselines", default="identity,toeplitz,zeros",
        help="matrices replacing every head, comma-separated: data-free (identity, toeplitz, zeros, uniform) "
        "or trained with the task's labels (toeplitz_init, average_init); 'all' (all six: Table 1's rows) "
        "or 'none' (default identity,toeplitz,zeros)",
    )
    parser.add_argument(
        "--lm-wikitext", type=options.positive, default=None, metavar="N",
        help="also score the language model (PAPA's MLM probe on an encoder) on the first N WikiText-2 "
        "test paragraphs of more than 20 words (--data-dir/wikitext2/test.txt)",
    )
    parser.add_argument("--out", default="curve.html",
                        help="HTML figure to write, the CSV beside it; or a .csv file: the table alone")
    parser.add_argument("--table", default=None, metavar="CSV",
                        help="also PAPA's Table 1, read from the same curve: this CSV and its Markdown "
                        "beside it, its relative view (_relative.md) and its baselines against average (_versus_average.md) (needs fraction 1 and, for its rows, --baselines all)")
    parser.add_argument("--json", default=None, metavar="FILE",
                        help="also the whole curve (table, seconds, timings, settings) as JSON")
    parser.add_argument(
        "--checkpoint", default=None, metavar="FOLDER",
        help="a folder for the finished points: run the same command again to resume an interrupted curve",
    )
    parser.add_argument(
        "--combine", nargs="+", default=None, metavar="CSV",
        help="run nothing: join the CSVs of runs split by task (each one's --out FILE.csv) into --out "
        "and --table",
    )
    options.probe_options(parser, required=False)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """``attnlens curve`` with the parsed ``args``: :func:`attnlens.cli.jobs.curve.run`, imported
    here, as the command runs (it imports torch); returns the exit status."""
    from attnlens.cli.jobs import curve

    return curve.run(args)
