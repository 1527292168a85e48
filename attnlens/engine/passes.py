"""The pass engine: the one loop over a corpus in attnlens.

Every analysis that reads a model over a corpus (PAPA constants, attention statistics, compare,
and the feature extraction of probes) is an :class:`Accumulator`: a small object that reads some
hook points, updates from each batch, merges with another of its kind, and gives a result, like
torchmetrics' ``update`` / ``merge_state`` / ``compute``. :func:`run` owns everything else:

- reading the corpus lazily (strings, ``(str, str)`` pairs, or a ``datasets`` column), batching
  and tokenizing it in a layout, moving batches to the model's device;
- one set of hooks per forward: each layer's ``hook_pattern`` is handed to every accumulator as a
  :class:`LayerPatterns`, whose effective attention (:mod:`attnlens.effective.core`) is computed
  once per layer if any accumulator reads it; interventions (``hooks=``) apply before reading;
- stopping the forward after the last layer's pattern when nothing needs the output;
- ``torch.inference_mode`` (or gradients, when an accumulator asks), eval mode;
- the progress bar, checkpoint and resume (a checkpoint records a fingerprint of the corpus
  consumed and of the settings, and refuses to resume anything else), SIGTERM saved like Ctrl-C;
- multi-process runs under ``torch.distributed`` (``torchrun``): the corpus is sharded
  contiguously and batch-aligned by rank, every accumulator is reduced with ``all_reduce`` (its
  small metadata with ``all_gather_object``), and the settings are checked to be the same on
  every rank.

A minimal accumulator::

    class MeanEntropy(passes.Accumulator):
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

import concurrent.futures
import contextlib
import contextvars
import hashlib
import itertools
import json
import math
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, SupportsIndex

import einops
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from attnlens.core import devices, memory, models, seam
from attnlens.core.checks import flag, whole_number
from attnlens.core.corpus import corpus_iterator
from attnlens.core.files import (
    check_sealed,
    clean_temporaries,
    safetensors_bytes,
    verify_checksum,
    write_atomic,
)
from attnlens.core.inputs import (
    LAYOUTS,
    Batch,
    BlankText,
    Words,
    by_length,
    check_max_len,
    compact_batch,
    default_layout,
    example_kind,
    tokenize,
)
from attnlens.core.loading import is_causal, model_id, require_bridge, weights_fingerprint
from attnlens.core.modes import eval_mode
from attnlens.core.notebook import in_notebook
from attnlens.engine.effective import effective_attention
from attnlens.engine.hooks import Hooks, as_hooks
from attnlens.errors import (
    DamagedFileError,
    FileFormatError,
    InputError,
    InputTypeError,
    MismatchError,
    ModelBehaviourError,
    UnavailableError,
)

#: batches between two checkpoint writes when ``checkpoint=`` is given
CHECKPOINT_EVERY = 20

#: a pass by length (:func:`run`'s ``by_length``) orders each window of this many batches of
#: consecutive examples (2,048 examples at batch size 32: the strings only, a few hundred kB)
BY_LENGTH_BATCHES = 64

#: format of checkpoint files written by :func:`run`
CHECKPOINT_FORMAT = "attnlens.pass/1"

#: what every ``hooks=`` accepts: a :class:`attnlens.engine.hooks.Hooks` (the one hook-list type,
#: which every attnlens intervention returns) or any sequence of ``(hook_name, hook_fn)`` pairs
FwdHooks = Hooks | Sequence[tuple[str | Callable, Callable]]


# ------------------------------------------------------------------------------------------------
# what accumulators see


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
    the same key (e.g. the token classes of :func:`attnlens.stats.token_classes`)."""

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
    def compact_positions(self) -> Int[Tensor, "batch key"] | None:
        """:attr:`positions` when the batch is compact (its columns are not its positions),
        else ``None``: what readers that count offsets or gather constants by position take."""
        return self.batch.positions if self.batch.compact else None

    def shared(self, key: str, compute: Callable[[], Any]) -> Any:
        """``compute()``, once per batch and key."""
        return _once(self._shared, key, compute)

    def __len__(self) -> int:
        return len(self.batch)


@dataclass
class LayerPatterns:
    """One layer's attention for the batch being run.

    ``pattern``: ``[batch, head, query, key]``, the pattern after any intervention (``hooks=``);
    ``effective``: its effective attention ``A⊥`` (:func:`attnlens.effective.effective_attention`),
    computed on first access and shared by every accumulator; ``key_mask``: ``[batch, key]``,
    True for real tokens (the batch's own mask).
    """

    layer: int
    pattern: Float[Tensor, "batch head query key"]
    batch: PassBatch
    values: Float[Tensor, "batch head key d_head"] | None = None
    options: dict[str, Any] = field(default_factory=dict, repr=False)
    _shared: dict[Any, Any] = field(default_factory=dict, repr=False)

    @property
    def key_mask(self) -> Bool[Tensor, "batch key"]:
        return self.batch.key_mask

    def shared(self, key: Any, compute: Callable[[], Any]) -> Any:
        """``compute()``, once per layer of a batch and key: what several accumulators read of
        this layer (a view's maps, :meth:`attnlens.views.View.read`) is made once. Readers must
        not change what it returns in place."""
        return _once(self._shared, key, compute)

    @property
    def effective(self) -> Float[Tensor, "batch head query key"]:
        if self.values is None:
            raise ModelBehaviourError(
                "effective attention needs the layer's values: set needs_effective = True "
                "on the accumulator that reads LayerPatterns.effective."
            )

        return self.shared("effective", lambda: effective_attention(  # the model's: not checked
            self.pattern, self.values, key_mask=self.key_mask, check=False, **self.options
        ))


def _once(cache: dict[Any, Any], key: Any, compute: Callable[[], Any]) -> Any:
    """``cache[key]``, made by ``compute()`` the first time it is asked for."""
    if key not in cache:
        cache[key] = compute()
    return cache[key]


class Accumulator:
    """Streaming state over a corpus; subclass it and override what you need.

    Class attributes:

    - ``name``: a key unique among the accumulators of one :func:`run` (checkpoints use it);
    - ``needs_effective``: :attr:`LayerPatterns.effective` is read (the engine then stashes V);
    - ``needs_output``: the whole forward runs and :meth:`update_output` gets the model output
      (otherwise the forward stops after the last layer's ``hook_pattern``);
    - ``needs_residual``: the forward runs through the last block (its ``hook_out``, the
      residual stream leaving it) and stops there, before the final norm and the LM head;
    - ``needs_grad``: the forward runs with gradients (else under ``torch.inference_mode``);
    - ``compact``: it reads token positions from :attr:`PassBatch.positions`, never from column
      indices, so PAPA-layout batches may run compact (:func:`attnlens.inputs.compact_batch`).
      A pass runs compact only when every accumulator says so.
    - ``any_order``: its result does not depend on the order of the examples or on which of them
      share a batch (up to float rounding), and it finds an example's corpus index in
      :attr:`PassBatch.indices`, never from :attr:`PassBatch.start`. A pass runs its examples
      by length (:func:`run`'s ``by_length``) only when every accumulator says so: batches of
      similar lengths compute little padding.

    Methods, called by :func:`run` in this order for each batch: :meth:`prepare`,
    :meth:`start_batch`,
    :meth:`update` for each layer, :meth:`update_output` (if ``needs_output``),
    :meth:`end_batch`. A batch interrupted half-way is never checkpointed, so ``update`` may
    write into the state directly.

    Merging and saving: :meth:`state_dict` returns the tensors that add up over shards (sums,
    counts), :meth:`metadata` small JSON-able facts. The default :meth:`merge`,
    :meth:`all_reduce`, :meth:`load_state_dict` add, all-reduce and copy those tensors; override
    them for state that does not add up.
    """

    name: str = "accumulator"
    needs_effective: bool = False
    needs_output: bool = False
    needs_residual: bool = False
    needs_grad: bool = False
    compact: bool = False
    any_order: bool = False

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

    def state_dict(self) -> dict[str, Tensor]:
        """Tensors that add up over shards of a corpus."""
        return {}

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

    def merge(self, other: Accumulator) -> Accumulator:
        """Add ``other``'s state (the same kind, over another part of a corpus) into this one."""
        if type(other) is not type(self):
            raise InputTypeError(f"cannot merge {type(self).__name__} with {type(other).__name__}")
        mine, theirs = self.state_dict(), other.state_dict()
        for key, value in mine.items():
            value += theirs[key].to(value.device)
        return self

    def all_reduce(self, group: Any = None) -> None:
        """Sum :meth:`state_dict` over the ranks of ``torch.distributed`` (in place)."""
        import torch.distributed as dist

        for value in self.state_dict().values():
            dist.all_reduce(value, op=dist.ReduceOp.SUM, group=group)

    def to(self, device: str | torch.device) -> Accumulator:
        """Move the state (:meth:`state_dict`'s tensors) to ``device``, in place: every name
        bound to a state tensor sees it there (``Tensor.data`` is swapped, as ``nn.Module``
        did). :func:`run` moves the state to the model's device before the first batch, so that
        :meth:`update` adds device tensors to device tensors and reads nothing back to the host,
        and to the CPU after the last, so that :meth:`result` reads it once. Override it for
        state kept outside :meth:`state_dict`."""
        for value in self.state_dict().values():
            if value.device != torch.device(device):
                value.data = value.data.to(device)
        return self

    def result(self) -> Any:
        """What the accumulator measured."""
        raise NotImplementedError


@dataclass
class PassSummary:
    """What :func:`run` read: ``n_examples``, real tokens (``n_tokens``), ``n_truncated``
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


# ------------------------------------------------------------------------------------------------
# the corpus


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


def device_of(model: Any) -> torch.device:
    """The device of the model's parameters (CPU for a model without any)."""
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


class _Fingerprint:
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


# ------------------------------------------------------------------------------------------------
# running a batch


class _Stop(Exception):
    """Raised after the last layer's pattern hook: the rest of the forward is not needed."""


def values_per_query_head(
    model: Any, v: Tensor
) -> Float[Tensor, "batch head key d_head"]:
    """``hook_v``'s values (``[batch, key, kv_head, d_head]`` or ``[batch, key, kv_head*d_head]``)
    as one ``[key, d_head]`` matrix per query head: with grouped key-value heads, query head ``h``
    reads key-value head ``h // (n_heads / n_kv_heads)``, as Hugging Face's ``repeat_kv``."""
    n_heads = int(model.cfg.n_heads)
    architecture = models.find(model)
    n_kv = architecture.kv_heads(model.original_model.config) if architecture else n_heads
    if v.ndim == 3:
        v = einops.rearrange(v, "b k (h d) -> b h k d", h=n_kv)
    else:
        v = einops.rearrange(v, "b k h d -> b h k d")
    if v.shape[1] != n_heads:
        if n_heads % v.shape[1]:
            raise InputError(f"{n_heads} query heads cannot share {v.shape[1]} key-value heads evenly.")
        v = v.repeat_interleave(n_heads // v.shape[1], dim=1)
    return v


def value_hook(model: Any, layer: int) -> str:
    """Name of the hook point carrying layer ``layer``'s value vectors (the architecture's
    :attr:`~attnlens.models.Architecture.value_hook`)."""
    architecture = models.find(model)
    preferred = architecture.value_hook.format(layer=layer) if architecture else None
    for name in (preferred, f"blocks.{layer}.attn.hook_v", f"blocks.{layer}.attn.v.hook_out"):
        if name is not None and name in model.hook_dict:
            return name
    raise InputError(f"The model has no value hook for layer {layer} (blocks.{layer}.attn.hook_v).")


def model_inputs(batch: Batch) -> tuple[Tensor, dict[str, Tensor | None]]:
    """``(input_ids, kwargs)`` to run ``batch`` with: ``model(ids, **kwargs)``. Use it (or
    :func:`run_with_hooks`) rather than ``batch.input_ids`` alone, which would drop the mask and
    the model's positions (see :meth:`attnlens.Batch.model_kwargs`)."""
    return batch.input_ids, batch.model_kwargs()


def run_with_hooks(
    model: Any, batch: Batch, hooks: FwdHooks = (), **kwargs: Any
) -> Any:
    """``model.run_with_hooks`` on a :class:`attnlens.Batch` with its mask and positions (the
    common path made impossible to get wrong), moved to the model's device; inside, pattern
    hooks' :func:`attnlens.seam.key_mask` is the batch's own mask and :func:`attnlens.seam.positions`
    its layout positions (a compact batch). Returns the model's output."""
    require_bridge(model, "attnlens.run_with_hooks")
    if not isinstance(batch, Batch):
        raise InputTypeError(
            f"attnlens.run_with_hooks takes a Batch from attnlens.tokenize, got {type(batch).__name__}."
        )
    check_hooks(hooks, batch)
    check_token_ids(model, batch)
    return _forward(model, batch.to(device_of(model)), hooks, **kwargs)


def _forward(model: Any, batch: Batch, hooks: FwdHooks = (), **kwargs: Any) -> Any:
    """:func:`run_with_hooks` of a batch already on the model's device and checked (the pass
    checks its batches on the host, before they are copied: no read of a device tensor)."""
    with seam.batch_key_mask(batch.attention_mask.bool()), seam.batch_positions(batch.position_ids), \
            as_hooks(hooks).patched(model) as fwd_hooks:
        return model.run_with_hooks(batch.input_ids, **batch.model_kwargs(), fwd_hooks=fwd_hooks, **kwargs)


def check_token_ids(model: Any, batch: Batch) -> None:
    """:class:`~attnlens.errors.InputError` when a token id of ``batch`` is negative or beyond
    the model's vocabulary (a batch not made by :func:`attnlens.tokenize` for this model)."""
    vocab = getattr(model.cfg, "d_vocab", None)
    ids = batch.input_ids
    if not isinstance(vocab, int) or ids.numel() == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise InputError(
            f"batch.input_ids holds the token id {bad}, outside the model's vocabulary 0..{vocab - 1}; "
            "tokenize with attnlens.tokenize(model, texts, ...) using this model's tokenizer."
        )


def check_hooks(hooks: FwdHooks, batch: Batch) -> None:
    """:class:`~attnlens.errors.MismatchError` when a hook of :func:`attnlens.papa.hooks` holds
    constants fitted on sentence pairs and ``batch`` holds single sentences, or the reverse; and
    what each hook checks of a batch (its ``check_batch``, e.g. PAPA's layout), once per batch on
    the host rather than at every layer on the device."""
    for item in hooks:
        function = item[1] if isinstance(item, tuple | list) and len(item) == 2 else None
        check = getattr(function, "check_batch", None)  # what a hook checks of a batch, on the host
        if check is not None:
            check(batch)
        constants = getattr(function, "constants", None)
        pairs = getattr(constants, "pairs", None)
        if pairs is not None and bool(batch.is_pair) != bool(pairs):
            fitted = "sentence pairs" if pairs else "single sentences"
            given = "sentence pairs" if batch.is_pair else "single sentences"
            raise MismatchError(
                f"the PAPA hooks' constants were fitted on {fitted}; these inputs are {given}. "
                f"Fit constants on {given} (papa.fit on such a corpus) to use them here."
            )


def pattern_hooks(
    model: Any,
    on_pattern: Callable[[int, Tensor, Tensor | None, Tensor], Tensor | None],
    *,
    layers: Iterable[int] | None = None,
    values: bool = True,
) -> list[tuple[str, Callable]]:
    """``fwd_hooks`` calling ``on_pattern(layer, A, V, valid)`` at each layer's
    ``hook_pattern``, with ``V`` the layer's values per query head (stashed at its value hook,
    which fires first; ``None`` with ``values=False``) and ``valid`` the ``[batch, key]`` mask of
    real tokens (:func:`attnlens.seam.key_mask`). Whatever ``on_pattern`` returns replaces the
    pattern (``None`` leaves it)."""
    n_layers = int(model.cfg.n_layers)
    chosen = range(n_layers) if layers is None else sorted({int(layer) for layer in layers})
    causal = is_causal(model)
    stash: dict[int, Tensor] = {}
    fwd_hooks: list[tuple[str, Callable]] = []
    for layer in chosen:
        if values:

            def keep_v(v: Tensor, hook: Any, layer: int = layer) -> None:
                stash[layer] = v

            fwd_hooks.append((value_hook(model, layer), keep_v))

        def on_hook(pattern: Tensor, hook: Any, layer: int = layer) -> Tensor | None:
            v = None
            if values:
                if layer not in stash:
                    raise ModelBehaviourError(f"the value hook of layer {layer} did not fire before its hook_pattern.")
                v = values_per_query_head(model, stash.pop(layer))
            return on_pattern(layer, pattern, v, seam.key_mask(pattern, causal=causal))

        fwd_hooks.append((f"blocks.{layer}.attn.hook_pattern", on_hook))
    return fwd_hooks


def run_patterns(model: Any, batch: Batch, fwd_hooks: FwdHooks, *, until: str | None = None) -> int:
    """Run ``batch`` (checked: :func:`check_token_ids`; moved to the model's device) with
    ``fwd_hooks`` without gradients, stopping after the last layer's ``hook_pattern`` hooks have
    run (or after the hook point ``until``, e.g. the last block's ``hook_out``). Returns how many
    times that hook point fired (1 when the forward reached it)."""
    last = until or f"blocks.{model.cfg.n_layers - 1}.attn.hook_pattern"
    reached = 0

    def stop(pattern: Any, hook: Any) -> None:
        nonlocal reached
        reached += 1
        raise _Stop

    try:
        with torch.no_grad():
            _forward(model, batch.to(device_of(model)), [*fwd_hooks, (last, stop)])
    except _Stop:
        pass
    return reached


# ------------------------------------------------------------------------------------------------
# torch.distributed


@dataclass(frozen=True)
class World:
    """This process's place in a ``torch.distributed`` run (rank 0 of 1 without one)."""

    rank: int = 0
    size: int = 1
    group: Any = None

    @property
    def distributed(self) -> bool:
        return self.size > 1


#: Set inside :func:`alone`: this process works by itself though a process group is initialised.
_ALONE: contextvars.ContextVar[bool] = contextvars.ContextVar("attnlens_alone", default=False)


def world() -> World:
    """The current ``torch.distributed`` world, or a single process (also inside :func:`alone`)."""
    if _ALONE.get():
        return World()
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch without distributed
        return World()
    if not (dist.is_available() and dist.is_initialized()):
        return World()
    return World(rank=dist.get_rank(), size=dist.get_world_size())


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """Inside this context the process runs as a single one (:func:`world` is rank 0 of 1):
    :func:`run` reads its whole corpus and reduces nothing, for work that one rank of a
    ``torch.distributed`` run does by itself (:func:`distribute`)."""
    token = _ALONE.set(True)
    try:
        yield
    finally:
        _ALONE.reset(token)


_distributed = itertools.count()  # every rank makes the same calls to distribute: the same keys


def distribute(items: Sequence[Any], work: Callable[..., Any], *, what: str = "item",
               after: Sequence[int | None] | None = None) -> list[Any]:
    """``[work(item) for item in items]``, the items shared among the ranks of
    ``torch.distributed`` (a plain loop without it).

    Each rank claims the first unclaimed item it may run from the process group's store, so a
    rank that finishes early takes the next one (give the costliest items first), and runs it
    :func:`alone`. Then every rank receives every result, in the order of ``items``
    (``all_gather_object``: results must pickle, and should be small). An item that raised on
    any rank raises :class:`~attnlens.errors.UnavailableError` naming it on every rank, rather
    than leaving the others waiting.

    ``after``: for each item, ``None`` or the index of an earlier item whose result it needs;
    such an item runs as ``work(item, result)``, once that result exists (on any rank: it passes
    through the store, pickled), and the others as ``work(item, None)``. A rank that finds every
    unclaimed item waiting for a result still being computed waits for it, and takes the first
    that becomes free. So one item's dependants spread over every rank, rather than running
    where it ran."""
    if after is not None:
        after = list(after)
        if len(after) != len(items):
            raise InputError(f"after has {len(after)} entries for {len(items)} {what}s; give one per item.")
        wrong = [index for index, needed in enumerate(after)
                 if needed is not None and not 0 <= needed < index]
        if wrong:
            raise InputError(f"after[{wrong[0]}] = {after[wrong[0]]!r}: an item can only need an earlier "
                             f"one (an index from 0 to {wrong[0] - 1}), or None.")
    current = world()
    if not current.distributed:
        if after is None:
            return [work(item) for item in items]
        ordered: list[Any] = []
        for item, needed in zip(items, after, strict=True):
            ordered.append(work(item, None if needed is None else ordered[needed]))
        return ordered
    import torch.distributed as dist

    key = f"attnlens/distribute/{next(_distributed)}"
    try:
        store = dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError):  # no store to claim with: every size-th item
        store = None
    if store is None:  # with after, no store to pass results through: every rank runs every item
        claims: Iterator[int] = iter(range(len(items)) if after is not None else
                                     range(current.rank, len(items), current.size))
    else:
        claims = _claims_from_store(store, key, len(items), after)
    needed_by = {index for index in (after or ()) if index is not None}
    done: dict[Any, Any] = {}
    failure: Exception | None = None
    for index in claims:
        try:
            with alone():
                if after is None:
                    result = work(items[index])
                else:
                    result = work(items[index], None if after[index] is None else
                                  _result_of(after[index], done, store, key))
            done[index] = result
            if store is not None and index in needed_by:
                store.set(f"{key}/result/{index}", pickle.dumps(result))
        except Exception as error:  # told to every rank below, so that none waits forever
            failure, done = error, {"failed": f"{what} {items[index]!r}: {type(error).__name__}: {error}"}
            if store is not None:
                store.set(f"{key}/failed", b"1")  # a rank waiting on this item's result stops
            break
    if store is not None:
        # wait for the other ranks on the store, not in the collective: a rank may finish its
        # items long before another (more than the process group's timeout, 30 minutes)
        store.add(f"{key}/finished", 1)
        while int(store.add(f"{key}/finished", 0)) < current.size:
            time.sleep(1.0)
    gathered: list[Any] = [None] * current.size
    _collective(f"gathering the {what}s' results", lambda: dist.all_gather_object(gathered, done), current)
    if failure is not None:
        raise failure
    failed = [part["failed"] for part in gathered if "failed" in part]
    if failed:
        raise UnavailableError(f"another rank failed: {failed[0]}")
    results: dict[Any, Any] = {}
    for part in gathered:
        results.update(part)
    return [results[index] for index in range(len(items))]


#: Seconds a rank sleeps while every item it could claim waits for a result still being computed.
WAIT = 0.2


def _claims_from_store(store: Any, key: str, n: int, after: list[int | None] | None) -> Iterator[int]:
    """The indices this rank claims, in order: each time the first item no rank has claimed
    whose needed result (``after``) is in the store; while there is none but some wait, this
    rank waits. It stops when every item is claimed, or another rank failed."""
    claimed: set[int] = set()  # by any rank, as far as this one has seen
    while len(claimed) < n:
        waiting = False
        for index in range(n):
            if index in claimed:
                continue
            needed = after[index] if after is not None else None
            if needed is not None and not store.check([f"{key}/result/{needed}"]):
                waiting = True
                continue
            claimed.add(index)
            if int(store.add(f"{key}/claim/{index}", 1)) == 1:  # atomically: the first to ask gets it
                yield index
                break
        else:
            if not waiting or store.check([f"{key}/failed"]):
                return
            time.sleep(WAIT)


def _result_of(index: int, done: dict[Any, Any], store: Any, key: str) -> Any:
    """The result of item ``index``: this rank's own, or another's from the store."""
    if index in done:
        return done[index]
    return pickle.loads(store.get(f"{key}/result/{index}"))  # noqa: S301 - written by a rank of this run


def shard(n_examples: int, batch_size: int, rank: int, size: int) -> tuple[int, int]:
    """``(start, stop)`` of rank ``rank``'s contiguous, batch-aligned share of ``n_examples``:
    the corpus's ``ceil(n / batch_size)`` batches are split as evenly as whole batches allow, so
    every batch is the one a single process would run."""
    n_batches = math.ceil(n_examples / batch_size)
    first = rank * n_batches // size
    last = (rank + 1) * n_batches // size
    return min(first * batch_size, n_examples), min(last * batch_size, n_examples)


def interleaved(n_examples: int, batch_size: int, rank: int, size: int) -> list[int]:
    """The batches (numbers in the pass's order) of rank ``rank``'s share of a pass by length:
    every ``size``-th of the ``ceil(n / batch_size)`` batches from batch ``rank``, so that every
    rank runs short and long batches alike (a contiguous share of batches sorted by length would
    give the last rank the longest); every batch is the one a single process would run."""
    return list(range(rank, math.ceil(n_examples / batch_size), size))


def _collective(what: str, function: Callable[[], Any], current: World) -> Any:
    """Run a collective; a failure (a rank that died) becomes one clear error."""
    try:
        return function()
    except Exception as error:  # gloo/NCCL raise RuntimeError / DistBackendError
        raise UnavailableError(
            f"rank {current.rank} of {current.size}: {what} failed ({str(error).splitlines()[0][:200]}); "
            "another rank probably died. Run the same command again: with --checkpoint each rank "
            "resumes from its own checkpoint."
        ) from None


def _check_same_settings(settings: str, current: World) -> None:
    import torch.distributed as dist

    gathered: list[Any] = [None] * current.size
    _collective(
        "comparing settings", lambda: dist.all_gather_object(gathered, settings), current
    )
    if len(set(gathered)) > 1:
        differing = [rank for rank, value in enumerate(gathered) if value != gathered[0]]
        raise InputError(
            f"the ranks of this torchrun were given different corpora or settings (ranks "
            f"{differing} differ from rank 0): give every rank the same command and files."
        )


def _reduce(accumulators: Sequence[Accumulator], counts: dict[str, Any], current: World) -> None:
    import torch.distributed as dist

    for accumulator in accumulators:
        _collective(f"reducing {accumulator.name}", accumulator.all_reduce, current)
    gathered: list[Any] = [None] * current.size
    _collective("gathering counts", lambda: dist.all_gather_object(gathered, counts), current)
    kinds = {part["pairs"] for part in gathered if part["pairs"] is not None}
    if len(kinds) > 1:
        raise InputError("The corpus mixes single sentences and sentence pairs across ranks.")
    for key in ("examples", "tokens", "truncated"):
        counts[key] = sum(part[key] for part in gathered)
    counts["longest"] = max(part.get("longest", 0) for part in gathered)
    counts["pairs"] = kinds.pop() if kinds else None


# ------------------------------------------------------------------------------------------------
# checkpoints


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
        other for other in path.parent.glob(f"{path.stem}.rank*-of-*{path.suffix}") if other.name != mine.name
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
    tail: _Tail | None = None,
) -> None:
    """Write every accumulator's state and the pass's counts atomically to ``path``; with
    ``tail``, also the state and counts at the start of the unfinished last unit of the pass
    (:class:`_Tail`: tensors ``@tail/<name>/<key>``, metadata ``tail``)."""
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
    checkpoint written by :func:`run`; ``ValueError`` naming the file if it is not one."""
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


def _restore(
    path: Path, accumulators: Sequence[Accumulator], header: dict[str, Any]
) -> tuple[dict[str, Any], _Tail | None]:
    """Load a checkpoint's states into ``accumulators``; its counts and its :class:`_Tail` (or
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
        tail = _Tail(saved["counts"], states, saved["accumulators"], saved["size"],
                     recorded=(saved["indices"], saved["examples"]))
    return meta["counts"], tail


#: the prefix of a checkpoint's tensors that hold the state at the start of its last unit
TAIL = "@tail/"


@dataclass
class _Tail:
    """The state of a pass at the start of its last unit of examples when that unit is
    unfinished: the corpus ended inside it (a batch shorter than ``batch_size`` in corpus order,
    a window shorter than ``BY_LENGTH_BATCHES * batch_size`` by length). A checkpoint written
    inside such a unit keeps it, so that the pass can resume on a longer corpus that starts with
    the same examples: it goes back to the unit's start and runs the unit as the longer corpus
    makes it (more rows in the batch, another length order in the window), exactly as a pass
    over the whole longer corpus would. ``counts``: the pass's counts then (``corpus``: the
    fingerprint of the examples before it); ``states``: each accumulator's :meth:`state_dict`,
    on the host; ``metadata``: each one's :meth:`Accumulator.metadata`; ``size``: the examples
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
        fingerprint = _Fingerprint()
        fingerprint.update([example for _, example in ordered])
        return [index for index, _ in ordered], fingerprint.hexdigest()

    @classmethod
    def take(cls, accumulators: Sequence[Accumulator], counts: dict[str, Any], corpus: str, size: int) -> _Tail:
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


class _Signals:
    """Inside it, SIGTERM (what ``timeout``, Slurm and ``docker stop`` send) raises
    ``KeyboardInterrupt`` like Ctrl-C, so an interrupted pass saves its checkpoint; a second
    signal while the checkpoint is written waits for the write (:meth:`saving`)."""

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}
        self.pending: int | None = None
        self.deferring = False
        self.batching = False

    def __enter__(self) -> _Signals:
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


# ------------------------------------------------------------------------------------------------
# the pass


def run(
    model: Any,
    corpus: Any,
    accumulators: Sequence[Accumulator],
    *,
    max_len: SupportsIndex = 128,
    layout: str | None = None,
    batch_size: SupportsIndex = 32,
    hooks: FwdHooks = (),
    progress: bool = True,
    description: str = "pass",
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: SupportsIndex = CHECKPOINT_EVERY,
    effective: Mapping[str, Any] | None = None,
    settings: Mapping[str, Any] | None = None,
    compact: bool = True,
    by_length: bool = True,
) -> PassSummary:
    """Run ``model`` over ``corpus`` once, updating every accumulator; returns a
    :class:`PassSummary`.

    ``corpus``: strings or ``(str, str)`` pairs (a list, a generator, a ``datasets`` column),
    tokenized ``batch_size`` at a time with ``max_len`` in ``layout`` (default: the
    architecture's, :func:`attnlens.inputs.default_layout`). ``hooks``: interventions
    (``fwd_hooks``) active during the pass; accumulators read the patterns they produce. What
    they patch in the model (:meth:`attnlens.engine.hooks.Hooks.patched`: the replaced heads of
    ``papa.hooks(..., fast=True)`` skip their work) holds for the whole pass.
    ``effective``: keyword arguments of :func:`attnlens.effective.effective_attention`
    (``rtol``, ``padded``). ``settings``: anything else that changes the result (recorded in
    checkpoints and compared across ranks). ``compact``: run PAPA-layout batches at the length
    of their longest real text, with the layout's positions (:func:`attnlens.inputs.compact_batch`;
    the same results up to float32 rounding, for the real tokens' share of the cost) when every
    accumulator reads positions rather than columns (:attr:`Accumulator.compact`); ``False``
    pads them to ``max_len``. Hooks (``hooks=``) must then read positions too, as PAPA's do.
    ``by_length``: run each window of :data:`BY_LENGTH_BATCHES` batches of consecutive examples
    from its shortest example to its longest (:func:`attnlens.inputs.by_length`) when every
    accumulator allows it (:attr:`Accumulator.any_order`) and batches are not all padded to
    ``max_len``: each batch then holds examples of similar lengths (the embedded corpus: 0.48x
    the positions of batches in its order), with the same results up to float32 rounding of
    sums taken in another order. The order depends only on the sequence of examples, so a list
    and a generator of the same examples run the same batches, and a resumed pass meets them in
    the same order. ``False`` runs the corpus in its order.

    ``checkpoint``: a file to which the state is written atomically every ``checkpoint_every``
    batches, at an interrupt (Ctrl-C, SIGTERM) and at the end. Running again with the same
    checkpoint resumes: it must be the same model, settings and world size, and the first
    examples of the pass's order must be those consumed (their fingerprint is recorded; by
    length, a window is read whole before its first batch runs); anything else is refused.
    With the same ``batch_size`` the result is bit-identical to an uninterrupted pass.

    Under ``torch.distributed`` each rank runs its contiguous, batch-aligned shard
    (:func:`shard`), or by length every ``size``-th batch (:func:`interleaved`), with its own checkpoint (:func:`checkpoint_path`); the accumulators are
    then summed over ranks, so every rank holds the result.

    The first pass of a process keeps freed memory for reuse (:func:`attnlens.core.memory.reuse_freed_memory`:
    glibc's mmap and trim thresholds; ``ATTNLENS_REUSE_MEMORY=0`` keeps glibc's defaults).
    """
    require_bridge(model, description)
    memory.reuse_freed_memory()
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
    current = world()
    examples = corpus_iterator(corpus)
    total: int | None = len(corpus) if hasattr(corpus, "__len__") else None
    flag(by_length, "by_length")
    window = BY_LENGTH_BATCHES * batch_size if (
        by_length and all(a.any_order for a in accumulators) and (compact or layout != "papa")) else None
    sizes: dict[int, int] = {}  # the size of each window read, by its start in the pass's order
    numbered = pass_order(examples, model.tokenizer, window, sizes=sizes)  # (corpus index, example) in the pass's order
    starts: list[int] | None = None  # where each of this process's batches starts in the pass's order
    if current.distributed:
        listed = list(numbered)
        whole = _Fingerprint()
        whole.update([example for _, example in listed])
        if window is None:
            start, stop = shard(len(listed), batch_size, current.rank, current.size)
            starts = list(range(start, stop, batch_size))
        else:
            starts = [b * batch_size for b in interleaved(len(listed), batch_size, current.rank, current.size)]
        mine = [listed[start : start + batch_size] for start in starts]
        numbered = (item for batch in mine for item in batch)
        total = sum(map(len, mine))
    header = {
        "model": model_id(model),
        "fingerprint": weights_fingerprint(model),
        "layout": layout,
        "max_len": max_len,
        "batch_size": batch_size,
        "accumulators": sorted(names),
        "order": "corpus" if window is None else f"by length, {window} examples at a time",
        "world_size": current.size,
        "rank": current.rank,
        "settings": json.loads(json.dumps(dict(settings or {}), sort_keys=True, default=str)),
        "effective": json.loads(json.dumps(dict(effective or {}), sort_keys=True, default=str)),
    }
    if current.distributed:
        _check_same_settings(
            json.dumps({**header, "rank": None, "corpus": whole.hexdigest()}, sort_keys=True),
            current,
        )

    counts: dict[str, Any] = {
        "examples": 0, "tokens": 0, "truncated": 0, "pairs": None, "corpus": None, "longest": 0,
    }
    fingerprint = _Fingerprint()
    path = checkpoint_path(checkpoint, current) if checkpoint is not None else None
    tail: _Tail | None = None  # the state at the start of an unfinished last unit (see _Tail)
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
        if window is None:
            following = next(numbered, None)
            if following is not None:
                numbered = itertools.chain([following], numbered)
            longer = following is not None  # a short batch is the end of the corpus it was run on
            kept = same  # the unit's examples are among those the fingerprint covers
        else:
            longer = sizes.get(start, 0) > tail.size  # that window was read to consume `resumed`
            if longer:  # the examples the unit ran must be in the longer window, at the same indices
                consumed += itertools.islice(numbered, start + sizes[start] - len(consumed))
                found = dict(consumed[start:])
                indices, recorded = tail.seen()
                mine = _Fingerprint()
                mine.update([found[index] for index in indices if index in found])
                kept = all(index in found for index in indices) and mine.hexdigest() == recorded
                numbered = itertools.chain(consumed[resumed:], numbered)
                del consumed[resumed:]
            else:
                kept = False
        before = _Fingerprint()
        before.update([example for _, example in consumed[:start]])
        if longer and kept and before.hexdigest() == tail.counts["corpus"]:
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
    unit = batch_size if window is None else window  # what a _Tail starts

    device = device_of(model)
    needs_effective = any(a.needs_effective for a in accumulators)
    needs_output = any(a.needs_output for a in accumulators)
    until = f"blocks.{int(model.cfg.n_layers) - 1}.hook_out" if any(
        a.needs_residual for a in accumulators) else None
    needs_grad = any(a.needs_grad for a in accumulators)
    options = dict(effective or {})
    state: dict[str, Any] = {}

    def on_pattern(layer: int, pattern: Tensor, v: Tensor | None, valid: Tensor) -> None:
        patterns = LayerPatterns(layer, pattern, state["batch"], v, options)
        for accumulator in accumulators:
            accumulator.update(patterns)
        state["layers"] += 1

    reading = pattern_hooks(model, on_pattern, values=needs_effective)
    extra = [hook for accumulator in accumulators for hook in accumulator.hooks(model)]
    n_layers = int(model.cfg.n_layers)

    bar = progress_bar(
        range(total) if total is not None else corpus, description,
        progress and current.rank == 0, initial=resumed,
    )
    saved_at, since_save = counts["examples"], 0
    state["consistent"] = True  # the state holds whole batches (a checkpoint may be written)
    signals = _Signals()

    def save() -> None:
        counts["corpus"] = fingerprint.hexdigest()
        save_checkpoint(path, accumulators, counts, header, tail)

    def one(host: _Staged, start: int, forwarded: Callable[[], None]) -> None:
        """Run the batch (or part of a batch) ``host``, whose first row is example ``start`` of
        the pass; count it. ``forwarded()`` is called after the forward, before ``end_batch``."""
        on_host, inputs = _inputs(model, accumulators, hooks, host.batch, device)
        pass_batch = PassBatch(inputs, start, model, host.indices, host.numbers["tokens"], on_host)
        for accumulator in accumulators:  # may refuse the batch; changes no state
            accumulator.start_batch(pass_batch)
        state.update(batch=pass_batch, layers=0, consistent=False)
        grad = torch.enable_grad() if needs_grad else torch.inference_mode()
        with grad:
            if needs_output:
                output = _forward(model, inputs, fwd_hooks)
                for accumulator in accumulators:
                    accumulator.update_output(pass_batch, output)
            else:
                run_patterns(model, inputs, fwd_hooks, until=until)
        if state["layers"] != n_layers:
            raise ModelBehaviourError(
                f"hook_pattern fired {state['layers']} times for {n_layers} layers; "
                f"{description} needs every layer's attention pattern."
            )
        forwarded()
        for accumulator in accumulators:
            accumulator.end_batch(pass_batch)
        _count(counts, host.numbers)
        fingerprint.update(host.chunk)
        state["consistent"] = True
        bar.update(len(host.chunk))

    # an intervention that patches the model (PapaHooks(fast=True): replaced heads skip their
    # work) holds for the whole pass; the rest of it runs as hooks
    with signals, eval_mode(model), as_hooks(hooks).patched(model) as intervening:
        fwd_hooks = [*intervening, *extra, *reading]
        for accumulator in accumulators:  # the state lives beside the patterns during the pass
            accumulator.to(device)

        multiple = devices.width_multiple(device)  # compact widths in buckets off the CPU

        def staged(pairs: list) -> _Staged:
            # a batch starts with its tokenization: a first SIGTERM / SIGINT now waits for its end
            signals.batching = True
            return _stage(model, pairs, max_len=max_len, layout=layout, compact=compact, multiple=multiple)

        # a batch that runs out of device memory is split in halves and run again (_Split)
        split = _Split(accumulators, staged, device, state, splits=all(a.any_order for a in accumulators))
        # on a GPU the next batch is tokenized on the host while the device runs this one
        ahead = _ahead(device, staged)
        try:
            for host in ahead(chunks(numbered, batch_size)):
                signals.batching = True  # a first SIGTERM / SIGINT now waits for the batch's end
                done = counts["examples"]  # by this process; its batches before the last are whole
                size = len(host.chunk) if window is None else sizes.get(done, unit)
                if path is not None and starts is None and done % unit == 0 and size < unit:
                    tail = _Tail.take(accumulators, counts, fingerprint.hexdigest(), size)  # the last unit, unfinished
                split.run(host, done if starts is None else starts[done // batch_size], one)
                if tail is not None:
                    tail.unit.extend(zip(host.indices, host.chunk, strict=True))
                since_save += 1
                signals.end_batch()  # interrupted during the batch: stop now, saving it
                if path is not None and since_save >= checkpoint_every:
                    with signals.saving():
                        save()
                    saved_at, since_save = counts["examples"], 0
        except BaseException:
            # Keep what was done; a batch cut half-way leaves the last periodic checkpoint in place.
            if path is not None and state["consistent"] and counts["examples"] > saved_at:
                with signals.saving():
                    save()
            raise
        finally:
            bar.close()
        if path is not None and counts["examples"] > saved_at:
            with signals.saving():
                save()
    if current.distributed:
        _reduce(accumulators, counts, current)
    for accumulator in accumulators:  # read back once: results are made on the host
        accumulator.to("cpu")
    if counts["examples"] == 0:
        raise InputError(
            f"corpus is empty: {description} needs at least one string or (str, str) pair "
            f"(got {type(corpus).__name__})."
        )
    return PassSummary(
        n_examples=counts["examples"],
        n_tokens=counts["tokens"],
        n_truncated=counts["truncated"],
        pairs=counts["pairs"],
        layout=layout,
        max_len=max_len,
        accumulators=list(accumulators),
        resumed=resumed,
        longest=counts.get("longest", 0),
    )


def pass_order(examples: Iterable, tokenizer: Any, window: int | None, *,
               sizes: dict[int, int] | None = None) -> Iterator[tuple[int, Any]]:
    """``(corpus index, example)`` of every example, in the order a pass runs them: the corpus's
    (``window=None``), or each ``window`` of consecutive examples from its shortest to its
    longest (:func:`_length_order`; :func:`run` by length uses ``BY_LENGTH_BATCHES *
    batch_size``). Lazy: a window is read when the pass reaches it. ``sizes``: filled with the
    number of examples of each window read, by the position of its first example (only the
    corpus's last window may be shorter than ``window``)."""
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
    """:func:`attnlens.inputs.by_length` of ``examples``, or ``None`` (their order) when they
    are not all strings, all pairs or all words: :func:`attnlens.inputs.tokenize` then names
    the example that is not one."""
    kinds = {example_kind(example) for example in examples}
    if len(kinds) != 1 or None in kinds:
        return None
    try:
        return by_length(tokenizer, examples)
    except (TypeError, ValueError):  # a tokenizer that cannot take them: tokenize says why
        return None


def _prepare(accumulators: Sequence[Accumulator], batch: Batch) -> Batch:
    """The inputs of the forward: ``batch``, or what the one accumulator that changes it makes."""
    changed = [(a, a.prepare(batch)) for a in accumulators]
    changed = [(a, inputs) for a, inputs in changed if inputs is not batch]
    if len(changed) > 1:
        names = ", ".join(a.name for a, _ in changed)
        raise InputError(f"accumulators {names} each change the model's inputs; run them in separate passes.")
    return changed[0][1] if changed else batch


@dataclass
class _Staged:
    """The host side of one batch: the corpus ``indices`` and examples (``chunk``) of its rows,
    the tokenized ``batch`` and its counts (``numbers``: examples, real tokens, truncated,
    pairs, longest), read off host tensors."""

    indices: list[int]
    chunk: list
    batch: Batch
    numbers: dict[str, Any]


def _stage(model: Any, pairs: list, *, max_len: int, layout: str, compact: bool, multiple: int = 1) -> _Staged:
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
    return _Staged(indices, chunk, batch, numbers)


def _inputs(model: Any, accumulators: Sequence[Accumulator], hooks: FwdHooks, batch: Batch,
            device: torch.device) -> tuple[Batch, Batch]:
    """The forward's inputs of a tokenized host ``batch``, on the host and on ``device``: made by
    the accumulators (:meth:`Accumulator.prepare`, which may keep per-batch state: run in the
    pass's thread), checked on the host, then copied (from pinned memory without waiting, on a
    GPU)."""
    check_hooks(hooks, batch)
    inputs = _prepare(accumulators, batch)
    check_token_ids(model, inputs)
    if device.type == "cuda":
        return inputs, inputs.pin_memory().to(device, non_blocking=True)
    return inputs, inputs.to(device)


def _ahead(device: torch.device, stage: Callable[[list], _Staged]) -> Callable[[Iterable[list]], Iterator[_Staged]]:
    """``stage`` over chunks of a corpus: in line on a CPU (its cores run the forward), one chunk
    ahead in a worker thread on another device (concurrent.futures), so that the host prepares
    batch k + 1 while the device runs batch k."""
    def inline(parts: Iterable[list]) -> Iterator[_Staged]:
        return map(stage, parts)

    def threaded(parts: Iterable[list]) -> Iterator[_Staged]:
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


class _Split:
    """Runs each batch of a pass, and the halves of one that runs out of device memory.

    A batch whose forward (or copy to the device) raises ``torch.OutOfMemoryError``
    (``torch.cuda.OutOfMemoryError`` is the same class) is split in two halves, re-tokenized on
    the host, and each half is run, split again if it fails too, down to one example; one example
    that does not fit re-raises the error, with the state as it was before that example, so that
    the pass writes its checkpoint (if it has one) before it stops. The first batch that fits
    after a failure warns once, naming its size; every later batch of the pass is then run in
    parts of at most that size (:attr:`limit`; it only shrinks), rather than failing again.
    Splitting is only done when every accumulator is :attr:`Accumulator.any_order` (its result
    does not depend on which examples share a batch): the result is then that of the unsplit pass
    up to float32 rounding of per-batch sums (a sum over ``B`` rows in float32 is within
    ``(B - 1)·2⁻²⁴`` of its exact value, relatively; split, within the same bound), and of a
    forward at another padded length. Otherwise the error is raised, the state put back.

    A failed batch leaves no partial state: before each batch, the versions of the
    accumulators' state tensors (``Tensor._version``, a host counter that every in-place change
    bumps) are noted, and the state of the accumulators that change it during a forward (before
    :meth:`Accumulator.end_batch`) is copied on the device (``clone``; no host read); after a
    failure, that copy is put back (:meth:`Accumulator.load_state_dict`). Which accumulators those
    are is learnt on the pass's first batch, for which every state is copied: :class:`PatternSums`
    and others that add their batch in ``end_batch`` are never copied after it, so the normal path
    costs a few attribute reads per batch (and a copy of the small states of accumulators that
    add in ``update``, such as :class:`attnlens.stats.Statistics`)."""

    def __init__(self, accumulators: Sequence[Accumulator], stage: Callable[[list], _Staged],
                 device: torch.device, state: dict[str, Any], *, splits: bool) -> None:
        self.accumulators, self.stage, self.device, self.splits = list(accumulators), stage, device, splits
        self.state = state  # run's: "consistent" is set again once the state is put back
        self.limit: int | None = None  # after a failure: the most examples run at once
        self.writers: set[int] | None = None  # accumulators that change their state in a forward
        self.warned = False

    def run(self, host: _Staged, start: int, one: Callable[[_Staged, int, Callable[[], None]], None]) -> None:
        """Run ``host`` (its first row is example ``start`` of the pass) with ``one``, in parts
        of at most :attr:`limit` examples, halving a part that runs out of memory."""
        pending = [host]
        while pending:
            part = pending.pop(0)
            if self.limit is not None and len(part.chunk) > self.limit:
                pairs = list(zip(part.indices, part.chunk, strict=True))
                pending[:0] = [self.stage(pairs[i : i + self.limit]) for i in range(0, len(pairs), self.limit)]
            elif self._attempt(part, start, one):
                start += len(part.chunk)
            else:  # out of memory: the limit is now below its size, and it is split above
                pending.insert(0, part)

    def _versions(self) -> list[list[Any]]:
        """Each state tensor's version; an inference tensor (state made under
        ``torch.inference_mode``) keeps none, so it gets a new object each time: always changed,
        always copied."""
        return [[object() if value.is_inference() else value._version for value in a.state_dict().values()]
                for a in self.accumulators]

    def _attempt(self, host: _Staged, start: int, one: Callable[[_Staged, int, Callable[[], None]], None]) -> bool:
        """Run ``host``: True; or False when it ran out of memory (the state put back, and
        :attr:`limit` lowered to half its size); the error when it cannot be split."""
        before = self._versions()
        copied = {i: ({key: value.clone() for key, value in a.state_dict().items()}, a.metadata())
                  for i, a in enumerate(self.accumulators) if self.writers is None or i in self.writers}

        def forwarded() -> None:  # which accumulators changed their state during the forward
            changed = {i for i, (now, then) in enumerate(zip(self._versions(), before, strict=True)) if now != then}
            self.writers = changed | (self.writers or set())

        try:
            one(host, start, forwarded)
        except torch.OutOfMemoryError:
            self._put_back(before, copied)
            self.state["consistent"] = True  # as before the batch: a checkpoint may be written
            if not self.splits or len(host.chunk) == 1:
                raise
        else:
            if self.limit is not None and not self.warned:
                self.warned = True
                import warnings

                warnings.warn(
                    f"out of memory on {self.device}: batches are split in halves until they fit; a "
                    f"batch of {len(host.chunk)} examples fitted, and the pass goes on with batches "
                    f"of at most {self.limit} examples (the same result up to float32 rounding; pass "
                    f"batch_size={self.limit} to avoid the failed tries).", stacklevel=4)
            return True
        # returned out of the except block: the failed forward's tensors (held by the traceback) are freed
        half = (len(host.chunk) + 1) // 2
        self.limit = half if self.limit is None else min(self.limit, half)
        return False

    def _put_back(self, before: list[list[int]], copied: dict[int, tuple[dict[str, Tensor], dict[str, Any]]]) -> None:
        """The state as it was before the failed batch: the copies of the accumulators whose
        state changed; an unchanged state stays. A change without a copy (an accumulator that
        never changed its state in a forward before) cannot be undone: the error then says so."""
        for i, (now, then) in enumerate(zip(self._versions(), before, strict=True)):
            if now == then:
                continue
            if i not in copied:
                raise ModelBehaviourError(
                    f"out of memory in a batch, and accumulator {self.accumulators[i].name!r} changed its "
                    "state during it where no earlier batch did, so the state cannot be put back; run "
                    "the pass again with a smaller batch_size (from its checkpoint, if it has one).")
            state, metadata = copied[i]
            self.accumulators[i].load_state_dict(state, metadata)


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
