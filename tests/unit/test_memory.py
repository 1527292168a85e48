"""attnlens.core.memory: glibc keeps freed blocks for reuse once a pass or a probe fit has run.

The effect is measured, not assumed: in a fresh interpreter, allocating and freeing the same
25 MB arrays (the size of one layer's maps of a batch) faults every page in again under glibc's
starting thresholds, and almost none once :func:`reuse_freed_memory` has run; and a probe's later
fits on features made without a pass fault hundreds of thousands of pages under those thresholds,
almost none as attnlens runs them."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
import torch

from attnlens.core import memory
from attnlens.engine import passes
from attnlens.evaluation.probing import Features, PapaProbe
from tests import tiny

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

#: glibc's starting thresholds (128 KB), fixed for the fresh interpreters below: every block above
#: them is mapped when made and unmapped when freed. Left to glibc, the mmap threshold rises as
#: blocks are freed, and whether the heap's top is then trimmed depends on where torch's small
#: allocations land: in 8 batches of the maps below, 49,088 to 134,104 faults in five runs on one
#: machine (25,000 to 95,000 earlier), none at all in one CI run. Fixed, the same interpreter
#: faults 48,684 to 73,740 pages a batch on every run, and :func:`reuse_freed_memory` must replace
#: these thresholds (as it replaces glibc's own) for the pages to be reused.
STARTING_THRESHOLDS = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}

#: a fresh interpreter at one thread: batches of different lengths (as compact batches are), each
#: making and freeing several maps of one layer (20 to 25 MB each, as compare's statistics do);
#: prints the minor page faults of each of the last 8 batches (after 16 of warm-up)
FAULTS = """
import ctypes, resource, sys
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE: pages of 4 KB, whatever the kernel's THP setting
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

#: a fresh interpreter at one thread, with features made in memory (as read from the cache: no
#: pass runs first): four fits of a sequence probe on 160 examples of 20 to 120 tokens (16 a
#: step, each step a float32 copy of its vectors, 5 to 15 MB); prints each fit's minor page faults
PROBE_FITS = """
import ctypes, resource
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE, as above
import torch
torch.set_num_threads(1)
from attnlens.evaluation.probing import Features, PapaProbe
generator = torch.Generator().manual_seed(0)
lengths = torch.randint(20, 121, (160,), generator=generator)
vectors = torch.randn(int(lengths.sum()), 7, 384, generator=generator).half()
positions = torch.cat([torch.arange(int(n)) for n in lengths])
features = Features(vectors, lengths, positions, torch.zeros(0, dtype=torch.long), "sequence", 128)
labels = torch.randint(0, 2, (160,), generator=generator).tolist()
faults = []
for seed in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    PapaProbe(epochs=2, batch_size=16, seed=seed, progress=False).fit(features, labels)
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


def test_a_probe_fit_applies_it(fresh):
    """Features from the cache reach the probe with no pass before it."""
    features = Features(torch.ones(6, 2, 4).half(), torch.tensor([3, 3]), torch.tensor([0, 1, 2, 0, 1, 2]),
                        torch.zeros(0, dtype=torch.long), "sequence", 8)
    assert memory._applied is None
    PapaProbe(epochs=1, batch_size=2, progress=False).fit(features, [0, 1])
    assert memory._applied is True and len(fresh.calls) == 2


@pytest.mark.slow  # two fresh interpreters, 24 batches of 25 MB maps each: 5 s alone
@pytest.mark.skipif(not GLIBC, reason="glibc's allocator only")
def test_freed_maps_are_reused_instead_of_faulted_in_again():
    """From glibc's starting thresholds (:data:`STARTING_THRESHOLDS`) the kernel faults every
    freed map's pages in again (measured: 12 maps of 4,057 to 6,145 pages a batch, 487,392 in 8
    batches, every run); with attnlens's thresholds set, none. Reuse's largest batch is left out:
    the heap may still grow once after warm-up (one batch of 6,144 to 22,344 faults, in about one
    run in four), which is not a cost paid again."""
    runs = {mode: subprocess.Popen([sys.executable, "-c", FAULTS, mode], stdout=subprocess.PIPE, text=True,
                                   env={**os.environ, **STARTING_THRESHOLDS})
            for mode in ("default", "reuse")}
    faults = {mode: [int(n) for n in run.communicate()[0].split()] for mode, run in runs.items()}
    assert all(run.returncode == 0 for run in runs.values())
    default, reuse = sum(faults["default"]), sum(faults["reuse"]) - max(faults["reuse"])
    assert default > 10_000, faults
    assert reuse * 20 < default, faults


@pytest.mark.slow  # two fresh interpreters, four probe fits each: 6.5 s, run side by side
@pytest.mark.skipif(not GLIBC, reason="glibc's allocator only")
def test_a_probe_fit_reuses_freed_memory_without_a_pass():
    """The same fits from glibc's starting thresholds (:data:`STARTING_THRESHOLDS`, with
    ``ATTNLENS_REUSE_MEMORY=0``) and as attnlens sets them (by the fit itself: no pass runs). The
    first fit grows the heap in both and is left out. Measured: from the starting thresholds
    345,000 to 349,000 faults in every later fit; with attnlens's 1 to 2,068, so reuse's largest
    later fit is left out as in the test above."""
    runs = {mode: subprocess.Popen([sys.executable, "-c", PROBE_FITS], stdout=subprocess.PIPE, text=True,
                                   env={**os.environ, **STARTING_THRESHOLDS, memory.ENVIRONMENT: flag})
            for mode, flag in (("default", "0"), ("reuse", "1"))}
    faults = {mode: [int(n) for n in run.communicate()[0].split()][1:] for mode, run in runs.items()}
    assert all(run.returncode == 0 for run in runs.values())
    default, reuse = sum(faults["default"]), sum(faults["reuse"]) - max(faults["reuse"])
    assert default > 10_000, faults
    assert reuse * 20 < default, faults
