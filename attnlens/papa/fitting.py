"""Fit PAPA constants: one streaming pass of a model over an unlabeled corpus.

This module is the one place where constants are averaged. For every batch, a hook on each
``blocks.{l}.attn.hook_pattern`` sums ``attention × valid(query) × valid(key)`` and its square
over the batch (in float32, one batch at a time), and the batch totals are added into float64
running sums together with the number of valid ``(query, key)`` pairs. Only one batch of patterns
exists at any time: memory is constant in the corpus size.

The pass stops right after the last layer's pattern is summed (nothing after it is needed: the
rest of the last block and the LM head, which for MiniLM costs more than the encoder, are
skipped).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from jaxtyping import Float, Int
from torch import Tensor

from attnlens.inputs import LAYOUTS, Batch, check_max_len, tokenize
from attnlens.loading import is_causal, require_bridge
from attnlens.papa.constants import PapaConstants, check_model
from attnlens.streaming import chunks, corpus_iterator, device_of, progress_bar, run_patterns

#: batches between two checkpoint writes when ``checkpoint=`` is given
CHECKPOINT_EVERY = 20


def default_layout(model: Any) -> str:
    """The layout constants are fitted in when none is named (``compare``, ``attnlens fit-papa``):
    ``padded`` for a decoder, which has no [CLS]/[SEP] to fix in place, else ``papa``."""
    return "padded" if is_causal(model) else "papa"


def fit(
    model: Any,
    corpus: Iterable[str] | Iterable[tuple[str, str]],
    *,
    max_len: int = 128,
    layout: str = "papa",
    batch_size: int = 32,
    progress: bool = True,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = CHECKPOINT_EVERY,
) -> PapaConstants:
    """Each head's mean attention over ``corpus``, as :class:`PapaConstants`.

    ``corpus`` is an iterable of strings or of ``(str, str)`` pairs (a list, a generator, a
    ``datasets`` column such as ``dataset["sentence"]``); it is read once, ``batch_size`` examples
    at a time, tokenized with ``attnlens.tokenize(model, ..., max_len=max_len, layout=layout)``.

    With ``checkpoint="path"`` the running sums are written there atomically every
    ``checkpoint_every`` batches, when the fit is interrupted (e.g. ``KeyboardInterrupt``) and at
    the end, together with the number of examples consumed. Calling ``fit`` again with the same
    checkpoint and the same corpus resumes: the consumed examples are skipped. With the same
    ``batch_size`` the result is bit-identical to an uninterrupted fit. A checkpoint of a finished
    fit simply returns its constants.

    The model runs with its own position ids (see :meth:`attnlens.Batch.model_kwargs`), so the patterns are
    those of the Hugging Face model on the same inputs; run interventions the same way
    (``model(batch.input_ids, **batch.model_kwargs())``).
    """
    require_bridge(model, "papa.fit")
    if layout not in LAYOUTS:
        raise ValueError(f"Unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}.")
    if batch_size < 1 or checkpoint_every < 1:
        raise ValueError("batch_size and checkpoint_every must be at least 1.")
    max_len = check_max_len(model, max_len, layout=layout)  # pairs need more: checked per batch
    examples = corpus_iterator(corpus)
    state = _start(model, max_len=max_len, layout=layout, checkpoint=checkpoint)
    consumed = state.examples
    skipped = sum(1 for _ in itertools.islice(examples, consumed))
    if skipped < consumed:
        raise ValueError(
            f"checkpoint {checkpoint} has consumed {consumed} examples but the corpus has only "
            f"{skipped}: it belongs to another corpus."
        )
    sums = _PatternSums(model)
    device = device_of(model)
    bar = progress_bar(corpus, "papa.fit", progress, initial=consumed)
    saved_at, since_save, committing = state.examples, 0, False
    was_training = model.training
    model.eval()
    try:
        for chunk in chunks(examples, batch_size):
            batch = tokenize(model, chunk, max_len=max_len, layout=layout).to(device)
            if state.examples and state.pairs != batch.is_pair:
                raise ValueError(_mixed_inputs(state, batch, checkpoint, resumed=consumed))
            first, second, pair_counts = sums.run(model, batch)
            committing = True
            _commit(state, batch, first, second, pair_counts)
            committing = False
            bar.update(len(chunk))
            since_save += 1
            if checkpoint is not None and since_save >= checkpoint_every:
                state._save(checkpoint, {"batch_size": batch_size})
                saved_at, since_save = state.examples, 0
    except BaseException:
        # Keep what was done; a commit cut half-way leaves the last periodic checkpoint in place.
        if checkpoint is not None and not committing and state.examples > saved_at:
            state._save(checkpoint, {"batch_size": batch_size})
        raise
    finally:
        bar.close()
        model.train(was_training)
    if state.examples == 0:
        raise ValueError(
            "corpus is empty: papa.fit needs at least one string or (str, str) pair "
            f"(got {type(corpus).__name__})."
        )
    if checkpoint is not None and state.examples > saved_at:
        state._save(checkpoint, {"batch_size": batch_size})
    return state


class _PatternSums:
    """Hooks that sum one batch's masked patterns (and their squares) per layer."""

    def __init__(self, model: Any) -> None:
        self.n_layers = int(model.cfg.n_layers)
        self.weights: Tensor | None = None
        self.ones: Tensor | None = None
        self.first: list[Tensor | None] = [None] * self.n_layers
        self.second: list[Tensor | None] = [None] * self.n_layers
        self.fired = 0
        self.hooks = [
            (f"blocks.{layer}.attn.hook_pattern", self._hook(layer)) for layer in range(self.n_layers)
        ]

    def _hook(self, layer: int):
        def accumulate(pattern: Float[Tensor, "batch head query key"], hook: Any) -> None:
            # Sums over the batch as a [1, batch] @ [batch, head*query*key] product: the same
            # float32 sum as .sum(0), but a BLAS call copes far better with a busy CPU.
            masked = (pattern.detach().float() * self.weights).reshape(pattern.shape[0], -1)
            self.first[layer] = (self.ones @ masked).view(pattern.shape[1:])
            masked.mul_(masked)
            self.second[layer] = (self.ones @ masked).view(pattern.shape[1:])
            self.fired += 1

        return accumulate

    def run(
        self, model: Any, batch: Batch
    ) -> tuple[
        list[Float[Tensor, "head query key"]],
        list[Float[Tensor, "head query key"]],
        Int[Tensor, "query key"],
    ]:
        """Per layer, float32 sums over the batch of masked attention and of its square; and
        the number of valid (query, key) pairs."""
        valid = batch.attention_mask.bool()
        pairs = valid[:, :, None] & valid[:, None, :]
        self.weights = pairs[:, None].float()
        self.ones = self.weights.new_ones(1, len(batch))
        self.fired = 0
        try:
            run_patterns(model, batch, self.hooks)
        finally:
            self.weights = self.ones = None
        if self.fired != self.n_layers:
            raise RuntimeError(
                f"hook_pattern fired {self.fired} times for {self.n_layers} layers; "
                "papa.fit needs every layer's attention pattern."
            )
        first, second = self.first, self.second
        self.first = [None] * self.n_layers
        self.second = [None] * self.n_layers
        return first, second, pairs.sum(0).cpu()


def _commit(
    state: PapaConstants,
    batch: Batch,
    first: list[Tensor],
    second: list[Tensor],
    pair_counts: Tensor,
) -> None:
    """Add one batch's float32 sums into the float64 running sums (in place)."""
    n = pair_counts.shape[-1]
    for layer, (total, squares) in enumerate(zip(first, second, strict=True)):
        state.sums[layer, :, :n, :n] += total.to(state.sums.device)
        state.squares[layer, :, :n, :n] += squares.to(state.squares.device)
    state.pair_counts[:n, :n] += pair_counts
    state.examples += len(batch)
    state.tokens += int(batch.attention_mask.sum())
    state.truncated += int(batch.n_truncated)
    state.pairs = bool(batch.is_pair)


def _start(model: Any, *, max_len: int, layout: str, checkpoint: Any) -> PapaConstants:
    """Empty constants, or the state saved in ``checkpoint`` if that file exists."""
    if checkpoint is None or not Path(checkpoint).exists():
        return PapaConstants.empty(model, max_len=max_len, layout=layout)
    state, _ = PapaConstants._load(checkpoint)
    check_model(state, model)
    if state.kind != "average":
        raise ValueError(f"checkpoint {checkpoint} holds {state.kind!r} constants, not a fit.")
    if (state.layout, state.max_len) != (layout, max_len):
        raise ValueError(
            f"checkpoint {checkpoint} was fitted with layout={state.layout!r}, "
            f"max_len={state.max_len}; this fit asks for layout={layout!r}, max_len={max_len}."
        )
    return state


def _mixed_inputs(state: PapaConstants, batch: Batch, checkpoint: Any, *, resumed: int) -> str:
    """Why a batch of sentences (or pairs) cannot be added to sums of pairs (or sentences):
    the checkpoint being resumed holds the other kind, or the corpus mixes both."""
    fitted = "sentence pairs" if state.pairs else "single sentences"
    given = "sentence pairs" if batch.is_pair else "single sentences"
    if resumed and state.examples == resumed:
        return (
            f"checkpoint {checkpoint} was fitted on {fitted}; this corpus holds {given}. Resume it "
            "with the corpus it was fitted on, or start a new fit with another checkpoint path."
        )
    return (
        f"The corpus mixes single sentences and sentence pairs: {state.examples} examples of "
        f"{fitted}, then {given}."
    )
