"""Benchmark: ``attnlens.papa.fit`` (one pass of the engine) against a plain forward on the same batches.

Both sides tokenize the same texts in the same batches (``batch_size``, ``max_len``, the model's
default layout: ``papa`` for MiniLM, in compact batches as the fit runs it, see
:func:`attnlens.core.inputs.compact_batch`; ``padded`` for SmolLM2), in the order the fit runs them
(by length, :func:`attnlens.engine.passes.run`), and run the model up to the same
point, right after the last layer's attention pattern: the fit needs nothing after it and stops
there; the plain forward is stopped there by a hook that raises
(:func:`attnlens.engine.forward.run_patterns` with no other hook). So the ratio is the cost of the engine
and of the accumulation (float32 batch sums of masked patterns and their squares, added into
float64 running sums), and 1.00x is its limit. Whole passes are timed, alternating fit and plain
forward ``--repeats`` times after a warm-up, so both see the same background load; medians and
ranges are printed.

MiniLM: 512 WikiText-2 validation paragraphs, max_len 128, batch 32 (target <= 1.03x).
SmolLM2-135M (``--model smollm2-135m``): 64 paragraphs, max_len 128, batch 16.

Also timed in the same rounds, on the texts in corpus order as a user writes them: a *full
forward* (``model(input_ids, ...)``, every layer and the unembed; MiniLM: every text padded to
``max_len`` in the PAPA layout), and the peer, a hand-written TransformerLens loop doing what
the fit does: per batch ``run_with_cache`` of every ``hook_pattern`` and masked sums of the
patterns and their squares (target: fit <= 0.5x that loop). Results go to ``build/bench/papa_fit.json`` for
``benchmarks/table.py``.

Run: ``HF_HUB_OFFLINE=1 python benchmarks/papa_fit.py [--model smollm2-135m] [--device D] [--threads N]``
(``make bench``). Compact against padded PAPA batches: ``benchmarks/compact.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import (
    RANDOM_MODELS,
    add_arguments,
    encoder_flops,
    load_model,
    pass_order,
    pattern_pass_flops,
    record,
    setup,
)
from realdata import wikitext_paragraphs

import attnlens
from attnlens import papa
from attnlens.core.inputs import default_layout
from attnlens.engine.forward import run_patterns

TARGET = 1.03
PEER_TARGET = 0.5


def full_forward(model, texts, *, max_len: int, layout: str, batch_size: int) -> None:
    """The whole forward (every layer and the unembed) of the same batches."""
    for start in range(0, len(texts), batch_size):
        batch = attnlens.tokenize(model, texts[start : start + batch_size], max_len=max_len, layout=layout)
        batch = batch.to(model.cfg.device)
        with torch.inference_mode():
            model(batch.input_ids, **batch.model_kwargs())


def transformer_lens_loop(model, texts, *, max_len: int, layout: str, batch_size: int):
    """The peer: what one writes with TransformerLens alone: ``run_with_cache`` of every
    ``hook_pattern``, then masked sums of the patterns and of their squares per layer."""
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    sums = squares = None
    counts = None
    for start in range(0, len(texts), batch_size):
        batch = attnlens.tokenize(model, texts[start : start + batch_size], max_len=max_len, layout=layout)
        batch = batch.to(model.cfg.device)
        with torch.inference_mode():
            _, cache = model.run_with_cache(
                batch.input_ids, **batch.model_kwargs(), names_filter=lambda name: name.endswith("hook_pattern")
            )
            valid = batch.attention_mask.bool()
            pairs = (valid[:, :, None] & valid[:, None, :]).float()
            if sums is None:
                n = pairs.shape[-1]
                sums = torch.zeros(n_layers, n_heads, n, n, dtype=torch.float64, device=pairs.device)
                squares, counts = torch.zeros_like(sums), torch.zeros(n, n, dtype=torch.float64, device=pairs.device)
            for layer in range(n_layers):
                pattern = cache[f"blocks.{layer}.attn.hook_pattern"] * pairs[:, None]
                sums[layer] += pattern.sum(0)
                squares[layer] += (pattern * pattern).sum(0)
            counts += pairs.sum(0)
    return sums, squares, counts


def plain_forward(model, texts, *, max_len: int, layout: str, batch_size: int) -> None:
    """The forward the fit hooks, on the same batches, reading nothing (``texts`` in the fit's
    order, :func:`common.pass_order`)."""
    for start in range(0, len(texts), batch_size):
        batch = attnlens.tokenize(model, texts[start : start + batch_size], max_len=max_len, layout=layout,
                                  compact=True)
        with torch.inference_mode():
            run_patterns(model, batch, [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None,
                        help=f"default: the embedded MiniLM; or smollm2-135m, or {', '.join(RANDOM_MODELS)} "
                             "(random weights of a user's size)")
    parser.add_argument("--n", type=int, default=None, help="paragraphs (MiniLM 512, SmolLM2 64)")
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=None, help="MiniLM 32, SmolLM2 16")
    parser.add_argument("--repeats", type=int, default=3)
    add_arguments(parser)
    args = parser.parse_args()
    device = setup(args)
    small = args.model is not None
    n = args.n or (64 if small else 512)
    batch_size = args.batch_size or (16 if small else 32)

    if args.model in RANDOM_MODELS:
        model, _ = load_model(args.model, device)
    else:
        model = attnlens.load(args.model, device=device)
    layout = default_layout(model)
    texts = wikitext_paragraphs()[:n]
    shape = dict(max_len=args.max_len, layout=layout, batch_size=batch_size)
    print(
        f"papa.fit benchmark: {attnlens.core.loading.model_id(model)} ({model.cfg.n_layers} layers x "
        f"{model.cfg.n_heads} heads), {len(texts)} WikiText-2 paragraphs, max_len {args.max_len}, "
        f"batch {batch_size}, layout {layout}, torch threads {torch.get_num_threads()}"
    )

    def fit() -> None:
        papa.fit(model, texts, progress=False, **shape)

    ordered = pass_order(model, texts, batch_size)

    def plain() -> None:
        plain_forward(model, ordered, **shape)

    def full() -> None:
        full_forward(model, texts, **shape)

    def peer() -> None:
        transformer_lens_loop(model, texts, **shape)

    papa.fit(model, texts[:batch_size], progress=False, **shape)  # warm-up
    plain_forward(model, texts[:batch_size], **shape)
    fit_times, plain_times, full_times, peer_times = [], [], [], []
    jobs = ((fit, fit_times), (plain, plain_times), (full, full_times), (peer, peer_times))
    for repeat in range(args.repeats):
        for function, bucket in jobs[:: 1 if repeat % 2 == 0 else -1]:
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
    full_ratio = statistics.median(f / g for f, g in zip(fit_times, full_times, strict=True))
    peer_ratio = statistics.median(f / p for f, p in zip(fit_times, peer_times, strict=True))
    print(f"full forward:  median {statistics.median(full_times):7.2f} s  (every layer and the unembed)")
    print(f"TL loop:       median {statistics.median(peer_times):7.2f} s  (run_with_cache + masked sums)")
    print(f"RATIO fit / full forward {full_ratio:.3f}x; fit / TransformerLens loop {peer_ratio:.3f}x "
          f"(target <= {PEER_TARGET}x: {'met' if peer_ratio <= PEER_TARGET else 'missed'})")
    limit = None
    if hasattr(model.original_model, "bert") or hasattr(model.original_model, "roberta"):
        # the fit's batches (by length, compact) to its stop, over the full forward's (every
        # text padded to max_len in the papa layout)
        limit = (pattern_pass_flops(model, texts, **shape)
                 / encoder_flops(model.cfg, len(texts) * args.max_len, args.max_len))
    name = "papa_fit" if not small else f"papa_fit_{args.model}"
    record(name, [{
        "job": f"papa.fit ({attnlens.core.loading.model_id(model).split('/')[-1]})",
        "seconds": t_fit, "forward_ratio": full_ratio, "limit_ratio": limit,
        "peer": "TransformerLens loop", "peer_ratio": peer_ratio,
        "note": f"plain forward to the same stop {ratio:.2f}x",
    }], texts=len(texts), max_len=args.max_len, device=device, threads=torch.get_num_threads())


if __name__ == "__main__":
    main()
