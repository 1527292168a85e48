"""Benchmark: ``attnlens.papa.fit`` (one pass of the engine) against a plain forward on the same batches.

Both sides tokenize the same texts in the same batches (``batch_size``, ``max_len``, the model's
default layout: ``papa`` for MiniLM, in compact batches as the fit runs it, see
:func:`attnlens.inputs.compact_batch`; ``padded`` for SmolLM2) and run the model up to the same
point, right after the last layer's attention pattern: the fit needs nothing after it and stops
there; the plain forward is stopped there by a hook that raises
(:func:`attnlens.passes.run_patterns` with no other hook). So the ratio is the cost of the engine
and of the accumulation (float32 batch sums of masked patterns and their squares, added into
float64 running sums), and 1.00x is its limit. Whole passes are timed, alternating fit and plain
forward ``--repeats`` times after a warm-up, so both see the same background load; medians and
ranges are printed.

MiniLM: 512 WikiText-2 validation paragraphs, max_len 128, batch 32 (target <= 1.03x).
SmolLM2-135M (``--model smollm2-135m``): 64 paragraphs, max_len 128, batch 16.

Run: ``HF_HUB_OFFLINE=1 python benchmarks/papa_fit.py [--model smollm2-135m] [--device cpu]
[--threads 2]`` (``make bench``). Compact against padded PAPA batches: ``benchmarks/compact.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from realdata import wikitext_paragraphs

import attnlens
from attnlens import papa, passes
from attnlens.inputs import default_layout

TARGET = 1.03


def plain_forward(model, texts, *, max_len: int, layout: str, batch_size: int) -> None:
    """The forward the fit hooks, on the same batches, reading nothing."""
    for start in range(0, len(texts), batch_size):
        batch = attnlens.tokenize(model, texts[start : start + batch_size], max_len=max_len, layout=layout,
                                  compact=True)
        with torch.inference_mode():
            passes.run_patterns(model, batch, [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="default: the embedded MiniLM; or smollm2-135m")
    parser.add_argument("--n", type=int, default=None, help="paragraphs (MiniLM 512, SmolLM2 64)")
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=None, help="MiniLM 32, SmolLM2 16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--device", default=None, help="torch device (default: attnlens.load's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    small = args.model is not None
    n = args.n or (64 if small else 512)
    batch_size = args.batch_size or (16 if small else 32)

    model = attnlens.load(args.model, device=args.device)
    layout = default_layout(model)
    texts = wikitext_paragraphs()[:n]
    shape = dict(max_len=args.max_len, layout=layout, batch_size=batch_size)
    print(
        f"papa.fit benchmark: {attnlens.loading.model_id(model)} ({model.cfg.n_layers} layers x "
        f"{model.cfg.n_heads} heads), {len(texts)} WikiText-2 paragraphs, max_len {args.max_len}, "
        f"batch {batch_size}, layout {layout}, torch threads {torch.get_num_threads()}"
    )

    def fit() -> None:
        papa.fit(model, texts, progress=False, **shape)

    def plain() -> None:
        plain_forward(model, texts, **shape)

    papa.fit(model, texts[:batch_size], progress=False, **shape)  # warm-up
    plain_forward(model, texts[:batch_size], **shape)
    fit_times, plain_times = [], []
    for repeat in range(args.repeats):
        for function, bucket in ((fit, fit_times), (plain, plain_times))[:: 1 if repeat % 2 == 0 else -1]:
            start = time.perf_counter()
            function()
            bucket.append(time.perf_counter() - start)
    ratios = sorted(f / p for f, p in zip(fit_times, plain_times, strict=True))
    t_fit, t_plain = statistics.median(fit_times), statistics.median(plain_times)
    print(f"papa.fit:      median {t_fit:7.2f} s  {len(texts) / t_fit:7.1f} seq/s  (runs {', '.join(f'{t:.2f}' for t in fit_times)})")
    print(f"plain forward: median {t_plain:7.2f} s  {len(texts) / t_plain:7.1f} seq/s  (same batches, same stop point)")
    ratio = statistics.median(ratios)
    verdict = "" if small else f"; {'meets' if ratio <= TARGET else 'misses'} the {TARGET:.2f}x target"
    print(
        f"RATIO fit / plain forward: median of the {len(ratios)} back-to-back pairs {ratio:.3f}x "
        f"(range {ratios[0]:.3f}-{ratios[-1]:.3f}x; ratio of medians {t_fit / t_plain:.3f}x; "
        f"limit 1.00x{verdict}); wall-clock on a possibly shared CPU"
    )


if __name__ == "__main__":
    main()
