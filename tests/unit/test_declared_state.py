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


def test_additions_made_together_equal_one_at_a_time():
    """add_at inside added_together: nothing changes until the block ends, then every state
    holds what one addition at a time gives (exactly: the same additions, in float64 and int64);
    the same state added twice gets both; every state's version counter moves (engine.split
    reads it to know what to put back after running out of memory); a block that raises adds
    nothing it deferred."""
    from attnlens.engine.accumulator import add_at, added_together

    generator = torch.Generator().manual_seed(0)
    totals = torch.rand(6, 4, generator=generator, dtype=torch.float64)
    counts = torch.randint(0, 9, (6, 4, 5), generator=generator)
    sums = torch.rand(3, 4, generator=generator, dtype=torch.float64)
    more = torch.rand(2, 4, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, 9, (3, 4, 5), generator=generator)
    expected = totals.clone(), counts.clone()
    expected[0][2:5] += sums
    expected[0][0:2] += more
    expected[1][1:4] += labels
    before, versions = totals.clone(), (totals._version, counts._version)
    with added_together():
        add_at(totals, 0, [2, 3, 4], sums)
        add_at(counts, 0, [1, 2, 3], labels)
        assert torch.equal(totals, before)
        add_at(totals, 0, [0, 1], more)  # the same state again
    assert torch.equal(totals, expected[0]) and torch.equal(counts, expected[1])
    assert totals._version > versions[0] and counts._version > versions[1]
    with pytest.raises(RuntimeError, match="stop"), added_together():
        add_at(totals, 0, [0], more[:1])
        raise RuntimeError("stop")
    assert torch.equal(totals, expected[0])
