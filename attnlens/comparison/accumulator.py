"""The pass of :func:`attnlens.compare` as one accumulator: :class:`ViewsAccumulator`, the
methods' own accumulators for every view, run together, and the maps it keeps for the figures
and the report's explorer (:class:`ReportRows`)."""

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
from attnlens.engine.accumulator import Accumulator, LayerPatterns, PassBatch, added_together
from attnlens.errors import InputError
from attnlens.methods import views as registry
from attnlens.methods.patterns.counts import PatternTypes, type_counts
from attnlens.methods.patterns.templates import batch_positions, template_labels
from attnlens.methods.stats import (
    AttentionStatistics,
    Distance,
    Statistics,
    batch_statistic_terms,
    statistic_sums,
    token_classes,
    token_texts,
    total_dtype,
    total_variation,
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
    from the declarations. One layer at a time (the CPU) it hands each layer to its parts; a
    stack of the batch's layers (off the CPU, :attr:`stacks`: every view stacks its maps) it
    computes for all views at once with the parts' own functions and adds to their state
    (:meth:`_update_stack`). It keeps the valid block of example ``example``'s maps for the
    figures.
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
        #: the views of each sign, as indices into names: the template rules and the kept maps'
        #: codes read signed maps their own way
        self.signs = [(sign, [j for j, view in enumerate(names) if self.views[view].signed == sign])
                      for sign in (False, True) if any(self.views[view].signed == sign for view in names)]
        self.kept_patterns = KeptPatterns(names, signed, n_layers, n_heads, limit=report_examples)
        self.report_rows: ReportRows | None = None
        # off the CPU the kept maps wait on the device until the pass ends (to("cpu")), their
        # scales telling whether encode refused any of them: nothing is read per batch
        self.pending: list[ReportRows] = []
        self.staged_kept: dict[str, Tensor] = {}
        # off the CPU, the engine hands a batch's layers as one stack (every view stacks its maps)
        self.stacks = all(value.stacks for value in self.views.values())

    def start_batch(self, batch: PassBatch) -> None:
        if self.constants is not None:
            check_constants(self.constants, batch.batch)
        indices = batch.indices
        self.row = indices.index(self.example) if self.example in indices else None
        if self.row is not None:
            keep, self.staged_tokens, _ = row_tokens(batch, self.row)
            self.keep = devices.to_device(keep, batch.key_mask.device)  # pinned: no wait for the device
            self.staged = {view: [None] * self.n_layers for view in self.names}
        self.report_rows = None
        if self.report_examples:
            rows = [row for row, index in enumerate(indices) if index < self.report_examples or index == self.example]
            if rows:
                self.report_rows = ReportRows.of(batch, rows, self.n_layers, self.names)

    @property
    def types(self) -> dict[str, Tensor]:
        """``view -> [layer, head, type]`` counts of each pattern type (its PatternTypes)."""
        return {view: parts[1].counts for view, parts in self.parts.items()}

    def update(self, layer: LayerPatterns) -> None:
        if layer.layers:  # a stack of the batch's layers (off the CPU): every part in one call
            self._update_stack(layer)
            return
        for statistics, type_counter in self.parts.values():  # one layer: each view's parts in turn
            statistics.update(layer)
            type_counter.update(layer)
        for distance in self.distances.values():
            distance.update(layer)
        if self.row is not None or self.report_rows is not None:
            self._keep_rows([layer.layer], torch.stack([value.read(layer, self.constants, causal=self.causal).float()[None]
                                                        for value in self.views.values()]))

    def _keep_rows(self, layers: list[int], maps: Float[Tensor, "view layer batch head query key"]) -> None:
        """Keep the figures' example's and the report's rows of ``maps``, every view's maps (in
        :attr:`names`' order) of ``layers``: the example's valid block, and the report rows'
        codes (one :func:`encode` for the views of each sign, all their layers at once)."""
        if self.row is not None:
            block = maps[:, :, self.row].index_select(-2, self.keep).index_select(-1, self.keep)
            for j, view in enumerate(self.names):
                for i, index in enumerate(layers):
                    self.staged[view][index] = block[j, i]
        kept = self.report_rows
        if kept is None:
            return
        blocks = kept.blocks(maps)  # the kept rows' maps, [view, layer, row, head, most, most]
        check = devices.reads_are_free(blocks)
        for signed, group in self.signs:
            chosen = _views_of(blocks, group)
            codes, scales = encode(chosen, signed=signed, check=check)  # unchecked: scales read at the end
            for g, j in enumerate(group):
                for i, index in enumerate(layers):
                    kept.codes[self.names[j]][index], kept.scales[self.names[j]][index] = codes[g, i], scales[g, i]

    def _update_stack(self, stack: LayerPatterns) -> None:
        """Every part's additions for a stack of the batch's layers
        (:meth:`LayerPatterns.stack`), computed for all their maps at once: every view's maps
        of the stack (:meth:`attnlens.methods.views.View.read`, one call each, stacked); the statistics
        and pattern types of all of them stacked (view after view, layer after layer: the same
        per-example arithmetic, every statistic and template share a function of one map, split
        back by view and layer before it is summed); each view's distances
        (:func:`attnlens.methods.stats.total_variation`); and the kept rows (:meth:`_keep_rows`).
        One call of each for the batch instead of one per layer and view: on a device, an
        eighteenth of the launches of MiniLM's six layers and three views."""
        batch, key_mask, layers = stack.batch, stack.batch.key_mask, list(stack.layers)
        n = len(batch)
        maps = torch.stack([value.read(stack, self.constants, causal=self.causal).float().unflatten(0, (len(layers), n))
                            for value in self.views.values()])  # [view, layer, example, head, query, key]
        sums = statistic_sums(maps, batch_statistic_terms(batch)).movedim(-1, 0)  # [statistic, view, layer, head]
        types: dict[str, Tensor] = {}
        for signed, group in self.signs:  # the template rules read signed maps their own way
            labels = template_labels(_views_of(maps, group), batch_positions(batch), signed=signed)  # [view, layer, example, head]
            counts = type_counts(labels)  # [view, layer, head, type]
            types.update({self.names[j]: counts[g] for g, j in enumerate(group)})
        # every view but the first from the model's own maps (analyses: the first has no distance)
        distances = total_variation(maps[1:], stack.pattern.float().unflatten(0, (len(layers), n)), key_mask) \
            if len(self.names) > 1 else None
        if self.row is not None or self.report_rows is not None:
            self._keep_rows(layers, maps)
        # everything computed before any state changes: a stack that runs out of memory above
        # adds nothing (engine.split puts back what an earlier stack of the batch added)
        # in the totals' dtype at once, and added together (one multi-tensor addition per dtype)
        total = total_dtype(key_mask.device)
        sums, count = sums.to(total), key_mask.sum().to(total)
        distances = None if distances is None else distances.to(total)
        with added_together():
            for j, view in enumerate(self.names):
                self.parts[view][0].statistics.add_sums(layers, sums[:, j], count)
                self.parts[view][1].add_counts(layers, types[view])
                if distances is not None and j:
                    self.distances[view].add_totals(layers, distances[j - 1])

    def end_batch(self, batch: PassBatch) -> None:
        for _, type_counter in self.parts.values():
            type_counter.end_batch(batch)
        d_head = self.d_head  # counted on the host's copy of the tokens (PassBatch.from_host)
        longer = batch.from_host("compare.longer", lambda inputs: (inputs.attention_mask.sum(-1) > d_head).sum())
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
                for example in self.report_rows.examples(*devices.to_host((self.report_rows.codes,
                                                                            self.report_rows.scales))):
                    self._insert(example)
            else:
                self.pending.append(self.report_rows)
        self.report_rows = None

    def _insert(self, example: KeptExample) -> None:
        """Keep ``example`` in corpus order, whatever order the pass runs."""
        bisect.insort(self.kept_patterns.examples, example, key=lambda kept: kept.index)

    def _read_kept(self) -> None:
        """The maps kept on the device, read in one copy (:func:`attnlens.core.devices.to_host`):
        the figures' example, the report's examples, and whether any was one encode refuses."""
        read = devices.to_host({"kept": self.staged_kept, "rows": [(rows.codes, rows.scales) for rows in self.pending]})
        if any(refused(np.asarray(layer)) for _, scales in read["rows"] for layers in scales.values() for layer in layers):
            raise InputError("attention maps to keep hold NaN or infinite values (or an unsigned view "
                             "negative ones): the model's patterns are not distributions")
        if self.staged_kept:
            self.kept, self.staged_kept = read["kept"], {}
        for rows, (codes, scales) in zip(self.pending, read["rows"], strict=True):
            for example in rows.examples(codes, scales):
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

    def settings(self) -> dict[str, Any]:
        return registry.value_settings(self.constants)

    def result(self) -> tuple[dict[str, AttentionStatistics], dict[str, Tensor]]:
        zeros = torch.zeros(self.n_layers, self.n_heads, dtype=torch.float64)  # standard from itself
        distance = {view: self.distances[view].result() if view in self.distances else zeros
                    for view in self.names}
        return self.statistics, distance


@dataclass
class ReportRows:
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
    def of(cls, batch: PassBatch, rows: list[int], n_layers: int, views: Sequence[str]) -> ReportRows:
        found = [row_tokens(batch, row) for row in rows]
        most = max(len(keep) for keep, _, _ in found)
        columns = torch.zeros(len(rows), most, dtype=torch.long)
        valid = torch.zeros(len(rows), most, dtype=torch.bool)
        for i, (keep, _, _) in enumerate(found):
            columns[i, : len(keep)], valid[i, : len(keep)] = keep, True
        # the rows' indices in one pinned copy (devices.to_device): pageable copies would wait
        index, columns, valid = devices.to_device((torch.tensor(rows), columns, valid), batch.key_mask.device)
        return cls(
            [batch.indices[row] for row in rows], index, columns, valid,
            [tokens for _, tokens, _ in found],
            [segments_of(separators, bool(batch.batch.is_pair)) for _, _, separators in found],
            {view: [None] * n_layers for view in views}, {view: [None] * n_layers for view in views},
        )

    def blocks(self, pattern: Float[Tensor, "*stack batch head query key"]) -> Float[Tensor, "*stack row head most most"]:
        """Each kept row's map on its real tokens, in the top-left corner, zero elsewhere
        (``stack``: any leading axes, e.g. the layers of the batch)."""
        chosen = pattern.index_select(-4, self.rows)
        *stack, n_rows, n_heads, width, _ = chosen.shape
        most = self.columns.shape[1]
        queries = chosen.gather(-2, self.columns[:, None, :, None].expand(*stack, n_rows, n_heads, most, width))
        block = queries.gather(-1, self.columns[:, None, None, :].expand(*stack, n_rows, n_heads, most, most))
        return block * (self.valid[:, None, :, None] & self.valid[:, None, None, :])

    def examples(self, codes: dict[str, list[np.ndarray]], scales: dict[str, list[np.ndarray]]) -> list[KeptExample]:
        """The kept examples, from :attr:`codes` and :attr:`scales` read on the host (``codes``,
        ``scales``: the same per view and layer, as arrays)."""
        codes = {view: np.stack(layers, 1) for view, layers in codes.items()}
        scales = {view: np.stack(layers, 1) for view, layers in scales.items()}
        return [
            KeptExample.from_codes(
                index, "", tokens, segments,
                {view: every[i, :, :, : len(tokens), : len(tokens)] for view, every in codes.items()},
                {view: every[i] for view, every in scales.items()},
            )
            for i, (index, tokens, segments) in enumerate(zip(self.indices, self.tokens, self.segments, strict=True))
        ]


def _views_of(maps: Tensor, group: list[int]) -> Tensor:
    """``maps``' entries ``group`` along its first axis (the views): a slice when they follow
    one another (no copy), else a stack."""
    if group == list(range(group[0], group[0] + len(group))):
        return maps[group[0] : group[0] + len(group)]
    return torch.stack([maps[j] for j in group])


def row_tokens(batch: PassBatch, row: int) -> tuple[Tensor, list[str], list[int]]:
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
