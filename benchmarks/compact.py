"""Benchmark: probe features in compact PAPA batches against the same batches padded to ``max_len``.

Both sides run :func:`attnlens.evaluation.probing.extract` (no cache) on the SST-2 dev sentences (872),
``max_len`` 64, batch 32, the PAPA layout: padded (``compact=False``, every text padded to
``max_len`` so that its final [SEP] sits at ``max_len - 1``) and compact (each batch as wide as
its longest real text, with the layout's position ids; :func:`attnlens.core.inputs.compact_batch`;
the examples run shortest first, :func:`attnlens.evaluation.probing.features.by_length`).
Whole passes are timed, alternating the two ``--repeats`` times after a warm-up, so both see the
same background load; medians are printed, with the features' largest difference.

The limit of the time ratio is the share of positions the compact batches still compute,
``sum(batch width x batch size) / (examples x max_len)`` ("positions ratio"), close to the
real-token ratio ``real tokens / (examples x max_len)`` since the batches hold texts of similar
lengths. Attention is quadratic in the width, so its part can gain more than that; the fixed
costs per batch (hooks, copying features) gain nothing.

Run: ``HF_HUB_OFFLINE=1 python benchmarks/compact.py [--device cpu] [--threads 2]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from realdata import DATA

import attnlens
from attnlens.evaluation import probing, tasks
from attnlens.evaluation.probing.features import by_length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=None, help="SST-2 dev sentences (default: all 872)")
    parser.add_argument("--max-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default=None, help="torch device (default: attnlens.load's)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = attnlens.load(device=args.device)
    texts = tasks.load("sst2", "dev", data_dir=DATA, limit=args.n).inputs()
    options = dict(max_len=args.max_len, layout="papa", batch_size=args.batch_size, cache=False, progress=False)
    width_tokens = real_tokens = 0
    ordered = [texts[index] for index in by_length(model.tokenizer, texts)]
    for start in range(0, len(texts), args.batch_size):
        batch = attnlens.tokenize(model, ordered[start : start + args.batch_size], max_len=args.max_len,
                                  compact=True)
        width_tokens += batch.input_ids.numel()
        real_tokens += int(batch.attention_mask.sum())
    padded_tokens = len(texts) * args.max_len
    print(
        f"compact vs padded features: {attnlens.core.loading.model_id(model)}, {len(texts)} SST-2 dev sentences, "
        f"max_len {args.max_len}, batch {args.batch_size}, device {next(model.parameters()).device}, "
        f"torch threads {torch.get_num_threads()}, {os.cpu_count()} CPUs"
    )

    def run(compact: bool, examples: list = texts) -> probing.Features:
        return probing.extract(model, examples, compact=compact, **options)

    run(False, texts[:64]), run(True, texts[:64])  # warm-up
    times: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}  # process CPU time: less hurt by a shared CPU
    for repeat in range(args.repeats):
        for compact in (False, True)[:: 1 if repeat % 2 == 0 else -1]:
            start, start_cpu = time.perf_counter(), time.process_time()
            features = run(compact)
            times[compact].append(time.perf_counter() - start)
            cpu[compact].append(time.process_time() - start_cpu)
            if compact:
                compact_features = features
            else:
                padded_features = features
    difference = float((compact_features.vectors.float() - padded_features.vectors.float()).abs().max())
    t_padded, t_compact = statistics.median(times[False]), statistics.median(times[True])
    c_padded, c_compact = statistics.median(cpu[False]), statistics.median(cpu[True])
    print(f"padded:  median {t_padded:6.2f} s  {len(texts) / t_padded:7.1f} seq/s  (runs {', '.join(f'{t:.2f}' for t in times[False])})")
    print(f"compact: median {t_compact:6.2f} s  {len(texts) / t_compact:7.1f} seq/s  (runs {', '.join(f'{t:.2f}' for t in times[True])})")
    print(
        f"RATIO compact / padded wall time {t_compact / t_padded:.3f}x (speed-up {t_padded / t_compact:.2f}x), "
        f"CPU time {c_compact / c_padded:.3f}x ({c_compact:.1f} / {c_padded:.1f} s); "
        f"positions ratio {width_tokens / padded_tokens:.3f} ({width_tokens} of {padded_tokens}), "
        f"real-token ratio {real_tokens / padded_tokens:.3f}; largest feature difference {difference:.2e} "
        f"(float16 features); wall-clock on a possibly shared CPU"
    )


if __name__ == "__main__":
    main()
