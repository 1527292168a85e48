"""The hook seam: make ``blocks.{l}.attn.hook_pattern`` a real intervention point on encoders.

TransformerLens 4.x fires ``hook_pattern`` on BERT/RoBERTa bridges only *after* the Hugging Face
module has used the pattern, so an edited pattern is discarded. TransformerLens also has a seam for
modules that run the pattern through the hook themselves: when a wrapped module has
``accepts_pattern_fn = True``, the ``AttentionBridge`` passes ``pattern_fn=self.hook_pattern`` down
as a keyword argument. BERT and RoBERTa forward their ``**kwargs`` all the way to the attention
function chosen by ``config._attn_implementation``.

So the seam is three small steps:

1. register :func:`attention_forward` under the name ``"attnlens"`` in transformers'
   ``AttentionInterface``, and the eager mask builder under the same name in
   ``AttentionMaskInterface`` (without it the attention function would receive no mask), made
   even for a batch without padding (:func:`made_mask`: no read of the device to decide);
2. switch the HF model to ``attn_implementation="attnlens"``;
3. set ``accepts_pattern_fn = True`` on every wrapped attention module.

:func:`attention_forward` is the eager attention of BERT/RoBERTa line for line, with
``pattern_fn`` applied between the softmax and the value product. With no hook (or an identity
hook) the numerics are exactly those of ``attn_implementation="eager"``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from attnlens.core import devices, models
from attnlens.errors import InputError

ATTN_IMPLEMENTATION = "attnlens"

#: off the CPU, whether a layer of constant and computed heads (:func:`constant_heads`) weighs its
#: assembled ``[batch, head, query, key]`` pattern in one product (four kernels, where writing each
#: group's outputs apart takes seven) rather than each group's outputs apart (fewer bytes: no
#: pattern written and read again, no constant shared by the batch copied per example). Which
#: is faster on a GPU depends on whether its batches are bound by launches or by memory:
#: ``benchmarks/constant_speed.py --device cuda`` times both, ``benchmarks/launches.py`` counts both
ASSEMBLED_OFF_THE_CPU = True

_KEY_MASK: contextvars.ContextVar[Tensor | None] = contextvars.ContextVar(
    "attnlens_key_mask", default=None
)
_POSITIONS: contextvars.ContextVar[Tensor | None] = contextvars.ContextVar(
    "attnlens_positions", default=None
)
#: the shape ``(batch, key)`` of the batch being run when the host knows it has no padding
_UNPADDED: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "attnlens_unpadded", default=None
)


def attention_forward(
    module: nn.Module,
    query: Float[Tensor, "batch head query d_head"],
    key: Float[Tensor, "batch head key d_head"],
    value: Float[Tensor, "batch head key d_head"],
    attention_mask: Float[Tensor, "batch 1 query key"] | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    pattern_fn: Callable[[Tensor], Tensor] | None = None,
    **kwargs: Any,
) -> tuple[Float[Tensor, "batch query head d_head"], Float[Tensor, "batch head query key"]]:
    """Eager scaled dot-product attention with ``pattern_fn`` applied to the softmaxed pattern.

    Axes: ``batch`` examples, ``head`` attention heads, ``query``/``key`` token positions.
    ``attention_mask`` is the additive mask built by transformers' eager mask function
    (0 where allowed, the dtype's minimum where masked). Returns the attention output,
    laid out ``[batch, query, head, d_head]`` as HF expects, and the (possibly edited) pattern.
    """
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    pattern = nn.functional.softmax(scores, dim=-1)
    pattern = nn.functional.dropout(pattern, p=dropout, training=module.training)
    if hooked(pattern_fn):
        token = _KEY_MASK.set(_layer_key_mask(attention_mask, key.shape[0], key.shape[2], key.device))
        try:
            pattern = pattern_fn(pattern)
        finally:
            _KEY_MASK.reset(token)
    output = torch.matmul(pattern, value).transpose(1, 2).contiguous()
    return output, pattern


def hooked(point: Callable[[Tensor], Tensor] | None) -> bool:
    """Whether calling ``point`` may do anything: a TransformerLens hook point returns its input
    as it is while no hook (forward or backward) is on it. What the seam passes its layer's
    ``hook_pattern`` through (with no hook, neither the call nor the key mask it would see is
    needed: one kernel a layer fewer), and what the normalization bridges' direct path asks of
    their ``hook_scale`` / ``hook_normalized`` (:mod:`attnlens.core.norms`). A hook is
    TransformerLens's (``fwd_hooks`` / ``bwd_hooks``) or PyTorch's own on the point
    (``register_forward_hook``, ...) or on every module (``register_module_forward_hook``):
    :func:`_runs_hooks`. ``None``: False; any other callable: True (it is called)."""
    if point is None:
        return False
    hooks = [getattr(point, name, None) for name in ("fwd_hooks", "bwd_hooks")]
    return any(hooks) or _runs_hooks(point) if all(isinstance(value, list) for value in hooks) else True


def _layer_key_mask(
    attention_mask: Tensor | None, batch: int, n_keys: int, device: torch.device
) -> Bool[Tensor, "batch key"]:
    """The key mask of the batch a layer runs: inside an attnlens run, the batch's own
    (:func:`batch_key_mask`, no kernel); else read off the additive mask
    (:func:`_key_mask_from_additive`)."""
    stashed = _KEY_MASK.get()
    if stashed is not None and stashed.shape == (batch, n_keys) and stashed.device == device:
        return stashed
    return _key_mask_from_additive(attention_mask, batch, n_keys, device)


def _key_mask_from_additive(
    attention_mask: Tensor | None, batch: int, n_keys: int, device: torch.device
) -> Bool[Tensor, "batch key"]:
    """Which keys a padded encoder batch may attend to, read off the additive mask.

    For a bidirectional mask every query row is the same, so the last row is used
    (for a causal mask the last query row sees every non-padded key too).
    """
    if attention_mask is None:
        return torch.ones(batch, n_keys, dtype=torch.bool, device=device)
    if attention_mask.dtype == torch.bool:
        rows = attention_mask[:, 0, -1, :]
    else:
        rows = attention_mask[:, 0, -1, :] > torch.finfo(attention_mask.dtype).min / 2
    return rows.expand(batch, n_keys)


@contextlib.contextmanager
def batch_key_mask(valid: Bool[Tensor, "batch key"]) -> Iterator[None]:
    """Inside this context, :func:`key_mask` returns ``valid`` (``[batch, key]``, True for real
    tokens) for patterns of that batch and length (an attention module prepared by
    :func:`install` reads its own additive mask only outside it: the same keys, read again at
    every layer). attnlens's runs over a :class:`Batch` use it, so that decoders (whose pattern
    hooks have no seam) need no inference either."""
    token = _KEY_MASK.set(valid)
    try:
        yield
    finally:
        _KEY_MASK.reset(token)


@contextlib.contextmanager
def batch_positions(positions: Int[Tensor, "batch key"] | None) -> Iterator[None]:
    """Inside this context, :func:`positions` returns ``positions`` (``[batch, key]``: the
    layout position of every column of a compact PAPA batch, :attr:`attnlens.Batch.position_ids`)
    for patterns of that batch and length; ``None`` (an ordinary batch) leaves it unset.
    attnlens's runs over a :class:`attnlens.Batch` (:func:`attnlens.engine.forward.run_with_hooks`)
    use it, so that PAPA hooks gather their constants at the layout's positions."""
    token = _POSITIONS.set(positions)
    try:
        yield
    finally:
        _POSITIONS.reset(token)


@contextlib.contextmanager
def batch_unpadded(shape: tuple[int, int] | None) -> Iterator[None]:
    """Inside this context, the batch of ``shape`` (``(batch, key)``) is known, on the host, to
    have no padding (``None``: not known): its attention needs no mask (:func:`made_mask`), which
    transformers finds out only by reading the device. attnlens's runs over a :class:`Batch` on
    the host set it."""
    token = _UNPADDED.set(None if shape is None else tuple(shape))
    try:
        yield
    finally:
        _UNPADDED.reset(token)


def positions(pattern: Float[Tensor, "batch head query key"]) -> Int[Tensor, "batch key"] | None:
    """The layout positions of the keys (and queries) of the batch being run, set by
    :func:`batch_positions` for a compact batch of ``pattern``'s batch size and length; ``None``
    when the columns are the positions (an ordinary batch)."""
    return _stashed_positions(pattern.shape[0], pattern.shape[-1], pattern.device)


def mask_positions(valid: Bool[Tensor, "batch key"]) -> Int[Tensor, "batch key"] | None:
    """:func:`positions` for a batch known by its ``[batch, key]`` key mask (the fast constant
    heads of :func:`constant_heads` have no pattern to ask with)."""
    return _stashed_positions(valid.shape[0], valid.shape[-1], valid.device)


def _stashed_positions(batch: int, n_keys: int, device: torch.device) -> Tensor | None:
    stashed = _POSITIONS.get()
    if stashed is not None and stashed.shape == (batch, n_keys):
        return stashed.to(device)
    return None


def key_mask(
    pattern: Float[Tensor, "batch head query key"], *, causal: bool = False
) -> Bool[Tensor, "batch key"]:
    """Which keys of the batch being run are real tokens (True) rather than padding (False).

    Inside a ``hook_pattern`` hook on an encoder prepared by :func:`install`, this is read from
    the attention mask the model is using; inside :func:`batch_key_mask`, it is that mask.
    Elsewhere (e.g. GPT-2's native hook run by hand, or a pattern taken from a cache) it is
    inferred from the pattern: a key is valid if any head and any query gives it non-zero
    attention (padded keys receive exactly 0 after the masked softmax).

    ``causal=True`` (a decoder's pattern) leaves out query rows that give weight to a later key:
    a left-padded decoder's padded query rows see no allowed key and come out uniform over every
    key, padding included; the real rows (and right padding's trailing rows) are causal.
    """
    stashed = _KEY_MASK.get()
    batch, _, n_queries, n_keys = pattern.shape
    if stashed is not None and stashed.shape == (batch, n_keys):
        return stashed.to(pattern.device)
    attended = pattern.detach() != 0
    if causal:  # rows of fully masked (padded) queries are not causal; drop them
        later = attended.triu(n_keys - n_queries + 1).any(dim=-1, keepdim=True)
        attended = attended & ~later
    return attended.any(dim=1).any(dim=1)


#: ``(key_mask, dtype) -> {layer: [batch or 1, replaced, query, key]}``: the constant patterns of
#: every patched layer's replaced heads (in head order) for a batch with that ``[batch, key]`` key
#: mask, made at once; a leading axis of 1 when every example gets the same pattern (no padding)
ConstantFn = Callable[[Tensor, torch.dtype], dict[int, Tensor]]


def skips_constant_heads(bridge: Any) -> bool:
    """True when :func:`constant_heads` can run on ``bridge``: an encoder whose seam is
    ``"attnlens"`` (BERT, RoBERTa; its architecture file), prepared by :func:`install`."""
    return models.of(bridge).seam == "attnlens" and is_installed(bridge)


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
    of the weights (through ``F.linear``, so the ``hook_q`` / ``hook_k`` hooks of such a layer do
    not run; ``hook_v`` and ``hook_pattern`` do). Dropout (training mode only) applies to the
    computed heads alone. Layers not in ``replaced`` are untouched.

    The full ``[batch, head, query, key]`` pattern (constant heads and computed heads together)
    is assembled only when something would read it: a hook on the layer's ``hook_pattern`` or
    ``hook_attn_scores``, a forward hook on the self-attention module or the attention module
    around it, or a global module hook. ``hook_pattern`` then sees it and its edits reach the
    output, as on the hook path. Otherwise each head group's output is written straight into the
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
            module = _self_attention(attention.original_component)
            if "forward" in vars(module):
                raise InputError(f"layer {layer}'s attention is already patched (nested constant_heads?)")
            scores = getattr(attention, "hook_attn_scores", None)
            readers = ((module, attention.original_component), () if scores is None else (scores,))
            heads = _HeadIndices.of(layer, mask, int(module.attention_head_size), next(module.parameters()).device)
            module.forward = functools.partial(_constant_forward, module, heads, made, readers)
            patched.append(module)
        yield
    finally:
        for module in patched:
            del module.forward


def _runs_hooks(module: Any) -> bool:
    """True when calling ``module`` (a ``HookPoint`` or any ``nn.Module``) may run a hook: its own
    forward or backward hooks, or a global module hook."""
    if not isinstance(module, nn.Module):
        return module is not None  # a plain callable: assume it reads the pattern
    from torch.nn.modules import module as torch_module

    own = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    if any(getattr(module, name, None) for name in own):
        return True
    glob = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
            "_global_backward_pre_hooks")
    return any(getattr(torch_module, name, None) for name in glob)


def _reads_output(module: nn.Module) -> bool:
    """True when a forward hook on ``module`` (the self-attention, or the attention around it)
    may read its pattern output.

    transformers' ``output_capturing_hook`` (the ``output_attentions`` recorder) does not count:
    TransformerLens loads every model with ``output_attentions=True``, so it records on every
    forward for outputs the bridge never returns; it skips a module that returns no pattern."""
    return any(
        getattr(hook, "__name__", "") != "output_capturing_hook" for hook in module._forward_hooks.values()
    )


def _wants_pattern(pattern_fn: Any, readers: tuple[tuple[nn.Module, ...], tuple[Any, ...]]) -> bool:
    """Whether anything would read the assembled pattern (see :func:`constant_heads`):
    ``readers`` holds the modules whose output carries it (the self-attention and the attention
    around it) and the bridge's hook points that see it besides ``pattern_fn``."""
    modules, hook_points = readers
    if _runs_hooks(pattern_fn) or any(_runs_hooks(point) for point in hook_points):
        return True
    return any(_reads_output(module) for module in modules)


def _self_attention(attention: nn.Module) -> nn.Module:
    """The module that projects queries, keys and values (``BertSelfAttention``)."""
    inner = getattr(attention, "self", attention)
    if not all(hasattr(inner, name) for name in ("query", "key", "value", "attention_head_size")):
        raise InputError(f"{type(attention).__name__} has no query/key/value projections to skip")
    return inner




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
        version = tuple((layer.weight._version, None if layer.bias is None else layer.bias._version) for layer in inner)
        kept = self._weights.get(id(inner[0].weight))
        if torch.is_grad_enabled() or kept is None or kept[0] != version:
            rows = self.computed_rows
            weight = torch.cat([layer.weight.index_select(0, rows) for layer in inner])
            biases = [layer.bias for layer in inner]
            bias = None if any(b is None for b in biases) else torch.cat([b.index_select(0, rows) for b in biases])
            if torch.is_grad_enabled():
                return weight, bias
            kept = self._weights[id(inner[0].weight)] = (version, (weight, bias))
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
    readers: tuple[tuple[nn.Module, ...], tuple[Any, ...]],
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
    batch, n = hidden_states.shape[:2]
    n_heads, d_head = int(module.num_attention_heads), int(module.attention_head_size)
    device = hidden_states.device
    value = module.value(hidden_states).view(batch, n, n_heads, d_head)
    key_mask = functools.partial(_layer_key_mask, attention_mask, batch, n, device)
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
        if hooked(pattern_fn):  # an unhooked hook point changes nothing: neither it nor the key mask runs
            token = _KEY_MASK.set(key_mask())
            try:
                pattern = pattern_fn(pattern)
            finally:
                _KEY_MASK.reset(token)
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


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, made_mask)


def made_mask(*args: Any, **kwargs: Any) -> Tensor | None:
    """transformers' eager mask, always made: never skipped for a batch without padding.

    Skipping it (``allow_is_bidirectional_skip``) first asks whether every token is real,
    ``padding_mask.all()``: a read of the device at every forward, which makes the host wait for
    the GPU to finish the work queued before (the previous batch's) before it can queue the next.
    Made, the mask of a batch without padding is all zeros, and adding it changes no score
    (``x + 0.0 == x``): the same patterns bit for bit. An encoder's plain padding mask
    (transformers' bidirectional mask of a 2D ``attention_mask``, no offsets, no mask functions
    of the model's own) is made in one kernel, ``0`` where the key is a real token and the dtype's
    minimum elsewhere, broadcast over the queries, where transformers' general construction
    (index ranges, the mask function evaluated on them, then the same ``where``) takes about a
    dozen; the same values; and none at all for a batch the host knows has no padding
    (:func:`batch_unpadded`), which is what transformers' skip gives. Anything else goes to
    transformers' ``eager_mask``."""
    from transformers.masking_utils import bidirectional_mask_function, eager_mask

    kwargs["allow_is_bidirectional_skip"] = False
    padding = kwargs.get("attention_mask")
    plain = (
        not args and kwargs.get("mask_function") is bidirectional_mask_function
        and not kwargs.get("q_offset") and not kwargs.get("kv_offset") and kwargs.get("local_size") is None
        and not kwargs.get("use_vmap") and isinstance(padding, Tensor) and padding.ndim == 2
        and padding.shape == (kwargs.get("batch_size"), kwargs.get("kv_length"))
    )
    if not plain:
        return eager_mask(*args, **kwargs)
    if _UNPADDED.get() == tuple(padding.shape):  # the host said every token is real: no mask, as
        return None  # transformers' skip gives, without its read (batch_unpadded)
    dtype = kwargs.get("dtype", torch.float32)
    additive = torch.where(padding[:, None, None, :].bool(), torch.zeros((), device=padding.device, dtype=dtype),
                           torch.finfo(dtype).min)
    return additive.expand(-1, 1, kwargs["q_length"], -1)


def install(bridge: Any) -> Any:
    """Make ``hook_pattern`` edits change the computation of ``bridge`` (in place; returns it).

    Architectures whose seam is ``"attnlens"`` (BERT, RoBERTa) are switched to the
    ``"attnlens"`` attention implementation and their attention modules opt into
    TransformerLens's ``pattern_fn`` seam. Those whose bridges already honour pattern edits
    (``"native"``: GPT-2, Llama) are left as they are. An architecture without an adapter raises
    :class:`attnlens.core.models.UnsupportedArchitecture`.
    """
    if models.of(bridge).seam == "native":
        return bridge
    _register()
    bridge.original_model.set_attn_implementation(ATTN_IMPLEMENTATION)
    for block in bridge.blocks:
        block.attn.original_component.accepts_pattern_fn = True
    return bridge


def is_installed(bridge: Any) -> bool:
    """True when ``hook_pattern`` edits reach the output of ``bridge``."""
    architecture = models.find(bridge)
    if architecture is None:
        return False
    if architecture.seam == "native":
        return True
    return bridge.original_model.config._attn_implementation == ATTN_IMPLEMENTATION and all(
        getattr(block.attn.original_component, "accepts_pattern_fn", False)
        for block in bridge.blocks
    )
