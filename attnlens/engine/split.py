"""A batch that runs out of device memory, split in halves and run again (:class:`Split`),
with the accumulators' state put back as it was before the failed try.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from attnlens.core.modes import version
from attnlens.engine.accumulator import Accumulator
from attnlens.engine.batches import Staged
from attnlens.errors import ModelBehaviourError


class Split:
    """Runs each batch of a pass, and the halves of one that runs out of device memory.

    A batch whose forward (or copy to the device) raises ``torch.OutOfMemoryError``
    (``torch.cuda.OutOfMemoryError`` is the same class) is split in two halves, re-tokenized on
    the host, and each half is run, split again if it fails too, down to one example; one example
    that does not fit re-raises the error, with the state as it was before that example, so that
    the pass writes its checkpoint (if it has one) before it stops. The first batch that fits
    after a failure warns once, naming its size; every later batch of the pass is then run in
    parts of at most that size (:attr:`limit`; it only shrinks), rather than failing again.
    Splitting is only done when every accumulator is :attr:`~attnlens.engine.accumulator.Accumulator.any_order` (its result
    does not depend on which examples share a batch): the result is then that of the unsplit pass
    up to float32 rounding of per-batch sums (a sum over ``B`` rows in float32 is within
    ``(B - 1)·2⁻²⁴`` of its exact value, relatively; split, within the same bound), and of a
    forward at another padded length. Otherwise the error is raised, the state put back.

    A failed batch leaves no partial state: before each batch, the versions of the
    accumulators' state tensors (``Tensor._version``, a host counter that every in-place change
    bumps) are noted, and the state of the accumulators that change it during a forward (before
    :meth:`~attnlens.engine.accumulator.Accumulator.end_batch`) is copied on the device (one multi-tensor copy per dtype, :func:`_copies`; no host read); after a
    failure, that copy is put back (:meth:`~attnlens.engine.accumulator.Accumulator.load_state_dict`). Which accumulators those
    are is learnt on the pass's first batch, for which every state is copied: :class:`~attnlens.methods.papa.fitting.PatternSums`
    and others that add their batch in ``end_batch`` are never copied after it, so the normal path
    costs a few attribute reads per batch (and a copy of the small states of accumulators that
    add in ``update``, such as :class:`attnlens.methods.stats.Statistics`)."""

    def __init__(self, accumulators: Sequence[Accumulator], stage: Callable[[list], Staged],
                 device: torch.device, state: dict[str, Any], *, splits: bool) -> None:
        self.accumulators, self.stage, self.device, self.splits = list(accumulators), stage, device, splits
        self.state = state  # run's: "consistent" is set again once the state is put back
        self.limit: int | None = None  # after a failure: the most examples run at once
        self.writers: set[int] | None = None  # accumulators that change their state in a forward
        self.warned = False

    def run(self, host: Staged, start: int, one: Callable[[Staged, int, Callable[[], None]], None]) -> None:
        """Run ``host`` (its first row is example ``start`` of the pass) with ``one``, in parts
        of at most :attr:`limit` examples, halving a part that runs out of memory."""
        pending = [host]
        while pending:
            part = pending.pop(0)
            if self.limit is not None and len(part.chunk) > self.limit:
                pairs = list(zip(part.indices, part.chunk, strict=True))
                pending[:0] = [self.stage(pairs[i : i + self.limit]) for i in range(0, len(pairs), self.limit)]
            elif self._attempt(part, start, one):
                start += len(part.chunk)
            else:  # out of memory: the limit is now below its size, and it is split above
                pending.insert(0, part)

    def _versions(self) -> list[list[Any]]:
        """Each state tensor's version (:func:`attnlens.core.modes.version`: a state made under
        ``torch.inference_mode`` is always changed, always copied)."""
        return [[version(value) for value in a.state_dict().values()]
                for a in self.accumulators]

    def _attempt(self, host: Staged, start: int, one: Callable[[Staged, int, Callable[[], None]], None]) -> bool:
        """Run ``host``: True; or False when it ran out of memory (the state put back, and
        :attr:`limit` lowered to half its size); the error when it cannot be split."""
        before = self._versions()
        chosen = [i for i in range(len(self.accumulators)) if self.writers is None or i in self.writers]
        states = _copies([self.accumulators[i].state_dict() for i in chosen])
        copied = {i: (state, self.accumulators[i].metadata()) for i, state in zip(chosen, states, strict=True)}

        ended: list[bool] = []

        def forwarded() -> None:  # which accumulators changed their state during the forward
            changed = {i for i, (now, then) in enumerate(zip(self._versions(), before, strict=True)) if now != then}
            self.writers = changed | (self.writers or set())
            ended.append(True)

        try:
            one(host, start, forwarded)
        except torch.OutOfMemoryError:
            self._put_back(before, copied, after_forward=bool(ended))
            self.state["consistent"] = True  # as before the batch: a checkpoint may be written
            if not self.splits or len(host.chunk) == 1:
                raise
        else:
            if self.limit is not None and not self.warned:
                self.warned = True
                warnings.warn(
                    f"out of memory on {self.device}: batches are split in halves until they fit; a "
                    f"batch of {len(host.chunk)} examples fitted, and the pass goes on with batches "
                    f"of at most {self.limit} examples (the same result up to float32 rounding; pass "
                    f"batch_size={self.limit} to avoid the failed tries).",
                    stacklevel=6)  # the caller of passes.run: above Split.run, _Pass._batch, _Pass.batches, run
            return True
        # returned out of the except block: the failed forward's tensors (held by the traceback) are freed
        half = (len(host.chunk) + 1) // 2
        self.limit = half if self.limit is None else min(self.limit, half)
        return False

    def _put_back(self, before: list[list[int]], copied: dict[int, tuple[dict[str, Tensor], dict[str, Any]]],
                  *, after_forward: bool) -> None:
        """The state as it was before the failed batch: the copies of the accumulators whose
        state changed; an unchanged state stays. A change without a copy (an accumulator that adds
        its batch at its end, whose state is not copied, or that never changed its state in a
        forward before) cannot be undone: the error then says so."""
        for i, (now, then) in enumerate(zip(self._versions(), before, strict=True)):
            if now == then:
                continue
            if i not in copied:
                where = ("after the forward, at the batch's end (a batch is split only when its forward "
                         f"runs out), when accumulator {self.accumulators[i].name!r} had already added the batch"
                         if after_forward else
                         f"and accumulator {self.accumulators[i].name!r} changed its state during it where no "
                         "earlier batch did")
                raise ModelBehaviourError(
                    f"out of memory in a batch {where}, so the state cannot be put back; run the pass "
                    "again with a smaller batch_size (from its checkpoint, if it has one).")
            state, metadata = copied[i]
            self.accumulators[i].load_state_dict(state, metadata)


def _copies(states: list[dict[str, Tensor]]) -> list[dict[str, Tensor]]:
    """Copies of every tensor of ``states``, made by one multi-tensor copy per device and dtype
    (``torch._foreach_copy_``, as PyTorch's optimizers update their parameters): on a GPU a
    kernel or two for all of them, rather than one per tensor."""
    copies = [{key: torch.empty_like(value) for key, value in state.items()} for state in states]
    groups: dict[tuple[torch.device, torch.dtype], tuple[list[Tensor], list[Tensor]]] = {}
    for state, copy in zip(states, copies, strict=True):
        for key, value in state.items():
            targets, sources = groups.setdefault((value.device, value.dtype), ([], []))
            targets.append(copy[key])
            sources.append(value)
    for targets, sources in groups.values():
        torch._foreach_copy_(targets, sources)
    return copies
