"""Stacked PAPA probes: several probes of one shape trained as one model.

PAPA (Hassid et al. 2022, §4.1) reports every score as the mean of three probe seeds, at each
point of each task's curve (Fig. 2): many small probes (:class:`PapaProbe`, §3.3) of the same
shape, trained on the same examples. :func:`fit_many` trains them together: every parameter
gets a leading *member* axis (a member: one probe, i.e. one seed on one feature set), the
forward pass runs all members with batched matmuls (``torch.baddbmm``), and one Adam step
updates them all. On a GPU that is one sequence of kernels for all members instead of one per
probe; on the CPU it saves the per-step overhead of each probe.

Each member is the same fit as its own :meth:`PapaProbe.fit`:

- its initial weights come from a :class:`ProbeNetwork` built under its seed, as in ``fit``;
- its examples' order and its held-out split come from its own generator (its seed);
- its loss is its own mean cross-entropy, and the model's loss is the *sum* over members, so
  each member's gradient is that of its own loss (the other members' terms do not depend on
  its parameters). Adam is element-wise (its moments and step are per element; the step count
  is shared, and all members step together), so each member's update equals its own fit's;
- its dropout masks are drawn from its own generator in the order its own fit draws them: on
  the CPU, a generator holding the state the global generator has in ``fit`` once the network
  is built (``fit`` seeds it, builds the network, then draws one mask per step with
  ``bernoulli_(1 - p)``, as ``nn.Dropout`` does on the CPU, on a ``[row, hidden]`` tensor of
  the same shape); so the masks are the very same bits. On a GPU, ``nn.Dropout`` runs a fused
  kernel that draws from its own Philox stream with a layout of its own, which no per-member
  draw can reproduce: there each member's masks come from a CUDA generator seeded with its
  seed (the same distribution, reproducible, not the same bits as a separate fit);
- early stopping is per member: after each epoch every member still training is judged on its
  own held-out examples; a member that stops (or reaches its own ``epochs``) keeps its best
  epoch's weights, as ``fit`` does, and leaves the stacked model (its slices of the parameters
  and of Adam's moments are dropped), so the others train on without it.

What differs from separate fits is only the order of float32 sums inside the batched matmuls
and the loss reductions (on the CPU, ``torch.baddbmm`` runs the same GEMM per member as
``nn.Linear``; tests/unit/test_stacked_probe.py checks each member against its own fit).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from attnlens.core import devices, memory
from attnlens.core.modes import gradients, own_arithmetic
from attnlens.engine.batches import progress_bar
from attnlens.errors import InputError, InputTypeError, MismatchError
from attnlens.evaluation.probing.features import Features
from attnlens.evaluation.probing.probe import (
    PapaProbe,
    ProbeNetwork,
    as_lists,
    held_out_split,
    label_targets,
    made_for_record,
    standardize,
)

#: Settings that may differ between the members of one stacked fit (every other one is shared).
PER_MEMBER: tuple[str, ...] = ("seed", "epochs")

#: The parameters and buffers of :class:`ProbeNetwork`, by their names in its ``state_dict``, and
#: the attribute each has in :class:`StackedNetwork` (with a leading member axis).
STATE: dict[str, str] = {"position_weights": "position_weights", "mean": "mean", "scale": "scale",
                         "dense.weight": "dense_t", "dense.bias": "dense_bias",
                         "out.weight": "out_t", "out.bias": "out_bias"}
BUFFERS = ("mean", "scale")
#: The weights kept transposed, ``[member, in, out]``: the layout ``torch.baddbmm`` takes and
#: returns their gradients in (``nn.Linear``'s ``[out, in]`` would cost a copy of every weight's
#: gradient per step).
TRANSPOSED = ("dense.weight", "out.weight")


class StackedNetwork(nn.Module):
    """``M`` probe networks (:class:`ProbeNetwork`) of one shape as one module: each of their
    tensors with a leading member axis: ``position_weights [member, layer, max_len]`` (sequence
    probes), the buffers ``mean`` / ``scale [member, layer, d_model]``, ``dense_t
    [member, layer·d_model, hidden]``, ``dense_bias [member, hidden]``, ``out_t
    [member, hidden, label]``, ``out_bias [member, label]`` (the two weights transposed:
    :data:`TRANSPOSED`). ``state`` / :meth:`member` / :meth:`subset` speak :class:`ProbeNetwork`'s
    names and layout."""

    def __init__(self, state: dict[str, Tensor], *, sequence: bool, max_len: int, pooling: str,
                 standardize: bool, dropout: float) -> None:
        super().__init__()
        self.sequence, self.max_len, self.pooling = sequence, max_len, pooling
        self.standardize, self.dropout = standardize, float(dropout)
        for name, attribute in STATE.items():
            if name not in state:
                continue
            value = state[name].detach()
            value = value.transpose(1, 2) if name in TRANSPOSED else value
            value = value.clone(memory_format=torch.contiguous_format)
            if name in BUFFERS:
                self.register_buffer(attribute, value)
            else:
                setattr(self, attribute, nn.Parameter(value))

    @classmethod
    def of(cls, networks: Sequence[ProbeNetwork]) -> StackedNetwork:
        """The networks stacked, in order (member ``i``: ``networks[i]``)."""
        first = networks[0]
        states = [network.state_dict() for network in networks]
        return cls({name: torch.stack([state[name] for state in states]) for name in states[0]},
                   sequence=first.sequence, max_len=first.max_len, pooling=first.pooling,
                   standardize=first.standardize, dropout=first.dropout.p)

    @property
    def members(self) -> int:
        return int(self.dense_t.shape[0])

    def state(self) -> dict[str, Tensor]:
        """Every tensor by its :class:`ProbeNetwork` name and in its layout, with the member axis
        first (views)."""
        return {name: getattr(self, attribute).transpose(1, 2) if name in TRANSPOSED else getattr(self, attribute)
                for name, attribute in STATE.items() if hasattr(self, attribute)}

    def member(self, index: int) -> dict[str, Tensor]:
        """Member ``index``'s ``state_dict`` for a :class:`ProbeNetwork` (copies)."""
        return {name: value.detach()[index].clone(memory_format=torch.contiguous_format)
                for name, value in self.state().items()}

    def subset(self, keep: Int[Tensor, " kept"]) -> StackedNetwork:
        """A new stacked network of the members at ``keep`` (in that order)."""
        return StackedNetwork({name: value.detach()[keep] for name, value in self.state().items()},
                              sequence=self.sequence, max_len=self.max_len, pooling=self.pooling,
                              standardize=self.standardize, dropout=self.dropout)

    def forward(self, groups: Sequence[Group], n_rows: int, noise: Sequence[torch.Generator] | None = None,
                real: Sequence[int] | None = None) -> Float[Tensor, "member row label"]:
        """Logits of every member's rows: ``[member, row, label]``, a row being an example
        (sequence probes) or a word's vector (word probes); rows past a member's ``real[m]``
        are padding (their logits are to be ignored).

        ``groups``: the tokens of the members that read one feature set (:class:`Group`: their
        vectors of every layer, positions, members and rows); each is pooled on its own, so that
        no step holds a copy of all members' token vectors at once (on the CPU, tensors past the
        allocator's reuse threshold are fresh pages at every step:
        :data:`attnlens.core.memory.MMAP_THRESHOLD`). ``noise``: one generator per member to
        draw its dropout masks from (training), or ``None`` (evaluation: no dropout); ``real``:
        each member's real rows (masks are drawn for those only, as a separate fit of that batch
        does)."""
        count = self.members
        first = groups[0].vectors
        width = first.shape[1:]
        pooled = torch.zeros((count * n_rows, *width), dtype=first.dtype, device=first.device)
        if self.sequence:
            total = torch.zeros((count * n_rows, width[0]), dtype=first.dtype, device=first.device)
            tokens = torch.zeros(count * n_rows, dtype=first.dtype, device=first.device)
        for group in groups:
            slot = group.member * n_rows + group.row
            if not self.sequence:
                pooled[slot] = group.vectors
                continue
            # as ProbeNetwork.forward, per member: s[e, l] = Σ_{p in e} w[l, p] · (h_l[p] − μ_l) / σ_l
            weights = self.position_weights[group.member, :, group.positions]  # [token, layer]
            pooled.index_add_(0, slot, group.vectors * weights[:, :, None])
            if self.standardize:
                total.index_add_(0, slot, weights)
            if self.pooling == "mean":
                tokens.index_add_(0, slot, tokens.new_ones(len(slot)))  # (bincount reads back on a GPU)
        pooled = pooled.view(count, n_rows, *width)
        if self.sequence:
            if self.standardize:
                pooled = (pooled - self.mean[:, None] * total.view(count, n_rows, width[0], 1)) / self.scale[:, None]
            if self.pooling == "mean":
                pooled = pooled * (self.max_len / tokens.clamp_min(1)).view(count, n_rows, 1, 1)
        elif self.standardize:
            pooled = (pooled - self.mean[:, None]) / self.scale[:, None]
        hidden = torch.tanh(torch.baddbmm(self.dense_bias[:, None], pooled.reshape(count, n_rows, -1), self.dense_t))
        if noise is not None and self.dropout > 0:
            # nn.Dropout's own steps on the CPU: a mask of bernoulli_(1 - p), divided by 1 - p
            mask = torch.ones_like(hidden)
            for index, generator in enumerate(noise):
                mask[index, : (n_rows if real is None else real[index])].bernoulli_(1 - self.dropout,
                                                                                   generator=generator)
            hidden = hidden * mask.div_(1 - self.dropout)
        return torch.baddbmm(self.out_bias[:, None], hidden, self.out_t)


@dataclass
class _Member:
    """One probe of a stacked fit: its probe, features, targets and training state."""

    probe: PapaProbe
    features: Features
    targets: Tensor  # on the CPU, as the indices of a step
    lengths: Tensor  # the features' lengths, on the CPU
    offsets: Tensor  # and their offsets
    order: torch.Generator  # the examples' order (and the held-out split), from its seed
    noise: torch.Generator  # its dropout masks
    train: Tensor
    held: Tensor | None
    epochs: int
    scores: list[float] = field(default_factory=list)
    best: float = -float("inf")
    best_state: dict[str, Tensor] | None = None
    waited: int = 0
    final: dict[str, Tensor] | None = None


@gradients()  # autograd on, whatever the caller's mode
def fit_many(probes: Sequence[PapaProbe], features: Features | Sequence[Features], labels: list, *,
             task: str | None = None, label_names: Sequence[str] | None = None,
             scorer: Callable[[np.ndarray, list], float] | None = None) -> list[PapaProbe]:
    """Fit ``probes`` together as one stacked model (see the module docstring); returns them,
    each fitted as its own :meth:`PapaProbe.fit` would fit it (``network``, ``epochs_``,
    ``validation_scores_``; ``score`` / ``predict`` / ``save`` as after ``fit``).

    ``features``: one :class:`Features` for every probe (seeds on the same features), or one
    per probe (e.g. the points of a task's curve: the same examples under other hooks), all of
    one kind and shape (examples, layers, ``d_model``, ``max_len``); ``labels``: the examples'
    labels, shared by all. The probes' settings must be equal but for :data:`PER_MEMBER`
    (``seed``, ``epochs``). ``task``, ``label_names`` and ``scorer``: as in
    :meth:`PapaProbe.fit` (``scorer`` judges each member's own held-out examples)."""
    members = _members(probes, features, labels, task, label_names)
    settings = members[0].probe.settings
    device = members[0].features.vectors.device
    stacked = StackedNetwork.of([member.probe.network for member in members]).to(device)
    optimiser = _adam(stacked, settings, device)
    active = list(range(len(members)))  # the members still training, in the stacked model's order
    bar = progress_bar(range(sum(member.epochs * len(member.train) for member in members)), "probes",
                       any(member.probe.progress for member in members))
    try:
        for epoch in range(1, max(member.epochs for member in members) + 1):
            stacked.train()
            running = [members[index] for index in active]
            orders = [member.train[torch.randperm(len(member.train), generator=member.order)] for member in running]
            for start in range(0, len(orders[0]), settings.batch_size):
                chosen = [order[start : start + settings.batch_size] for order in orders]
                logits, wanted = _logits(stacked, running, chosen, training=True)
                value = _mean_losses(logits, wanted).sum()  # each member's gradient: its own loss's
                optimiser.zero_grad()
                value.backward()
                optimiser.step()
                bar.update(sum(len(part) for part in chosen))
            judged = running[0].held is not None and epoch >= settings.min_epochs
            current = _judge(stacked, running, scorer) if judged else [None] * len(running)
            keep = []
            for index, (member, value) in enumerate(zip(running, current, strict=True)):
                stopped = False
                if value is not None:
                    member.scores.append(float(value))
                    if value > member.best:
                        member.best, member.waited = value, 0
                        member.best_state = stacked.member(index)
                    else:
                        member.waited += 1
                        stopped = member.waited >= settings.n_iter_no_change
                if stopped or epoch >= member.epochs:
                    member.final = stacked.member(index) if member.best_state is None else member.best_state
                else:
                    keep.append(index)
            if not keep:
                break
            if len(keep) < len(running):  # the finished members leave the model and the optimiser
                stacked, optimiser = _subset(stacked, optimiser, keep, settings, device)
                active = [active[index] for index in keep]
    finally:
        bar.close()
    for member in members:
        probe = member.probe
        probe.network.to(device).load_state_dict(member.final)
        probe.network.eval()
        probe.validation_scores_ = member.scores
        first = min(probe.settings.min_epochs, probe.settings.epochs)
        probe.epochs_ = (int(torch.tensor(member.scores).argmax()) + first if member.scores
                         else probe.settings.epochs)
    return [member.probe for member in members]


def _members(probes: Sequence[PapaProbe], features: Features | Sequence[Features], labels: list,
             task: str | None, label_names: Sequence[str] | None) -> list[_Member]:
    """The members of a stacked fit, checked, each set up as :meth:`PapaProbe.fit` sets itself
    up: its targets, labels, split, initial network (under its seed) and standardisation."""
    probes = list(probes)
    if not probes:
        raise InputError("no probe to fit; give at least one PapaProbe.")
    for index, probe in enumerate(probes):
        if not isinstance(probe, PapaProbe):
            raise InputTypeError(f"probes[{index}] is a {type(probe).__name__}, not a PapaProbe.")
    if isinstance(features, Features):
        sets = [features] * len(probes)
    else:
        sets = list(features)
        if len(sets) != len(probes):
            raise InputError(f"{len(sets)} feature sets for {len(probes)} probes; give one per probe, "
                             "or one for all.")
        for index, one in enumerate(sets):
            if not isinstance(one, Features):
                raise InputTypeError(f"features[{index}] is a {type(one).__name__}, not Features.")
    shared = {name: value for name, value in asdict(probes[0].settings).items() if name not in PER_MEMBER}
    for index, probe in enumerate(probes[1:], 1):
        for name, value in asdict(probe.settings).items():
            if name in shared and shared[name] != value:
                raise InputError(f"probes[{index}] has {name}={value!r} and probes[0] {name}={shared[name]!r}; "
                                 f"stacked probes share every setting but {', '.join(PER_MEMBER)}: fit "
                                 "the others separately.")
    shape = _shape(sets[0])
    for index, one in enumerate(sets[1:], 1):
        if _shape(one) != shape:
            raise MismatchError(f"features[{index}] are {_shape(one)} and features[0] {shape} "
                                "(kind, examples, layers, d_model, max_len); stacked probes need features "
                                "of one shape: fit the others separately.")
    memory.reuse_freed_memory()
    targets_of: dict[int, Tensor] = {}
    lengths_of: dict[int, Tensor] = {}
    standard: dict[int, tuple[Tensor, Tensor]] = {}
    members = []
    for probe, one in zip(probes, sets, strict=True):
        if id(one) not in targets_of:
            targets_of[id(one)] = label_targets(one.check_finite(), labels).cpu()
            lengths_of[id(one)] = one.lengths.cpu()  # one copy per fit: every step indexes them
        targets = targets_of[id(one)]
        valid = targets >= 0
        if not valid.any():
            raise InputError("no labelled example to train the probe on.")
        settings = probe.settings
        probe.n_labels = int(targets[valid].max()) + 1  # this fit's labels: a refit is a fresh fit
        probe.fallback = int(torch.bincount(targets[valid], minlength=probe.n_labels).argmax())
        probe.max_len = one.max_len
        probe.made_for = made_for_record(one, task, label_names)
        order = torch.Generator().manual_seed(settings.seed)
        train, held = held_out_split(len(one), settings.validation_fraction if settings.early_stopping else 0.0, order)
        with torch.random.fork_rng(devices=[]):  # initial weights, then dropout: from the seed, as fit
            torch.manual_seed(settings.seed)
            probe.network = ProbeNetwork(
                one.n_layers, one.d_model, settings.hidden or one.d_model, probe.n_labels, one.max_len,
                one.kind == "sequence", settings.dropout, settings.pooling, settings.standardize,
            )
            dropout_state = torch.get_rng_state()
        if one.vectors.device.type == "cpu":
            noise = torch.Generator()
            noise.set_state(dropout_state)
        else:  # see the module docstring: the fused GPU dropout's draws cannot be reproduced
            noise = torch.Generator(device=one.vectors.device).manual_seed(settings.seed)
        if settings.standardize:
            if id(one) not in standard:
                standardize(probe.network, one, targets)
                standard[id(one)] = (probe.network.mean.clone(), probe.network.scale.clone())
            probe.network.mean.copy_(standard[id(one)][0])
            probe.network.scale.copy_(standard[id(one)][1])
        lengths = lengths_of[id(one)]
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        members.append(_Member(probe, one, targets, lengths, offsets, order, noise, train, held, settings.epochs))
    labels_each = {member.probe.n_labels for member in members}
    if len(labels_each) > 1:
        raise MismatchError(f"these probes would have {sorted(labels_each)} labels; stacked probes need one "
                            "number of labels: fit the others separately.")
    return members


def _shape(features: Features) -> tuple[Any, ...]:
    return (features.kind, len(features), features.n_layers, features.d_model, features.max_len)


def _adam(stacked: StackedNetwork, settings: Any, device: torch.device) -> torch.optim.Adam:
    """The optimiser of :meth:`PapaProbe.fit`, over the stacked parameters."""
    return torch.optim.Adam(stacked.parameters(), lr=settings.lr, weight_decay=settings.weight_decay,
                            fused=device.type in ("cpu", "cuda"))


def _subset(stacked: StackedNetwork, optimiser: torch.optim.Adam, keep: list[int], settings: Any,
            device: torch.device) -> tuple[StackedNetwork, torch.optim.Adam]:
    """The stacked model and its optimiser for the members at ``keep``: their slices of every
    parameter and of Adam's per-element moments, and the shared step count."""
    index = torch.tensor(keep, device=device)
    smaller = stacked.subset(index)
    moved = _adam(smaller, settings, device)
    for old, new in zip(stacked.parameters(), smaller.parameters(), strict=True):
        moved.state[new] = {name: (value[index].clone() if value.ndim > 0 else value.clone())
                            for name, value in optimiser.state[old].items()}
    return smaller, moved


@dataclass
class Group:
    """The tokens of one step of the members that read one feature set: ``vectors [token, layer,
    d_model]`` (float32), ``positions``, and for each token its ``member`` and its ``row`` within
    that member (see :meth:`StackedNetwork.forward`)."""

    vectors: Float[Tensor, "token layer d_model"]
    positions: Int[Tensor, " token"]
    member: Int[Tensor, " token"]
    row: Int[Tensor, " token"]


def _batch(members: Sequence[_Member], chosen: Sequence[Tensor], device: torch.device
           ) -> tuple[list[Group], int, list[int], Tensor]:
    """The tokens of each member's ``chosen`` examples, as :meth:`PapaProbe._logits` gathers
    them, for :meth:`StackedNetwork.forward`: ``(groups, n_rows, real, targets [member, row])``,
    one :class:`Group` per feature set (targets ``-1`` on padding rows)."""
    sequence = members[0].features.kind == "sequence"
    rows_of, example_of = [], []
    for member, part in zip(members, chosen, strict=True):
        lengths = member.lengths[part]
        example = torch.repeat_interleave(torch.arange(len(part)), lengths)
        starts = member.offsets[:-1][part] - (lengths.cumsum(0) - lengths)
        rows_of.append(starts[example] + torch.arange(int(lengths.sum())))
        example_of.append(example)
    # one gather per feature set (all the members of a seed-only stack: one)
    by_features: dict[int, list[int]] = {}
    for index, member in enumerate(members):
        by_features.setdefault(id(member.features), []).append(index)
    host = []  # per feature set: its rows, and each row's position, member and row in that member
    for indices in by_features.values():
        features = members[indices[0]].features
        rows = torch.cat([rows_of[index] for index in indices])
        member_of = torch.cat([torch.full((len(rows_of[index]),), index, dtype=torch.long) for index in indices])
        row_of = torch.cat([example_of[index] if sequence else torch.arange(len(rows_of[index]))
                            for index in indices])
        host.append((rows, features.positions.index_select(0, rows.to(features.positions.device)), member_of, row_of))
    real = [len(part) for part in chosen] if sequence else [len(rows) for rows in rows_of]
    n_rows = max(real) if real else 0
    targets = torch.full((len(members), n_rows), -1, dtype=torch.long)
    for index, member in enumerate(members):
        picked = member.targets[chosen[index]] if sequence else member.targets[rows_of[index]]
        targets[index, : len(picked)] = picked
    # every index of the step to the device in one copy (devices.to_device: pinned, no wait); a
    # copy per tensor from pageable memory would make the host wait for the device every step
    moved, targets = devices.to_device((host, targets), device)
    groups = []
    for indices, (rows, positions, member_of, row_of) in zip(by_features.values(), moved, strict=True):
        vectors = members[indices[0]].features.vectors
        groups.append(Group(vectors.index_select(0, rows.to(vectors.device)).float().to(device), positions,
                            member_of, row_of))
    return groups, n_rows, real, targets


def _logits(stacked: StackedNetwork, members: Sequence[_Member], chosen: Sequence[Tensor], *,
            training: bool) -> tuple[Tensor, Tensor]:
    """Every member's logits of its ``chosen`` examples and their targets, ``[member, row, …]``."""
    groups, n_rows, real, targets = _batch(members, chosen, stacked.dense_t.device)
    noise = [one.noise for one in members] if training else None
    return stacked(groups, n_rows, noise=noise, real=real), targets


def _mean_losses(logits: Float[Tensor, "member row label"], targets: Int[Tensor, "member row"]
                 ) -> Float[Tensor, " member"]:
    """Each member's mean cross-entropy over its labelled rows (``nn.CrossEntropyLoss``'s)."""
    each = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1,
                                       reduction="none").view(targets.shape)
    return each.sum(1) / (targets >= 0).sum(1).clamp_min(1)


def _judge(stacked: StackedNetwork, members: Sequence[_Member],
           scorer: Callable[[np.ndarray, list], float] | None, batch_size: int = 256) -> list[float]:
    """Each member's held-out value after an epoch, as :meth:`PapaProbe.fit` judges it (in
    evaluation mode): ``scorer(indices, predictions)`` of its held-out examples, or minus their
    mean cross-entropy. One read to the host per batch of ``batch_size`` examples."""
    stacked.eval()
    helds = [member.held for member in members]
    totals, counts = [0.0] * len(members), [0] * len(members)
    predicted: list[list] = [[] for _ in members]
    with torch.no_grad(), own_arithmetic():
        for start in range(0, len(helds[0]), batch_size):
            chosen = [held[start : start + batch_size] for held in helds]
            logits, targets = _logits(stacked, members, chosen, training=False)
            if scorer is None:
                losses = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1,
                                                     reduction="none").view(targets.shape)
                for index, (total, count) in enumerate(zip(losses.sum(1).tolist(),
                                                           (targets >= 0).sum(1).tolist(), strict=True)):
                    totals[index] += total
                    counts[index] += count
                continue
            best = logits.argmax(-1).cpu()
            for index, member in enumerate(members):
                rows = len(chosen[index]) if member.features.kind == "sequence" else int(
                    member.lengths[chosen[index]].sum())
                predicted[index].extend(as_lists(member.features, chosen[index], best[index, :rows],
                                                 member.probe.fallback))
    if scorer is None:
        return [-total / max(count, 1) for total, count in zip(totals, counts, strict=True)]
    return [scorer(held.numpy(), lists) for held, lists in zip(helds, predicted, strict=True)]

