"""Benchmark: ``papa.fit`` throughput in one process against two ``torchrun`` processes (gloo).

Each configuration runs in fresh processes, loads the model, warms up on one batch, waits at a
barrier, then times one whole ``papa.fit`` over the same texts (the engine shards them by rank,
contiguous and batch-aligned, and all-reduces the sums at the end; the all-reduce is timed). Three
configurations on the same machine:

- 1 process, 1 torch thread;
- 1 process, ``--threads`` torch threads (default 2: every core of this machine to one process);
- ``torchrun --nproc_per_node 2``, 1 torch thread per rank (the same cores, split by process).

Printed: examples per second of each, the speed-up of two processes over each one-process run,
and the largest difference between the two-process constants and the one-process ones (equal up
to float64 rounding of the order of additions; the counts exactly). The limit of the speed-up is
the number of processes (2.00x) on a machine with that many free cores; a 2-core machine shared
with anything else gets less.

MiniLM: 256 WikiText-2 validation paragraphs, max_len 128, batch 16.

Run: ``HF_HUB_OFFLINE=1 python benchmarks/distributed.py [--texts 256] [--repeats 3]`` (``make bench``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(args: argparse.Namespace) -> None:
    """One process of a run (alone, or one rank under torchrun): time the fit, rank 0 reports."""
    import torch
    import torch.distributed as dist
    from realdata import wikitext_paragraphs
    from transformers.utils import logging as hf_logging

    import attnlens
    from attnlens import papa

    hf_logging.disable_progress_bar()
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    model = attnlens.load(args.model)
    texts = wikitext_paragraphs()[: args.texts]
    shape = dict(max_len=args.max_len, batch_size=args.batch_size, progress=False)
    _warm_up(model, texts, shape)
    if distributed:
        dist.barrier()
    start = time.perf_counter()
    constants = papa.fit(model, texts, **shape)
    if distributed:
        dist.barrier()
    seconds = time.perf_counter() - start
    rank = dist.get_rank() if distributed else 0
    if rank == 0:
        constants.save(args.out + ".safetensors")
        Path(args.out + ".json").write_text(
            json.dumps({"seconds": seconds, "threads": torch.get_num_threads()}), encoding="utf-8"
        )
    if distributed:
        dist.destroy_process_group()


def _warm_up(model, texts, shape) -> None:
    """One batch's forward to the last pattern, outside the engine (so no collective runs)."""
    import torch

    import attnlens
    from attnlens.core.inputs import default_layout
    from attnlens.engine.forward import run_patterns

    batch = attnlens.tokenize(model, texts[: shape["batch_size"]], max_len=shape["max_len"],
                              layout=default_layout(model))
    with torch.inference_mode():
        run_patterns(model, batch, [])


def launch(args: argparse.Namespace, *, processes: int, threads: int, out: str) -> float:
    """Run one configuration in fresh processes; returns the timed seconds."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    script = [str(Path(__file__).resolve()), "--worker", "--out", out, "--texts", str(args.texts),
              "--max-len", str(args.max_len), "--batch-size", str(args.batch_size)]
    if args.model:
        script += ["--model", args.model]
    if processes == 1:
        command = [sys.executable, *script]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
                   "--standalone", *script]
    subprocess.run(command, env=env, check=True, cwd=ROOT / "benchmarks")
    return json.loads(Path(out + ".json").read_text(encoding="utf-8"))["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    parser.add_argument("--model", default=None, help="default: the embedded MiniLM")
    parser.add_argument("--texts", type=int, default=256, help="WikiText-2 paragraphs")
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the wide one-process run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="cpu only: the runs use gloo on CPU processes")
    args = parser.parse_args()
    if args.device != "cpu":
        raise SystemExit("benchmarks/distributed.py measures CPU processes (gloo); --device cpu only")
    if args.worker:
        worker(args)
        return

    import torch

    from attnlens import papa

    configurations = [("1 process x 1 thread", 1, 1), (f"1 process x {args.threads} threads", 1, args.threads),
                      ("torchrun 2 processes x 1 thread", 2, 1)]
    print(f"distributed papa.fit benchmark: {args.texts} WikiText-2 paragraphs, max_len {args.max_len}, "
          f"batch {args.batch_size}, gloo on localhost, {os.cpu_count()} CPUs; each run in fresh "
          f"processes, median of {args.repeats}")
    times: dict[int, list[float]] = {index: [] for index in range(len(configurations))}
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(args.repeats):
            order = range(len(configurations)) if repeat % 2 == 0 else reversed(range(len(configurations)))
            for index in order:
                _, processes, threads = configurations[index]
                times[index].append(launch(args, processes=processes, threads=threads,
                                           out=os.path.join(folder, f"run{index}")))
        single = papa.PapaConstants.load(os.path.join(folder, "run0.safetensors"))
        double = papa.PapaConstants.load(os.path.join(folder, "run2.safetensors"))
        sums = (double.sums - single.sums).abs().max().item()
        squares = (double.squares - single.squares).abs().max().item()
        counts_equal = torch.equal(double.pair_counts, single.pair_counts)
    medians = {index: statistics.median(values) for index, values in times.items()}
    for index, (label, _, _) in enumerate(configurations):
        runs = ", ".join(f"{t:.2f}" for t in times[index])
        print(f"{label:34s} median {medians[index]:7.2f} s  {args.texts / medians[index]:6.1f} ex/s  (runs {runs})")
    print(f"SPEED-UP 2 processes vs 1 process x 1 thread: {medians[0] / medians[2]:.2f}x; "
          f"vs 1 process x {args.threads} threads: {medians[1] / medians[2]:.2f}x (limit 2.00x with 2 free cores)")
    print(f"2-process constants vs 1-process: max |sums diff| {sums:.1e}, max |square sums diff| {squares:.1e}, "
          f"pair counts {'equal' if counts_equal else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
