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

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import numpy as np
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


#: byte alignment of each tensor in :func:`to_device`'s buffer (every dtype's element size divides it)
ALIGNMENT = 16


def to_device(tree: Any, device: torch.device) -> Any:
    """``tree`` with every tensor on ``device``, copied in one transfer. ``tree``: tensors on the
    host in dicts, lists, tuples and dataclasses (anything else is kept as it is). For what is
    computed of a batch's tokens on the host, e.g. the token classes and the pattern types'
    positions (:meth:`attnlens.engine.accumulator.PassBatch.from_host`): one copy
    (:func:`packed_copy`), instead of a launch per operator on the device. Returns ``tree``
    itself on the CPU."""
    device = torch.device(device)
    return tree if device.type == "cpu" else packed_copy(tree, device)


def packed_copy(tree: Any, device: torch.device) -> Any:
    """:func:`to_device`'s copy: each tensor's bytes packed into one buffer at multiples of
    :data:`ALIGNMENT` (in pinned memory for a GPU), the buffer copied without waiting
    (``non_blocking``), and each tensor viewed back on ``device`` with its dtype and shape."""
    leaves: list[Tensor] = []
    _leaves(tree, leaves)
    offsets, total = [], 0
    for leaf in leaves:
        offsets.append(total)
        total += -(-leaf.numel() * leaf.element_size() // ALIGNMENT) * ALIGNMENT
    packed = torch.empty(total, dtype=torch.uint8, pin_memory=torch.device(device).type == "cuda")
    for leaf, offset in zip(leaves, offsets, strict=True):
        size = leaf.numel() * leaf.element_size()
        if size:
            packed[offset : offset + size].copy_(leaf.detach().contiguous().reshape(-1).view(torch.uint8))
    copied = packed.to(device, non_blocking=True)
    moved = iter([
        copied[offset : offset + leaf.numel() * leaf.element_size()].view(leaf.dtype).view(leaf.shape)
        for leaf, offset in zip(leaves, offsets, strict=True)
    ])
    return _rebuilt(tree, lambda leaf: next(moved))


def _leaves(tree: Any, out: list[Tensor]) -> None:
    """The tensors of ``tree``, depth first (the order :func:`_rebuilt` visits them)."""
    if isinstance(tree, Tensor):
        out.append(tree)
    elif isinstance(tree, dict):
        for value in tree.values():
            _leaves(value, out)
    elif isinstance(tree, list | tuple):
        for value in tree:
            _leaves(value, out)
    elif dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        for field in dataclasses.fields(tree):
            if field.init:
                _leaves(getattr(tree, field.name), out)


def _rebuilt(tree: Any, on_tensor: Callable[[Tensor], Any]) -> Any:
    """``tree`` rebuilt with ``on_tensor(t)`` for each tensor ``t``, in :func:`_leaves`' order."""
    if isinstance(tree, Tensor):
        return on_tensor(tree)
    if isinstance(tree, dict):
        return {key: _rebuilt(value, on_tensor) for key, value in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_rebuilt(value, on_tensor) for value in tree)
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        return dataclasses.replace(tree, **{field.name: _rebuilt(getattr(tree, field.name), on_tensor)
                                            for field in dataclasses.fields(tree) if field.init})
    return tree


def to_host(tree: Any) -> Any:
    """``tree`` with every tensor read into a NumPy array on the host (dicts, lists, tuples and
    dataclasses of tensors, as :func:`to_device` takes): where reads wait for a device, in one
    read (each tensor's bytes concatenated on the device, one copy, then viewed back with its
    dtype and shape), so a pass that keeps tensors on the device (the report's kept maps) reads
    them once, not once each; on the CPU, each tensor's own array."""
    leaves: list[Tensor] = []
    _leaves(tree, leaves)
    if not leaves or all(reads_are_free(leaf) for leaf in leaves):
        return _rebuilt(tree, lambda leaf: leaf.detach().numpy())
    flat = [leaf.detach().contiguous().reshape(-1).view(torch.uint8) for leaf in leaves]
    packed = torch.cat([part.to(flat[0].device) for part in flat]).cpu().numpy()
    arrays, offset = [], 0
    for leaf, part in zip(leaves, flat, strict=True):
        size = part.numel()
        dtype = np.dtype(str(leaf.dtype).removeprefix("torch."))  # bool, uint8, int64, float32, ...
        arrays.append(packed[offset : offset + size].view(dtype).reshape(leaf.shape))
        offset += size
    read = iter(arrays)
    return _rebuilt(tree, lambda leaf: next(read))
