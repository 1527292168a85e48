"""Benchmark: a sequence probe's fits in a fresh process with no pass before them, under glibc's
allocator defaults against the thresholds attnlens sets (``attnlens.core.memory``).

Features read from the cache reach :meth:`attnlens.evaluation.probing.PapaProbe.fit` with no pass run
first, and a pass used to be the only place that set glibc's mmap and trim thresholds. Every
step of a sequence probe makes and frees float32 copies of its examples' vectors (16 MRPC pairs:
about 800 tokens of 7 x 384, 8.6 MB each), and under the defaults the kernel faults their pages
in again. This runs the same fits in two fresh interpreters side by side (so that both meet the
machine in the same state; give each its own core: ``--threads 1`` on 2 cores), one with
``ATTNLENS_REUSE_MEMORY=0`` (glibc's defaults) and one as attnlens runs (the fit sets the
thresholds itself), on random features of MRPC's shape (4,000 pairs of 25 to 75 kept tokens,
float16; the work does not depend on the values) with MRPC's Table 3 recipe (batch 16, lr 2e-5),
one epoch a fit, and prints each fit's seconds and minor page faults, then the ratios: the first
fit (the heap grows in both) and the median of the later ones.

Results are the same bit for bit (the allocator only chooses addresses): the benchmark checks
that both processes' probes have the same weights (a SHA-256 of their bytes).

Run: ``python benchmarks/probe_memory.py [--fits 4] [--threads 1]`` (``make bench``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from common import add_arguments, mrpc_features, setup

EXAMPLES = 4000


def child(args: argparse.Namespace) -> None:
    """One process's fits: prints one JSON line of seconds, faults and a hash of the weights per fit."""
    import hashlib
    import resource
    import time

    import torch

    from attnlens.evaluation.probing import TABLE3, PapaProbe

    if args.threads:
        torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    features = mrpc_features(EXAMPLES, generator, args.device)
    labels = torch.randint(0, 2, (EXAMPLES,), generator=generator).tolist()
    recipe = TABLE3["mrpc"]
    fits = []
    for seed in range(args.fits):
        before, started = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        probe = PapaProbe(epochs=1, batch_size=recipe.batch_size, lr=recipe.lr, seed=seed, progress=False)
        probe.fit(features, labels)
        seconds = time.perf_counter() - started
        digest = hashlib.sha256()
        for parameter in probe.network.parameters():
            digest.update(parameter.detach().cpu().numpy().tobytes())
        fits.append({"seconds": seconds, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before,
                     "sha256": digest.hexdigest()})
    print(json.dumps({"threads": torch.get_num_threads(), "vectors": int(features.vectors.shape[0]), "fits": fits}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fits", type=int, default=4, help="one-epoch fits per process (at least 2)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    add_arguments(parser)
    args = parser.parse_args()
    if args.child:
        return child(args)
    setup(args)  # checks --device here (the children run the fits)
    if args.fits < 2:
        raise SystemExit("--fits must be at least 2: the first fit grows the heap in both processes")
    command = [sys.executable, __file__, "--child", "--fits", str(args.fits), "--device", args.device]
    if args.threads:
        command += ["--threads", str(args.threads)]
    started = {mode: subprocess.Popen(command, env={**os.environ, "ATTNLENS_REUSE_MEMORY": flag},
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for mode, flag in (("defaults", "0"), ("attnlens", "1"))}
    runs = {}
    for mode, process in started.items():
        out, err = process.communicate()
        if process.returncode:
            raise SystemExit(f"the {mode} process failed:\n{err[-2000:]}")
        runs[mode] = json.loads(out.strip().splitlines()[-1])
    defaults, ours = runs["defaults"], runs["attnlens"]
    print(f"probe fits: {EXAMPLES} MRPC-shaped pairs, {ours['vectors']:,} vectors of 7 x 384 (float16), one epoch "
          f"a fit, {ours['threads']} torch thread(s), a fresh process each, no pass before the fits")
    for mode, run in runs.items():
        print(f"  {mode:9s} " + "  ".join(f"{fit['seconds']:.2f} s ({fit['faults']:,} faults)" for fit in run["fits"]))
    same = all(a["sha256"] == b["sha256"] for a, b in zip(defaults["fits"], ours["fits"], strict=True))
    if not same:
        raise SystemExit("the two processes' probes differ: the allocator must not change results")
    first = defaults["fits"][0]["seconds"] / ours["fits"][0]["seconds"]
    later = (statistics.median(fit["seconds"] for fit in defaults["fits"][1:])
             / statistics.median(fit["seconds"] for fit in ours["fits"][1:]))
    print(f"FRESH-PROCESS PROBE under glibc's defaults ÷ with attnlens's thresholds: first fit {first:.2f}x, "
          f"later fits {later:.2f}x (medians); the same weights in both, bit for bit")


if __name__ == "__main__":
    main()
