"""Fit PAPA constants: one pass of the engine (:mod:`attnlens.engine.passes`) over an unlabeled corpus.

This module is the one place where constants are averaged. :class:`PatternSums` is the pass's
accumulator: for every batch it sums ``attention × valid(query) × valid(key)`` and its square
over the batch at each layer's ``hook_pattern`` (in float32, one batch at a time), and adds the
batch totals into float64 running sums together with the number of valid ``(query, key)`` pairs.
A compact batch (:func:`attnlens.core.inputs.compact_batch`, the default of the PAPA layout) is
scatter-added instead: the value of column pair ``(i, j)`` of example ``b`` goes to
``(positions[b, i], positions[b, j])``, the fixed positions of the layout, so the constants are
those of the padded layout (up to the float32 order of the per-batch sums).
Only one batch of patterns exists at any time: memory is constant in the corpus size. The pass
stops right after the last layer's pattern is summed (the rest of the last block and the LM head,
which for MiniLM costs more than the encoder, are skipped).

Under ``torchrun`` each rank sums its shard and the sums are all-reduced (:func:`attnlens.engine.passes.run`).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, SupportsIndex

import torch
from jaxtyping import Float
from torch import Tensor

from attnlens.core.corpus import corpus_iterator
from attnlens.core.fingerprints import fingerprints_kept
from attnlens.core.inputs import LAYOUTS, check_max_len, default_layout
from attnlens.core.loading import require_bridge
from attnlens.engine import passes
from attnlens.engine.accumulator import Accumulator, LayerPatterns, PassBatch, add_at
from attnlens.engine.checkpoints import checkpoint_path
from attnlens.engine.distributed import world
from attnlens.engine.passes import CHECKPOINT_EVERY
from attnlens.engine.recording import Recording
from attnlens.errors import InputError, InputTypeError
from attnlens.methods.papa.compatibility import check_model
from attnlens.methods.papa.constants import PapaConstants, fields_of

__all__ = ["CHECKPOINT_EVERY", "PatternSums", "default_layout", "fit"]


@fingerprints_kept()  # the weights do not change during the fit: fingerprinted once
def fit(
    model: Any,
    corpus: Iterable[str] | Iterable[tuple[str, str]],
    *,
    max_len: SupportsIndex = 128,
    layout: str | None = None,
    batch_size: SupportsIndex = 32,
    progress: bool = True,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: SupportsIndex = CHECKPOINT_EVERY,
    compact: bool = True,
    by_length: bool = True,
    record: Recording | None = None,
) -> PapaConstants:
    """Each head's mean attention over ``corpus``, as :class:`PapaConstants`.

    ``corpus`` is an iterable of strings or of ``(str, str)`` pairs (a list, a generator, a
    ``datasets`` column such as ``dataset["sentence"]``); it is read once, ``batch_size`` examples
    at a time, tokenized with ``attnlens.tokenize(model, ..., max_len=max_len, layout=layout)``;
    ``layout=None`` is the model's default (:func:`attnlens.core.inputs.default_layout`: ``"papa"``
    for encoders, ``"padded"`` for decoders).

    With ``checkpoint="path"`` the running sums are written there atomically every
    ``checkpoint_every`` batches, when the fit is interrupted (e.g. ``KeyboardInterrupt``) and at
    the end, together with the number of examples consumed. Calling ``fit`` again with the same
    checkpoint and the same corpus resumes: the consumed examples are skipped. With the same
    ``batch_size`` the result is bit-identical to an uninterrupted fit. A checkpoint of a finished
    fit simply returns its constants.

    ``compact``: run PAPA-layout batches at the length of their longest real text and
    scatter-add the patterns to the layout's positions (:func:`attnlens.engine.passes.run`); ``False``
    pads every text to ``max_len`` (the same constants up to float32 rounding, at a higher cost).
    ``by_length``: run each window of consecutive examples from the shortest to the longest, so
    that a batch computes little padding (:func:`attnlens.engine.passes.run`; the same constants up to
    float32 rounding); ``False`` runs the corpus in its order, so that the fits of consecutive
    parts of a corpus, each a whole number of batches, merge to the fit of the whole bit for bit.

    ``record``: keep the pass's patterns (and values) for a later pass over the same corpus
    (:class:`attnlens.engine.recording.Recording`; :func:`attnlens.compare` replays them rather
    than running the forward again).

    The model runs with its own position ids (see :meth:`attnlens.Batch.model_kwargs`), so the patterns are
    those of the Hugging Face model on the same inputs; run interventions the same way
    (``model(batch.input_ids, **batch.model_kwargs())``).
    """
    require_bridge(model, "papa.fit")
    layout = default_layout(model) if layout is None else layout
    if layout not in LAYOUTS:
        raise InputError(f"Unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}.")
    max_len = check_max_len(model, max_len, layout=layout)  # pairs need more: checked per batch
    constants = _start(model, max_len=max_len, layout=layout, checkpoint=checkpoint)
    examples = corpus_iterator(corpus)
    if constants.n_examples:  # resuming: the checkpoint's kind of inputs must be this corpus's
        first = next(examples, None)
        if first is not None:
            is_pair = isinstance(first, tuple | list)
            if is_pair != constants.pairs:
                raise InputError(_mixed_inputs(constants, is_pair, checkpoint, resumed=True))
            examples = itertools.chain([first], examples)
        if hasattr(corpus, "__len__"):
            examples = _Sized(examples, len(corpus))
    else:
        examples = corpus
    sums = PatternSums(constants)
    passes.run(
        model, examples, [sums], max_len=max_len, layout=layout, batch_size=batch_size,
        progress=progress, description="papa.fit", checkpoint=checkpoint,
        checkpoint_every=checkpoint_every, compact=compact, by_length=by_length, record=record,
    )
    return sums.result()


class _Sized:
    """An iterator that keeps the length of the corpus it came from (for the progress bar)."""

    def __init__(self, iterator: Iterable, length: int) -> None:
        self.iterator, self.length = iterator, length

    def __iter__(self):
        return iter(self.iterator)

    def __len__(self) -> int:
        return self.length


class PatternSums(Accumulator):
    """The PAPA fit as an accumulator of :func:`attnlens.engine.passes.run`: running float64 sums of
    masked patterns and of their squares, per ``(layer, head, query, key)``, and valid-pair
    counts, kept in a :class:`PapaConstants` (``result()``)."""

    name = "papa"
    compact = True
    any_order = True  # sums over examples

    def __init__(self, constants: PapaConstants) -> None:
        self.constants = constants
        #: a batch's float32 sums of masked patterns and of their squares, per stack of layers
        #: (one layer on the CPU; off it, the engine's stacks, Accumulator.stacks), added in end_batch
        self.added: list[tuple[tuple[int, ...], Tensor, Tensor]] = []
        self.terms: dict[str, Tensor] = {}
        self.resumed = constants.n_examples
        self.stacks = True

    def start_batch(self, batch: PassBatch) -> None:
        state = self.constants
        if state.n_examples and state.pairs != batch.batch.is_pair:
            raise InputError(_mixed_inputs(state, batch.batch.is_pair, None, resumed=False))
        size = state.max_len
        self.terms = batch.from_host("papa.fit", lambda inputs: _batch_terms(inputs, size))
        self.added = []

    def update(self, layer: LayerPatterns) -> None:
        layers = layer.layers or (layer.layer,)
        pattern = layer.pattern.detach().float().unflatten(0, (len(layers), -1))  # [layer, batch, head, query, key]
        # The masked pattern goes into one buffer reused by every layer and batch: a fresh
        # [batch, head, query, key] tensor per layer would be new memory each time, and its
        # page faults cost more than the arithmetic.
        masked = self._buffer(pattern)
        torch.mul(pattern, self.terms["weights"], out=masked)
        first = self._sums(masked)
        masked.mul_(masked)
        self.added.append((layers, first, self._sums(masked)))

    def _sums(self, masked: Float[Tensor, "layer batch head query key"]) -> Float[Tensor, "layer head row column"]:
        """The batch's sums of ``masked``: over the examples; in a compact batch scatter-added at
        the layout positions of their columns (``[layer, head, max_len, max_len]``; else
        ``[layer, head, query, key]``)."""
        n_layers, n_batch, n_heads = masked.shape[:3]
        if "index" in self.terms:
            size = self.constants.max_len
            rows = masked.transpose(1, 2).reshape(n_layers * n_heads, -1)  # [layer · head, batch · query · key]
            total = masked.new_zeros(n_layers * n_heads, size * size).index_add_(1, self.terms["index"], rows)
            return total.view(n_layers, n_heads, size, size)
        # Sums over the batch as a [1, batch] @ [batch, head*query*key] product: the same
        # float32 sum as .sum(0), but a BLAS call copes far better with a busy CPU.
        ones = self.terms["ones"]
        return (ones @ masked.view(n_layers, n_batch, -1)).view(n_layers, *masked.shape[2:])

    def _buffer(self, pattern: Tensor) -> Tensor:
        """A float32 tensor of ``pattern``'s shape, reused while the shape and device stay."""
        buffer = getattr(self, "_scratch", None)
        if buffer is None or buffer.shape != pattern.shape or buffer.device != pattern.device:
            buffer = self._scratch = torch.empty(pattern.shape, dtype=torch.float32, device=pattern.device)
        return buffer

    def end_batch(self, batch: PassBatch) -> None:
        """Add the batch's float32 sums into the float64 running sums (in place), a stack of
        layers at a time."""
        state = self.constants
        counts = self.terms["counts"]
        n = counts.shape[-1]
        for layers, total, squares in self.added:
            add_at(state.sums[:, :, :n, :n], 0, layers, total)
            add_at(state.squares[:, :, :n, :n], 0, layers, squares)
        state.pair_counts[:n, :n] += counts
        state.n_examples += len(batch)
        state.n_tokens += batch.n_tokens
        state.n_truncated += int(batch.batch.n_truncated)
        state.pairs = bool(batch.batch.is_pair)
        self.added, self.terms = [], {}

    def state_dict(self) -> dict[str, Tensor]:
        return self.constants.tensors()

    def metadata(self) -> dict[str, Any]:
        return self.constants.metadata

    def load_state_dict(self, state: Mapping[str, Tensor], metadata: Mapping[str, Any]) -> None:
        restored = PapaConstants(
            **state, **fields_of({k: v for k, v in metadata.items() if k not in ("n_layers", "n_heads")})
        )
        self.constants = restored
        self.resumed = restored.n_examples

    def merge(self, other: Accumulator) -> PatternSums:
        if not isinstance(other, PatternSums):
            raise InputTypeError(f"cannot merge PatternSums with {type(other).__name__}")
        self.constants = self.constants.merge(other.constants)
        return self

    def all_reduce(self, group: Any = None) -> None:
        import torch.distributed as dist

        state = self.constants
        for value in self.state_dict().values():
            dist.all_reduce(value, op=dist.ReduceOp.SUM, group=group)
        numbers = torch.tensor([state.n_examples, state.n_tokens, state.n_truncated], dtype=torch.int64)
        dist.all_reduce(numbers, op=dist.ReduceOp.SUM, group=group)
        kinds: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(kinds, state.pairs if state.n_examples else None, group=group)
        found = {kind for kind in kinds if kind is not None}
        if len(found) > 1:
            raise InputError("The corpus mixes single sentences and sentence pairs across ranks.")
        state.n_examples, state.n_tokens, state.n_truncated = (int(x) for x in numbers)
        state.pairs = found.pop() if found else None

    def result(self) -> PapaConstants:
        self._scratch = None
        return self.constants


def _batch_terms(inputs: Any, size: int) -> dict[str, Tensor]:
    """What :class:`PatternSums` reads of a batch's tokens alone (in a pass, made on the host's
    copy of them and moved in one copy, :meth:`~attnlens.engine.accumulator.PassBatch.from_host`):
    ``weights``, ``[batch, 1, query, key]``, 1 where query and key are both real tokens;
    ``counts``, those pairs counted per layout position (``[size, size]``) in a compact batch,
    per column pair (``[query, key]``) else; and in a compact batch ``index``, every column
    pair's flat layout position, else ``ones``, ``[1, batch]``."""
    valid = inputs.attention_mask.bool()
    pairs = valid[:, :, None] & valid[:, None, :]
    terms = {"weights": pairs[:, None].float()}
    if inputs.compact:  # where each column pair goes: its flat (query, key) position
        index = (inputs.positions[:, :, None] * size + inputs.positions[:, None, :]).flatten()
        counts = torch.zeros(size * size, dtype=torch.int64, device=valid.device)
        terms.update(index=index, counts=counts.index_add_(0, index, pairs.flatten().long()).view(size, size))
    else:
        terms.update(ones=terms["weights"].new_ones(1, len(valid)), counts=pairs.sum(0))
    return terms


def _start(model: Any, *, max_len: int, layout: str, checkpoint: Any) -> PapaConstants:
    """Empty constants, or the state saved in ``checkpoint`` if that file exists."""
    if checkpoint is not None:
        checkpoint = checkpoint_path(checkpoint, world())
    if checkpoint is None or not Path(checkpoint).exists():
        return PapaConstants.empty(model, max_len=max_len, layout=layout)
    state = PapaConstants.load(checkpoint)
    check_model(state, model)
    if state.kind != "average":
        raise InputError(f"checkpoint {checkpoint} holds {state.kind!r} constants, not a fit.")
    if (state.layout, state.max_len) != (layout, max_len):
        raise InputError(
            f"checkpoint {checkpoint} was fitted with layout={state.layout!r}, "
            f"max_len={state.max_len}; this fit asks for layout={layout!r}, max_len={max_len}."
        )
    return state


def _mixed_inputs(state: PapaConstants, is_pair: bool, checkpoint: Any, *, resumed: bool) -> str:
    """Why a batch of sentences (or pairs) cannot be added to sums of pairs (or sentences):
    the checkpoint being resumed holds the other kind, or the corpus mixes both."""
    fitted = "sentence pairs" if state.pairs else "single sentences"
    given = "sentence pairs" if is_pair else "single sentences"
    if resumed:
        return (
            f"checkpoint {checkpoint} was fitted on {fitted}; this corpus holds {given}. Resume it "
            "with the corpus it was fitted on, or start a new fit with another checkpoint path."
        )
    return (
        f"The corpus mixes single sentences and sentence pairs: {state.n_examples} examples of "
        f"{fitted}, then {given}."
    )
