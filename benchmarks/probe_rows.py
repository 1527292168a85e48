"""Benchmark: the probe's standardisation and the linear baseline's rows, in cache-sized chunks
against the one big float32 copy they replaced.

Both read every stored float16 vector of a corpus's probe features once: the probe's
``_standardize`` sums them and their squares per (layer, dimension), :func:`design` averages each
sequence example's tokens. Features of MRPC's shape (4,000 pairs of 25 to 75 kept tokens, 7
layers of MiniLM's 384 dimensions, float16; random values: the work does not depend on them).
Printed, medians of alternated runs:

- the standardisation at ``probe.CHUNK`` vectors a chunk against 16,384 (attnlens before
  2026-11-26), the same float64 totals of float32 chunk sums;
- ``design`` at ``EXAMPLES_AT_A_TIME`` examples a chunk against one float32 copy of every vector
  pooled at once (its code before), and that their rows are equal;
- the limit: one pass that only converts every vector to float32, ``CHUNK`` at a time.

Run: ``python benchmarks/probe_rows.py [--repeats 5] [--threads 1]`` (``make bench``).
"""

from __future__ import annotations

import statistics

import torch
from common import alternate, mrpc_benchmark

from attnlens.evaluation.probing import Features, PapaProbe, probe
from attnlens.evaluation.probing.baseline import EXAMPLES_AT_A_TIME, design

OLD_CHUNK = 16384


def sums(vectors: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (layer, dimension) float64 totals of float32 chunk sums and squares (the probe's)."""
    total = torch.zeros(vectors.shape[1:], dtype=torch.float64)
    square = torch.zeros_like(total)
    for start in range(0, vectors.shape[0], chunk):
        part = vectors[start : start + chunk].float()
        total += part.sum(0)
        square += (part * part).sum(0)
    return total, square


def design_at_once(features: Features) -> torch.Tensor:
    """The baseline's sequence rows from one float32 copy of every vector (the code before)."""
    vectors = features.vectors.float()
    example = torch.repeat_interleave(torch.arange(len(features)), features.lengths)
    pooled = torch.zeros((len(features), *vectors.shape[1:])).index_add_(0, example, vectors)
    return (pooled / features.lengths.clamp_min(1)[:, None, None]).flatten(1)


def convert_only(vectors: torch.Tensor) -> None:
    for start in range(0, vectors.shape[0], probe.CHUNK):
        vectors[start : start + probe.CHUNK].float()


def main() -> None:
    args, device, features = mrpc_benchmark(__doc__.splitlines()[0], repeats=5)
    vectors = features.vectors
    standardizer = PapaProbe()  # a probe whose network receives the statistics, as in fit
    standardizer.network = probe.ProbeNetwork(7, 384, 384, 2, 128, True, 0.1)
    targets = torch.zeros(len(features), dtype=torch.long)
    print(f"features: {len(features)} examples, {vectors.shape[0]:,} vectors of {vectors.shape[1]} x "
          f"{vectors.shape[2]} (float16, {vectors.numel() * 2 / 1e9:.2f} GB), {torch.get_num_threads()} thread(s)")
    if not torch.equal(torch.as_tensor(design(features)), design_at_once(features)):
        raise SystemExit("design() and the one-copy rows differ")
    times = alternate([
        lambda: standardizer._standardize(features, targets),
        lambda: sums(vectors, OLD_CHUNK),
        lambda: design(features),
        lambda: design_at_once(features),
        lambda: convert_only(vectors),
    ], args.repeats, device)
    new_std, old_std, new_design, old_design, limit = (statistics.median(t) for t in times)
    print(f"STANDARDISATION {new_std:.2f} s in chunks of {probe.CHUNK} against {old_std:.2f} s in chunks of "
          f"{OLD_CHUNK}: {old_std / new_std:.1f}x faster; {new_std / limit:.2f}x the limit ({limit:.2f} s to "
          f"convert every vector once)")
    print(f"DESIGN {new_design:.2f} s, {EXAMPLES_AT_A_TIME} examples at a time, against {old_design:.2f} s from one "
          f"float32 copy: {old_design / new_design:.1f}x faster, the same rows; {new_design / limit:.2f}x the limit")


if __name__ == "__main__":
    main()
