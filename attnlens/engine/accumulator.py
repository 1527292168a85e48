"""What accumulators see, and what they are: the protocol between :func:`attnlens.engine.passes.run`
and every analysis that reads a model over a corpus.

- :class:`Accumulator`: streaming state over a corpus (``update`` / ``merge`` / ``result``, like
  torchmetrics' ``update`` / ``merge_state`` / ``compute``); subclass it;
- :class:`PassBatch`: the batch being run, as every accumulator sees it;
- :class:`LayerPatterns`: one layer's attention for that batch (its pattern, and its effective
  attention computed once for every accumulator that reads it);
- :class:`PassSummary`: what a pass read, with its accumulators.

A minimal accumulator::

    class MeanEntropy(accumulator.Accumulator):
        name = "entropy"
        def __init__(self, n_layers):
            self.total, self.rows = torch.zeros(n_layers, dtype=torch.float64), torch.zeros(n_layers)
        def update(self, layer):            # a LayerPatterns: layer.pattern [batch, head, q, k]
            p = layer.pattern.clamp_min(1e-30)
            rows = layer.key_mask[:, None, :, None]
            self.total[layer.layer] += float(-(p * p.log() * rows).sum())
            self.rows[layer.layer] += float(rows.sum()) * p.shape[1]
        def state_dict(self):
            return {"total": self.total, "rows": self.rows}
        def result(self):
            return self.total / self.rows

    summary = passes.run(model, texts, [MeanEntropy(model.cfg.n_layers)], max_len=64)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from attnlens.core import devices, processing
from attnlens.core.inputs import Batch
from attnlens.core.loading import is_causal
from attnlens.engine.effective import effective_attention
from attnlens.errors import InputError, InputTypeError, ModelBehaviourError


@dataclass
class PassBatch:
    """The batch being run: ``batch`` (on the model's device), ``start`` (how many examples the
    pass ran before it), ``indices`` (the corpus index of each row: ``start, start + 1, …``
    unless the pass runs by length, see :attr:`Accumulator.any_order`), ``key_mask``
    (``[batch, key]``, True for real tokens), ``positions`` (``[batch, key]``, the layout
    position of every column: :attr:`attnlens.Batch.positions`, which differ from the column
    index in a compact batch), ``model``, ``n_tokens``, the batch's real tokens (a host
    number, counted before the batch was copied to the device), and ``on_host``, the same inputs
    on the host (``None`` when the pass was not given them): what a reader needs to know of the
    batch's shape (which tokens are real, word indices) it reads there, never from the device.

    :meth:`shared` computes something once per batch for every accumulator that asks for it by
    the same key (e.g. the token classes of :func:`attnlens.methods.stats.token_classes`)."""

    batch: Batch
    start: int
    model: Any
    indices: list[int] = field(default_factory=list)
    n_tokens: int | None = None
    on_host: Batch | None = None
    key_mask: Bool[Tensor, "batch key"] = field(init=False)
    _shared: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.key_mask = self.batch.attention_mask.bool()
        if not self.indices:
            self.indices = list(range(self.start, self.start + len(self.batch)))
        if self.n_tokens is None:
            self.n_tokens = int(self.batch.attention_mask.sum())

    @property
    def positions(self) -> Int[Tensor, "batch key"]:
        return self.batch.positions

    @property
    def shortest(self) -> int | None:
        """The fewest real tokens of a row, read off the host's copy of the inputs
        (:attr:`on_host`; None without it, or on the CPU, where a read is free and not needed)."""
        if self.on_host is None or devices.reads_are_free(self.key_mask):
            return None
        return self.shared("shortest", lambda: on_host_copy(
            lambda inputs: int(inputs.attention_mask.sum(-1).min()), self.on_host))

    @property
    def compact_positions(self) -> Int[Tensor, "batch key"] | None:
        """:attr:`positions` when the batch is compact (its columns are not its positions),
        else ``None``: what readers that count offsets or gather constants by position take."""
        return self.batch.positions if self.batch.compact else None

    def shared(self, key: str, compute: Callable[[], Any]) -> Any:
        """``compute()``, once per batch and key."""
        return _once(self._shared, key, compute)

    def from_host(self, key: str, compute: Callable[[Batch], Any]) -> Any:
        """``compute(inputs)``, once per batch and key (:meth:`shared`), for what is computed of
        the batch's tokens alone (token classes, the pattern types' positions): off the CPU, on
        the host's copy of the inputs (:attr:`on_host`) and moved to the batch's device in one
        copy (:func:`attnlens.core.devices.to_device`), so the device runs none of its operators;
        on the CPU, or without a host copy, on :attr:`batch`. ``compute`` returns tensors in
        dicts, lists, tuples or dataclasses, the same on either copy."""
        def made() -> Any:
            if self.on_host is None or devices.reads_are_free(self.key_mask):
                return compute(self.batch)
            return devices.to_device(on_host_copy(compute, self.on_host), self.key_mask.device)

        return self.shared(key, made)

    def __len__(self) -> int:
        return len(self.batch)


@dataclass
class LayerPatterns:
    """One layer's attention for the batch being run.

    ``pattern``: ``[batch, head, query, key]``, the pattern after any intervention (``hooks=``);
    ``effective``: its effective attention ``A⊥`` (:func:`attnlens.methods.effective.effective_attention`),
    computed on first access and shared by every accumulator; ``key_mask``: ``[batch, key]``,
    True for real tokens (the batch's own mask); ``values``: ``[batch, kv_head, key, d_head]``, the
    layer's value vectors per key-value head (query head ``h`` reads ``h // (head / kv_head)``, as
    Hugging Face's ``repeat_kv``; ``kv_head == head`` without grouped heads), when an accumulator
    or view reads them.

    ``layers``: for a stack of several layers of the batch (:meth:`stack`), which ones, in the
    order their maps follow one another along the ``batch`` axis (``()`` for one layer).
    """

    layer: int
    pattern: Float[Tensor, "batch head query key"]
    batch: PassBatch
    values: Float[Tensor, "batch kv_head key d_head"] | None = None
    options: dict[str, Any] = field(default_factory=dict, repr=False)
    _shared: dict[Any, Any] = field(default_factory=dict, repr=False)
    layers: tuple[int, ...] = ()

    @classmethod
    def stack(cls, layers: Sequence[LayerPatterns]) -> LayerPatterns:
        """Several layers of one batch as one: their patterns (and values) concatenated along the
        batch axis, layer after layer, with the batch's key mask repeated to match. What is
        computed example by example from the pattern and values alone (the pattern itself,
        :attr:`effective`) is then computed for all of them in one call, equal to the
        concatenation of each layer's: a view whose maps are made so says so
        (:attr:`attnlens.methods.views.View.stacks`). :attr:`layer` is the first layer's;
        :attr:`output_weights` refuses a stack."""
        first = layers[0]
        return cls(
            first.layer, torch.cat([layer.pattern for layer in layers]), first.batch,
            None if first.values is None else torch.cat([layer.values for layer in layers]),
            first.options, layers=tuple(layer.layer for layer in layers),
        )

    @property
    def key_mask(self) -> Bool[Tensor, "batch key"]:
        if not self.layers:
            return self.batch.key_mask
        times = len(self.layers)
        return self.batch.shared(f"key_mask.tiled.{times}", lambda: self.batch.key_mask.repeat(times, 1))

    def shared(self, key: Any, compute: Callable[[], Any]) -> Any:
        """``compute()``, once per layer of a batch and key: what several accumulators read of
        this layer (a view's maps, :meth:`attnlens.methods.views.View.read`) is made once. Readers must
        not change what it returns in place."""
        return _once(self._shared, key, compute)

    @property
    def output_weights(self) -> Float[Tensor, "head d_head d_model"]:
        """The layer's output projection, one ``[d_head, d_model]`` matrix per query head
        (``model.blocks[layer].attn.W_O``): what a view that reads ``"output_weights"``
        (:attr:`attnlens.methods.views.View.reads`) takes. The model's weight, not a copy; refused
        (:func:`attnlens.core.processing.check`, host attributes alone) where TransformerLens's
        weight processing centred it."""
        if self.layers:
            raise ModelBehaviourError(f"a stack of layers {list(self.layers)} has no one output projection: "
                                      "read each layer's maps on its own (View.stacks is False).")
        processing.check(self.batch.model, ("output_weights",), "reading a layer's output weights W_O (the norm-based view)")
        return self.batch.model.blocks[self.layer].attn.W_O

    @property
    def effective(self) -> Float[Tensor, "batch head query key"]:
        if self.values is None:
            raise ModelBehaviourError(
                "effective attention needs the layer's values: set needs_values = True "
                "on the accumulator that reads LayerPatterns.effective."
            )

        # on a decoder, causal: each row projected onto the values of the keys it reads
        causal = self.batch.shared("causal", lambda: is_causal(self.batch.model))
        return self.shared("effective", lambda: effective_attention(  # the model's: not checked
            self.pattern, self.values, key_mask=self.key_mask, check=False, shortest=self.batch.shortest,
            **{"causal": causal, **self.options}
        ))


def on_host_copy(compute: Callable[[Batch], Any], inputs: Batch) -> Any:
    """``compute(inputs)`` on the host's copy of a batch (a frame of its own: what
    ``benchmarks/launches.py`` leaves out of a device's launches)."""
    return compute(inputs)


def _once(cache: dict[Any, Any], key: Any, compute: Callable[[], Any]) -> Any:
    """``cache[key]``, made by ``compute()`` the first time it is asked for."""
    if key not in cache:
        cache[key] = compute()
    return cache[key]


#: how a declared state tensor combines over shards (:meth:`Accumulator.add_state`)
REDUCTIONS: tuple[str, ...] = ("sum", "max", "min")


def add_at(state: Tensor, dim: int, layers: Sequence[int], values: Tensor) -> None:
    """``state``'s entries at ``layers`` along ``dim`` += ``values`` (``values.shape[dim] ==
    len(layers)``): what an accumulator adds for several layers of a batch at once. A run of
    consecutive layers is a slice (no index tensor to copy to the device; inside
    :func:`added_together`, added with the block's other additions), any other an
    ``index_add_``."""
    values = values.to(state.device, state.dtype)
    first = layers[0]
    if list(layers) != list(range(first, first + len(layers))):
        state.index_add_(dim, torch.tensor(list(layers), device=state.device), values)
        return
    target = state.narrow(dim, first, len(layers))
    if not _DEFERRED:
        target.add_(values)
        return
    pending = _DEFERRED[-1]
    storage = state.untyped_storage().data_ptr()
    if any(other.untyped_storage().data_ptr() == storage for other, _, _ in pending):
        _add_all(pending)  # one addition per tensor (or view of it) in a multi-tensor add
        pending.clear()
    pending.append((state, target, values))


#: the additions :func:`add_at` defers while :func:`added_together` blocks are open (innermost last)
_DEFERRED: list[list[tuple[Tensor, Tensor, Tensor]]] = []


@contextlib.contextmanager
def added_together() -> Iterator[None]:
    """Inside, :func:`add_at`'s additions wait, and are made when the block ends without an
    error, by one multi-tensor addition per device and dtype (``torch._foreach_add_``, as
    PyTorch's optimizers update their parameters): on a GPU a kernel or two for every state an
    update adds to, rather than one per state. A block that raises adds nothing it deferred."""
    _DEFERRED.append([])
    try:
        yield
    except BaseException:
        _DEFERRED.pop()
        raise
    _add_all(_DEFERRED.pop())


def _add_all(pending: list[tuple[Tensor, Tensor, Tensor]]) -> None:
    """Make :func:`added_together`'s deferred additions, and mark every state changed (its
    version counter, which ``engine.split`` reads to know what to put back after running out of
    memory, whether or not a multi-tensor kernel bumps it)."""
    groups: dict[tuple[torch.device, torch.dtype], tuple[list[Tensor], list[Tensor]]] = {}
    for state, target, values in pending:
        targets, additions = groups.setdefault((state.device, state.dtype), ([], []))
        targets.append(target)
        additions.append(values)
    for targets, additions in groups.values():
        torch._foreach_add_(targets, additions)
    torch.autograd.graph.increment_version([state for state, _, _ in pending])


class Accumulator:
    """Streaming state over a corpus; subclass it and override what you need.

    Class attributes:

    - ``name``: a key unique among the accumulators of one :func:`~attnlens.engine.passes.run` (checkpoints use it);
    - ``needs_values``: the layer's value vectors are read, :attr:`LayerPatterns.effective` or a
      view's ``"values"`` (the engine then stashes V);
    - ``needs_output``: the whole forward runs and :meth:`update_output` gets the model output
      (otherwise the forward stops after the last layer's ``hook_pattern``);
    - ``needs_residual``: the forward runs through the last block (its ``hook_out``, the
      residual stream leaving it) and stops there, before the final norm and the LM head;
    - ``needs_grad``: the forward runs with gradients (else under ``torch.inference_mode``);
    - ``compact``: it reads token positions from :attr:`PassBatch.positions`, never from column
      indices, so PAPA-layout batches may run compact (:func:`attnlens.core.inputs.compact_batch`).
      A pass runs compact only when every accumulator says so.
    - ``any_order``: its result does not depend on the order of the examples or on which of them
      share a batch (up to float rounding), and it finds an example's corpus index in
      :attr:`PassBatch.indices`, never from :attr:`PassBatch.start`. A pass runs its examples
      by length (:func:`~attnlens.engine.passes.run`'s ``by_length``) only when every accumulator says so: batches of
      similar lengths compute little padding.
    - ``stacks``: :meth:`update` also takes a stack of the batch's layers
      (:meth:`LayerPatterns.stack`; ``layer.layers`` names them, in order) and adds the same as
      for each of them. Off the CPU the engine then keeps the batch's layers and hands such an
      accumulator one stack after the forward (or sooner, when the kept patterns fill
      1 / :data:`attnlens.engine.passes.STACK_SHARE` of the device's free memory): one launch per
      operator for all the layers, instead of one per layer. On the CPU, one layer at a time.

    Methods, called by :func:`~attnlens.engine.passes.run` in this order for each batch: :meth:`prepare`,
    :meth:`start_batch`,
    :meth:`update` for each layer (a stacking accumulator off the CPU: for each stack, after the
    forward), :meth:`update_output` (if ``needs_output``), :meth:`end_batch`. A batch interrupted half-way is never checkpointed, so ``update`` may
    write into the state directly.

    Merging and saving: :meth:`state_dict` returns the tensors that add up over shards (sums,
    counts), :meth:`metadata` small JSON-able facts. The default :meth:`merge`,
    :meth:`all_reduce`, :meth:`load_state_dict` add, all-reduce and copy those tensors; override
    them for state that does not add up.

    Declared state, torchmetrics-style: :meth:`add_state` declares a tensor once, with how two
    shards combine (``"sum"``, ``"max"``, ``"min"``), and :meth:`add_child` makes another
    accumulator's state part of this one under a prefix (a collection run as one accumulator).
    The default :meth:`state_dict` is the declared tensors and the children's, prefixed; the
    default :meth:`merge`, :meth:`all_reduce`, :meth:`load_state_dict` and :meth:`to` follow
    from it and from :meth:`reductions`, so an accumulator that declares its state writes none
    of them.
    """

    name: str = "accumulator"
    needs_values: bool = False
    needs_output: bool = False
    needs_residual: bool = False
    needs_grad: bool = False
    compact: bool = False
    any_order: bool = False
    stacks: bool = False

    def hooks(self, model: Any) -> list[tuple[str | Callable, Callable]]:
        """Extra reading hooks (``fwd_hooks``) this accumulator needs; ``self.current`` is the
        :class:`PassBatch` being run when they fire."""
        return []

    def prepare(self, batch: Batch) -> Batch:
        """The inputs the forward runs on, made from the tokenized ``batch`` (default: it,
        unchanged). An accumulator that feeds the model other inputs (masked tokens for an MLM
        score, copies of each example with one token masked for a pseudo-log-likelihood) returns
        them here; at most one accumulator of a pass may change the inputs. The engine's counts
        (examples, tokens, truncated) are those of the tokenized batch."""
        return batch

    def start_batch(self, batch: PassBatch) -> None:
        self.current = batch

    def update(self, layer: LayerPatterns) -> None:
        """Read one layer's patterns of the current batch."""

    def update_output(self, batch: PassBatch, output: Any) -> None:
        """Read the model's output for the current batch (``needs_output``)."""

    def end_batch(self, batch: PassBatch) -> None:
        """The batch is complete (every layer was seen)."""

    def add_state(self, name: str, default: Tensor, reduction: str = "sum") -> Tensor:
        """Declare the state tensor ``name``: ``self.<name>`` is ``default``, and it is in the
        default :meth:`state_dict` with its ``reduction`` (:data:`REDUCTIONS`: how the tensors of
        two shards combine); returns it."""
        if reduction not in REDUCTIONS:
            raise InputError(f"{self.name}: reduction {reduction!r} of state {name!r}; use one of "
                             f"{', '.join(REDUCTIONS)}.")
        if not isinstance(default, Tensor):
            raise InputTypeError(f"{self.name}: state {name!r} must be a tensor, got {type(default).__name__}.")
        self.__dict__.setdefault("_declared", {})[name] = reduction
        setattr(self, name, default)
        return default

    def add_child(self, prefix: str, child: Accumulator) -> Accumulator:
        """Make ``child``'s state part of this one: its :meth:`state_dict` and :meth:`reductions`
        under ``{prefix}.{key}``, moved with this one (:meth:`to`); returns it."""
        self.__dict__.setdefault("_children", {})[prefix] = child
        return child

    def reductions(self) -> dict[str, str]:
        """How each tensor of :meth:`state_dict` combines over shards: the declared reductions
        (:meth:`add_state`), the children's under their prefix, ``"sum"`` for the others."""
        declared: dict[str, str] = dict(self.__dict__.get("_declared", {}))
        for prefix, child in self.__dict__.get("_children", {}).items():
            declared.update({f"{prefix}.{key}": how for key, how in child.reductions().items()})
        return {key: declared.get(key, "sum") for key in self.state_dict()}

    def state_dict(self) -> dict[str, Tensor]:
        """Tensors that add up over shards of a corpus (default: the declared ones,
        :meth:`add_state`, and the children's under their prefix, :meth:`add_child`)."""
        state = {name: getattr(self, name) for name in self.__dict__.get("_declared", {})}
        for prefix, child in self.__dict__.get("_children", {}).items():
            state.update({f"{prefix}.{key}": value for key, value in child.state_dict().items()})
        return state

    def load_state_dict(self, state: Mapping[str, Tensor], metadata: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (and :meth:`metadata`) saved by a checkpoint."""
        own = self.state_dict()
        for key, value in state.items():
            if key not in own:
                raise InputError(f"{self.name}: unexpected tensor {key!r} in the saved state.")
            own[key].copy_(value)

    def metadata(self) -> dict[str, Any]:
        """Small JSON-able facts saved with :meth:`state_dict` (the same on every shard)."""
        return {}

    def settings(self) -> dict[str, Any]:
        """What this accumulator computes beyond its :attr:`name` that a resumed pass must match,
        JSON-able (e.g. the checksum of the PAPA constants it reads a view from, its
        classifier's): a checkpoint records it and refuses another
        (:func:`attnlens.engine.passes.run`). Default: nothing."""
        return {}

    def merge(self, other: Accumulator) -> Accumulator:
        """Add ``other``'s state (the same kind, over another part of a corpus) into this one."""
        if type(other) is not type(self):
            raise InputTypeError(f"cannot merge {type(self).__name__} with {type(other).__name__}")
        mine, theirs, how = self.state_dict(), other.state_dict(), self.reductions()
        for key, value in mine.items():
            other_value = theirs[key].to(value.device)
            if how[key] == "sum":
                value += other_value
            elif how[key] == "max":
                torch.maximum(value, other_value, out=value)
            else:
                torch.minimum(value, other_value, out=value)
        return self

    def all_reduce(self, group: Any = None) -> None:
        """Reduce :meth:`state_dict` over the ranks of ``torch.distributed`` (in place), each
        tensor by its :meth:`reductions` (a sum unless declared otherwise)."""
        import torch.distributed as dist

        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
        how = self.reductions()
        for key, value in self.state_dict().items():
            dist.all_reduce(value, op=ops[how[key]], group=group)

    def to(self, device: str | torch.device) -> Accumulator:
        """Move the state (:meth:`state_dict`'s tensors) to ``device``, in place: every name
        bound to a state tensor sees it there (``Tensor.data`` is swapped, as ``nn.Module``
        did). :func:`~attnlens.engine.passes.run` moves the state to the model's device before the first batch, so that
        :meth:`update` adds device tensors to device tensors and reads nothing back to the host,
        and to the CPU after the last, so that :meth:`result` reads it once. Override it for
        state kept outside :meth:`state_dict` (a child's own :meth:`to` is called too)."""
        for child in self.__dict__.get("_children", {}).values():
            child.to(device)
        for value in self.state_dict().values():
            if value.device != torch.device(device):
                value.data = value.data.to(device)
        return self

    def result(self) -> Any:
        """What the accumulator measured."""
        raise NotImplementedError


@dataclass
class PassSummary:
    """What :func:`~attnlens.engine.passes.run` read: ``n_examples``, real tokens (``n_tokens``), ``n_truncated``
    examples (that lost tokens to ``max_len``), whether the corpus held sentence pairs
    (``pairs``; None if empty), the ``layout`` and ``max_len``, the ``accumulators``, updated
    (and reduced over ranks under ``torch.distributed``), the examples skipped because a
    checkpoint had them (``resumed``) and the most real tokens in one example (``longest``)."""

    n_examples: int
    n_tokens: int
    n_truncated: int
    pairs: bool | None
    layout: str
    max_len: int
    accumulators: list[Accumulator]
    resumed: int = 0
    longest: int = 0

