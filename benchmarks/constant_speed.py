"""Benchmark: a forward with a fraction of the heads replaced by PAPA constants, fast path
(``papa.intervention(..., fast=True)``: replaced heads skip Q/K projections, QKᵀ and softmax)
against the hook path (the pattern computed, then replaced in ``hook_pattern``) and the plain
forward, with the saving the flop count predicts (issue 25.4).

MiniLM (6 layers x 12 heads, d = 384, d' = 32), WikiText-2 paragraphs, ``--length`` tokens (PAPA
layout), ``--batch`` texts; constants fitted on ``--fit`` paragraphs. The forward runs the encoder
(``original_model.bert``: embeddings and every layer, no MLM head, whose vocabulary-sized product
would hide attention). For each fraction of heads replaced (the least input-dependent first) the
three forwards are timed in turn ``--repeats`` times; medians.

Predicted saving: a replaced head skips ``2·n²·d'`` flops of QKᵀ and ``2·2·n·d·d'`` of its Q and K
projections per example (2 flops per multiply-add; softmax's exponentials are not counted; its
pattern·V product, ``2·n²·d'``, remains: the constant still weighs the values), over the
encoder's ``n·(8·d² + 4·d·d_mlp + 4·n·d)`` per layer. (Issue 25's ``2·n²·d' + 2·n·d·d'`` counts
multiply-adds of QKᵀ, pattern·V and the projections: the cost of a head, not what replacing it saves.)

The fast path makes the constant of the replaced heads only (``[1, head, n, n]`` when no example
of the batch has padding, as here: the longest paragraphs fill every position), weighs their values
with it in one product per head, and assembles no ``[batch, head, n, n]`` pattern unless a hook
reads ``hook_pattern`` (none does here).

Measured (2 shared CPU cores, torch one thread, 8 texts x 256 tokens, 5 rounds, medians; one run
each, noisy to a few percent: the 0% row patches nothing and is noise and the context's cost)::

    replaced   fast/plain before   fast/plain after (two runs)   predicted (flops)
      0.00          1.076x            1.058x   0.976x                 1.00x
      0.25          1.115x            0.851x   0.877x                 0.95x
      0.50          1.058x            0.835x   0.822x                 0.90x
      0.75          1.027x            0.694x   0.762x                 0.85x
      1.00          0.953x            0.650x   0.685x                 0.80x

"before": every head's constant built and renormalised per example, then overwritten by the
computed heads (commit fe85440). The saving now grows with the fraction replaced and exceeds the
flop prediction: the count leaves out the softmax and the scale and mask passes over
``[batch, head, n, n]``, which on a CPU cost more than their flops suggest.

Run: ``ATTNLENS_DATA=../shared/data HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 python
benchmarks/constant_speed.py --threads 1 --repeats 5 [--length 256]``.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from common import add_arguments, alternate, encoder_flops, record, setup
from realdata import wikitext_paragraphs

import attnlens
from attnlens import papa
from attnlens.core import devices, fast_heads

FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)


def main() -> None:
    parser = add_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--length", type=int, default=256, help="tokens per text (default 256)")
    parser.add_argument("--batch", type=int, default=8, help="texts per forward (default 8)")
    parser.add_argument("--fit", type=int, default=32, help="paragraphs to fit the constants on")
    parser.add_argument("--repeats", type=int, default=9, help=(
        "rounds of the three forwards (default 9: with 3, one make bench on a noisy machine "
        "measured savings of 2.9%%, -8.4%%, 15.7%%, 4.6%%, 22.2%%; 9 gave -0.5%% ... 24.3%%, in order)"))
    args = parser.parse_args()
    device = setup(args)
    model = attnlens.load(device=device)
    paragraphs = sorted(wikitext_paragraphs(), key=len, reverse=True)
    constants = papa.fit(model, paragraphs[: args.fit], max_len=args.length, layout="papa", progress=False)
    batch = attnlens.tokenize(model, paragraphs[args.fit : args.fit + args.batch], max_len=args.length,
                              layout="papa").to(device)
    encoder = getattr(model.original_model, "bert", None) or model.original_model.roberta
    kwargs = {"attention_mask": batch.attention_mask, "token_type_ids": batch.token_type_ids}
    cfg = model.cfg
    n, d, d_head = args.length, int(cfg.d_model), int(cfg.d_head)
    n_heads = int(cfg.n_layers) * int(cfg.n_heads)
    total = encoder_flops(cfg, batch.input_ids.numel(), n, unembed=False)
    per_head = (2 * n * n * d_head + 4 * n * d * d_head) * batch.input_ids.shape[0]
    print(f"constant heads: {attnlens.core.loading.model_id(model)}, {batch.input_ids.shape[0]} texts x {n} "
          f"tokens, device {device}, torch threads {torch.get_num_threads()}, {args.repeats} rounds; "
          f"a replaced head saves {per_head / total:.2%} of the encoder's flops; "
          f"{int((~batch.attention_mask.bool()).sum())} padded positions (none: the constant is made once "
          "per layer, [1, head, n, n])")

    def plain() -> None:
        with torch.inference_mode():
            encoder(batch.input_ids, **kwargs)

    def under(heads: float, fast: bool, assembled: bool = True):
        def forward() -> None:
            fast_heads.ASSEMBLED_OFF_THE_CPU = assembled
            try:
                with torch.inference_mode(), papa.intervention(model, constants, heads=heads, fast=fast):
                    encoder(batch.input_ids, **kwargs)
            finally:
                fast_heads.ASSEMBLED_OFF_THE_CPU = True
        return forward

    # off the CPU, a layer of both kinds of heads also weighs each group apart (fast_heads.ASSEMBLED_OFF_THE_CPU
    # off): fewer bytes, more launches; which is faster is the device's to say
    by_group = not devices.reads_are_free(torch.device(device))

    plain()
    print(f"{'replaced':>8} {'plain s':>8} {'hooks s':>8} {'fast s':>8} {'fast/plain':>10} "
          f"{'saving':>7} {'predicted':>9} {'hooks/plain':>11}" + (f" {'by group/plain':>14}" if by_group else ""))
    jobs = []
    savings = []
    for fraction in FRACTIONS:
        timed = alternate([plain, under(fraction, False), under(fraction, True)]
                          + ([under(fraction, True, assembled=False)] if by_group else []), args.repeats, device)
        t_plain, t_hooks, t_fast = timed[:3]
        med = statistics.median
        group_ratio = med(g / p for g, p in zip(timed[3], t_plain, strict=True)) if by_group else None
        fast_ratio = med(f / p for f, p in zip(t_fast, t_plain, strict=True))
        hook_ratio = med(h / p for h, p in zip(t_hooks, t_plain, strict=True))
        replaced = round(fraction * n_heads)
        predicted = replaced * per_head / total
        savings.append(1 - fast_ratio)
        print(f"{fraction:8.2f} {med(t_plain):8.3f} {med(t_hooks):8.3f} {med(t_fast):8.3f} {fast_ratio:9.3f}x "
              f"{1 - fast_ratio:7.1%} {predicted:9.1%} {hook_ratio:10.3f}x"
              + (f" {group_ratio:13.3f}x" if by_group else ""))
        jobs.append({"job": f"forward, {fraction:.0%} heads constant (fast)", "seconds": med(t_fast),
                     "forward_ratio": fast_ratio, "limit_ratio": 1 - predicted,
                     "peer": "hook path", "peer_ratio": med(f / h for f, h in zip(t_fast, t_hooks, strict=True)),
                     **({} if group_ratio is None else {"note": f"by group {group_ratio:.3f}x plain"})})
    grows = all(b >= a - 0.02 for a, b in zip(savings, savings[1:], strict=False))
    print(f"saving grows with the fraction replaced: {'yes' if grows else 'no'} "
          f"(measured {', '.join(f'{s:.1%}' for s in savings)})")
    record("constant_speed", jobs, length=n, batch=args.batch, device=device, threads=torch.get_num_threads())


if __name__ == "__main__":
    main()
