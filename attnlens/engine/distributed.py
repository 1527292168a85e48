"""``torch.distributed`` (``torchrun``) for a pass: which process this is (:func:`world`), which
examples it runs (:func:`shard`, or by length :func:`interleaved`), and the collectives that end
a pass (every accumulator summed with ``all_reduce``, the counts gathered with
``all_gather_object``) or check that every rank was given the same settings. A failed collective
(a rank that died) is one clear :class:`~attnlens.errors.UnavailableError`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from attnlens.engine.accumulator import Accumulator
from attnlens.errors import InputError, UnavailableError


@dataclass(frozen=True)
class World:
    """This process's place in a ``torch.distributed`` run (rank 0 of 1 without one)."""

    rank: int = 0
    size: int = 1
    group: Any = None

    @property
    def distributed(self) -> bool:
        return self.size > 1


def world() -> World:
    """The current ``torch.distributed`` world, or a single process."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch without distributed
        return World()
    if not (dist.is_available() and dist.is_initialized()):
        return World()
    return World(rank=dist.get_rank(), size=dist.get_world_size())


def shard(n_examples: int, batch_size: int, rank: int, size: int) -> tuple[int, int]:
    """``(start, stop)`` of rank ``rank``'s contiguous, batch-aligned share of ``n_examples``:
    the corpus's ``ceil(n / batch_size)`` batches are split as evenly as whole batches allow, so
    every batch is the one a single process would run."""
    n_batches = math.ceil(n_examples / batch_size)
    first = rank * n_batches // size
    last = (rank + 1) * n_batches // size
    return min(first * batch_size, n_examples), min(last * batch_size, n_examples)


def interleaved(n_examples: int, batch_size: int, rank: int, size: int) -> list[int]:
    """The batches (numbers in the pass's order) of rank ``rank``'s share of a pass by length:
    every ``size``-th of the ``ceil(n / batch_size)`` batches from batch ``rank``, so that every
    rank runs short and long batches alike (a contiguous share of batches sorted by length would
    give the last rank the longest); every batch is the one a single process would run."""
    return list(range(rank, math.ceil(n_examples / batch_size), size))


def _collective(what: str, function: Callable[[], Any], current: World) -> Any:
    """Run a collective; a failure (a rank that died) becomes one clear error."""
    try:
        return function()
    except Exception as error:  # gloo/NCCL raise RuntimeError / DistBackendError
        raise UnavailableError(
            f"rank {current.rank} of {current.size}: {what} failed ({str(error).splitlines()[0][:200]}); "
            "another rank probably died. Run the same command again: with --checkpoint each rank "
            "resumes from its own checkpoint."
        ) from None


def check_same_settings(settings: str, current: World) -> None:
    """Refuse a pass whose ranks were given different ``settings`` (its header as JSON, the
    corpus's fingerprint included): one :class:`~attnlens.errors.InputError` naming the ranks
    that differ from rank 0."""
    import torch.distributed as dist

    gathered: list[Any] = [None] * current.size
    _collective(
        "comparing settings", lambda: dist.all_gather_object(gathered, settings), current
    )
    if len(set(gathered)) > 1:
        differing = [rank for rank, value in enumerate(gathered) if value != gathered[0]]
        raise InputError(
            f"the ranks of this torchrun were given different corpora or settings (ranks "
            f"{differing} differ from rank 0): give every rank the same command and files."
        )


def reduce_across_ranks(accumulators: Sequence[Accumulator], counts: dict[str, Any], current: World) -> None:
    """Every accumulator's states reduced over the ranks (:meth:`Accumulator.all_reduce`, each
    state by its own reduction), and the pass's ``counts`` summed (``longest``: the maximum), in
    place: every rank then holds the whole corpus's."""
    import torch.distributed as dist

    for accumulator in accumulators:
        _collective(f"reducing {accumulator.name}", accumulator.all_reduce, current)
    gathered: list[Any] = [None] * current.size
    _collective("gathering counts", lambda: dist.all_gather_object(gathered, counts), current)
    kinds = {part["pairs"] for part in gathered if part["pairs"] is not None}
    if len(kinds) > 1:
        raise InputError("The corpus mixes single sentences and sentence pairs across ranks.")
    for key in ("examples", "tokens", "truncated"):
        counts[key] = sum(part[key] for part in gathered)
    counts["longest"] = max(part.get("longest", 0) for part in gathered)
    counts["pairs"] = kinds.pop() if kinds else None
