"""The fast path of constant heads: a replaced head computes no query, key, ``QKᵀ`` or softmax.

PAPA (Hassid et al. 2022) replaces a head's attention by a constant matrix ``C``, so its output
is ``C·V`` whatever the input. :func:`constant_heads` patches the self-attention modules of an
encoder prepared by :func:`attnlens.core.seam.install` (BERT, RoBERTa) for the duration of a
context: a layer's replaced heads take their pattern from the constants (made once a forward for
every layer, :class:`_Made`), the others compute theirs from their own rows of the query and key
projections, and both groups' outputs are written into the attention output, or their assembled
pattern weighed in one product where something reads it or off the CPU
(:data:`ASSEMBLED_OFF_THE_CPU`). What the hook path (``papa.hooks``: the full softmax, then the
replaced heads' patterns set in ``hook_pattern``) gives, within float32 summation order.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from attnlens.core import devices, models, seam
from attnlens.core.modes import version
from attnlens.errors import InputError

#: off the CPU, whether a layer of constant and computed heads (:func:`constant_heads`) weighs its
#: assembled ``[batch, head, query, key]`` pattern in one product (four kernels, where writing each
#: group's outputs apart takes seven) rather than each group's outputs apart (fewer bytes: no
#: pattern written and read again, no constant shared by the batch copied per example). Which
#: is faster on a GPU depends on whether its batches are bound by launches or by memory:
#: ``benchmarks/constant_speed.py --device cuda`` times both, ``benchmarks/launches.py`` counts both
ASSEMBLED_OFF_THE_CPU = True

#: ``(key_mask, dtype) -> {layer: [batch or 1, replaced, query, key]}``: the constant patterns of
#: every patched layer's replaced heads (in head order) for a batch with that ``[batch, key]`` key
#: mask, made at once; a leading axis of 1 when every example gets the same pattern (no padding)
ConstantFn = Callable[[Tensor, torch.dtype], dict[int, Tensor]]


def skips_constant_heads(bridge: Any) -> bool:
    """True when :func:`constant_heads` can run on ``bridge``: an encoder whose seam is
    ``"attnlens"`` (BERT, RoBERTa; its architecture file), prepared by
    :func:`attnlens.core.seam.install`."""
    return models.of(bridge).seam == "attnlens" and seam.is_installed(bridge)


def patched_layers(bridge: Any) -> list[int]:
    """The layers whose self-attention :func:`constant_heads` patches now (their module has an
    instance ``forward``): a model inside ``papa.intervention(..., fast=True)`` or a fast
    :class:`attnlens.papa.PapaHooks`'s ``apply``. Empty where constant heads cannot run."""
    if models.find(bridge) is None or not skips_constant_heads(bridge):
        return []
    return [layer for layer, block in enumerate(bridge.blocks)
            if "forward" in vars(seam.self_attention(block.attn.original_component))]


@contextlib.contextmanager
def constant_heads(
    bridge: Any, replaced: dict[int, Bool[Tensor, "head"]], constant: ConstantFn
) -> Iterator[None]:
    """Inside this context, the heads of ``replaced`` marked True compute nothing of their own.

    ``replaced``: ``{layer: [head] boolean mask}``; ``constant(key_mask, dtype)`` returns every
    patched layer's ``[batch, replaced, query, key]`` pattern of its replaced heads for a batch
    with that ``[batch, key]`` mask (True for real tokens), or ``[1, replaced, query, key]`` when
    it is the same for every example: called once per forward, at its first patched layer, and
    read by the others (on a GPU one launch per operator for all the layers). For those heads the layer runs no query or key projection, no ``QKᵀ`` and no
    softmax: their output is the constant pattern times their values (PAPA, Hassid et al. 2022:
    a constant head is ``C·V``). The other heads' query and key projections use only their rows
    of the weights (through ``F.linear``). Dropout (training mode only) applies to the computed
    heads alone. Layers not in ``replaced`` are untouched.

    The full ``[batch, head, query, key]`` pattern (constant heads and computed heads together)
    is assembled only when something would read it: a hook on the layer's ``hook_pattern``, a
    forward hook on the self-attention module or the attention module around it, or a global
    module hook. ``hook_pattern`` then sees it and its edits reach the output, as on the hook
    path. A hook that reads the layer's queries, keys or scores (on ``hook_q``, ``hook_k``,
    ``hook_attn_scores`` or the query and key projections) sees every head's: the layer then
    computes them all, as on the hook path (an edit of a replaced head's changes nothing, its
    pattern being the constant's). Otherwise each head group's output is written straight into the
    attention output and the module returns no pattern, as with ``attn_implementation="sdpa"``:
    a Hugging Face output's ``attentions`` (``output_attentions=True``) then lacks the patched
    layers; read patterns through ``hook_pattern`` (``run_with_cache``) instead.

    Only for encoders whose seam is ``"attnlens"`` (BERT, RoBERTa: :func:`install`);
    :class:`~attnlens.errors.InputError` otherwise. The self-attention modules get an instance
    ``forward`` for the duration, removed on exit.
    """
    if not skips_constant_heads(bridge):
        raise InputError(
            "constant heads skip their work only on encoders prepared by attnlens.load() "
            f"(BERT, RoBERTa); this is a {type(bridge.original_model).__name__}"
        )
    patched = []
    made = _Made(constant, min(replaced, default=0), max(replaced, default=0))
    try:
        for layer, mask in replaced.items():
            attention = bridge.blocks[layer].attn
            module = seam.self_attention(attention.original_component)
            if "forward" in vars(module):
                nested = getattr(vars(module)["forward"], "func", None) is _constant_forward
                raise InputError(
                    f"layer {layer}'s attention is already patched (nested constant_heads?)" if nested else
                    f"layer {layer}'s self-attention has a forward of a user's (assigned to the module), which "
                    "the constant heads' patch would replace and then delete: remove it, or pass fast=False"
                )
            readers = (module, attention.original_component)
            heads = _HeadIndices.of(layer, mask, int(module.attention_head_size), next(module.parameters()).device)
            module.forward = functools.partial(_constant_forward, module, heads, made, readers)
            patched.append(module)
        yield
    finally:
        for module in patched:
            del module.forward


def _reads_output(module: nn.Module) -> bool:
    """True when a forward hook on ``module`` (the self-attention, or the attention around it)
    may read its pattern output.

    transformers' ``output_capturing_hook`` (the ``output_attentions`` recorder) does not count:
    TransformerLens loads every model with ``output_attentions=True``, so it records on every
    forward for outputs the bridge never returns; it skips a module that returns no pattern."""
    return any(
        getattr(hook, "__name__", "") != "output_capturing_hook" for hook in module._forward_hooks.values()
    )


def _wants_pattern(pattern_fn: Any, readers: tuple[nn.Module, ...]) -> bool:
    """Whether anything would read the assembled pattern (see :func:`constant_heads`):
    ``pattern_fn`` or a forward hook on ``readers``, the modules whose output carries it (the
    self-attention and the attention around it)."""
    return seam.runs_hooks(pattern_fn) or any(_reads_output(module) for module in readers)




@dataclass(frozen=True)
class _HeadIndices:
    """A layer's replaced and computed heads for :func:`_constant_forward`, found once, when the
    layer is patched, on the model's device (what the forward indexes with), so that a forward
    neither reads nor copies them (a copy from pageable host memory waits for the device)."""

    layer: int
    fixed: Int[Tensor, "fixed"]
    computed: Int[Tensor, "computed"]
    #: the computed heads' output features of the query and key projections (``head · d_head + i``)
    computed_rows: Int[Tensor, "row"]
    #: their rows of the query and key projections' weights and biases, with the versions they were taken at
    _weights: dict[int, Any] = field(default_factory=dict, compare=False, repr=False)

    def query_key(self, module: nn.Module) -> tuple[Tensor, Tensor | None]:
        """The rows of the query and key projections' weights (and biases) that produce the
        computed heads, stacked (queries first): one product makes both. Taken once per
        weight (and in-place version of them) where no gradient is recorded, else every time
        (the rows of a weight being trained follow it)."""
        inner = [getattr(linear, "original_component", linear) for linear in (module.query, module.key)]
        versions = tuple((version(layer.weight), None if layer.bias is None else version(layer.bias)) for layer in inner)
        kept = self._weights.get(id(inner[0].weight))
        if torch.is_grad_enabled() or kept is None or kept[0] != versions:
            rows = self.computed_rows
            weight = torch.cat([layer.weight.index_select(0, rows) for layer in inner])
            biases = [layer.bias for layer in inner]
            bias = None if any(b is None for b in biases) else torch.cat([b.index_select(0, rows) for b in biases])
            if torch.is_grad_enabled():
                return weight, bias
            kept = self._weights[id(inner[0].weight)] = (versions, (weight, bias))
        return kept[1]

    @classmethod
    def of(cls, layer: int, replaced: Bool[Tensor, "head"], d_head: int, device: torch.device) -> _HeadIndices:
        replaced = replaced.to(torch.bool).cpu()
        fixed, computed = replaced.nonzero().squeeze(-1), (~replaced).nonzero().squeeze(-1)
        rows = (computed[:, None] * d_head + torch.arange(d_head)).reshape(-1)
        return cls(layer, fixed.to(device), computed.to(device), rows.to(device))


class _Made:
    """The constant patterns of a forward's patched layers (:func:`constant_heads`): made at the
    first patched layer (a forward runs its layers in order), read by each, let go at the last."""

    def __init__(self, constant: ConstantFn, first: int, last: int) -> None:
        self.constant, self.first, self.last = constant, first, last
        self.patterns: dict[int, Tensor] = {}

    def of(self, layer: int, key_mask: Callable[[], Tensor], dtype: torch.dtype, batch: int, n: int) -> Tensor:
        """``layer``'s replaced heads' pattern for a batch of ``batch`` examples of ``n`` tokens,
        whose key mask ``key_mask()`` gives (made only when the patterns are)."""
        made = self.patterns.get(layer)
        if layer == self.first or made is None or made.shape[-1] != n or made.shape[0] not in (1, batch) \
                or made.dtype != dtype:
            self.patterns = self.constant(key_mask(), dtype)  # a new forward (or a layer run on its own)
            made = self.patterns[layer]
        if layer == self.last:
            self.patterns = {}
        return made


def _constant_forward(
    module: nn.Module,
    heads: _HeadIndices,
    made: _Made,
    readers: tuple[nn.Module, ...],
    hidden_states: Float[Tensor, "batch pos d_model"],
    attention_mask: Float[Tensor, "batch 1 query key"] | None = None,
    *args: Any,
    pattern_fn: Callable[[Tensor], Tensor] | None = None,
    **kwargs: Any,
) -> tuple[Float[Tensor, "batch pos d_model"], Float[Tensor, "batch head query key"] | None]:
    """``BertSelfAttention.forward`` with the replaced heads' patterns taken from ``constant``
    (see :func:`constant_heads`; ``heads``: which they are); the others as
    :func:`attention_forward` computes them.

    Each head's output is its pattern times its values (``[batch, pos, head, d_head]``); the
    constant heads' ``C·V`` and the computed heads' ``softmax(QKᵀ)·V`` are computed apart and
    written into their heads' slots, unless the assembled pattern is wanted (:func:`_wants_pattern`)
    or the layer runs off the CPU with heads of both kinds (one product of the assembled pattern
    is then fewer kernels).
    """
    if _reads_query_key(module):  # every head's queries, keys or scores are read, as on the hook
        # path: computed (hook_q, hook_k, hook_attn_scores run), the replaced heads' patterns then set
        fixing = functools.partial(_fixed_then, heads, made, pattern_fn)
        return type(module).forward(module, hidden_states, attention_mask, *args, pattern_fn=fixing, **kwargs)
    batch, n = hidden_states.shape[:2]
    n_heads, d_head = int(module.num_attention_heads), int(module.attention_head_size)
    device = hidden_states.device
    value = module.value(hidden_states).view(batch, n, n_heads, d_head)
    key_mask = functools.partial(seam.layer_key_mask, attention_mask, batch, n, device)
    fixed_heads, computed = heads.fixed, heads.computed
    fixed = made.of(heads.layer, key_mask, value.dtype, batch, n)
    own = _own_pattern(module, hidden_states, attention_mask, heads) if computed.numel() else None
    wanted = _wants_pattern(pattern_fn, readers)
    # off the CPU the heads' outputs are one product of the assembled pattern
    # (ASSEMBLED_OFF_THE_CPU); on the CPU the constant heads' pattern, shared by the batch, is
    # never copied per example
    if wanted or (own is not None and ASSEMBLED_OFF_THE_CPU and not devices.reads_are_free(value)):
        pattern = value.new_empty(batch, n_heads, n, n)
        pattern[:, fixed_heads] = fixed
        if own is not None:
            pattern[:, computed] = own.to(pattern.dtype)
        if seam.hooked(pattern_fn):  # an unhooked hook point changes nothing: neither it nor the key mask runs
            pattern = seam.call_hook(pattern_fn, pattern, key_mask)
        output = torch.matmul(pattern, value.transpose(1, 2)).transpose(1, 2)
        return output.reshape(batch, n, n_heads * d_head), pattern
    if own is None:  # every head replaced: their outputs in head order, as they are
        return _weigh(fixed, value).reshape(batch, n, n_heads * d_head), None
    output = value.new_empty(batch, n, n_heads, d_head)
    output[:, :, fixed_heads] = _weigh(fixed, value.index_select(2, fixed_heads))
    if own is not None:
        own_values = value.index_select(2, computed).transpose(1, 2)
        output[:, :, computed] = torch.matmul(own.to(value.dtype), own_values).transpose(1, 2)
    return output.reshape(batch, n, n_heads * d_head), None


def _reads_query_key(module: nn.Module) -> bool:
    """Whether a hook would see the queries, keys or scores of the self-attention ``module``: on
    its query or key projection (the module, or its TransformerLens hook points ``hook_in`` and
    ``hook_out``: ``hook_q``, ``hook_k``) or on its bridge's ``hook_attn_scores``."""
    projections = (module.query, module.key)
    points = [getattr(linear, name, None) for linear in projections for name in ("hook_in", "hook_out")]
    return any(seam.runs_hooks(linear) for linear in projections) or any(
        seam.hooked(point) for point in (*points, seam.scores_point(module)) if point is not None)


def _fixed_then(
    heads: _HeadIndices,
    made: _Made,
    pattern_fn: Callable[[Tensor], Tensor] | None,
    pattern: Float[Tensor, "batch head query key"],
) -> Float[Tensor, "batch head query key"]:
    """``pattern`` (every head's softmaxed scores) with the replaced heads of ``heads`` given
    their constant pattern (``made``), then through ``pattern_fn`` when it is hooked: what the
    hook path's ``hook_pattern`` gives, for a layer whose ``hook_attn_scores`` is read."""
    batch, _, n, _ = pattern.shape
    fixed = made.of(heads.layer, functools.partial(seam.key_mask, pattern), pattern.dtype, batch, n)
    pattern = pattern.index_copy(1, heads.fixed, fixed.to(pattern.dtype).expand(batch, -1, -1, -1))
    return pattern_fn(pattern) if seam.hooked(pattern_fn) else pattern


def _own_pattern(
    module: nn.Module,
    hidden_states: Float[Tensor, "batch pos d_model"],
    attention_mask: Float[Tensor, "batch 1 query key"] | None,
    heads: _HeadIndices,
) -> Float[Tensor, "batch computed query key"]:
    """The softmaxed pattern of the computed heads of ``heads``, from their rows of the query and
    key projections (one product, :meth:`_HeadIndices.query_key`; dropout in training mode), as
    :func:`attention_forward` computes it."""
    batch, n = hidden_states.shape[:2]
    d_head = int(module.attention_head_size)
    shape = (batch, n, heads.computed.numel(), d_head)
    query, key = nn.functional.linear(hidden_states, *heads.query_key(module)).chunk(2, dim=-1)
    query, key = query.reshape(shape).transpose(1, 2), key.reshape(shape).transpose(1, 2)
    scaling = getattr(module, "scaling", d_head**-0.5)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    own = nn.functional.softmax(scores, dim=-1)
    return module.dropout(own) if module.training else own


def _weigh(
    pattern: Float[Tensor, "one_or_batch head query key"], value: Float[Tensor, "batch key head d_head"]
) -> Float[Tensor, "batch query head d_head"]:
    """``pattern · value`` per example and head, laid out ``[batch, query, head, d_head]``.

    A pattern shared by the batch (leading axis 1) weighs every example's values in one product
    per head, ``[query, key] · [key, batch·d_head]``, rather than a broadcast that would copy the
    pattern ``batch`` times."""
    batch, n_keys, n_heads, d_head = value.shape
    if pattern.shape[0] == 1 and batch > 1:
        stacked = value.permute(2, 1, 0, 3).reshape(n_heads, n_keys, batch * d_head)
        product = torch.matmul(pattern[0], stacked).view(n_heads, -1, batch, d_head)
        return product.permute(2, 1, 0, 3)
    return torch.matmul(pattern, value.transpose(1, 2)).transpose(1, 2)
