"""Checkpoints of a pass, and the signals that write one: a pass with ``checkpoint=`` writes its
accumulators' state and its counts atomically (:func:`save_checkpoint`, safetensors with a
checksum) every few batches, at an interrupt (Ctrl-C, SIGTERM: :class:`InterruptingSignals`) and at the end;
run again, it resumes (:func:`resume`) only the same model, settings, world size and corpus (a
fingerprint of the examples consumed is recorded), or a longer corpus that starts with them
(:class:`Tail`). Under ``torch.distributed`` each rank writes its own file
(:func:`checkpoint_path`).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import itertools
import json
import os
import signal
import threading
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from attnlens.core.files import (
    check_sealed,
    clean_temporaries,
    safetensors_bytes,
    verify_checksum,
    write_atomic,
)
from attnlens.core.inputs import Words
from attnlens.engine.accumulator import Accumulator
from attnlens.engine.distributed import World
from attnlens.errors import DamagedFileError, FileFormatError, InputError

#: format of checkpoint files written by :func:`attnlens.engine.passes.run`
CHECKPOINT_FORMAT = "attnlens.pass/1"


class CorpusFingerprint:
    """A running SHA-256 of the examples of a corpus, in order."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()

    def update(self, examples: Iterable) -> None:
        for example in examples:
            if isinstance(example, Words):
                example = {"words": list(example.words)}
            self.digest.update(json.dumps(example, ensure_ascii=False).encode())
            self.digest.update(b"\n")

    def hexdigest(self) -> str:
        return self.digest.hexdigest()


def checkpoint_path(checkpoint: str | os.PathLike, current: World) -> Path:
    """Each rank's own checkpoint file: ``checkpoint`` itself for a single process, else
    ``<stem>.rank<r>-of-<n><suffix>`` beside it."""
    path = Path(checkpoint)
    if not current.distributed:
        return path
    return path.with_name(f"{path.stem}.rank{current.rank}-of-{current.size}{path.suffix}")


def check_world_size(checkpoint: str | os.PathLike, current: World) -> None:
    """Refuse to start when ``checkpoint`` was written by a run of another number of processes
    (its own file, or per-rank files of another world size, are there instead of this run's)."""
    path = Path(checkpoint)
    mine = checkpoint_path(path, current)
    found = [path] if path.exists() and current.distributed else []
    found += sorted(
        other for other in path.parent.glob(f"{glob.escape(path.stem)}.rank*-of-*{glob.escape(path.suffix)}")
        if other.name != mine.name
        and not other.name.endswith(f"-of-{current.size}{path.suffix}")
    ) if path.parent.is_dir() else []
    if found:
        raise InputError(
            f"checkpoint {found[0]} was written by a run of another number of processes than "
            f"this one ({current.size}); resume it with the same torchrun --nproc_per_node and "
            "--nnodes, or give another checkpoint path."
        )


def save_checkpoint(
    path: Path, accumulators: Sequence[Accumulator], counts: dict[str, Any], header: dict[str, Any],
    tail: Tail | None = None,
) -> None:
    """Write every accumulator's state and the pass's counts atomically to ``path``; with
    ``tail``, also the state and counts at the start of the unfinished last unit of the pass
    (:class:`Tail`: tensors ``@tail/<name>/<key>``, metadata ``tail``)."""
    tensors: dict[str, Tensor] = {}
    for accumulator in accumulators:
        for key, value in accumulator.state_dict().items():
            tensors[f"{accumulator.name}/{key}"] = value.detach().cpu().contiguous()
    metadata = {  # safetensors_bytes adds the checksum
        "format": CHECKPOINT_FORMAT,
        "header": json.dumps(header, sort_keys=True),
        "counts": json.dumps(counts, sort_keys=True),
        "accumulators": json.dumps(
            {a.name: a.metadata() for a in accumulators}, sort_keys=True
        ),
    }
    if tail is not None:
        for name, state in tail.states.items():
            for key, value in state.items():
                tensors[f"{TAIL}{name}/{key}"] = value.contiguous()
        indices, examples = tail.seen()
        metadata["tail"] = json.dumps({"counts": tail.counts, "accumulators": tail.metadata, "size": tail.size,
                                       "indices": indices, "examples": examples}, sort_keys=True)
    write_atomic(path, safetensors_bytes(tensors, metadata))


def read_checkpoint(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """The metadata (``header``, ``counts``, ``accumulators``, parsed) and tensors of a
    checkpoint written by :func:`~attnlens.engine.passes.run`; ``ValueError`` naming the file if it is not one."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            raw = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}

        if raw.get("format") != CHECKPOINT_FORMAT:
            check_sealed(path, raw, tensors)
            raise InputError(f"its format is {raw.get('format')!r}, not {CHECKPOINT_FORMAT!r}")
        verify_checksum(path, raw, tensors)
        meta = {key: json.loads(raw[key]) for key in ("header", "counts", "accumulators")}
        meta["tail"] = json.loads(raw["tail"]) if "tail" in raw else None
    except DamagedFileError:
        raise
    except (SafetensorError, ValueError, KeyError, json.JSONDecodeError) as error:
        raise FileFormatError(
            f"{path} is not an attnlens checkpoint (one written by a pass with checkpoint=...): {error}"
        ) from None
    return meta, tensors


#: how a checkpoint's header names interventions without a key (functions of the user's): by
#: their hook points alone, so a resume warns that it cannot tell whether they are the same
UNKNOWN_HOOKS = "hooks without a key"


def _restore(
    path: Path, accumulators: Sequence[Accumulator], header: dict[str, Any]
) -> tuple[dict[str, Any], Tail | None]:
    """Load a checkpoint's states into ``accumulators``; its counts and its :class:`Tail` (or
    None). Refuses another setting."""
    meta, tensors = read_checkpoint(path)
    saved = {"order": "corpus", **meta["header"]}  # checkpoints before passes by length ran in corpus order
    differing = [
        f"{key} {saved.get(key)!r} (now {value!r})"
        for key, value in header.items()
        if key not in ("corpus",) and saved.get(key) != value
    ]
    if differing:
        raise InputError(
            f"checkpoint {path} was written by another run: {'; '.join(differing)}. Resume it "
            "with the same settings, or give another checkpoint path."
            + (" (by_length=False runs the corpus in its order, by_length=True by length.)"
               if saved.get("order") != header.get("order") else "")
        )
    if str(saved.get("hooks", "")).startswith(UNKNOWN_HOOKS):
        warnings.warn(
            f"checkpoint {path} was written under hooks attnlens cannot identify ({saved['hooks']}): "
            "resuming assumes they are the same functions as now. Give hooks a key (attnlens.engine.hooks.Hooks"
            "(pairs, key=...)), and pass those on the model as hooks=, to have it checked.",
            UserWarning, stacklevel=4,
        )
    for accumulator in accumulators:
        prefix = f"{accumulator.name}/"
        state = {key[len(prefix):]: value for key, value in tensors.items() if key.startswith(prefix)}
        accumulator.load_state_dict(state, meta["accumulators"].get(accumulator.name, {}))
    tail = None
    if meta["tail"] is not None:
        states: dict[str, dict[str, Tensor]] = {}
        for key, value in tensors.items():
            if key.startswith(TAIL):
                name, _, rest = key[len(TAIL):].rpartition("/")
                states.setdefault(name, {})[rest] = value
        saved = meta["tail"]
        tail = Tail(saved["counts"], states, saved["accumulators"], saved["size"],
                    recorded=(saved["indices"], saved["examples"]))
    return meta["counts"], tail


#: the prefix of a checkpoint's tensors that hold the state at the start of its last unit
TAIL = "@tail/"


@dataclass
class Tail:
    """The state of a pass at the start of its last unit of examples when that unit is
    unfinished: the corpus ended inside it (a batch shorter than ``batch_size`` in corpus order,
    a window shorter than ``BY_LENGTH_BATCHES * batch_size`` by length). A checkpoint written
    inside such a unit keeps it, so that the pass can resume on a longer corpus that starts with
    the same examples: it goes back to the unit's start and runs the unit as the longer corpus
    makes it (more rows in the batch, another length order in the window), exactly as a pass
    over the whole longer corpus would. ``counts``: the pass's counts then (``corpus``: the
    fingerprint of the examples before it); ``states``: each accumulator's :meth:`~attnlens.engine.accumulator.Accumulator.state_dict`,
    on the host; ``metadata``: each one's :meth:`~attnlens.engine.accumulator.Accumulator.metadata`; ``size``: the examples
    of the unit; ``unit``: the ``(corpus index, example)`` pairs the pass ran of it so far
    (``recorded``: their indices and fingerprint, in corpus order, read from a checkpoint)."""

    counts: dict[str, Any]
    states: dict[str, dict[str, Tensor]]
    metadata: dict[str, Any]
    size: int
    unit: list[tuple[int, Any]] = field(default_factory=list)
    recorded: tuple[list[int], str] | None = None

    def seen(self) -> tuple[list[int], str]:
        """The corpus indices of the examples of the unit run so far, in order, and the
        fingerprint of those examples in that order."""
        if self.recorded is not None and not self.unit:
            return self.recorded
        ordered = sorted(self.unit, key=lambda pair: pair[0])
        fingerprint = CorpusFingerprint()
        fingerprint.update([example for _, example in ordered])
        return [index for index, _ in ordered], fingerprint.hexdigest()

    @classmethod
    def take(cls, accumulators: Sequence[Accumulator], counts: dict[str, Any], corpus: str, size: int) -> Tail:
        """The current state (copied to the host: once per pass, at the start of its last unit)."""
        return cls({**counts, "corpus": corpus},
                   {a.name: {key: value.detach().to("cpu", copy=True) for key, value in a.state_dict().items()}
                    for a in accumulators},
                   {a.name: a.metadata() for a in accumulators}, size)

    def load(self, accumulators: Sequence[Accumulator]) -> dict[str, Any]:
        """Put the state back into ``accumulators``; the counts."""
        for accumulator in accumulators:
            state = {key: value.clone() for key, value in self.states.get(accumulator.name, {}).items()}
            accumulator.load_state_dict(state, self.metadata.get(accumulator.name, {}))
        return dict(self.counts)


class InterruptingSignals:
    """Inside it, SIGTERM (what ``timeout``, Slurm and ``docker stop`` send) raises
    ``KeyboardInterrupt`` like Ctrl-C, so an interrupted pass saves its checkpoint; a second
    signal while the checkpoint is written waits for the write (:meth:`saving`)."""

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}
        self.pending: int | None = None
        self.deferring = False
        self.batching = False

    def __enter__(self) -> InterruptingSignals:
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGTERM, signal.SIGINT):
                self.previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for number, handler in self.previous.items():
            signal.signal(number, handler)

    def _handle(self, number: int, frame: Any) -> None:
        if self.deferring or (self.batching and self.pending is None):
            self.pending = number  # during a batch, the first signal waits for its end
            return
        raise KeyboardInterrupt(f"signal {signal.Signals(number).name}")

    def end_batch(self) -> None:
        """End of a batch (started by setting :attr:`batching`): a signal that came during it
        interrupts now, when the batch is counted, so the checkpoint written on the way out
        holds it (a second signal during a batch interrupts at once)."""
        self.batching = False
        if self.pending is not None:
            number, self.pending = self.pending, None
            raise KeyboardInterrupt(f"signal {signal.Signals(number).name}")

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        self.deferring = True
        try:
            yield
        finally:
            self.deferring = False
        if self.pending is not None:
            number, self.pending = self.pending, None
            raise KeyboardInterrupt(f"signal {signal.Signals(number).name}")


@dataclass
class Start:
    """Where a pass starts: its checkpoint file (``path``, None without one), the ``counts`` and
    corpus ``fingerprint`` of the examples run before (none, or a checkpoint's), the
    :class:`Tail` to keep (or None), how many examples were ``resumed``, and ``numbered``, the
    ``(corpus index, example)`` pairs still to run."""

    path: Path | None
    counts: dict[str, Any]
    fingerprint: CorpusFingerprint
    tail: Tail | None
    resumed: int
    numbered: Iterator[tuple[int, Any]]


def resume(
    checkpoint: str | os.PathLike | None, accumulators: Sequence[Accumulator], header: dict[str, Any],
    numbered: Iterator[tuple[int, Any]], *, sizes: dict[int, int], window: int | None, current: World,
) -> Start:
    """Load ``checkpoint`` (if it exists) into ``accumulators`` and skip the examples it
    consumed of ``numbered`` (the pass's order; ``sizes`` and ``window`` as
    :func:`attnlens.engine.batches.pass_order` fills and took them), refusing another corpus or
    settings (``header``); a fresh start without one."""
    counts: dict[str, Any] = {
        "examples": 0, "tokens": 0, "truncated": 0, "pairs": None, "corpus": None, "longest": 0,
    }
    fingerprint = CorpusFingerprint()
    path = checkpoint_path(checkpoint, current) if checkpoint is not None else None
    tail: Tail | None = None  # the state at the start of an unfinished last unit (see Tail)
    if path is not None:
        clean_temporaries(path)
        check_world_size(checkpoint, current)
        if path.exists():
            counts, tail = _restore(path, accumulators, header)
    resumed = counts["examples"]
    consumed = list(itertools.islice(numbered, resumed))
    fingerprint.update([example for _, example in consumed])
    if len(consumed) < resumed:
        raise InputError(
            f"checkpoint {path} has consumed {resumed} examples but the corpus has only "
            f"{len(consumed)}: it belongs to another corpus."
        )
    same = fingerprint.hexdigest() == counts["corpus"]
    if resumed and tail is not None and not current.distributed:
        # The checkpoint ended inside the corpus's last unit (a short batch, or a short window
        # by length). If this corpus makes that unit longer (it goes on past it), go back to the
        # unit's start: the pass then runs it as a pass over this whole corpus does (a fuller
        # batch; a window in another length order), and the result is the same bit for bit.
        start = tail.counts["examples"]
        longer, numbered = _longer_unit(tail, consumed, numbered, same=same, sizes=sizes, window=window)
        before = CorpusFingerprint()
        before.update([example for _, example in consumed[:start]])
        if longer and before.hexdigest() == tail.counts["corpus"]:
            counts, fingerprint, same = tail.load(accumulators), before, True
            numbered = itertools.chain(consumed[start:], numbered)
            resumed, tail = start, None  # taken again when the pass starts that unit
        elif same:
            tail.unit = consumed[start:]  # the same unit, resumed where it stopped
    if resumed and not same:
        raise InputError(
            f"checkpoint {path} was written for another corpus: the first {resumed} examples "
            "given now differ from those it consumed. Resume it with the same corpus, or give "
            "another checkpoint path." + ("" if window is None else (
                f" (The pass runs each window of {window} examples from the shortest to the longest; "
                "a checkpoint resumes on a longer corpus only if that corpus starts with the "
                "examples it consumed, in the same order.)"))
        )
    return Start(path, counts, fingerprint, tail, resumed, numbered)


def _longer_unit(
    tail: Tail, consumed: list[tuple[int, Any]], numbered: Iterator[tuple[int, Any]], *, same: bool,
    sizes: dict[int, int], window: int | None,
) -> tuple[bool, Iterator[tuple[int, Any]]]:
    """Whether this corpus makes the checkpoint's unfinished last unit (``tail``) longer, with the
    examples the pass ran of it (``consumed`` holds those before the checkpoint) at the same
    indices; and ``numbered`` with the examples read ahead to tell put back."""
    start = tail.counts["examples"]
    if window is None:
        following = next(numbered, None)
        if following is None:  # a short batch is the end of the corpus it was run on
            return False, numbered
        return same, itertools.chain([following], numbered)  # its examples: those the fingerprint covers
    if sizes.get(start, 0) <= tail.size:  # that window was read to consume the checkpoint's examples
        return False, numbered
    ahead = list(itertools.islice(numbered, start + sizes[start] - len(consumed)))
    found = dict([*consumed, *ahead][start:])  # the examples the unit ran must be there, at the same indices
    indices, recorded = tail.seen()
    mine = CorpusFingerprint()
    mine.update([found[index] for index in indices if index in found])
    kept = all(index in found for index in indices) and mine.hexdigest() == recorded
    return kept, itertools.chain(ahead, numbered)
