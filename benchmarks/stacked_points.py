"""Benchmark: a task's curve points trained as one stacked probe against one stack per point.

PAPA's curve (Hassid et al. 2022, Fig. 2) probes each task at every share of heads replaced, three
seeds each. Every later point of a task trains for the same epochs on the same examples, so
:func:`attnlens.evaluation.probing.run_many` trains all of them, every seed, as one stacked model
(:func:`attnlens.evaluation.probing.fit_many`). Before, each point was its own stack of its seeds.
This measures, in one run, on random sequence features of SST-2's shape (4,000 sentences of 5 to
40 kept tokens, MiniLM's 7 layers of 384 dimensions in float16, 2 labels, Table 3's recipe):

- **per point**: ``--points`` calls of ``fit_many`` with the 3 seeds of one point each;
- **all points**: one call with ``--points`` × 3 members;

and prints the ratio, whose limit is below 1 (the same arithmetic; fewer optimizer steps and
launches). It checks that the members' parameters are equal in both (each member the same fit
as alone).

Run: ``OMP_NUM_THREADS=1 python benchmarks/stacked_points.py [--points 6] [--epochs 1]
[--device cuda]`` (``make bench``).
"""

from __future__ import annotations

import argparse
import statistics

import torch
from common import add_arguments, alternate, setup

from attnlens.evaluation.probing import TABLE3, Features, PapaProbe, fit_many

SENTENCES, LAYERS, D_MODEL, SEEDS = 4000, 7, 384, 3


def point_features(generator: torch.Generator, lengths: torch.Tensor, device: str) -> Features:
    """One point's features: the same sentences (``lengths``), other vectors (another hook set)."""
    vectors = torch.randn(int(lengths.sum()), LAYERS, D_MODEL, generator=generator).half().to(device)
    positions = torch.cat([torch.arange(int(n)) for n in lengths])
    return Features(vectors, lengths, positions, torch.zeros(0, dtype=torch.long), "sequence", 66)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    add_arguments(parser)
    args = parser.parse_args()
    device = setup(args)
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(5, 41, (SENTENCES,), generator=generator)
    points = [point_features(generator, lengths, device) for _ in range(args.points)]
    labels = torch.randint(0, 2, (SENTENCES,), generator=generator).tolist()
    recipe = {**TABLE3["sst2"].probe_settings(), "epochs": args.epochs, "progress": False}

    def probes() -> list[PapaProbe]:
        return [PapaProbe(**{**recipe, "seed": seed}) for _ in points for seed in range(SEEDS)]

    fitted: dict[str, list[PapaProbe]] = {}

    def per_point() -> None:
        made = probes()
        fitted["per point"] = [probe for index, features in enumerate(points)
                               for probe in fit_many(made[index * SEEDS:(index + 1) * SEEDS], features, labels)]

    def all_points() -> None:
        fitted["all points"] = fit_many(probes(), [features for features in points for _ in range(SEEDS)], labels)

    separate, together = alternate([per_point, all_points], args.repeats, device)
    worst = max(float((a - b).abs().max()) for one, other in zip(fitted["per point"], fitted["all points"], strict=True)
                for a, b in zip(one.network.state_dict().values(), other.network.state_dict().values(), strict=True))
    ratio = statistics.median(b / a for a, b in zip(separate, together, strict=True))
    print(f"{args.points} points x {SEEDS} seeds, {SENTENCES} sentences, {int(lengths.sum()):,} tokens a point, "
          f"{args.epochs} epoch(s), {device}, {torch.get_num_threads()} thread(s)")
    print(f"STACKED POINTS all points in one stack {statistics.median(together):.2f} s, one stack per point "
          f"{statistics.median(separate):.2f} s: {ratio:.2f}x (limit: below 1, the same arithmetic); "
          f"largest parameter difference {worst:.1e}")


if __name__ == "__main__":
    main()
