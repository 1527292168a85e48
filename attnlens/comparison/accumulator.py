"""The pass of :func:`attnlens.compare` as one accumulator: :class:`ViewsAccumulator`, the
methods' own accumulators for every view, run together, and the maps it keeps for the figures
and the report's explorer (:class:`_ReportRows`)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from attnlens.core import devices
from attnlens.engine.accumulator import Accumulator, LayerPatterns, PassBatch
from attnlens.errors import InputError
from attnlens.methods import views as registry
from attnlens.methods.patterns.counts import PatternTypes, batch_positions
from attnlens.methods.patterns.templates import TYPES, template_labels, tiled
from attnlens.methods.stats import (
    BATCH_DTYPE,
    STATISTICS,
    AttentionStatistics,
    Distance,
    Statistics,
    batch_classes,
    row_statistics,
    token_classes,
    token_texts,
)
from attnlens.present.kept import KeptExample, KeptPatterns, encode, refused, segments_of


def analyses(n_layers: int, n_heads: int, view: str, *, constants: Any, causal: bool,
             first: bool) -> dict[str, Accumulator]:
    """The methods' own accumulators :func:`attnlens.compare` runs for ``view``, by name: its head
    statistics (:class:`attnlens.methods.stats.Statistics`), its pattern types
    (:class:`attnlens.methods.patterns.counts.PatternTypes`) and, for every view but the
    ``first`` (the model's own attention), its distance from the first
    (:class:`attnlens.methods.stats.Distance`). Each reads its view's maps as the registered
    :class:`attnlens.methods.views.View` says (a view given by constants: the constants
    restricted to the batch's valid tokens, :meth:`View.read`)."""
    parts: dict[str, Accumulator] = {
        "statistics": Statistics(n_layers, n_heads, view, constants=constants, causal=causal),
        "types": PatternTypes(n_layers, n_heads, view=view, constants=constants, causal=causal),
    }
    if not first:
        parts["distance"] = Distance(n_layers, n_heads, view, constants=constants, causal=causal)
    return parts


def check_constants(constants: Any, batch: Any) -> None:
    """Refuse constants that do not fit ``batch`` (layout, ``max_len``, sentences or pairs; the
    model was checked once, before the pass)."""
    try:
        constants.check_compatible(batch=batch)
    except ValueError as error:
        raise InputError(
            f"the PAPA constants do not fit this corpus: {error} Pass constants fitted on a corpus "
            "of the same kind (single sentences or pairs), or leave constants out to fit them on "
            "this one."
        ) from error


#: off the CPU, the maps of a batch's layers kept for one call of the statistics and pattern
#: types may fill 1 / BUFFER_SHARE of the memory free on their device (their float32 copies;
#: the calls' intermediates take a few times that): all of MiniLM's six layers at batch 32 and
#: max_len 128 (450 MB) on a GPU of some GBs free
BUFFER_SHARE = 16


class ViewsAccumulator(Accumulator):
    """The pass of :func:`attnlens.compare` as an accumulator of :func:`attnlens.engine.passes.run`.

    A collection, torchmetrics-style, of the methods' own accumulators for every view, run in
    this one pass (:func:`analyses`: :class:`attnlens.methods.stats.Statistics`,
    :class:`attnlens.methods.patterns.counts.PatternTypes` and, views other than standard,
    :class:`attnlens.methods.stats.Distance`); each is a child
    (:meth:`attnlens.engine.accumulator.Accumulator.add_child`) whose state is this one's under
    ``"{view}.{analysis}"``, and the count of texts longer than ``d_head`` is declared state
    (:meth:`~attnlens.engine.accumulator.Accumulator.add_state`), so :meth:`state_dict`, the
    sums of :meth:`merge` and :meth:`all_reduce`, :meth:`load_state_dict` and :meth:`to` follow
    from the declarations. It computes no statistic itself: it only keeps the valid block of
    example ``example``'s maps for the figures.
    With ``report_examples`` it also keeps, 8-bit and compressed (:mod:`attnlens.present.kept`), the maps
    of the first ``report_examples`` examples and of ``example`` (``kept_patterns``; the
    report's budget is applied afterwards, :meth:`attnlens.present.kept.KeptPatterns.select`).
    """

    name = "compare"
    #: runs compact PAPA batches (no compute on padding): every part reads positions, not
    #: columns, and the kept maps are each example's valid block
    compact = True
    #: and the corpus by length: its parts add up over examples, and the kept examples are
    #: found by their corpus index (PassBatch.indices)
    any_order = True

    def __init__(
        self, model: Any, names: tuple[str, ...], constants: Any, *, example: int, causal: bool,
        report_examples: int = 0,
    ) -> None:
        n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
        self.model, self.names, self.constants = model, names, constants
        self.example, self.causal, self.n_layers, self.n_heads = example, causal, n_layers, n_heads
        self.views = {view: registry.get_view(view) for view in names}
        self.needs_values = any(value.needs_values for value in self.views.values())
        # the methods' own accumulators (ANALYSES) for every view, updated in this one pass, each
        # a child whose state is this one's under "{view}.{analysis}" (Accumulator.add_child):
        # state_dict, merge, all_reduce, load_state_dict and to follow from the declarations
        self.analyses = {
            view: analyses(n_layers, n_heads, view, constants=constants, causal=causal, first=index == 0)
            for index, view in enumerate(names)
        }
        for view, parts in self.analyses.items():
            for analysis, part in parts.items():
                self.add_child(f"{view}.{analysis}", part)
        self.statistics = {view: parts["statistics"].statistics for view, parts in self.analyses.items()}
        self.distances = {view: parts["distance"] for view, parts in self.analyses.items() if "distance" in parts}
        self.parts = {view: (parts["statistics"], parts["types"]) for view, parts in self.analyses.items()}
        self.kept: dict[str, np.ndarray] = {}
        self.kept_tokens: list[str] = []
        self.row: int | None = None
        self.d_head = int(model.cfg.d_head)
        # texts with more than d_head real tokens (effective attention sees the others as standard)
        self.add_state("longer_than_d_head", torch.zeros((), dtype=torch.int64))
        self.report_examples = report_examples
        signed = tuple(view for view in names if self.views[view].signed)
        self.kept_patterns = KeptPatterns(names, signed, n_layers, n_heads, limit=report_examples)
        self.report_rows: _ReportRows | None = None
        # off the CPU the kept maps wait on the device until the pass ends (to("cpu")), and so
        # does whether any of them was one encode refuses: nothing is read per batch
        self.pending: list[_ReportRows] = []
        self.staged_kept: dict[str, Tensor] = {}
        self.refused = torch.zeros((), dtype=torch.bool)
        # off the CPU, the layers' maps wait until the batch ends (or fill BUFFER_SHARE of the
        # device's free memory), then their statistics and pattern types run in one call
        self.buffered: list[tuple[int, dict[str, Tensor]]] = []
        self.buffered_bytes, self.buffer_limit = 0, 0

    def start_batch(self, batch: PassBatch) -> None:
        self.buffered, self.buffered_bytes = [], 0  # a batch split after running out of memory: none of it kept
        if self.constants is not None:
            check_constants(self.constants, batch.batch)
        indices = batch.indices
        self.row = indices.index(self.example) if self.example in indices else None
        if self.row is not None:
            keep, self.staged_tokens, _ = _row_tokens(batch, self.row)
            self.keep = keep.to(batch.key_mask.device, non_blocking=True)
            self.layers: list[Any] = [None] * self.n_layers
            self.staged = {view: [None] * self.n_layers for view in self.names}
        self.report_rows = None
        if self.report_examples:
            rows = [row for row, index in enumerate(indices) if index < self.report_examples or index == self.example]
            if rows:
                self.report_rows = _ReportRows.of(batch, rows, self.n_layers, self.names)

    @property
    def types(self) -> dict[str, Tensor]:
        """``view -> [layer, head, type]`` counts of each pattern type (its PatternTypes)."""
        return {view: parts[1].counts for view, parts in self.parts.items()}

    def update(self, layer: LayerPatterns) -> None:
        index = layer.layer
        classifiers = any(type_counter.classifier is not None for _, type_counter in self.parts.values())
        if devices.reads_are_free(layer.pattern) or classifiers:  # the CPU: each view's accumulators in turn
            for statistics, type_counter in self.parts.values():
                statistics.update(layer)
                type_counter.update(layer)
        else:  # a device: every view's maps in one call of each (a third of the kernel launches)
            self._update_together(layer)
        for distance in self.distances.values():
            distance.update(layer)
        if self.row is None and self.report_rows is None:
            return
        per_view = {view: value.read(layer, self.constants, causal=self.causal).float()
                    for view, value in self.views.items()}
        for view, pattern in per_view.items():
            if self.row is not None:
                keep = self.keep
                self.staged[view][index] = pattern[self.row][:, keep][:, :, keep]
            kept = self.report_rows
            if kept is not None:  # the kept rows' maps, coded together (one call per view and layer)
                signed = self.views[view].signed
                blocks = kept.blocks(pattern)
                check = devices.reads_are_free(blocks)
                codes, scales = encode(blocks, signed=signed, check=check)
                if not check:
                    self.refused = self.refused.to(blocks.device) | refused(blocks, signed=signed)
                kept.codes[view][index], kept.scales[view][index] = codes, scales

    def _update_together(self, layer: LayerPatterns) -> None:
        """Keep ``layer``'s maps of every view for :meth:`_flush`, which runs the views'
        :class:`Statistics` and :class:`PatternTypes` for the batch's layers at once; it runs
        here when the kept maps fill :data:`BUFFER_SHARE` of the memory free on their device."""
        maps = {view: value.read(layer, self.constants, causal=self.causal).detach()
                for view, value in self.views.items()}
        if not self.buffer_limit:  # once: the device's free memory (a driver call, no wait)
            self.buffer_limit = max(1, devices.free_bytes(layer.pattern.device) // BUFFER_SHARE)
        self.buffered.append((layer.layer, maps))
        self.buffered_bytes += sum(4 * pattern.numel() for pattern in maps.values())  # their float32 copies
        if self.buffered_bytes >= self.buffer_limit:
            self._flush(layer.batch, layer.key_mask)

    def _flush(self, batch: PassBatch, key_mask: Tensor) -> None:
        """What each view's :class:`Statistics` and :class:`PatternTypes` add for the kept
        layers, computed for all their maps stacked along the batch axis (layer after layer,
        view after view): the same per-example arithmetic (every statistic and template share is
        a function of one map), split back by layer and view before it is summed. One call of
        each for the batch instead of one per layer: on a device, a sixth of the launches of
        MiniLM's six layers."""
        if not self.buffered:
            return
        n, views = len(batch), list(self.views)
        kept, self.buffered, self.buffered_bytes = self.buffered, [], 0
        times = len(kept) * len(views)

        def tiled_inputs() -> tuple[dict[str, Tensor], Tensor, Tensor | None]:
            """What the statistics read of the batch, once per layer and view."""
            return ({name: mask.repeat(times, 1) for name, mask in batch_classes(batch).items()},
                    key_mask.repeat(times, 1),
                    None if batch.compact_positions is None else batch.compact_positions.repeat(times, 1))

        classes, tiled_mask, positions = batch.shared(f"statistics.tiled.{times}", tiled_inputs)
        rows = row_statistics(torch.cat([maps[view].float() for _, maps in kept for view in views]), classes,
                              tiled_mask, positions)
        layers = [index for index, _ in kept]
        # [statistic, layer, view, example, head, query], summed over the valid query rows
        stacked = torch.stack([rows[name] for name in STATISTICS]).unflatten(1, (len(kept), len(views), n))
        sums = (stacked * key_mask[:, None, :].to(BATCH_DTYPE)).sum(dim=(3, 5))  # [statistic, layer, view, head]
        types: dict[str, Tensor] = {}
        for signed in (False, True):  # the template rules read signed maps their own way
            group = [view for view in views if self.views[view].signed == signed]
            if not group:
                continue
            times = len(kept) * len(group)
            positions = batch.shared(f"patterns.positions.tiled.{times}",
                                     lambda times=times: tiled(batch_positions(batch), times))
            labels = template_labels(torch.cat([maps[view] for _, maps in kept for view in group]), positions,
                                     signed=signed)
            counts = torch.nn.functional.one_hot(labels.unflatten(0, (len(kept), len(group), n)),
                                                 len(TYPES)).sum(2)  # [layer, view, head, type]
            types.update({view: counts[:, j] for j, view in enumerate(group)})
        # everything computed before any state changes: running out of memory above leaves the
        # state as it was, whether or not engine.split copied it before the batch
        count = key_mask.sum()
        for j, view in enumerate(views):
            self.parts[view][0].statistics.add_sums(layers, sums[:, :, j], count)
            self.parts[view][1].add_counts(layers, types[view])

    def end_batch(self, batch: PassBatch) -> None:
        self._flush(batch, batch.key_mask)  # the layers kept since the last flush (off the CPU)
        for _, type_counter in self.parts.values():
            type_counter.end_batch(batch)
        longer = (batch.key_mask.sum(-1) > self.d_head).sum()
        self.longer_than_d_head += longer.to(self.longer_than_d_head.device)
        on_host = devices.reads_are_free(batch.key_mask)
        if self.row is not None:
            self.staged_kept = {view: torch.stack(layers) for view, layers in self.staged.items()}
            self.kept_tokens = self.staged_tokens
            self.row = None
            if on_host:
                self._read_kept()
        if self.report_rows is not None:
            if on_host:
                for example in self.report_rows.examples():
                    self._insert(example)
            else:
                self.pending.append(self.report_rows)
        self.report_rows = None

    def _insert(self, example: KeptExample) -> None:
        """Keep ``example`` in corpus order, whatever order the pass runs."""
        bisect.insort(self.kept_patterns.examples, example, key=lambda kept: kept.index)

    def _read_kept(self) -> None:
        """The maps kept on the device, read: the figures' example and the report's examples."""
        if bool(self.refused):
            raise InputError("attention maps to keep hold NaN or infinite values (or an unsigned view "
                             "negative ones): the model's patterns are not distributions")
        if self.staged_kept:
            self.kept = {view: maps.cpu().numpy() for view, maps in self.staged_kept.items()}
            self.staged_kept = {}
        for kept in self.pending:
            for example in kept.examples():
                self._insert(example)
        self.pending = []

    def to(self, device: str | torch.device) -> ViewsAccumulator:
        """Move the state; to the CPU (the end of a pass) the kept maps are read too, once."""
        super().to(device)
        if torch.device(device).type == "cpu":
            self._read_kept()
        return self

    def merge(self, other: Accumulator) -> ViewsAccumulator:
        super().merge(other)
        if not self.kept and isinstance(other, ViewsAccumulator):
            self.kept, self.kept_tokens = other.kept, other.kept_tokens
        if isinstance(other, ViewsAccumulator):
            self.kept_patterns = self.kept_patterns.merged([other.kept_patterns])
        return self

    def all_reduce(self, group: Any = None) -> None:
        import torch.distributed as dist

        super().all_reduce(group)
        parts: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(parts, (self.kept, self.kept_tokens) if self.kept else None, group=group)
        found = next((part for part in parts if part is not None), None)
        if found is not None:
            self.kept, self.kept_tokens = found
        if self.report_examples:
            shards: list[Any] = [None] * dist.get_world_size(group)
            dist.all_gather_object(shards, self.kept_patterns, group=group)
            self.kept_patterns = self.kept_patterns.merged(
                [shard for rank, shard in enumerate(shards) if rank != dist.get_rank(group)]
            )

    def result(self) -> tuple[dict[str, AttentionStatistics], dict[str, Tensor]]:
        zeros = torch.zeros(self.n_layers, self.n_heads, dtype=torch.float64)  # standard from itself
        distance = {view: self.distances[view].result() if view in self.distances else zeros
                    for view in self.names}
        return self.statistics, distance


@dataclass
class _ReportRows:
    """The rows of the batch being run whose maps :class:`ViewsAccumulator` keeps for the report,
    coded together: their corpus ``indices``, ``rows`` in the batch, each row's real columns
    (``columns`` ``[row, most]``, padded with column 0, and ``valid`` where they are real; found
    on the host), tokens and segments, and per view and layer the codes and scales of
    :func:`attnlens.present.kept.encode` of all of them at once (``[row, head, most, most]`` and
    ``[row, head]``; a row's own map is its first ``n × n`` block, zero beyond it, which changes
    no scale)."""

    indices: list[int]
    rows: Tensor
    columns: Tensor
    valid: Tensor
    tokens: list[list[str]]
    segments: list[list[int]]
    codes: dict[str, list[Any]]
    scales: dict[str, list[Any]]

    @classmethod
    def of(cls, batch: PassBatch, rows: list[int], n_layers: int, views: Sequence[str]) -> _ReportRows:
        found = [_row_tokens(batch, row) for row in rows]
        most = max(len(keep) for keep, _, _ in found)
        columns = torch.zeros(len(rows), most, dtype=torch.long)
        valid = torch.zeros(len(rows), most, dtype=torch.bool)
        for i, (keep, _, _) in enumerate(found):
            columns[i, : len(keep)], valid[i, : len(keep)] = keep, True
        device = batch.key_mask.device
        return cls(
            [batch.indices[row] for row in rows], torch.tensor(rows).to(device, non_blocking=True),
            columns.to(device, non_blocking=True), valid.to(device, non_blocking=True),
            [tokens for _, tokens, _ in found],
            [segments_of(separators, bool(batch.batch.is_pair)) for _, _, separators in found],
            {view: [None] * n_layers for view in views}, {view: [None] * n_layers for view in views},
        )

    def blocks(self, pattern: Float[Tensor, "batch head query key"]) -> Float[Tensor, "row head most most"]:
        """Each kept row's map on its real tokens, in the top-left corner, zero elsewhere."""
        chosen = pattern.index_select(0, self.rows)
        n_rows, n_heads, width, _ = chosen.shape
        most = self.columns.shape[1]
        queries = chosen.gather(2, self.columns[:, None, :, None].expand(n_rows, n_heads, most, width))
        block = queries.gather(3, self.columns[:, None, None, :].expand(n_rows, n_heads, most, most))
        return block * (self.valid[:, None, :, None] & self.valid[:, None, None, :])

    def examples(self) -> list[KeptExample]:
        """The kept examples (their codes read from the device, one copy per view)."""
        codes = {view: torch.stack(layers, 1).cpu().numpy() for view, layers in self.codes.items()}
        scales = {view: torch.stack(layers, 1).cpu().numpy() for view, layers in self.scales.items()}
        return [
            KeptExample.from_codes(
                index, "", tokens, segments,
                {view: every[i, :, :, : len(tokens), : len(tokens)] for view, every in codes.items()},
                {view: every[i] for view, every in scales.items()},
            )
            for i, (index, tokens, segments) in enumerate(zip(self.indices, self.tokens, self.segments, strict=True))
        ]


def _row_tokens(batch: PassBatch, row: int) -> tuple[Tensor, list[str], list[int]]:
    """``(keep, tokens, separators)`` of one row of a pass's batch, read on the host (the pass's
    copy of the inputs there, :attr:`PassBatch.on_host`): the columns of its real tokens, their
    texts, and which of them are separators."""
    host = batch.on_host if batch.on_host is not None else batch.batch.to("cpu")
    mask = host.attention_mask.bool()
    keep = mask[row].nonzero().squeeze(-1)
    tokenizer = batch.model.tokenizer
    ids = host.input_ids[row, keep]
    tokens = token_texts(tokenizer, tokenizer.convert_ids_to_tokens(ids.tolist()))
    separators = batch.shared("compare.host_classes", lambda: token_classes(tokenizer, host.input_ids, mask))["sep"]
    return keep, tokens, separators[row, keep].tolist()
