"""The pass engine: the one loop over a corpus in attnlens.

Every analysis that reads a model over a corpus (PAPA constants, attention statistics, compare,
and the feature extraction of probes) is an
:class:`~attnlens.engine.accumulator.Accumulator`: a small object that reads some hook points,
updates from each batch, merges with another of its kind, and gives a result, like torchmetrics'
``update`` / ``merge_state`` / ``compute``. :func:`run` owns everything else:

- reading the corpus lazily (strings, ``(str, str)`` pairs, or a ``datasets`` column), batching
  and tokenizing it in a layout, moving batches to the model's device
  (:mod:`attnlens.engine.batches`);
- one set of hooks per forward: each layer's ``hook_pattern`` is handed to every accumulator as a
  :class:`~attnlens.engine.accumulator.LayerPatterns`, whose effective attention
  (:mod:`attnlens.engine.effective`) is computed once per layer if any accumulator reads it;
  interventions (``hooks=``) apply before reading (:mod:`attnlens.engine.forward`);
- stopping the forward after the last layer's pattern when nothing needs the output;
- ``torch.inference_mode`` (or gradients, when an accumulator asks), eval mode;
- the progress bar, checkpoint and resume (a checkpoint records a fingerprint of the corpus
  consumed and of the settings, and refuses to resume anything else), SIGTERM saved like Ctrl-C
  (:mod:`attnlens.engine.checkpoints`);
- a batch that runs out of device memory, split in halves (:mod:`attnlens.engine.split`);
- a recording of a pass's patterns and values, replayed by a later pass over the same batches
  instead of its forward (:mod:`attnlens.engine.recording`; what ``compare`` does after fitting);
- multi-process runs under ``torch.distributed`` (``torchrun``): the corpus is sharded
  contiguously and batch-aligned by rank, every accumulator is reduced with ``all_reduce`` (its
  small metadata with ``all_gather_object``), and the settings are checked to be the same on
  every rank (:mod:`attnlens.engine.distributed`).

A minimal accumulator: see :mod:`attnlens.engine.accumulator`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, SupportsIndex

import torch
from torch import Tensor

from attnlens.core import devices, memory
from attnlens.core.checks import flag, whole_number
from attnlens.core.corpus import corpus_iterator
from attnlens.core.fingerprints import identity
from attnlens.core.inputs import LAYOUTS, Batch, check_max_len, default_layout
from attnlens.core.loading import is_causal, require_bridge
from attnlens.core.modes import eval_mode, gradients, own_arithmetic
from attnlens.engine.accumulator import Accumulator, LayerPatterns, PassBatch, PassSummary
from attnlens.engine.batches import (
    Staged,
    chunks,
    pass_order,
    progress_bar,
    stage_batch,
    staged_ahead,
)
from attnlens.engine.checkpoints import (
    UNKNOWN_HOOKS,
    CorpusFingerprint,
    InterruptingSignals,
    Start,
    Tail,
    resume,
    save_checkpoint,
)
from attnlens.engine.distributed import (
    World,
    check_same_settings,
    interleaved,
    reduce_across_ranks,
    shard,
    world,
)
from attnlens.engine.forward import (
    FwdHooks,
    batch_context,
    check_hooks,
    check_hooks_model,
    check_token_ids,
    device_of,
    forward_batch,
    pattern_hooks,
    run_patterns,
)
from attnlens.engine.hooks import as_hooks, on_model
from attnlens.engine.recording import Recording
from attnlens.engine.split import Split
from attnlens.errors import InputError, ModelBehaviourError

#: batches between two checkpoint writes when ``checkpoint=`` is given
CHECKPOINT_EVERY = 20

#: off the CPU, the layers of a batch kept for the stacking accumulators
#: (:attr:`~attnlens.engine.accumulator.Accumulator.stacks`) may fill 1 / STACK_SHARE of the
#: memory free on their device (their patterns; what the accumulators make of a stack, a few
#: maps per view and their intermediates, takes several times that): all of MiniLM's six layers
#: at batch 32 and max_len 128 (151 MB) on a GPU with 10 GB free
STACK_SHARE = 64

#: a pass by length (:func:`run`'s ``by_length``) orders each window of this many batches of
#: consecutive examples (2,048 examples at batch size 32: the strings only, a few hundred kB)
BY_LENGTH_BATCHES = 64


@own_arithmetic()  # the model's dtype, whatever the caller's torch.autocast and default dtype
def run(
    model: Any, corpus: Any, accumulators: Sequence[Accumulator], *, max_len: SupportsIndex = 128,
    layout: str | None = None, batch_size: SupportsIndex = 32, hooks: FwdHooks = (), progress: bool = True,
    description: str = "pass", checkpoint: str | os.PathLike | None = None,
    checkpoint_every: SupportsIndex = CHECKPOINT_EVERY, effective: Mapping[str, Any] | None = None,
    settings: Mapping[str, Any] | None = None, compact: bool = True, by_length: bool = True,
    record: Recording | None = None, replay: Recording | None = None,
) -> PassSummary:
    """Run ``model`` over ``corpus`` once, updating every accumulator; returns a
    :class:`~attnlens.engine.accumulator.PassSummary`.

    ``corpus``: strings or ``(str, str)`` pairs (a list, a generator, a ``datasets`` column),
    tokenized ``batch_size`` at a time with ``max_len`` in ``layout`` (default: the
    architecture's, :func:`attnlens.core.inputs.default_layout`). ``hooks``: interventions
    (``fwd_hooks``) active during the pass; accumulators read the patterns they produce. What
    they patch in the model (:meth:`attnlens.engine.hooks.Hooks.patched`: the replaced heads of
    ``papa.hooks(..., fast=True)`` skip their work) holds for the whole pass.
    ``effective``: keyword arguments of :func:`attnlens.methods.effective.effective_attention`
    (``rtol``, ``padded``). ``settings``: anything else that changes the result (recorded in
    checkpoints and compared across ranks). ``compact``: run PAPA-layout batches at the length
    of their longest real text, with the layout's positions (:func:`attnlens.core.inputs.compact_batch`;
    the same results up to float32 rounding, for the real tokens' share of the cost) when every
    accumulator reads positions rather than columns
    (:attr:`~attnlens.engine.accumulator.Accumulator.compact`); ``False`` pads them to
    ``max_len``. Hooks (``hooks=``) must then read positions too, as PAPA's do. ``by_length``:
    run each window of :data:`BY_LENGTH_BATCHES` batches of consecutive examples from its
    shortest example to its longest (:func:`attnlens.core.inputs.by_length`,
    :func:`attnlens.engine.batches.pass_order`) when every accumulator allows it
    (:attr:`~attnlens.engine.accumulator.Accumulator.any_order`) and batches are not all padded to
    ``max_len``: each batch then holds examples of similar lengths (the embedded corpus: 0.48x
    the positions of batches in its order), with the same results up to float32 rounding of
    sums taken in another order. The order depends only on the sequence of examples, so a list
    and a generator of the same examples run the same batches, and a resumed pass meets them in
    the same order. ``False`` runs the corpus in its order.

    ``checkpoint``: a file to which the state is written atomically every ``checkpoint_every``
    batches, at an interrupt (Ctrl-C, SIGTERM) and at the end. Running again with the same
    checkpoint resumes: the same model, settings, hooks, accumulators, batches and world size
    (:func:`_header`), and the first examples of the pass's order must be those consumed (their
    fingerprint is recorded; by length, a window is read whole before its first batch runs);
    anything else is refused.
    With the same ``batch_size`` the result is bit-identical to an uninterrupted pass.

    Under ``torch.distributed`` each rank runs its contiguous, batch-aligned shard
    (:func:`~attnlens.engine.distributed.shard`), or by length every ``size``-th batch
    (:func:`~attnlens.engine.distributed.interleaved`), with its own checkpoint
    (:func:`~attnlens.engine.checkpoints.checkpoint_path`); the accumulators are then summed over
    ranks, so every rank holds the result.

    ``record``: keep each batch's patterns (and values) in a :class:`~attnlens.engine.recording.Recording`,
    up to its memory budget, for a later pass over the same batches; ``replay``: such a recording
    of an earlier pass, whose batches this pass hands to its accumulators without running the
    forward again (a batch it does not hold runs the forward). The result is the same, exactly
    (:mod:`attnlens.engine.recording`); a pass that needs more than the patterns and values (an
    intervention, the output, the residual stream, gradients, another hook point) refuses a
    replay.

    The first pass of a process keeps freed memory for reuse (:func:`attnlens.core.memory.reuse_freed_memory`:
    glibc's mmap and trim thresholds; ``ATTNLENS_REUSE_MEMORY=0`` keeps glibc's defaults).
    """
    require_bridge(model, description)
    memory.reuse_freed_memory()
    plan = _plan(model, accumulators, max_len=max_len, layout=layout, batch_size=batch_size,
                 checkpoint_every=checkpoint_every, compact=compact)
    order = _order(model, corpus, accumulators, plan, by_length)
    if hasattr(corpus, "__len__") and len(corpus) == 0:  # refused before a progress bar is drawn
        raise _empty(description, corpus)
    header = _header(model, plan, order, settings, effective, accumulators, hooks)
    check_hooks_model(model, hooks)
    start = resume(checkpoint, accumulators, header, order.numbered, sizes=order.sizes, window=order.window,
                   current=plan.current)
    if replay is not None:
        _check_replay(model, accumulators, hooks, replay)
    if record is not None:
        record.begin({**header, "hooks": as_hooks(hooks).key()})  # a recording with interventions is never replayed
    running = _Pass(model, corpus, accumulators, plan, order, start, header, hooks=hooks,
                    description=description, effective=effective, progress=progress, record=record,
                    replay=replay)
    running.batches(InterruptingSignals())
    return running.summary()


@dataclass
class _Plan:
    """The settings of a pass, checked: the accumulators' ``names``, the ``layout``, whether
    batches run ``compact``, ``batch_size``, ``checkpoint_every``, ``max_len`` and this process's
    place in a ``torch.distributed`` run (``current``)."""

    names: list[str]
    layout: str
    compact: bool
    batch_size: int
    checkpoint_every: int
    max_len: int
    current: World


def _plan(model: Any, accumulators: Sequence[Accumulator], *, max_len: SupportsIndex, layout: str | None,
          batch_size: SupportsIndex, checkpoint_every: SupportsIndex, compact: bool) -> _Plan:
    """:func:`run`'s settings, checked (one clear error for each bad one)."""
    names = [a.name for a in accumulators]
    if len(set(names)) != len(names):
        raise InputError(f"accumulator names must be unique, got {names}")
    layout = default_layout(model) if layout is None else layout
    if layout not in LAYOUTS:
        raise InputError(f"Unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}.")
    compact = flag(compact, "compact") and layout == "papa" and all(a.compact for a in accumulators)
    batch_size = _positive(batch_size, "batch_size", "examples per batch (e.g. batch_size=32)")
    checkpoint_every = _positive(checkpoint_every, "checkpoint_every", "batches (e.g. 20)")
    max_len = check_max_len(model, max_len, layout=layout)  # pairs need more: checked per batch
    return _Plan(names, layout, compact, batch_size, checkpoint_every, max_len, world())


@dataclass
class _Order:
    """This process's examples in the pass's order: ``numbered``, ``(corpus index, example)``
    pairs read lazily; ``total``, how many (None for a corpus without a length); ``window``, the
    examples ordered by length at a time (None: the corpus's order); ``sizes``, the size of each
    window read, by its start in the pass's order (filled as they are read); under
    ``torch.distributed``, ``starts``, where each of this process's batches starts in the pass's
    order, and ``corpus``, the fingerprint of the whole corpus."""

    numbered: Iterator[tuple[int, Any]]
    total: int | None
    window: int | None
    sizes: dict[int, int]
    starts: list[int] | None = None
    corpus: str | None = None


def _order(model: Any, corpus: Any, accumulators: Sequence[Accumulator], plan: _Plan, by_length: bool) -> _Order:
    """The examples this process runs, in the pass's order (:func:`~attnlens.engine.batches.pass_order`): all of them, or
    under ``torch.distributed`` its share of the batches (:func:`~attnlens.engine.distributed.shard`, :func:`~attnlens.engine.distributed.interleaved`)."""
    examples = corpus_iterator(corpus)
    total: int | None = len(corpus) if hasattr(corpus, "__len__") else None
    flag(by_length, "by_length")
    window = BY_LENGTH_BATCHES * plan.batch_size if (
        by_length and all(a.any_order for a in accumulators) and (plan.compact or plan.layout != "papa")) else None
    sizes: dict[int, int] = {}
    numbered = pass_order(examples, model.tokenizer, window, sizes=sizes)
    current, batch_size = plan.current, plan.batch_size
    if not current.distributed:
        return _Order(numbered, total, window, sizes)
    listed = list(numbered)
    whole = CorpusFingerprint()
    whole.update([example for _, example in listed])
    if window is None:
        first, stop = shard(len(listed), batch_size, current.rank, current.size)
        starts = list(range(first, stop, batch_size))
    else:
        starts = [b * batch_size for b in interleaved(len(listed), batch_size, current.rank, current.size)]
    mine = [listed[start : start + batch_size] for start in starts]
    return _Order((item for batch in mine for item in batch), sum(map(len, mine)), window, sizes, starts,
                  whole.hexdigest())


def _empty(description: str, corpus: Any) -> InputError:
    """The refusal of a corpus without an example (a sized one before the pass, any other after)."""
    return InputError(f"corpus is empty: {description} needs at least one string or (str, str) pair "
                      f"(got {type(corpus).__name__}).")


def _header(model: Any, plan: _Plan, order: _Order, settings: Mapping[str, Any] | None,
            effective: Mapping[str, Any] | None, accumulators: Sequence[Accumulator], hooks: FwdHooks) -> dict[str, Any]:
    """What a checkpoint records of the pass, and refuses to resume with another; under
    ``torch.distributed``, checked to be the same on every rank (the corpus too). The
    interventions are recorded by their key (:meth:`attnlens.engine.hooks.Hooks.key`); hooks
    without one (a function of the user's) by their hook points alone, which a resume cannot
    check further (:data:`UNKNOWN_HOOKS`: it warns), and so are hooks the model carries
    (:func:`attnlens.engine.hooks.on_model`); each accumulator with its
    :meth:`~attnlens.engine.accumulator.Accumulator.settings` (e.g. the PAPA constants it reads);
    compact or padded batches."""
    given = as_hooks(hooks)
    carried = [f"{name} (on the model)" for name in on_model(model)]
    key = given.key() if not carried else None
    header = {
        **identity(model),
        "layout": plan.layout,
        "max_len": plan.max_len,
        "batch_size": plan.batch_size,
        "accumulators": sorted(plan.names),
        "accumulator_settings": {accumulator.name: json.loads(json.dumps(accumulator.settings(), sort_keys=True))
                                 for accumulator in accumulators},
        "hooks": key if key is not None else f"{UNKNOWN_HOOKS} at {', '.join([*given.hook_names, *carried])}",
        "compact": plan.compact,
        "order": "corpus" if order.window is None else f"by length, {order.window} examples at a time",
        "world_size": plan.current.size,
        "rank": plan.current.rank,
        "settings": json.loads(json.dumps(dict(settings or {}), sort_keys=True, default=str)),
        # a decoder's effective maps are causal (since 2026-12-01): recorded for a pass that reads
        # values (effective attention needs them), so that a checkpoint of the former rule (every
        # row onto the whole sequence's values) is not resumed into them
        "effective": json.loads(json.dumps({**dict(effective or {}), **({"causal": True} if is_causal(model) and any(
            accumulator.needs_values for accumulator in accumulators) else {})}, sort_keys=True, default=str)),
    }
    if plan.current.distributed:
        check_same_settings(
            json.dumps({**header, "rank": None, "corpus": order.corpus}, sort_keys=True),
            plan.current,
        )
    return header


class _Pass:
    """A pass while its batches run: the hooks that hand each layer's pattern to the
    accumulators, one batch's forward (:meth:`one`), the counts and fingerprint of what ran, the
    checkpoint written of it (:meth:`save`) and the progress bar."""

    def __init__(self, model: Any, corpus: Any, accumulators: Sequence[Accumulator], plan: _Plan, order: _Order,
                 start: Start, header: dict[str, Any], *, hooks: FwdHooks, description: str,
                 effective: Mapping[str, Any] | None, progress: bool, record: Recording | None = None,
                 replay: Recording | None = None) -> None:
        self.model, self.corpus, self.accumulators, self.plan, self.order = model, corpus, accumulators, plan, order
        self.start, self.header, self.hooks, self.description = start, header, hooks, description
        self.counts, self.fingerprint, self.tail = start.counts, start.fingerprint, start.tail
        self.record, self.replay = record, replay
        self.device = device_of(model)
        needs_values = any(a.needs_values for a in accumulators) or (record is not None and record.values)
        self.needs_output = any(a.needs_output for a in accumulators)
        self.until = f"blocks.{int(model.cfg.n_layers) - 1}.hook_out" if any(
            a.needs_residual for a in accumulators) else None
        self.needs_grad = any(a.needs_grad for a in accumulators)
        self.options = dict(effective or {})
        self.state: dict[str, Any] = {}  # the batch being run, its layers seen, whether whole batches
        self.reading = pattern_hooks(model, self._on_pattern, values=needs_values)
        # off the CPU, a batch's layers kept for the accumulators that take them stacked
        self.stacking = [a for a in accumulators if a.stacks]
        self.layerwise = [a for a in accumulators if not a.stacks]
        self.kept: list[LayerPatterns] = []
        self.kept_bytes, self.stack_limit = 0, 0
        self.extra = [hook for accumulator in accumulators for hook in accumulator.hooks(model)]
        self.n_layers = int(model.cfg.n_layers)
        self.fwd_hooks: list = []  # set for the whole pass, inside the interventions' patch
        self.bar = progress_bar(
            range(order.total) if order.total is not None else corpus, description,
            progress and plan.current.rank == 0, initial=start.resumed,
        )

    def _on_pattern(self, layer: int, pattern: Tensor, v: Tensor | None, valid: Tensor | None = None) -> None:
        if self.record is not None:
            self.record.add(pattern, v)
        patterns = LayerPatterns(layer, pattern, self.state["batch"], v, self.options)
        kept = self.stacking and not devices.reads_are_free(pattern)
        for accumulator in self.layerwise if kept else self.accumulators:
            accumulator.update(patterns)
        if kept:
            self._keep(patterns)
        self.state["layers"] += 1

    def _keep(self, layer: LayerPatterns) -> None:
        """Keep ``layer`` for the stacking accumulators (:attr:`Accumulator.stacks`); hand them
        the kept layers when their patterns fill 1 / :data:`STACK_SHARE` of the free memory."""
        if not self.stack_limit:  # once: the device's free memory (a driver call, no wait)
            self.stack_limit = max(1, devices.free_bytes(layer.pattern.device) // STACK_SHARE)
        self.kept.append(layer)
        self.kept_bytes += layer.pattern.numel() * layer.pattern.element_size()
        if self.kept_bytes >= self.stack_limit:
            self._hand_stack()

    def _hand_stack(self) -> None:
        """Hand the kept layers, as one stack (:meth:`LayerPatterns.stack`), to every stacking
        accumulator."""
        if not self.kept:
            return
        stack = LayerPatterns.stack(self.kept)
        self.kept, self.kept_bytes = [], 0
        for accumulator in self.stacking:
            accumulator.update(stack)

    def batches(self, signals: InterruptingSignals) -> None:
        """Run this process's batches, with the interventions' patch on the model (an intervention
        that patches it, PapaHooks(fast=True), holds for the whole pass; the rest of it runs as
        hooks); write the checkpoint every ``checkpoint_every`` batches, at an interrupt (a batch cut
        half-way leaves the last periodic checkpoint in place) and at the end."""
        path, counts = self.start.path, self.counts
        saved_at, since_save = counts["examples"], 0
        self.state["consistent"] = True  # the state holds whole batches (a checkpoint may be written)
        with signals, eval_mode(self.model), as_hooks(self.hooks).patched(self.model) as intervening:
            self.fwd_hooks = [*intervening, *self.extra, *self.reading]
            for accumulator in self.accumulators:  # the state lives beside the patterns during the pass
                accumulator.to(self.device)
            split, ahead = self._runners(signals)
            try:
                for host in ahead(chunks(self.start.numbered, self.plan.batch_size)):
                    signals.batching = True  # a first SIGTERM / SIGINT now waits for the batch's end
                    self._batch(host, split)
                    since_save += 1
                    signals.end_batch()  # interrupted during the batch: stop now, saving it
                    if path is not None and since_save >= self.plan.checkpoint_every:
                        self.save(signals)
                        saved_at, since_save = counts["examples"], 0
            except BaseException:
                if path is not None and self.state["consistent"] and counts["examples"] > saved_at:
                    self.save(signals)
                raise
            finally:
                self.bar.close()
            if path is not None and counts["examples"] > saved_at:
                self.save(signals)

    def _runners(self, signals: InterruptingSignals) -> tuple[Split, Callable[[Iterator[list]], Iterator[Staged]]]:
        """What runs the batches: :class:`~attnlens.engine.split.Split` (a batch that runs out of device memory is split in
        halves and run again), and :func:`~attnlens.engine.batches.staged_ahead` (on a GPU the next batch is tokenized on the host
        while the device runs this one)."""
        multiple = devices.width_multiple(self.device)  # compact widths in buckets off the CPU
        plan = self.plan

        def staged(pairs: list) -> Staged:
            # a batch starts with its tokenization: a first SIGTERM / SIGINT now waits for its end
            signals.batching = True
            return stage_batch(self.model, pairs, max_len=plan.max_len, layout=plan.layout, compact=plan.compact,
                               multiple=multiple)

        split = Split(self.accumulators, staged, self.device, self.state,
                      splits=all(a.any_order for a in self.accumulators))
        return split, staged_ahead(self.device, staged)

    def _batch(self, host: Staged, split: Split) -> None:
        """Run one batch of this process (in parts, if it runs out of memory), keeping the state at
        the start of the pass's last unit when that unit is unfinished (:class:`~attnlens.engine.checkpoints.Tail`)."""
        order, batch_size = self.order, self.plan.batch_size
        unit = batch_size if order.window is None else order.window  # what a Tail starts
        done = self.counts["examples"]  # by this process; its batches before the last are whole
        size = len(host.chunk) if order.window is None else order.sizes.get(done, unit)
        if self.start.path is not None and order.starts is None and done % unit == 0 and size < unit:
            self.tail = Tail.take(self.accumulators, self.counts, self.fingerprint.hexdigest(), size)
        split.run(host, done if order.starts is None else order.starts[done // batch_size], self.one)
        if self.tail is not None:
            self.tail.unit.extend(zip(host.indices, host.chunk, strict=True))

    def one(self, host: Staged, start: int, forwarded: Callable[[], None]) -> None:
        """Run the batch (or part of a batch) ``host``, whose first row is example ``start`` of
        the pass; count it. ``forwarded()`` is called after the forward, before ``end_batch``."""
        model, accumulators = self.model, self.accumulators
        on_host, inputs, unpadded = _inputs(model, accumulators, self.hooks, host.batch, self.device)
        pass_batch = PassBatch(inputs, start, model, host.indices, host.numbers["tokens"], on_host)
        for accumulator in accumulators:  # may refuse the batch; changes no state
            accumulator.start_batch(pass_batch)
        self.state.update(batch=pass_batch, layers=0, consistent=False)
        self.kept, self.kept_bytes = [], 0  # none of a batch split after running out of memory
        recorded = None if self.replay is None else self.replay.find(self.header, start, on_host)
        if self.record is not None:
            self.record.start_batch(start, on_host)
        grad = gradients() if self.needs_grad else torch.inference_mode()
        with grad:
            if recorded is not None:  # the batch's layers as an earlier pass's forward made them
                with batch_context(inputs):
                    for layer, (pattern, values) in enumerate(recorded):
                        self._on_pattern(layer, pattern, values)
            elif self.needs_output:
                output = forward_batch(model, inputs, self.fwd_hooks, unpadded=unpadded)
            else:
                run_patterns(model, inputs, self.fwd_hooks, until=self.until, unpadded=unpadded)
            self._hand_stack()  # the layers kept since the last stack (before forwarded(): the batch's work)
            if self.needs_output:
                for accumulator in accumulators:
                    accumulator.update_output(pass_batch, output)
        if self.state["layers"] != self.n_layers:
            raise ModelBehaviourError(
                f"hook_pattern fired {self.state['layers']} times for {self.n_layers} layers; "
                f"{self.description} needs every layer's attention pattern."
            )
        forwarded()
        for accumulator in accumulators:
            accumulator.end_batch(pass_batch)
        if self.record is not None:
            self.record.end_batch(self.n_layers)
        _count(self.counts, host.numbers)
        self.fingerprint.update(host.chunk)
        self.state["consistent"] = True
        self.bar.update(len(host.chunk))

    def save(self, signals: InterruptingSignals) -> None:
        """Write the checkpoint (a signal meanwhile waits for the write)."""
        with signals.saving():
            self.counts["corpus"] = self.fingerprint.hexdigest()
            save_checkpoint(self.start.path, self.accumulators, self.counts, self.header, self.tail)

    def summary(self) -> PassSummary:
        """The accumulators summed over ranks (under ``torch.distributed``) and moved to the host,
        and what the pass read; refuses an empty corpus."""
        counts, current = self.counts, self.plan.current
        if current.distributed:
            reduce_across_ranks(self.accumulators, counts, current)
        for accumulator in self.accumulators:  # read back once: results are made on the host
            accumulator.to("cpu")
        if counts["examples"] == 0:
            raise _empty(self.description, self.corpus)
        return PassSummary(
            n_examples=counts["examples"],
            n_tokens=counts["tokens"],
            n_truncated=counts["truncated"],
            pairs=counts["pairs"],
            layout=self.plan.layout,
            max_len=self.plan.max_len,
            accumulators=list(self.accumulators),
            resumed=self.start.resumed,
            longest=counts.get("longest", 0),
        )


def _check_replay(model: Any, accumulators: Sequence[Accumulator], hooks: FwdHooks, replay: Recording) -> None:
    """One clear error when a pass needs more than a recording's patterns and values."""
    if as_hooks(hooks).key() != "none":  # "none": no hook and no patch
        raise InputError("a pass with interventions (hooks=) cannot replay a recording: the recorded patterns "
                         "were made without them; run it without replay=.")
    for a in accumulators:
        needs = [what for what, flagged in (("the model's output", a.needs_output),
                                            ("the residual stream", a.needs_residual), ("gradients", a.needs_grad),
                                            ("the values", a.needs_values and not replay.values)) if flagged]
        if a.hooks(model) or needs:
            what = ", ".join(needs) or "hook points of its own"
            raise InputError(f"accumulator {a.name!r} needs {what}, which a recording does not hold; "
                             "run its pass without replay=.")


def _prepare(accumulators: Sequence[Accumulator], batch: Batch) -> Batch:
    """The inputs of the forward: ``batch``, or what the one accumulator that changes it makes."""
    changed = [(a, a.prepare(batch)) for a in accumulators]
    changed = [(a, inputs) for a, inputs in changed if inputs is not batch]
    if len(changed) > 1:
        names = ", ".join(a.name for a, _ in changed)
        raise InputError(f"accumulators {names} each change the model's inputs; run them in separate passes.")
    return changed[0][1] if changed else batch


def _inputs(model: Any, accumulators: Sequence[Accumulator], hooks: FwdHooks, batch: Batch,
            device: torch.device) -> tuple[Batch, Batch, bool]:
    """The forward's inputs of a tokenized host ``batch``, on the host and on ``device``: made by
    the accumulators (:meth:`~attnlens.engine.accumulator.Accumulator.prepare`, which may keep per-batch state: run in the
    pass's thread), checked on the host, then copied (from pinned memory without waiting, on a
    GPU); and whether they have no padding (the attention then needs no mask), read off the host
    copy: on the host on any machine, so never a wait for the device (not
    :func:`~attnlens.engine.forward.has_no_padding`, which leaves a batch alone where the routes
    say reads wait: the tests' forced device routes would then lose the unpadded batches)."""
    check_hooks(hooks, batch)
    inputs = _prepare(accumulators, batch)
    check_token_ids(model, inputs)
    unpadded = bool(inputs.attention_mask.all())
    if device.type == "cuda":
        return inputs, inputs.pin_memory().to(device, non_blocking=True), unpadded
    return inputs, inputs.to(device), unpadded


def _count(counts: dict[str, Any], numbers: Mapping[str, Any]) -> None:
    for key in ("examples", "tokens", "truncated"):
        counts[key] += numbers[key]
    counts["pairs"] = numbers["pairs"]
    counts["longest"] = max(counts.get("longest", 0), numbers["longest"])


def _positive(value: Any, name: str, unit: str) -> int:
    number = whole_number(value, name, f" of {unit}")
    if number < 1:
        raise InputError(f"{name} must be at least 1, got {number}")
    return number
