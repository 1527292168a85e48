"""Measurement: does attnlens's default probe match its linear baseline on MiniLM's features?

For each task (SST-2, CoLA, MRPC, NER, POS), with standard attention, ``train_limit`` training
examples (default 4,000, a seeded subset) and the full dev set, at the task's Table 3 max length
(PAPA, Hassid et al. 2022, Appendix B), this prints and writes (``docs/probe_baselines.csv``,
and its Markdown beside it):

- ``probe``: attnlens's default probe (:func:`attnlens.evaluation.probing.run`: Table 3's learning rate
  and batch size, its epochs as the floor of the epochs chosen on a held-out tenth of the
  training examples, :func:`attnlens.evaluation.probing.choose_epochs`; ``PapaProbe``'s default
  pooling and inputs: the paper's since 2026-11-28, ``benchmarks/probe_choices.py``; the stored
  ``docs/probe_baselines.csv`` was made with mean pooling and standardised inputs), the mean over ``--seeds`` seeds, with its 95% bootstrap interval over the dev
  examples, and the epochs chosen;
- ``paper_probe``: the paper's probe exactly (``pooling="sum"``, ``standardize=False``, Table 3's
  epochs: ``select_epochs=False``), same seeds;
- ``linear``: the linear baseline (:class:`attnlens.evaluation.probing.LinearBaseline`, logistic regression
  on standardised mean-pooled features, ``C`` chosen on 20% of the training examples);
- ``majority``: always the most frequent training label;
- ``probe − linear``: the paired bootstrap interval of the difference (same resamples), its
  equivalence test (TOST, :meth:`attnlens.evaluation.probing.intervals.Paired.equivalent`, the
  margin ``attnlens.evaluation.conventions.EQUIVALENCE_MARGIN`` of the linear baseline's score),
  and the verdict: ``beats`` (interval above 0), ``below`` (under 0), ``equivalent`` (TOST
  passed) or ``not resolved`` (neither: a difference of the margin's size is still possible).
  The stored ``docs/probe_baselines.csv`` predates the equivalence test: where its interval
  holds 0 it says ``no difference shown``, and ``equivalent`` where its 95% interval already
  lies inside the margin (then the TOST's 90% one does too).

Features come from the cache (``$ATTNLENS_CACHE``) when present; the first run extracts them.

Run: ``HF_HUB_OFFLINE=1 python benchmarks/probe_baselines.py [--tasks sst2,cola] [--seeds 3]``.
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

from common import add_arguments, setup
from realdata import DATA

import attnlens
from attnlens.core.files import write_atomic
from attnlens.evaluation import conventions, probing

TASKS = ("sst2", "cola", "mrpc", "ner", "pos")
OUT = Path(__file__).resolve().parents[1] / "docs" / "probe_baselines.csv"


def _cell(interval) -> str:
    return f"{interval.score:.3f} [{interval.low:.3f}, {interval.high:.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--train-limit", type=int, default=4000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--no-paper-probe", action="store_true", help="skip the paper's exact probe")
    parser.add_argument("--out", default=str(OUT))
    add_arguments(parser)
    args = parser.parse_args()
    setup(args)
    model = attnlens.load(device=args.device)
    rows, lines = [], []
    for task in args.tasks.split(","):
        started = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", probing.ProbeWarning)  # the table shows the baselines
            result = probing.run(model, task, data_dir=DATA, train_limit=args.train_limit,
                                 seeds=args.seeds, progress=False)
            paper = None if args.no_paper_probe else probing.run(
                model, task, data_dir=DATA, train_limit=args.train_limit, seeds=args.seeds,
                progress=False, baseline=False, select_epochs=False,
                probe=dict(pooling="sum", standardize=False))
        versus = result.versus_baseline
        equivalent = versus.equivalent(conventions.EQUIVALENCE_MARGIN * abs(result.baseline))
        verdict = ("beats" if versus.low > 0 else "below" if versus.high < 0
                   else "equivalent" if equivalent else "not resolved")
        row = dict(
            task=task, metric=result.metric, n_train=result.n_train, n_eval=result.n_eval,
            max_len=result.settings["max_len"], seeds=len(result.scores),
            probe=result.score, probe_low=result.interval.low, probe_high=result.interval.high,
            probe_seed_std=result.seed_std, epochs=result.settings["epochs_chosen"],
            paper_probe=paper.score if paper else float("nan"),
            paper_probe_low=paper.interval.low if paper else float("nan"),
            paper_probe_high=paper.interval.high if paper else float("nan"),
            linear=result.baseline, linear_low=result.baseline_interval.low,
            linear_high=result.baseline_interval.high, linear_C=result.settings["baseline_C"],
            majority=result.majority, majority_low=result.majority_interval.low,
            majority_high=result.majority_interval.high,
            difference=versus.difference, difference_low=versus.low, difference_high=versus.high,
            tost_low=versus.tost_low, tost_high=versus.tost_high,
            verdict=verdict, seconds=time.perf_counter() - started,
        )
        rows.append(row)
        lines.append(
            f"| {task} | {result.metric} | {_cell(result.interval)} ± {result.seed_std:.3f} | "
            f"{result.settings['epochs_chosen']} | "
            + (f"{_cell(paper.interval)} | " if paper else "– | ")
            + f"{_cell(result.baseline_interval)} | {_cell(result.majority_interval)} | "
            f"{versus.difference:+.3f} [{versus.low:+.3f}, {versus.high:+.3f}] {verdict} |"
        )
        print(lines[-1], f"({row['seconds']:.0f} s)", flush=True)
    import pandas as pd

    header = ("| task | metric | probe (seed mean) [95%] ± seed std | epochs | paper's probe | linear baseline | "
              "majority | probe − linear [paired 95%] |\n|---|---|---|---|---|---|---|---|")
    out = Path(args.out)
    write_atomic(out, pd.DataFrame(rows).to_csv(index=False).encode("utf-8"))
    write_atomic(out.with_suffix(".md"), ("\n".join([header, *lines]) + "\n").encode("utf-8"))
    print(header)
    print("\n".join(lines))
    print(f"wrote {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
