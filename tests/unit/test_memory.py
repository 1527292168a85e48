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
#: prints the minor page faults of each of the last 8 batches (after 16 of warm-up)
FAULTS = """
import resource, sys
import torch
torch.set_num_threads(1)
if sys.argv[1] == "reuse":
    from attnlens.core import memory
    assert memory.reuse_freed_memory()
def batch(i):
    length = 128 - 8 * (i % 4)
    maps = [torch.full((32, 12, length, length), 0.5) for _ in range(4)]
    weights = [m.abs() for m in maps]
    return sum(float(w.clamp_min(1e-30).log_().mul_(w).sum()) for w in weights)
for i in range(16):  # warm-up
    batch(i)
faults = []
for i in range(8):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    batch(i)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(*faults)
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
    assert memory._applied is None
    summary = passes.run(model, tiny.CORPUS[:4], [passes.Accumulator()], max_len=16, progress=False)
    assert summary.n_examples == 4
    assert memory._applied is True and len(fresh.calls) == 2


@pytest.mark.slow  # two fresh interpreters, 24 batches of 25 MB maps each: 3 s alone, 5-8 s in the suite
@pytest.mark.skipif(not GLIBC, reason="glibc's allocator only")
def test_freed_maps_are_reused_instead_of_faulted_in_again():
    """Under glibc's defaults the kernel faults freed maps' pages in again whenever a batch is
    longer than the one before (measured: 25,000 to 95,000 faults in 8 batches); with the
    thresholds set, none. Reuse's largest batch is left out: the heap may still grow once after
    warm-up (one batch of 6,144 to 22,344 faults, in about one run in four), which is not a cost
    paid again."""
    runs = {mode: subprocess.Popen([sys.executable, "-c", FAULTS, mode], stdout=subprocess.PIPE, text=True)
            for mode in ("default", "reuse")}
    faults = {mode: [int(n) for n in run.communicate()[0].split()] for mode, run in runs.items()}
    assert all(run.returncode == 0 for run in runs.values())
    default, reuse = sum(faults["default"]), sum(faults["reuse"]) - max(faults["reuse"])
    assert default > 10_000, faults
    assert reuse * 20 < default, faults
