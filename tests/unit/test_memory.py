"""attnlens.core.memory: glibc keeps freed blocks for reuse once a pass has run.

The effect is measured, not assumed: in a fresh interpreter, allocating and freeing the same
25 MB arrays (the size of one layer's maps of a batch) faults every page in again under glibc's
defaults, and almost none once :func:`reuse_freed_memory` has run."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from attnlens.core import memory
from attnlens.engine import passes
from tests import tiny

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

#: a fresh interpreter at one thread: batches of different lengths (as compact batches are), each
#: making and freeing several maps of one layer (20 to 25 MB each, as compare's statistics do);
#: prints the minor page faults of the last 8 batches (after 16 of warm-up)
FAULTS = """
import resource, sys
import torch
torch.set_num_threads(1)
if sys.argv[1] == "reuse":
    from attnlens.core import memory
    assert memory.reuse_freed_memory()
def batches(n):
    total = 0.0
    for i in range(n):
        length = 128 - 8 * (i % 4)
        maps = [torch.rand(32, 12, length, length) for _ in range(4)]
        weights = [m.abs() for m in maps]
        total += sum(float(w.clamp_min(1e-30).log_().mul_(w).sum()) for w in weights)
        del maps, weights
    return total
batches(16)  # warm-up: the heap grows to the batches' largest layout once
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
batches(8)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


class _Recorder:
    """A stand-in for glibc's ``mallopt``: records its calls, answers ``ok``."""

    def __init__(self, ok: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.ok = ok

    def mallopt(self, parameter: int, value) -> int:
        self.calls.append((parameter, value.value))
        return self.ok


@pytest.fixture
def fresh(monkeypatch):
    """The module as in a new process (nothing applied yet), with a recording libc."""
    recorder = _Recorder()
    monkeypatch.setattr(memory, "_applied", None)
    monkeypatch.setattr(memory, "_libc", lambda: recorder)
    monkeypatch.delenv(memory.ENVIRONMENT, raising=False)
    return recorder


def test_both_thresholds_are_set_once_per_process(fresh):
    assert memory.reuse_freed_memory() is True
    assert fresh.calls == [(memory.M_MMAP_THRESHOLD, 32 * 2**20), (memory.M_TRIM_THRESHOLD, 2**30)]
    assert memory.reuse_freed_memory() is True
    assert len(fresh.calls) == 2  # not again


def test_the_environment_keeps_glibcs_defaults(fresh, monkeypatch):
    monkeypatch.setenv(memory.ENVIRONMENT, "0")
    assert memory.reuse_freed_memory() is False
    assert fresh.calls == []


def test_another_c_library_is_left_alone(fresh, monkeypatch):
    monkeypatch.setattr(memory, "_libc", lambda: None)
    assert memory.reuse_freed_memory() is False


def test_a_refused_setting_reports_false(fresh):
    fresh.ok = 0
    assert memory.reuse_freed_memory() is False


def test_a_pass_applies_it(fresh):
    model = tiny.bert_bridge()
    summary = passes.run(model, tiny.CORPUS[:4], [passes.Accumulator()], max_len=16, progress=False)
    assert summary is not None
    assert memory._applied is True and len(fresh.calls) == 2


@pytest.mark.skipif(not GLIBC, reason="glibc's allocator only")
def test_freed_maps_are_reused_instead_of_faulted_in_again():
    """Under glibc's defaults the kernel faults the freed maps' pages in again (measured here:
    about 79,000 faults in 8 batches, a third of the maps' pages); with the thresholds set,
    none (0 measured; Python's own small allocations may add a few)."""
    runs = {mode: subprocess.Popen([sys.executable, "-c", FAULTS, mode], stdout=subprocess.PIPE, text=True)
            for mode in ("default", "reuse")}
    faults = {mode: int(run.communicate()[0].strip()) for mode, run in runs.items()}
    assert all(run.returncode == 0 for run in runs.values())
    assert faults["default"] > 10_000, faults
    assert faults["reuse"] * 20 < faults["default"], faults
