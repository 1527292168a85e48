"""Benchmark: the full PAPA curve on MiniLM, on 2 CPU cores, and the probe training time per task.

PAPA constants are fitted on WikiText-2 (validation and test paragraphs, max_len 128, the papa
layout; a pair task's, MRPC's, on its own training pairs: constants are positional, and a pair's
middle [SEP] sits at ``max_len // 2``), then :func:`attnlens.papa.curve` probes SST-2, CoLA, MRPC, NER and POS at the paper's
five fractions of heads replaced (0, 1/2, 7/8, 15/16, 1; heads kept 1, 1/2, 1/8, 1/16, 0) by the
label-free ``input_dependence`` order, with ``train_limit=4000`` and the full dev sets, 3 probe
seeds per point, plus the data-free baselines replacing every head (identity, Toeplitz, zeros and
uniform; ``--baselines``) unless ``--no-baselines``. Every score has its linear and majority
baselines, its 95% bootstrap interval and a paired test against no head replaced. The feature
cache starts empty (a fresh folder), so every feature pass runs.

Printed: the fit time, the curve's cold wall time against the 20-minute target and against the
forward passes it needs (the time of one plain forward over each task's train and dev examples,
in the same compact PAPA batches and to the same stop point as the feature passes, measured in
the same run, times the number of distinct interventions: the curve's floor if probes cost
nothing), the share spent in feature passes (forward) and in probe training, the feature passes
against that floor and the curve against the floor plus its probes' training (what no schedule of
the same passes and probes can beat; the replaced heads skip their query, key, ``QKᵀ`` and softmax,
``papa.curve``'s ``fast`` on an encoder, so the feature passes may come in under it), the floor
plus the linear baselines alone (what no probe
recipe can beat: the time before any probe is trained), the probe training
time per task (at fraction 0, on cached features), and the table. Written: ``docs/papa_curve.csv`` (the table the docs show; ``--out`` to change)
and, read from the same curve (:meth:`attnlens.papa.PapaTable.from_curve`), PAPA's Table 1 as
``docs/papa_table.csv`` and ``docs/papa_table.md`` (beside ``--out``).

Two processes share the work by default (``--processes 2``: the script runs itself again under
``torchrun``, gloo, one torch thread per rank, one cache folder): ``papa.fit`` shards its corpus,
and :func:`attnlens.papa.curve` gives each rank a point at a time: every task's first point (no
head replaced), the costliest task first (``CLAIM_ORDER``), then the later points' feature
passes (they need nothing, so a rank does them while the first points train), then the later
points, each once its task's first point is done, a rank that finishes taking the next one.
The forward passes it needs are then divided by the number of processes (their floor, if the
points split evenly); probe training's share is of the time of all processes.
``--processes 1`` runs one process of ``--threads``.

Printed last: what more processes could reach (``SCHEDULE``), from this run's own seconds per
point: with ``k`` processes no schedule takes less than the larger of the processes' seconds
divided by ``k`` and the longest chain of work that must run in order (a task's first point,
then the probes and linear baseline of its longest later point); beside it the same bound when
each task ran whole on one process, as attnlens did before. Bounds, not measurements: they assume every process as fast as these.

Run: ``HF_HUB_OFFLINE=1 python benchmarks/curve.py [--device cpu] [--processes 2]``
(``make bench-curve``; see ``docs/probing.md`` for its time on 2 CPU cores). Tasks are
independent, so the run may also be split by hand, one process per task (``--tasks sst2 --lm 0
--out sst2.csv`` ...), and the tables joined afterwards with ``--combine sst2.csv cola.csv ...``
(the same table and Table 1 as one run; the cold time is then the sum of the runs').
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from common import record
from realdata import DATA

import attnlens
from attnlens import papa
from attnlens import tasks as task_module
from attnlens.engine.distributed import world
from attnlens.engine.forward import run_patterns
from attnlens.evaluation.curve import DATA_FREE, SEEDS
from attnlens.files import write_atomic
from attnlens.probing.features import by_length

TASKS = ("sst2", "cola", "mrpc", "ner", "pos")
#: The order the tasks are given to papa.curve: the costliest first, since ranks claim the next
#: point when they finish one (every task's first point, then the later points' features and then
#: the later points, task by task; measured: POS and NER are the longest, SST-2 the shortest), but
#: NER after MRPC: NER reads POS's sentences, so by the time NER's feature jobs come POS's have
#: written those files (run side by side, one rank would wait on the other's lock for every point).
CLAIM_ORDER = ("pos", "mrpc", "ner", "cola", "sst2")
TARGET_MINUTES = 20


def paragraphs() -> list[str]:
    texts = []
    for name in ("valid.txt", "test.txt"):
        lines = (DATA / "wikitext2" / name).read_text(encoding="utf-8").splitlines()
        texts += [line.strip() for line in lines if line.strip() and not line.strip().startswith("=")]
    return texts


def lm_paragraphs(n: int) -> list[str]:
    """The first ``n`` paragraphs of WikiText-2 test longer than 20 words (PAPA's MLM probe reads
    WikiText; its head trains on the first four fifths and is scored on the last fifth)."""
    lines = (DATA / "wikitext2" / "test.txt").read_text(encoding="utf-8").splitlines()
    texts = [line.strip() for line in lines if len(line.split()) > 20 and not line.strip().startswith("=")]
    return texts[:n]


def plain_forward(model, texts: list, *, max_len: int, batch_size: int = 32) -> float:
    """Seconds of one forward over ``texts`` in the curve's batches (compact PAPA layout), run
    to the feature passes' stop point (the last block's output) with no hook reading anything."""
    until = f"blocks.{int(model.cfg.n_layers) - 1}.hook_out"
    order = by_length(model.tokenizer, texts)  # as probing.extract runs them
    texts = [texts[index] for index in order]
    start = time.perf_counter()
    for first in range(0, len(texts), batch_size):
        batch = attnlens.tokenize(model, texts[first : first + batch_size], max_len=max_len, compact=True)
        with torch.inference_mode():
            run_patterns(model, batch, [], until=until)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--train-limit", type=int, default=4000)
    parser.add_argument("--eval-limit", type=int, default=None)
    parser.add_argument("--no-baselines", action="store_true")
    parser.add_argument("--baselines", default=",".join(DATA_FREE), help="data-free matrices replacing every head")
    parser.add_argument("--seeds", type=int, default=SEEDS, help="probe seeds per point")
    parser.add_argument("--lm", type=int, default=400,
                        help="also PAPA's MLM probe at every point, on this many WikiText-2 test paragraphs (0: none)")
    parser.add_argument("--cache", default=None,
                        help="an existing ATTNLENS_CACHE folder to reuse, kept (default: a fresh temporary one, so every feature pass runs, removed at the end)")
    parser.add_argument("--constants", default=None,
                        help="a constants file: read when it exists (no fit), else fitted and written there")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs" / "papa_curve.csv"))
    parser.add_argument("--device", default=None, help="torch device (default: attnlens.load's)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--combine", nargs="+", default=None, metavar="CSV",
                        help="join the tables of runs split by task into --out and Table 1 (runs nothing)")
    parser.add_argument("--processes", type=int, default=2,
                        help="processes sharing the points (torchrun, gloo, 1 torch thread each; default 2: "
                             "the cores of the target machine); 1: one process of --threads threads")
    args = parser.parse_args()
    if args.combine:
        combine([Path(path) for path in args.combine], Path(args.out))
        return
    if args.processes > 1 and "WORLD_SIZE" not in os.environ:
        raise SystemExit(launch(args.processes))
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    rank = world().rank
    if rank:  # one report, from rank 0
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process
    if args.threads:
        torch.set_num_threads(args.threads)
    # one cache folder for every rank: NER and POS read the same sentences, so the same features
    folder = [args.cache or (tempfile.mkdtemp(prefix="attnlens-curve-") if rank == 0 else None)]
    if rank == 0 and not args.cache:  # about 5 GB of features: removed when rank 0 is done (the others are then)
        atexit.register(shutil.rmtree, folder[0], ignore_errors=True)
    if world().distributed:
        dist.broadcast_object_list(folder, src=0)
    os.environ["ATTNLENS_CACHE"] = folder[0]
    model = attnlens.load(device=args.device)
    texts = paragraphs()
    print(f"PAPA curve benchmark: {attnlens.loading.model_id(model)}, {world().size} process(es) of "
          f"{torch.get_num_threads()} torch thread(s), {os.cpu_count()} CPUs; constants from {len(texts)} "
          f"WikiText-2 paragraphs")
    start = time.perf_counter()
    if args.constants and Path(args.constants).exists():
        constants = papa.PapaConstants.load(args.constants)
        print(f"papa constants read from {args.constants} (not timed: the curve alone)")
    else:
        constants = papa.fit(model, texts, max_len=128, progress=False)
        print(f"papa.fit: {time.perf_counter() - start:.1f} s")
        if args.constants and rank == 0:
            constants.save(args.constants)
    tasks = sorted((task for task in args.tasks.split(",") if task),
                   key=lambda task: CLAIM_ORDER.index(task) if task in CLAIM_ORDER else -1)
    # constants are positional: a pair task gets constants fitted on its own training pairs
    # (PAPA §4 fits every task's on its training inputs); the others share WikiText-2's
    by_task: dict = {task: constants for task in tasks}
    by_task["lm"] = constants
    for task in tasks:
        train = task_module.load(task, "train", data_dir=DATA, limit=args.train_limit, seed=0)
        if train.kind != "pair":
            continue
        path = Path(args.constants).with_name(f"{Path(args.constants).stem}-{task}.safetensors") if args.constants else None
        if path is not None and path.exists():
            by_task[task] = papa.PapaConstants.load(path)
        else:
            start = time.perf_counter()
            by_task[task] = papa.fit(model, train.inputs(), max_len=128, progress=False)
            print(f"papa.fit on {task}'s {len(train)} training pairs: {time.perf_counter() - start:.1f} s")
            if path is not None and rank == 0:
                by_task[task].save(path)
    baselines = () if args.no_baselines else tuple(name for name in args.baselines.split(",") if name)
    curve = papa.curve(model, by_task, tasks, data_dir=DATA, train_limit=args.train_limit,
                       eval_limit=args.eval_limit, baselines=baselines, seeds=args.seeds,
                       lm_texts=lm_paragraphs(args.lm) if args.lm else None, progress=False)
    minutes = curve.seconds / 60

    def forward_of(task: str) -> float:
        """One plain forward over the task's examples, as its feature passes run them."""
        train = task_module.load(task, "train", data_dir=DATA, limit=args.train_limit, seed=0)
        dev = task_module.load(task, "dev", data_dir=DATA, limit=args.eval_limit, seed=0)
        return plain_forward(model, train.inputs() + dev.inputs(), max_len=constants.max_len)

    forward = sum(forward_of(task) for task in tasks)
    interventions = len({(t["task"], t["strategy"], t["fraction"]) for t in curve.timings}) / max(len(tasks), 1)
    # the floor: every needed forward pass once, spread evenly over the processes
    needed = forward * interventions / curve.processes
    print(f"CURVE {len(tasks)} tasks x {len(curve.settings['fractions'])} fractions"
          f"{f' + {len(baselines)} baselines' if baselines else ''} x {args.seeds} seeds: {minutes:.1f} min (target <= {TARGET_MINUTES} min: "
          f"{'met' if minutes <= TARGET_MINUTES else 'missed'}); feature passes {curve.forward_seconds / 60:.1f} min "
          f"({curve.forward_seconds / (curve.seconds * curve.processes):.0%} of the processes' time), probe training "
          f"{curve.probe_seconds / 60:.1f} min ({curve.probe_share:.0%})")
    print(f"COLD wall time {curve.seconds:.0f} s = {curve.seconds / needed:.2f}x the forward passes it needs "
          f"({forward:.1f} s for one plain forward over every task's train + dev examples x "
          f"{interventions:.0f} interventions / {curve.processes} process(es) = {needed:.0f} s)")
    # what is left above the floor: the feature passes' own excess, and the probe recipe's time
    feature_ratio = curve.forward_seconds / (forward * interventions)
    with_probes = needed + curve.probe_seconds / curve.processes
    skipping = "skip their work" if curve.settings.get("fast") else "run in full (the hook path)"
    print(f"FEATURE passes {curve.forward_seconds:.0f} s = {feature_ratio:.2f}x the forward passes they need "
          f"(replaced heads {skipping}); "
          f"with the probes and baselines as trained ({curve.probe_seconds:.0f} s over {curve.processes} "
          f"process(es)) the floor is {with_probes:.0f} s, and the curve {curve.seconds / with_probes:.2f}x that")
    # what no probe recipe can undercut: the forward passes and the linear baselines the
    # Standards ask beside every score, with no probe trained at all
    baseline_seconds = sum(timing.get("baseline", 0.0) for timing in curve.timings)
    without_probes = needed + baseline_seconds / curve.processes
    print(f"WITHOUT PROBES the forward passes it needs and the linear baselines ({baseline_seconds:.0f} s over "
          f"{curve.processes} process(es)) take {without_probes:.0f} s = {without_probes / 60:.1f} min "
          f"(target <= {TARGET_MINUTES} min)")
    for task in tasks:  # each task's own seconds (on the rank that ran it)
        mine = [timing for timing in curve.timings if timing["task"] == task]
        print(f"  {task}: {sum(t['features'] + t['probe'] + t['baseline'] for t in mine) / 60:.1f} min: features "
              f"{sum(t['features'] for t in mine):.0f} s, probes {sum(t['probe'] for t in mine):.0f} s, linear "
              f"baselines {sum(t['baseline'] for t in mine):.0f} s over {len(mine)} points, run by rank(s) "
              f"{', '.join(map(str, sorted({t.get('rank', 0) for t in mine})))} (features: "
              f"{', '.join(map(str, sorted({t.get('features_rank', 0) for t in mine})))})")
    print_schedule(curve, tasks)
    if rank:
        return
    name = "curve" if set(tasks) == set(TASKS) else f"curve-{'-'.join(tasks)}"
    record(name, [{
        "job": f"papa.curve ({', '.join(tasks)}{' + lm' if args.lm else ''}; {len(curve.settings['fractions'])} "
               f"fractions + {len(baselines)} baselines, {args.seeds} seeds)",
        "seconds": curve.seconds, "forward_ratio": curve.seconds / needed, "limit_ratio": 1.0,
        "note": f"ratio to the {needed:.0f} s of forward passes it needs; feature passes {feature_ratio:.2f}x "
                f"theirs; probes {curve.probe_share:.0%}; without probes {without_probes / 60:.1f} min; "
                f"target <= {TARGET_MINUTES} min",
    }], train_limit=args.train_limit, eval_limit=args.eval_limit, seeds=args.seeds, lm=args.lm,
        device=str(args.device or "default"), threads=torch.get_num_threads(), processes=curve.processes)
    for timing in curve.timings:
        if timing["fraction"] == 0.0:
            print(f"  {timing['task']}: features {timing['features']:.1f} s (train + dev, forward), "
                  f"probe training + prediction {timing['probe']:.1f} s")
    # the table in the usual order of the tasks (they ran in CLAIM_ORDER), the LM last
    shown = [*TASKS, *(task for task in tasks if task not in TASKS), "lm"]
    curve.table = curve.table.sort_values("task", key=lambda column: column.map(shown.index), kind="stable",
                                          ignore_index=True)
    print(curve.table.to_string(index=False, float_format=lambda value: f"{value:.4f}"))
    curve.to_csv(args.out)
    print(f"wrote {args.out}")
    if baselines:
        write_table(curve, Path(args.out))


def print_schedule(curve: papa.Curve, tasks: list[str], processes: tuple[int, ...] = (2, 4, 8, 16)) -> None:
    """Lower bounds on the curve's wall time with more processes, from this run's seconds per
    point (features, probes and linear baselines; the LM's points share its seconds evenly):
    sharing points, a task's first point and then the training of its longest later point must
    run in order (a later point's features are extracted while the first point trains); sharing
    whole tasks, the longest task does."""
    mine = {task: [t for t in curve.timings if t["task"] == task] for task in tasks}
    cost = {task: [t["features"] + t["probe"] + t["baseline"] for t in points] for task, points in mine.items()}
    lm_seconds = max(curve.forward_seconds - sum(t["features"] for t in curve.timings), 0.0)
    total = sum(map(sum, cost.values())) + lm_seconds
    chain = max([seconds[0] + max((t["probe"] + t["baseline"] for t in mine[task][1:]), default=0.0)
                 for task, seconds in cost.items() if seconds] + [0.0])
    whole = max([sum(seconds) for seconds in cost.values()] + [lm_seconds])
    bounds = ", ".join(f"{k}: {max(total / k, chain) / 60:.1f} min ({max(total / k, whole) / 60:.1f})"
                       for k in processes)
    print(f"SCHEDULE {total / 60:.1f} process-minutes; the longest chain of points {chain / 60:.1f} min, the "
          f"longest task {whole / 60:.1f} min. No schedule of this run's points is shorter than, with k "
          f"processes as fast as these (whole tasks a process in brackets): {bounds}")


def launch(processes: int) -> int:
    """Run this script again under ``torchrun`` with ``processes`` ranks on this machine (gloo,
    one torch thread each: torchrun's default); its exit status."""
    # --standalone: the rendezvous store binds a free port itself (no port chosen here and
    # bound later, which another process could take in between)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
               str(processes), *sys.argv]
    return subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}).returncode


def write_table(curve: papa.Curve, out: Path) -> None:
    """PAPA's Table 1 read from ``curve``, as ``papa_table.csv`` and ``.md`` beside ``out``."""
    table = papa.PapaTable.from_curve(curve)
    out = out.with_name("papa_table.csv")
    write_atomic(out, table.table.to_csv(index=False).encode("utf-8"))
    write_atomic(out.with_suffix(".md"), (table.to_markdown() + "\n").encode("utf-8"))
    print(table.frame().to_string())
    print(table.frame(relative=True).to_string())
    print(f"wrote {out} and {out.with_suffix('.md')}")


def combine(paths: list[Path], out: Path) -> None:
    """One curve table (``out``) and Table 1 from the tables of runs split by task (each task's
    rows are independent of the others': its own probes, its own relative scores)."""
    import pandas as pd

    tables = [pd.read_csv(path) for path in paths]
    joined = pd.concat(tables, ignore_index=True)
    tasks = list(joined["task"])
    repeated = sorted({task for task in tasks if sum(task in set(t["task"]) for t in tables) > 1})
    if repeated:
        raise SystemExit(f"--combine: task {repeated[0]!r} is in more than one table; give each task once.")
    strategy = str(joined["strategy"].iloc[0])  # every run's first row: fraction 0 of its strategy
    curve = papa.Curve(joined, settings={"strategy": strategy})
    curve.to_csv(out)
    print(f"wrote {out} ({len(joined)} rows: {', '.join(dict.fromkeys(tasks))})")
    if (joined["strategy"] != strategy).any():
        write_table(curve, out)


if __name__ == "__main__":
    main()
