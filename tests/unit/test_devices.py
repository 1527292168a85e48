"""attnlens.core.devices: where reads are free, how wide compact batches run, and the memory a
device has free (what probing.run_many sizes its stacks by)."""

from __future__ import annotations

import pytest
import torch

from attnlens.core import devices


def test_the_cpu_reads_for_free_and_runs_batches_at_their_own_width():
    assert devices.reads_are_free(torch.device("cpu")) and devices.reads_are_free(torch.zeros(1))
    assert devices.width_multiple(torch.device("cpu")) == 1 and devices.width_multiple(torch.device("meta")) == 16
    assert not devices.reads_are_free(torch.device("meta"))


def test_the_free_memory_of_the_cpu_is_what_psutil_reports_available():
    """Reference: psutil's ``virtual_memory().available`` (Linux's MemAvailable); the two reads
    are moments apart, so they may differ by what the machine allocated in between (here at
    most 5% of the total)."""
    psutil = pytest.importorskip("psutil")
    memory = psutil.virtual_memory()
    free = devices.free_bytes(torch.device("cpu"))
    assert 0 < free <= memory.total
    assert abs(free - memory.available) <= 0.05 * memory.total, (free, memory.available)


def test_a_tree_of_host_tensors_moves_in_one_copy_and_comes_back_equal():
    """packed_copy (to_device's transfer off the CPU): every tensor of dicts, lists, tuples and a
    dataclass (the pattern types' positions with their terms) comes back with its dtype, shape and
    values, bit for bit (bytes copied, not converted), each a view of one buffer: one copy.
    Reference: the tensors themselves."""
    from attnlens.methods.patterns.templates import Positions, with_terms

    positions = with_terms(Positions.from_tokens([["[CLS]", "a", "[SEP]", "b", "[SEP]"], ["[CLS]", "c", "[SEP]"]]))
    tree = {
        "bool": torch.tensor([[True, False, True]]), "long": torch.arange(7) - 3,
        "float": [torch.randn(3, 5, generator=torch.Generator().manual_seed(0)).t()],  # not contiguous
        "double": (torch.tensor(0.1, dtype=torch.float64), 2, "kept"), "empty": torch.zeros(0, 4),
        "positions": positions,
    }
    moved = devices.packed_copy(tree, torch.device("cpu"))
    before, after = [], []
    devices._leaves(tree, before)
    devices._leaves(moved, after)
    assert len(before) == len(after) > 10
    for original, copy in zip(before, after, strict=True):
        assert copy.dtype == original.dtype and copy.shape == original.shape and torch.equal(copy, original)
    assert len({leaf.untyped_storage().data_ptr() for leaf in after}) == 1
    assert moved["double"][1:] == (2, "kept") and isinstance(moved["positions"], Positions)
    assert moved["positions"]._terms.keys() == positions._terms.keys()
    assert devices.to_device(tree, torch.device("cpu")) is tree  # nothing to move on the CPU


def test_tensors_kept_on_a_device_are_read_in_one_copy(monkeypatch):
    """to_host: where reads wait for a device (forced here), every tensor of the tree comes back
    as a NumPy array with its dtype, shape and values after one read of the device (``.cpu()``
    called once, counted); on the CPU, each tensor's own array. Reference: the tensors' own
    ``numpy()``."""
    tree = {"codes": [torch.arange(24, dtype=torch.uint8).view(2, 3, 4), torch.zeros(0, 3, dtype=torch.uint8)],
            "scales": (torch.rand(2, 3), torch.tensor(0.5, dtype=torch.float64)), "refused": torch.tensor(False),
            "index": torch.arange(5) - 2}
    expected = devices.to_host(tree)  # the CPU: each tensor's own array
    reads = []
    real_cpu = torch.Tensor.cpu
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self, *a, **k: reads.append(1) or real_cpu(self, *a, **k))
    monkeypatch.setattr(devices, "reads_are_free", lambda where: False)
    read = devices.to_host(tree)
    assert len(reads) == 1
    wanted: list = []
    devices._leaves(tree, wanted)
    for original, array in zip(wanted, [*read["codes"], *read["scales"], read["refused"], read["index"]], strict=True):
        assert array.dtype == original.numpy().dtype and array.shape == tuple(original.shape)
        assert (array == original.numpy()).all()
    assert expected["codes"][0].shape == (2, 3, 4) and bool(read["refused"]) is False
