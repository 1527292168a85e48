"""The batches of a pass, on the host: the corpus read lazily in consecutive lists
(:func:`chunks`) in the pass's order (:func:`pass_order`: the corpus's, or by length), each list
tokenized and counted (:func:`stage_batch`), one batch ahead in a worker thread off the CPU
(:func:`staged_ahead`); and the progress bar that counts them (:func:`progress_bar`).
"""

from __future__ import annotations

import concurrent.futures
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from attnlens.core.corpus import corpus_iterator
from attnlens.core.inputs import Batch, by_length, compact_batch, example_kind, tokenize
from attnlens.core.layouts import BlankText
from attnlens.core.notebook import in_notebook
from attnlens.errors import InputError


def chunks(corpus: Iterable, size: int) -> Iterator[list]:
    """Consecutive lists of ``size`` examples (the last one may be shorter), read lazily."""
    if size < 1:
        raise InputError(f"batch_size must be at least 1, got {size}")
    chunk: list = []
    for item in corpus_iterator(corpus):
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def progress_bar(
    corpus: Any, description: str, enabled: bool, *, initial: int = 0, unit: str = "example"
) -> Any:
    """A tqdm bar counting examples of ``corpus`` (its length is the total when it has one, so
    the bar shows a percentage and an ETA); ``enabled=False`` gives a silent bar.

    In a Jupyter kernel with ``ipywidgets`` installed the bar is a widget (``tqdm.notebook``);
    anywhere else, a notebook without ``ipywidgets`` included, it is tqdm's plain text bar on
    stderr, never tqdm's "IProgress not found" warning (:func:`tqdm_class`).
    """
    total = len(corpus) if hasattr(corpus, "__len__") else None
    return tqdm_class()(
        total=total, initial=initial, desc=description, unit=unit, disable=not enabled,
        dynamic_ncols=True,
    )


def tqdm_class() -> type:
    """``tqdm.notebook.tqdm`` (a widget) in a Jupyter kernel where ``ipywidgets`` imports, else
    ``tqdm.std.tqdm`` (text). Unlike ``tqdm.auto`` it never warns: without ``ipywidgets`` a
    notebook simply gets the text bar."""
    if in_notebook():
        try:
            import ipywidgets  # noqa: F401  (tqdm.notebook needs it for its widget)
            from tqdm.notebook import IProgress
            from tqdm.notebook import tqdm as notebook_tqdm
        except ImportError:
            pass
        else:
            if IProgress is not None:
                return notebook_tqdm
    from tqdm.std import tqdm

    return tqdm



def pass_order(examples: Iterable, tokenizer: Any, window: int | None, *,
               sizes: dict[int, int] | None = None) -> Iterator[tuple[int, Any]]:
    """``(corpus index, example)`` of every example, in the order a pass runs them: the corpus's
    (``window=None``), or each ``window`` of consecutive examples from its shortest to its
    longest (:func:`_length_order`; :func:`~attnlens.engine.passes.run` by length uses
    :data:`~attnlens.engine.passes.BY_LENGTH_BATCHES` ``* batch_size``). Lazy: a window is read
    when the pass reaches it. ``sizes``: filled with the number of examples of each window read,
    by the position of its first example (only the corpus's last window may be shorter than
    ``window``).

    By length, each batch holds examples of similar lengths (the embedded corpus: 0.48x the
    positions of batches in its order), with the same results up to float32 rounding of sums
    taken in another order. The order depends only on the sequence of examples, so a list and a
    generator of the same examples run the same batches, and a resumed pass meets them in the
    same order."""
    numbered = enumerate(examples)
    if window is None:
        yield from numbered
        return
    position = 0
    while part := list(itertools.islice(numbered, window)):
        if sizes is not None:
            sizes[position] = len(part)
        position += len(part)
        order = _length_order(tokenizer, [example for _, example in part])
        yield from part if order is None else (part[index] for index in order)


def _length_order(tokenizer: Any, examples: list) -> list[int] | None:
    """:func:`attnlens.core.inputs.by_length` of ``examples``, or ``None`` (their order) when they
    are not all strings, all pairs or all words: :func:`attnlens.core.inputs.tokenize` then names
    the example that is not one."""
    kinds = {example_kind(example) for example in examples}
    if len(kinds) != 1 or None in kinds:
        return None
    try:
        return by_length(tokenizer, examples)
    except (TypeError, ValueError):  # a tokenizer that cannot take them: tokenize says why
        return None


@dataclass
class Staged:
    """The host side of one batch: the corpus ``indices`` and examples (``chunk``) of its rows,
    the tokenized ``batch`` and its counts (``numbers``: examples, real tokens, truncated,
    pairs, longest), read off host tensors."""

    indices: list[int]
    chunk: list
    batch: Batch
    numbers: dict[str, Any]


def stage_batch(model: Any, pairs: list, *, max_len: int, layout: str, compact: bool, multiple: int = 1) -> Staged:
    """Tokenize and count ``pairs`` (``(corpus index, example)``) on the host (no device tensor
    is read); safe to run in a worker thread, since it touches no accumulator."""
    indices, chunk = [index for index, _ in pairs], [example for _, example in pairs]
    try:
        batch = tokenize(model, chunk, max_len=max_len, layout=layout, compact=False)
    except BlankText as blank:  # name the text by its index in the corpus
        raise blank.at(indices[blank.index]) from None
    if compact and layout == "papa":
        batch = compact_batch(batch, multiple=multiple)
    lengths = batch.attention_mask.sum(-1)
    numbers = {"examples": len(batch), "tokens": int(lengths.sum()), "truncated": int(batch.n_truncated),
               "pairs": bool(batch.is_pair), "longest": int(lengths.max())}
    return Staged(indices, chunk, batch, numbers)


def staged_ahead(device: torch.device, stage: Callable[[list], Staged]) -> Callable[[Iterable[list]], Iterator[Staged]]:
    """``stage`` over chunks of a corpus: in line on a CPU (its cores run the forward), one chunk
    ahead in a worker thread on another device (concurrent.futures), so that the host prepares
    batch k + 1 while the device runs batch k."""
    def inline(parts: Iterable[list]) -> Iterator[Staged]:
        return map(stage, parts)

    def threaded(parts: Iterable[list]) -> Iterator[Staged]:
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="attnlens-input") as pool:
            pending = None
            for part in parts:
                upcoming = pool.submit(stage, part)
                if pending is not None:
                    yield pending.result()
                pending = upcoming
            if pending is not None:
                yield pending.result()

    return inline if device.type == "cpu" else threaded
