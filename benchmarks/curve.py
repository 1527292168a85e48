"""Benchmark: the documented PAPA curve, cold: ``attnlens curve`` with the options that rewrite
``docs/papa_curve.csv`` and Table 1, timed.

It runs the command ``docs/probing.md`` gives (:data:`DOCUMENTED`: constants fitted on WikiText-2,
MRPC's on its own training pairs, SST-2, CoLA, MRPC, NER and POS at the paper's five fractions
and the four data-free matrices, 3 probe seeds, train 4,000, the full dev sets, the MLM probe on
400 WikiText-2 paragraphs) in this process, one process, with a fresh feature cache (every
feature pass runs), so it writes ``docs/papa_curve.csv``, ``docs/papa_table.csv`` and
``docs/papa_table.md``. Any further argument is an ``attnlens curve`` option that replaces the
documented one (``--task`` replaces every documented task; ``--out`` and ``--table`` change where
the tables go).

Printed after the command's own output: its wall time (the constants' fits included), the
curve's cold wall time against the forward passes it needs (one plain forward over each task's train and dev examples, in the same compact batches
and to the same stop point as the feature passes, measured in the same run, times the number of
distinct interventions: the curve's floor if probes cost nothing), the feature passes against
that floor, the floor plus the linear baselines alone (what no probe recipe can beat), and each
task's seconds. Written: ``build/bench/curve.json`` (``make bench`` adds its row to the table).

Run: ``HF_HUB_OFFLINE=1 python benchmarks/curve.py [--device cpu] [--threads N] [--cache DIR]
[attnlens curve options]`` (``make bench-curve``; see ``docs/probing.md`` for its time on 2 CPU
cores).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from common import ROOT, record
from realdata import DATA

import attnlens
from attnlens import cli
from attnlens.core.inputs import tokenize
from attnlens.engine.forward import run_patterns
from attnlens.evaluation import tasks as task_module
from attnlens.evaluation.curve import Curve
from attnlens.evaluation.curve_inputs import LM_PARAGRAPHS, TASKS
from attnlens.evaluation.probing.features import by_length

#: ``attnlens curve``'s options that rewrite docs/papa_curve.csv and Table 1 (docs/probing.md).
DOCUMENTED = ["--fit-wikitext", "--data-dir", str(DATA), *(part for task in TASKS for part in ("--task", task)),
              "--baselines", "all", "--lm-wikitext", str(LM_PARAGRAPHS),
              "--out", str(ROOT / "docs" / "papa_curve.csv"), "--table", str(ROOT / "docs" / "papa_table.csv")]
TARGET_MINUTES = 20


def plain_forward(model, texts: list, *, max_len: int, batch_size: int = 32) -> float:
    """Seconds of one forward over ``texts`` in the curve's batches (compact PAPA layout), run
    to the feature passes' stop point (the last block's output) with no hook reading anything."""
    until = f"blocks.{int(model.cfg.n_layers) - 1}.hook_out"
    texts = [texts[index] for index in by_length(model.tokenizer, texts)]  # as the feature passes run them
    start = time.perf_counter()
    for first in range(0, len(texts), batch_size):
        batch = tokenize(model, texts[first : first + batch_size], max_len=max_len, compact=True)
        with torch.inference_mode():
            run_patterns(model, batch, [], until=until)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="torch device (default: attnlens.load's)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--cache", default=None, help="an ATTNLENS_CACHE folder to reuse, kept (default: a fresh "
                        "temporary one, so every feature pass runs, removed at the end)")
    args, options = parser.parse_known_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    documented = DOCUMENTED
    if "--task" in options:  # the tasks given replace the documented ones
        documented = [part for index, part in enumerate(DOCUMENTED)
                      if "--task" not in (part, DOCUMENTED[index - 1])]
    data_dir = options[options.index("--data-dir") + 1] if "--data-dir" in options else DATA
    folder = args.cache or tempfile.mkdtemp(prefix="attnlens-curve-")
    os.environ["ATTNLENS_CACHE"] = folder
    try:
        result = Path(folder) / "curve.json"
        command = ["curve", *documented, *options, "--json", str(result), "--quiet"]
        if args.device:
            command += ["--device", args.device]
        print(f"PAPA curve benchmark: attnlens {' '.join(command)}; {torch.get_num_threads()} torch thread(s), "
              f"{os.cpu_count()} CPUs")
        started = time.perf_counter()
        if cli.main(command) != 0:
            raise SystemExit("attnlens curve failed")
        wall = time.perf_counter() - started
        measured = Curve.from_json(result)
        print(f"COMMAND {wall:.0f} s, the curve {measured.seconds:.0f} s of it (the rest: loading the model and "
              "fitting the constants)")
        report(measured, attnlens.load(device=args.device), data_dir, args)
    finally:
        if not args.cache:  # gigabytes of features
            shutil.rmtree(folder, ignore_errors=True)


def report(curve: Curve, model, data_dir, args: argparse.Namespace) -> None:
    """The curve's seconds against the forward passes it needs, printed and recorded."""
    tasks = list(dict.fromkeys(t["task"] for t in curve.timings))
    settings = curve.settings

    def forward_of(task: str) -> float:
        """One plain forward over the task's examples, as its feature passes run them."""
        train = task_module.load(task, "train", data_dir=data_dir, limit=settings["train_limit"], seed=0)
        dev = task_module.load(task, "dev", data_dir=data_dir, limit=settings["eval_limit"], seed=0)
        return plain_forward(model, train.inputs() + dev.inputs(), max_len=settings["max_len"])

    forward = sum(forward_of(task) for task in tasks)
    interventions = len({(t["task"], t["strategy"], t["fraction"]) for t in curve.timings}) / max(len(tasks), 1)
    needed = forward * interventions  # the floor: every needed forward pass once
    minutes = curve.seconds / 60
    print(f"CURVE {len(tasks)} tasks x {len(settings['fractions'])} fractions + {len(settings['baselines'])} "
          f"baselines x {settings['seeds']} seeds: {minutes:.1f} min (target <= {TARGET_MINUTES} min: "
          f"{'met' if minutes <= TARGET_MINUTES else 'missed'}); feature passes {curve.forward_seconds / 60:.1f} min, "
          f"probe training {curve.probe_seconds / 60:.1f} min ({curve.probe_share:.0%})")
    print(f"COLD wall time {curve.seconds:.0f} s = {curve.seconds / needed:.2f}x the forward passes it needs "
          f"({forward:.1f} s for one plain forward over every task's train + dev examples x "
          f"{interventions:.0f} interventions = {needed:.0f} s)")
    feature_ratio = curve.forward_seconds / needed
    print(f"FEATURE passes {curve.forward_seconds:.0f} s = {feature_ratio:.2f}x the forward passes they need "
          f"(replaced heads {'skip their work' if settings.get('fast') else 'run in full (the hook path)'}); "
          f"with the probes and baselines as trained the floor is {needed + curve.probe_seconds:.0f} s, and the "
          f"curve {curve.seconds / (needed + curve.probe_seconds):.2f}x that")
    baseline_seconds = sum(timing.get("baseline", 0.0) for timing in curve.timings)
    without_probes = needed + baseline_seconds
    print(f"WITHOUT PROBES the forward passes it needs and the linear baselines ({baseline_seconds:.0f} s) take "
          f"{without_probes:.0f} s = {without_probes / 60:.1f} min (target <= {TARGET_MINUTES} min)")
    for task in tasks:
        mine = [timing for timing in curve.timings if timing["task"] == task]
        print(f"  {task}: {sum(t['features'] + t['probe'] + t['baseline'] for t in mine) / 60:.1f} min: features "
              f"{sum(t['features'] for t in mine):.0f} s, probes {sum(t['probe'] for t in mine):.0f} s, linear "
              f"baselines {sum(t['baseline'] for t in mine):.0f} s over {len(mine)} points")
    lm = " + lm" if (curve.table["task"] == "lm").any() else ""
    record("curve" if set(tasks) == set(TASKS) else f"curve-{'-'.join(tasks)}", [{
        "job": f"attnlens curve ({', '.join(tasks)}{lm}; {len(settings['fractions'])} fractions + "
               f"{len(settings['baselines'])} baselines, {settings['seeds']} seeds)",
        "seconds": curve.seconds, "forward_ratio": curve.seconds / needed, "limit_ratio": 1.0,
        "note": f"ratio to the {needed:.0f} s of forward passes it needs; feature passes {feature_ratio:.2f}x "
                f"theirs; probes {curve.probe_share:.0%}; without probes {without_probes / 60:.1f} min; "
                f"target <= {TARGET_MINUTES} min; one process",
    }], train_limit=settings["train_limit"], eval_limit=settings["eval_limit"], seeds=settings["seeds"],
        device=str(args.device or "default"), threads=torch.get_num_threads(), processes=curve.processes)


if __name__ == "__main__":
    main()
