"""Measurement: the rule that chooses the probe's epochs, judged on examples held out from train.

``probing.run`` chooses a probe's epochs by default (``select_epochs=True``,
:func:`attnlens.evaluation.probing.choose_epochs`: Table 3's epochs the floor, three times them
the ceiling, stop after 3 epochs without a better held-out score). The rule itself was set from
dev scores. This script judges it without reading any dev set, on the split of
``benchmarks/probe_choices.py`` (the curve's training examples and features, 80% to fit, 20%
held out, seed 0):

- ``table3``: the probe trains on the fit part for exactly Table 3's epochs;
- ``chosen``: the rule chooses the epochs on the fit part alone (its own held-out tenth of it),
  then the probe trains on the whole fit part for that many epochs;

each for seeds 0-2 (one stacked model, :func:`attnlens.evaluation.probing.fit_many`), the
probe of ``PapaProbe()``'s defaults, scored on the held-out part with the task's metric, with
the paired bootstrap of ``chosen − table3`` (the held-out examples and the seeds).

**The decision rule (fixed before any of these numbers was seen).** The rule *helps* on a task
when the paired 95% interval of ``chosen − table3`` lies above 0, and *hurts* when it lies below.
``select_epochs=True`` stays the default only if the rule helps on more tasks than it hurts;
otherwise the default becomes Table 3's epochs (``select_epochs=False``), the paper's recipe.

Written (atomically): ``docs/epoch_choice.csv`` and ``docs/epoch_choice.md``. The dev sets are
never loaded.

Run: ``OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 python benchmarks/epoch_choice.py [--tasks sst2,cola]``.
"""

from __future__ import annotations

import argparse
import inspect
import time
from pathlib import Path

import numpy as np
import pandas as pd
from common import add_arguments, setup
from probe_choices import RESAMPLES, SEEDS, split
from realdata import DATA

import attnlens
from attnlens.core.files import write_atomic
from attnlens.core.inputs import default_layout
from attnlens.evaluation import probing, tasks
from attnlens.evaluation.probing import PapaProbe, choose_epochs, extract, fit_many, recipe
from attnlens.evaluation.probing.intervals import paired

TASKS = ("sst2", "cola", "mrpc", "ner", "pos")
OUT = Path(__file__).resolve().parents[1] / "docs" / "epoch_choice.csv"


def measure(model, task_name: str, train_limit: int, max_len: int, layout: str) -> dict:
    """The two rules' held-out runs on ``task_name``: one row of the CSV."""
    started = time.perf_counter()
    train = tasks.load(task_name, "train", data_dir=DATA, limit=train_limit, seed=0)
    features = extract(model, train.inputs(), hooks=(), max_len=max_len, layout=layout,
                       description=f"{task_name} train", progress=False)
    fit, held = split(len(train))
    labels = train.labels()
    fit_features, held_features = features.subset(fit.tolist()), features.subset(held.tolist())
    fit_labels = [labels[i] for i in fit]
    fit_task, held_task = train.select(fit.tolist()), train.select(held.tolist())
    settings = recipe(task_name).probe_settings()

    def scorer(indices, predicted):  # the rule's own held-out tenth, inside the fit part
        return fit_task.select(indices.tolist()).score(predicted)

    epochs, validation = choose_epochs(fit_features, fit_labels, {**settings, "seed": SEEDS[0]}, task=train.name,
                                       scorer=scorer)
    runs = {}
    for rule, count in (("table3", settings["epochs"]), ("chosen", epochs)):
        probes = [PapaProbe(**{**settings, "epochs": count, "seed": seed}) for seed in SEEDS]
        fitted = fit_many(probes, fit_features, fit_labels, task=train.name, label_names=train.label_names)
        runs[rule] = [probe.predict(held_features) for probe in fitted]
    versus = paired(held_task, runs["table3"], runs["chosen"], runs=True, resamples=RESAMPLES, seed=0)
    scores = {rule: [held_task.score(one) for one in found] for rule, found in runs.items()}
    return dict(task=task_name, metric=held_task.metric, n_fit=len(fit), n_held_out=len(held),
                table3_epochs=settings["epochs"], chosen_epochs=epochs,
                table3=float(np.mean(scores["table3"])), chosen=float(np.mean(scores["chosen"])),
                versus=versus.difference, versus_low=versus.low, versus_high=versus.high, versus_p=versus.p_value,
                seconds=time.perf_counter() - started)


def decide(rows: list[dict]) -> list[str]:
    """The rule of the module docstring, as the lines that say what it decided."""
    helps = [row["task"] for row in rows if row["versus_low"] > 0]
    hurts = [row["task"] for row in rows if row["versus_high"] < 0]
    keep = len(helps) > len(hurts)
    current = "chosen epochs" if _default_selects() else "Table 3's epochs"
    decision = "keep choosing the epochs" if keep else "train Table 3's epochs"
    return [f"The rule helps on {', '.join(helps) or 'no task'} and hurts on {', '.join(hurts) or 'no task'} "
            f"(paired 95% intervals of chosen − Table 3 above / below 0).",
            f"Decided: {decision} (select_epochs={keep}); probing.run's default is now {current}."]


def _default_selects() -> bool:
    return bool(inspect.signature(probing.run).parameters["select_epochs"].default)


def markdown(rows: list[dict], lines: list[str]) -> str:
    header = ("| task | metric | Table 3's epochs: held-out score | chosen epochs: held-out score | "
              "chosen − Table 3 [paired 95%] |\n|---|---|---|---|---|")
    body = [f"| {row['task']} | {row['metric']} | {row['table3_epochs']}: {row['table3']:.3f} | "
            f"{row['chosen_epochs']}: {row['chosen']:.3f} | {row['versus']:+.3f} [{row['versus_low']:+.3f}, "
            f"{row['versus_high']:+.3f}] |" for row in rows]
    return "\n".join([header, *body, "", *lines]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--train-limit", type=int, default=4000)
    parser.add_argument("--max-len", type=int, default=128, help="the documented curve's (default 128)")
    parser.add_argument("--out", default=str(OUT))
    add_arguments(parser)
    args = parser.parse_args()
    setup(args)
    model = attnlens.load(device=args.device)
    layout = default_layout(model)
    rows = []
    for task_name in args.tasks.split(","):
        rows.append(measure(model, task_name, args.train_limit, args.max_len, layout))
        print(f"{task_name}: {rows[-1]['seconds']:.0f} s", flush=True)
    lines = decide(rows)
    out = Path(args.out)
    write_atomic(out, pd.DataFrame(rows).to_csv(index=False).encode("utf-8"))
    text = markdown(rows, lines)
    write_atomic(out.with_suffix(".md"), text.encode("utf-8"))
    print(text)
    print(f"wrote {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
