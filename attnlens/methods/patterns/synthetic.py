"""Noisy prototype maps of each of Kovaleva et al.'s types, for tests and a quick start.

Each map is a row-wise softmax of logits: a prototype (a high logit on the type's keys) plus
Gaussian noise, so every row is a distribution over the example's keys. Token strings follow
BERT's layout: ``[CLS] w1 … wn [SEP]`` for a single sentence, ``[CLS] a … [SEP] b … [SEP]`` for a
pair; block maps are always pairs, the other types are pairs or not at random.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from attnlens.core.checks import describe, whole_number
from attnlens.errors import InputError
from attnlens.methods.patterns.templates import TYPES

#: logit of the prototype's keys above the others: ``log(length)`` (so one key can hold as much
#: as all the others together, whatever the length) plus a margin drawn uniformly from this range
STRENGTH = (1.5, 3.0)
#: standard deviation of the Gaussian noise added to every logit
NOISE = 1.0
#: heterogeneous rows: logits of this standard deviation on random keys (no template)
SPREAD = 2.5


@dataclass
class SyntheticMaps:
    """``maps``: ``[n, length, length]`` (every row sums to 1); ``labels``: the type of each map;
    ``tokens``: each map's token strings (``[CLS]``, ``[SEP]`` and words ``w1``, ``w2``…)."""

    maps: Float[Tensor, "n query key"]
    labels: list[str]
    tokens: list[list[str]]

    def __len__(self) -> int:
        return len(self.labels)


def _layout(length: int, pair: bool) -> tuple[list[str], list[int], list[int]]:
    """Tokens, special positions and each position's segment."""
    if not pair:
        tokens = ["[CLS]", *(f"w{i}" for i in range(1, length - 1)), "[SEP]"]
        return tokens, [0, length - 1], [0] * length
    first = (length - 3) // 2
    second = length - 3 - first
    tokens = ["[CLS]", *(f"a{i}" for i in range(1, first + 1)), "[SEP]",
              *(f"b{i}" for i in range(1, second + 1)), "[SEP]"]
    middle = first + 1
    segment = [0] * (middle + 1) + [1] * (length - middle - 1)
    return tokens, [0, middle, length - 1], segment


def _one(kind: str, length: int, rng: np.random.Generator) -> tuple[np.ndarray, list[str]]:
    pair = kind == "block" or (kind != "block" and rng.random() < 0.5)
    tokens, special, segment = _layout(length, pair)
    prototype = np.zeros((length, length))
    strength = np.log(length) + rng.uniform(*STRENGTH)
    index = np.arange(length)
    if kind in ("vertical", "vertical+diagonal"):
        weights = rng.dirichlet(np.ones(len(special)))  # how the column mass is shared
        for column, weight in zip(special, weights, strict=True):
            prototype[:, column] = strength + np.log(weight + 1e-3)
    if kind in ("diagonal", "vertical+diagonal"):
        offset = rng.choice([-1, 0, 1])
        rows = index[(index + offset >= 0) & (index + offset < length)]
        prototype[rows, rows + offset] = np.maximum(prototype[rows, rows + offset], strength)
    if kind == "block":
        segments = np.asarray(segment)
        same = segments[:, None] == segments[None, :]
        prototype[same] = strength
        prototype[:, special] = 0.0
    if kind == "heterogeneous":
        prototype = rng.normal(0.0, SPREAD, size=(length, length))
    logits = prototype + rng.normal(0.0, NOISE, size=(length, length))
    logits -= logits.max(-1, keepdims=True)
    weights = np.exp(logits)
    return weights / weights.sum(-1, keepdims=True), tokens


def synthetic(kind: str, n: int, length: int = 32, seed: int = 0) -> SyntheticMaps:
    """``n`` noisy maps of type ``kind`` (one of :data:`TYPES`, or ``"all"`` for ``n`` of each,
    in the order of :data:`TYPES`), ``length × length`` (at least 8), reproducible from ``seed``."""
    if kind != "all" and kind not in TYPES:
        raise InputError(f"Unknown pattern type {describe(kind)}; use one of {', '.join(TYPES)} or 'all'.")
    n = whole_number(n, "n", minimum=1)
    length = whole_number(length, "length", minimum=8)
    seed = whole_number(seed, "seed", minimum=0)
    kinds = list(TYPES) if kind == "all" else [kind]
    rng = np.random.default_rng(seed)
    maps, labels, tokens = [], [], []
    for name in kinds:
        for _ in range(n):
            values, words = _one(name, length, rng)
            maps.append(values)
            labels.append(name)
            tokens.append(words)
    return SyntheticMaps(torch.tensor(np.stack(maps), dtype=torch.float32), labels, tokens)
