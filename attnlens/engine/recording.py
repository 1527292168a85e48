"""A pass's patterns kept for a later pass over the same batches (:class:`Recording`).

Some analyses need two passes over one corpus: :func:`attnlens.compare` with the ``papa`` view
first fits the constants (the mean of every head's pattern) and then compares each batch's
patterns with them. Both passes run the same model on the same batches, so the second forward
would compute the very patterns the first one did. A :class:`Recording` handed to the first pass
(``passes.run(..., record=recording)``) keeps each batch's patterns (and values) as the model made
them, up to a memory budget; the second pass (``passes.run(..., replay=recording)``) hands the
kept layers of a batch to its accumulators instead of running the forward, and runs the forward
for any batch it does not hold (one beyond the budget, or split after running out of memory).

A batch is replayed only when it is the same batch: the same model (its weights' fingerprint),
layout, ``max_len``, batch size and order (the passes' headers, :func:`attnlens.engine.passes.run`),
and the same inputs, compared on the host (token ids, mask, token types and positions; no read of
the device). The accumulators then see the same tensors a forward would make (a forward is
deterministic on the same inputs), so a replayed pass gives the result of a live one exactly
(``tests/contract/test_accumulators.py``, property 6). What a replay cannot give: the model's
output, the residual stream, gradients, other hook points, or interventions (``hooks=``): a pass
that needs one of them refuses a replay.

Memory: the kept tensors stay where the model made them (on a GPU, device memory), up to
``1 / share`` of the memory free on that device when the first batch is kept
(:func:`attnlens.core.devices.free_bytes`); the recording frees them when it is dropped
(:meth:`Recording.clear`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from attnlens.core import devices
from attnlens.core.inputs import Batch

#: a recording keeps at most 1 / RECORD_SHARE of the memory free on the model's device when its
#: first batch is kept (MiniLM on the embedded corpus, 485 texts at max_len 128 in batches of 32:
#: 0.66 GB of patterns, 0.93 GB with the values)
RECORD_SHARE = 4

#: what two passes must share, of their headers (:func:`attnlens.engine.passes._header`), for one to
#: replay the other's batches
SAME_PASS = ("model", "fingerprint", "layout", "max_len", "batch_size", "order", "world_size", "rank")


@dataclass
class _Kept:
    """One batch kept: its host ``inputs`` (to recognise it), where it starts in the pass, and
    each layer's ``(pattern, values)`` as the forward handed them to the pass."""

    start: int
    inputs: Batch
    layers: list[tuple[Tensor, Tensor | None]] = field(default_factory=list)


class Recording:
    """Each batch's patterns (and, with ``values=True``, values per key-value head) of one pass, for
    a later pass over the same batches (see the module docstring).

    ``values``: keep the values too (what effective attention and norm-based attention read); the
    recording pass then reads its value hooks even if its accumulators do not. ``share``: keep at
    most ``1 / share`` of the device's free memory (default :data:`RECORD_SHARE`).

    After the recording pass, :attr:`n_batches` batches are held, :attr:`n_bytes` bytes;
    :attr:`complete` says whether every batch of the pass was kept.
    """

    def __init__(self, *, values: bool = True, share: int = RECORD_SHARE) -> None:
        self.values = bool(values)
        self.share = int(share)
        self.header: dict[str, Any] | None = None
        self.kept: dict[int, _Kept] = {}
        self.n_bytes = 0
        self.limit: int | None = None
        self.complete = True
        self._current: _Kept | None = None

    @property
    def n_batches(self) -> int:
        return len(self.kept)

    def begin(self, header: Mapping[str, Any]) -> None:
        """The recording pass starts (its header, with ``hooks``: the key of its interventions,
        ``"none"`` without; only such a recording is replayed): what was kept before is dropped."""
        self.clear()
        self.header = dict(header)

    def clear(self) -> None:
        """Drop every kept tensor."""
        self.kept, self.n_bytes, self.limit, self.complete, self._current = {}, 0, None, True, None

    def start_batch(self, start: int, inputs: Batch) -> None:
        """A batch whose first row is example ``start`` of the pass starts (its host ``inputs``);
        a batch started before and not ended (it ran out of memory) is not kept."""
        self._current = _Kept(start, inputs) if self.complete else None

    def add(self, pattern: Tensor, values: Tensor | None) -> None:
        """The next layer of the current batch, as the forward handed it to the pass."""
        current = self._current
        if current is None:
            return
        size = _nbytes((pattern, values))
        if self.limit is None:
            self.limit = devices.free_bytes(pattern.device) // self.share
        if self.n_bytes + size > self.limit:  # the budget is spent: this batch and the later ones run again
            self._current, self.complete = None, False
            self.n_bytes -= sum(_nbytes(layer) for layer in current.layers)
            return
        current.layers.append((pattern, values))
        self.n_bytes += size

    def end_batch(self, n_layers: int) -> None:
        """The current batch ended with its ``n_layers`` layers: it is kept."""
        current, self._current = self._current, None
        if current is not None and len(current.layers) == n_layers:
            self.kept[current.start] = current

    def find(self, header: Mapping[str, Any], start: int, inputs: Batch) -> list[tuple[Tensor, Tensor | None]] | None:
        """The layers kept of the batch of another pass (its ``header``) that starts at example
        ``start`` with host ``inputs``, or None when this recording does not hold that batch."""
        if self.header is None or self.header.get("hooks") != "none" or any(
                self.header.get(key) != header.get(key) for key in SAME_PASS):
            return None
        kept = self.kept.get(start)
        if kept is None or not same_inputs(kept.inputs, inputs):
            return None
        return kept.layers


def _nbytes(layer: tuple[Tensor, Tensor | None]) -> int:
    """The bytes a kept layer holds: its tensors' storages (a view keeps all of its storage)."""
    return sum(t.untyped_storage().nbytes() for t in layer if t is not None)


def same_inputs(a: Batch, b: Batch) -> bool:
    """Whether two host batches are the same inputs of a forward: token ids, mask, token types,
    positions and layout (tensors compared on the host)."""
    scalars = ("layout", "max_len", "is_pair", "token_types", "positions_from_mask", "counts_positions")
    if any(getattr(a, name) != getattr(b, name) for name in scalars):
        return False
    tensors: Sequence[tuple[Tensor | None, Tensor | None]] = [
        (a.input_ids, b.input_ids), (a.attention_mask, b.attention_mask),
        (a.token_type_ids, b.token_type_ids), (a.position_ids, b.position_ids),
    ]
    return all(
        (x is None and y is None) or (x is not None and y is not None and x.shape == y.shape and torch.equal(x, y))
        for x, y in tensors
    )
