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
