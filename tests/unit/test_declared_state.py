"""Declared state, torchmetrics-style (Accumulator.add_state / add_child / reductions): the
default state_dict, merge, load_state_dict and to follow from the declarations. References: the
sums, maxima and minima of the shards' tensors written out by hand."""

from __future__ import annotations

import pytest
import torch

from attnlens.engine.accumulator import Accumulator
from attnlens.errors import InputError


class Counts(Accumulator):
    name = "counts"

    def __init__(self, values: list[float]) -> None:
        data = torch.tensor(values, dtype=torch.float64)
        self.add_state("total", data.sum().reshape(1))
        self.add_state("largest", data.max().reshape(1), reduction="max")
        self.add_state("smallest", data.min().reshape(1), reduction="min")

    def result(self):
        return self.total, self.largest, self.smallest


class Collection(Accumulator):
    name = "collection"

    def __init__(self, first: list[float], second: list[float]) -> None:
        self.add_child("a", Counts(first))
        self.add_child("b.inner", Counts(second))
        self.add_state("examples", torch.tensor([len(first) + len(second)]))

    def result(self):
        return self.state_dict()


def test_declared_state_is_the_state_dict_and_merges_by_its_reduction():
    left, right = Counts([1.0, 5.0, -2.0]), Counts([3.0, 7.0])
    assert set(left.state_dict()) == {"total", "largest", "smallest"}
    assert left.reductions() == {"total": "sum", "largest": "max", "smallest": "min"}
    left.merge(right)
    assert left.total.item() == 1 + 5 - 2 + 3 + 7 and left.largest.item() == 7 and left.smallest.item() == -2


def test_a_collection_prefixes_its_children_state():
    whole, other = Collection([1.0, 2.0], [4.0]), Collection([8.0], [-1.0, 3.0])
    assert set(whole.state_dict()) == {"a.total", "a.largest", "a.smallest", "b.inner.total",
                                       "b.inner.largest", "b.inner.smallest", "examples"}
    assert whole.reductions()["b.inner.largest"] == "max" and whole.reductions()["examples"] == "sum"
    whole.merge(other)
    state = whole.state_dict()
    assert state["a.total"].item() == 11 and state["a.largest"].item() == 8 and state["a.smallest"].item() == 1
    assert state["b.inner.total"].item() == 6 and state["b.inner.smallest"].item() == -1
    assert state["examples"].item() == 6
    fresh = Collection([0.0], [0.0])
    fresh.load_state_dict({key: value.clone() for key, value in state.items()}, {})
    assert all(torch.equal(fresh.state_dict()[key], value) for key, value in state.items())
    moved = fresh.to("cpu")  # the children move with it (a no-op device here: same tensors)
    assert moved is fresh and fresh.state_dict()["a.total"].device.type == "cpu"


def test_an_unknown_reduction_is_refused():
    accumulator = Counts([1.0])
    with pytest.raises(InputError, match="reduction 'mean'"):
        accumulator.add_state("mean", torch.zeros(1), reduction="mean")
