"""Benchmark: probe feature extraction (every layer's vectors, one engine pass) against a plain
forward on the same batches, stopped at the same point (after the last block).

Both sides tokenize the same texts in the same batches (MiniLM, the papa layout, max_len 128,
batch 32; compact, the texts from the shortest to the longest, as the extraction runs them) and
run the model through its last block: the extraction reads ``blocks.0.hook_in`` and every
``blocks.{l}.hook_out``, keeps the real tokens' vectors in float16 and moves them to
the CPU; the plain forward reads nothing (:func:`attnlens.engine.forward.run_patterns` with ``until``
the last ``hook_out``). So 1.00x is the limit and the ratio is the cost of the engine and the
copies. The cache is off (``cache=False``): every extraction runs its forward. Whole passes are
timed alternately after a warm-up; the median of the back-to-back pairs is the headline.

Run: ``HF_HUB_OFFLINE=1 python benchmarks/probing.py [--texts 1024] [--repeats 3]`` (``make bench``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import add_arguments, pass_order, setup
from realdata import wikitext_paragraphs

import attnlens
from attnlens.core.inputs import default_layout
from attnlens.engine.forward import run_patterns
from attnlens.evaluation import probing

TARGET = 1.10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=1024)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    add_arguments(parser)
    args = parser.parse_args()
    device = setup(args)
    model = attnlens.load(device=device)
    layout = default_layout(model)
    texts = wikitext_paragraphs()[: args.texts]
    last = f"blocks.{model.cfg.n_layers - 1}.hook_out"

    def extract() -> None:
        probing.extract(model, texts, max_len=args.max_len, layout=layout, batch_size=args.batch_size,
                        cache=False, progress=False)

    ordered = pass_order(model, texts, args.batch_size)  # extract's batches: shortest first, compact

    def plain() -> None:
        for start in range(0, len(ordered), args.batch_size):
            batch = attnlens.tokenize(model, ordered[start : start + args.batch_size], max_len=args.max_len,
                                      layout=layout, compact=True)
            with torch.inference_mode():
                run_patterns(model, batch, [], until=last)

    print(f"probe features benchmark: {attnlens.core.loading.model_id(model)}, {len(texts)} WikiText-2 "
          f"paragraphs, max_len {args.max_len}, batch {args.batch_size}, layout {layout}, "
          f"torch threads {torch.get_num_threads()}")
    probing.extract(model, texts[: args.batch_size], max_len=args.max_len, cache=False, progress=False)
    plain_times, extract_times = [], []
    for repeat in range(args.repeats):
        pair = ((extract, extract_times), (plain, plain_times))
        for function, bucket in pair[:: 1 if repeat % 2 == 0 else -1]:
            start = time.perf_counter()
            function()
            bucket.append(time.perf_counter() - start)
    ratios = sorted(e / p for e, p in zip(extract_times, plain_times, strict=True))
    ratio = statistics.median(ratios)
    t_extract, t_plain = statistics.median(extract_times), statistics.median(plain_times)
    print(f"features extraction: median {t_extract:6.2f} s  {len(texts) / t_extract:6.1f} texts/s")
    print(f"plain forward:       median {t_plain:6.2f} s  {len(texts) / t_plain:6.1f} texts/s (same batches, same stop)")
    print(f"RATIO extraction / plain forward: {ratio:.3f}x (pairs {ratios[0]:.3f}-{ratios[-1]:.3f}x; limit 1.00x; "
          f"target <= {TARGET:.2f}x: {'met' if ratio <= TARGET else 'missed'}); wall-clock on a possibly shared CPU")


if __name__ == "__main__":
    main()
