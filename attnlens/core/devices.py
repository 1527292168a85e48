"""Where reading a tensor's value on the host is free, and where it waits for a device.

On the CPU a tensor's value is in host memory: ``bool(t.any())``, ``int(t.sum())`` or
``t.nonzero()`` cost what the arithmetic costs, and branching on them lets a computation skip
work (the short sequences of effective attention, the heads the fast route certifies). On a GPU
each such read is a synchronisation: the host waits until the device has run everything queued
before it, and the device then idles while the host prepares the next kernels. Code that runs
once per batch therefore takes, off the CPU, a route that reads nothing back (``torch.where``
over every case instead of a branch on which cases occur), and reads values once per pass.

:func:`reads_are_free` is the one test every such branch uses, so that a test can force the
device routes on a CPU (``monkeypatch.setattr(devices, "reads_are_free", lambda _: False)``)
and check both that they read nothing and that they give the CPU route's results.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor


def width_multiple(where: Tensor | torch.device) -> int:
    """What a pass rounds the width of its compact batches up to on ``where``: 1 on the CPU,
    where every column costs its arithmetic, 16 elsewhere, where a batch of a new width costs
    the choice of its kernels and a few columns of padding cost little (with batches by length,
    about 8 columns a batch, and a dozen widths up to 128 instead of up to 128)."""
    device = where.device if isinstance(where, Tensor) else torch.device(where)
    return 1 if device.type == "cpu" else 16


def reads_are_free(where: Tensor | torch.device) -> bool:
    """True when reading the value of a tensor on ``where`` (a tensor or a device) does not
    wait for a device: the CPU."""
    device = where.device if isinstance(where, Tensor) else torch.device(where)
    return device.type == "cpu"


def free_bytes(where: Tensor | torch.device) -> int:
    """The memory free on ``where`` now, in bytes: the device's free memory as its driver
    reports it (``torch.cuda.mem_get_info``) on a GPU; on the CPU the host's available memory
    (Linux's ``MemAvailable``: free pages and the caches the kernel can drop), else its unused
    physical pages (``sysconf``). What a caller sizes the work it holds at once by (e.g.
    :func:`attnlens.evaluation.probing.run_many`'s stacked probes)."""
    device = where.device if isinstance(where, Tensor) else torch.device(where)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
