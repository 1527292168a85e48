"""Streaming a corpus through a model's attention patterns, one batch at a time.

Methods that summarise attention over a corpus (PAPA constants, attention statistics, compare)
share two small steps, kept here once:

- :func:`chunks`: read a corpus lazily, ``size`` examples at a time;
- :func:`run_patterns`: run a batch with hooks on ``hook_pattern`` and stop the forward right
  after the last layer's pattern hook: what follows (the last MLP and the LM head, a third of a
  MiniLM forward) is not needed to read attention;
- :func:`progress_bar`: the tqdm bar every corpus pass shows, counting examples.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from attnlens.inputs import Batch
from attnlens.seam import batch_key_mask


class _Stop(Exception):
    """Raised after the last layer's pattern hook: the rest of the forward is not needed."""


def corpus_iterator(corpus: Any) -> Iterator:
    """An iterator over ``corpus`` (strings or (str, str) pairs), refusing things that are not one:
    a single string, or a whole table (``datasets.Dataset``, ``pandas.DataFrame``, a dict of
    columns), whose iteration would give its column names, instead of one of its columns."""
    if isinstance(corpus, str | bytes):
        raise TypeError("corpus must be an iterable of strings or (str, str) pairs, not one string.")
    datasets, pandas = sys.modules.get("datasets"), sys.modules.get("pandas")
    tables = (datasets.Dataset, datasets.IterableDataset) if datasets is not None else ()
    tables += (pandas.DataFrame,) if pandas is not None else ()
    if isinstance(corpus, Mapping) or (tables and isinstance(corpus, tables)):
        columns = corpus.column_names if hasattr(corpus, "column_names") else list(corpus.keys())
        names = ", ".join(repr(name) for name in (columns or []))
        raise TypeError(
            f"Pass one column of the {type(corpus).__name__} (e.g. corpus[{names.split(', ')[0] or 'text'}]), "
            f"not the whole table (columns: {names})."
        )
    try:
        return iter(corpus)
    except TypeError as error:
        raise TypeError(
            f"corpus must be an iterable of strings or (str, str) pairs, got {type(corpus).__name__}."
        ) from error


def chunks(corpus: Iterable, size: int) -> Iterator[list]:
    """Consecutive lists of ``size`` examples (the last one may be shorter), read lazily."""
    if size < 1:
        raise ValueError(f"batch_size must be at least 1, got {size}")
    chunk: list = []
    for item in corpus_iterator(corpus):
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def progress_bar(corpus: Any, description: str, enabled: bool, *, initial: int = 0) -> Any:
    """A tqdm bar counting examples of ``corpus`` (its length is the total when it has one, so
    the bar shows a percentage and an ETA); ``enabled=False`` gives a silent bar."""
    from tqdm.auto import tqdm

    total = len(corpus) if hasattr(corpus, "__len__") else None
    return tqdm(
        total=total, initial=initial, desc=description, unit="example", disable=not enabled,
        dynamic_ncols=True,
    )


def device_of(model: Any) -> torch.device:
    """The device of the model's parameters (CPU for a model without any)."""
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def run_patterns(
    model: Any,
    batch: Batch,
    fwd_hooks: list[tuple[str | Callable, Callable]],
) -> int:
    """Run ``batch`` with ``fwd_hooks`` under ``torch.no_grad``, stopping after the last layer's
    ``hook_pattern`` hooks have run. Returns how many pattern hooks of the last layer fired
    (1 when the forward reached it)."""
    last = f"blocks.{model.cfg.n_layers - 1}.attn.hook_pattern"
    reached = 0

    def stop(pattern: Any, hook: Any) -> None:
        nonlocal reached
        reached += 1
        raise _Stop

    try:
        with torch.no_grad(), batch_key_mask(batch.attention_mask.bool()):
            model.run_with_hooks(
                batch.input_ids, **batch.model_kwargs(), fwd_hooks=[*fwd_hooks, (last, stop)]
            )
    except _Stop:
        pass
    return reached
