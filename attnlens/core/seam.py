"""The hook seam: make ``blocks.{l}.attn.hook_pattern`` and ``hook_attn_scores`` real intervention
points on encoders.

TransformerLens 4.x fires ``hook_pattern`` on BERT/RoBERTa bridges only *after* the Hugging Face
module has used the pattern, so an edited pattern is discarded, and ``hook_attn_scores`` then too,
with that pattern in place of the scores (a cache of it held the softmaxed pattern).
TransformerLens also has a seam for modules that run the pattern through the hook themselves:
when a wrapped module has ``accepts_pattern_fn = True``, the ``AttentionBridge`` passes
``pattern_fn=self.hook_pattern`` down as a keyword argument. BERT and RoBERTa forward their ``**kwargs`` all the way to the attention
function chosen by ``config._attn_implementation``.

So the seam is three small steps:

1. register :func:`attention_forward` under the name ``"attnlens"`` in transformers'
   ``AttentionInterface``, and the eager mask builder under the same name in
   ``AttentionMaskInterface`` (without it the attention function would receive no mask), made
   even for a batch without padding (:func:`made_mask`: no read of the device to decide);
2. switch the HF model to ``attn_implementation="attnlens"``;
3. set ``accepts_pattern_fn = True`` on every wrapped attention module, give its self-attention
   the bridge's ``hook_attn_scores`` (:func:`scores_point`), and let the bridge no longer fire
   that point after the module returns (:func:`_post_hoc`).

:func:`attention_forward` is the eager attention of BERT/RoBERTa line for line, with
``hook_attn_scores`` applied to the scaled, masked scores before the softmax (what TransformerLens's
decoder bridges and ``HookedTransformer`` fire it with) and ``pattern_fn`` between the softmax and
the value product. With no hook (or identity hooks) the numerics are exactly those of
``attn_implementation="eager"``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn
from torch.nn.modules import module as torch_module

from attnlens.core import models
from attnlens.errors import InputError

ATTN_IMPLEMENTATION = "attnlens"

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
    key_mask = functools.partial(layer_key_mask, attention_mask, key.shape[0], key.shape[2], key.device)
    point = scores_point(module)
    if hooked(point):
        scores = call_hook(point, scores, key_mask)
    pattern = nn.functional.softmax(scores, dim=-1)
    pattern = nn.functional.dropout(pattern, p=dropout, training=module.training)
    if hooked(pattern_fn):
        pattern = call_hook(pattern_fn, pattern, key_mask)
    output = torch.matmul(pattern, value).transpose(1, 2).contiguous()
    return output, pattern


def call_hook(point: Callable[[Tensor], Tensor], tensor: Tensor, key_mask: Callable[[], Tensor]) -> Tensor:
    """``point(tensor)`` (a hook point of the layer) with the layer's key mask ``key_mask()``
    stashed for :func:`key_mask`."""
    token = _KEY_MASK.set(key_mask())
    try:
        return point(tensor)
    finally:
        _KEY_MASK.reset(token)


def scores_point(module: nn.Module) -> Callable[[Tensor], Tensor] | None:
    """The ``hook_attn_scores`` of the bridge around the self-attention ``module`` (given by
    :func:`install`; ``None`` for a module it did not prepare)."""
    held = module.__dict__.get("attnlens_scores")
    return None if held is None else held[0]


def hooked(point: Callable[[Tensor], Tensor] | None) -> bool:
    """Whether calling ``point`` may do anything: a TransformerLens hook point returns its input
    as it is while no hook (forward or backward) is on it. What the seam passes its layer's
    ``hook_pattern`` through (with no hook, neither the call nor the key mask it would see is
    needed: one kernel a layer fewer), and what the normalization bridges' direct path asks of
    their ``hook_scale`` / ``hook_normalized`` (:mod:`attnlens.core.norms`). A hook is
    TransformerLens's (``fwd_hooks`` / ``bwd_hooks``) or PyTorch's own on the point
    (``register_forward_hook``, ...) or on every module (``register_module_forward_hook``):
    :func:`runs_hooks`. ``None``: False; any other callable: True (it is called)."""
    if point is None:
        return False
    hooks = [getattr(point, name, None) for name in ("fwd_hooks", "bwd_hooks")]
    return any(hooks) or runs_hooks(point) if all(isinstance(value, list) for value in hooks) else True


def layer_key_mask(
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
    heads of :func:`attnlens.core.fast_heads.constant_heads` have no pattern to ask with)."""
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


#: PyTorch's hook tables: a module's own (``register_forward_hook``, ``register_forward_pre_hook``,
#: the backward ones) and those of ``torch.nn.modules.module`` that every module runs
#: (``register_module_forward_hook``, ...)
MODULE_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
GLOBAL_HOOKS = tuple(f"_global{table}" for table in MODULE_HOOKS)


def runs_hooks(module: Any) -> bool:
    """True when calling ``module`` (a ``HookPoint`` or any ``nn.Module``) may run a hook: its own
    forward or backward hooks, or a global module hook."""
    if not isinstance(module, nn.Module):
        return module is not None  # a plain callable: assume it reads the pattern
    if any(getattr(module, name, None) for name in MODULE_HOOKS):
        return True
    return any(getattr(torch_module, name, None) for name in GLOBAL_HOOKS)


def self_attention(attention: nn.Module) -> nn.Module:
    """The module that projects queries, keys and values (``BertSelfAttention``)."""
    inner = getattr(attention, "self", attention)
    if not all(hasattr(inner, name) for name in ("query", "key", "value", "attention_head_size")):
        raise InputError(f"{type(attention).__name__} has no query/key/value projections to skip")
    return inner




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
    """Make ``hook_pattern`` and ``hook_attn_scores`` edits change the computation of ``bridge``
    (in place; returns it).

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
        # a tuple: held, not registered as a submodule (the bridge's hook point stays its own)
        self_attention(block.attn.original_component).attnlens_scores = (block.attn.hook_attn_scores,)
        block.attn._fire_post_hoc_hook = functools.partial(_post_hoc, block.attn)
    return bridge


def _post_hoc(attention: nn.Module, hook: Any, tensor: Tensor, label: str) -> Tensor:
    """TransformerLens's firing of an attention bridge's hook point with what the Hugging Face
    module returned, but for ``hook_attn_scores``, which :func:`attention_forward` fires inside,
    with the scores (TransformerLens fires it here with the pattern the module returned)."""
    if hook is attention.hook_attn_scores:
        return tensor
    return type(attention)._fire_post_hoc_hook(attention, hook, tensor, label)


def is_installed(bridge: Any) -> bool:
    """True when ``hook_pattern`` and ``hook_attn_scores`` edits reach the output of ``bridge``."""
    architecture = models.find(bridge)
    if architecture is None:
        return False
    if architecture.seam == "native":
        return True
    return bridge.original_model.config._attn_implementation == ATTN_IMPLEMENTATION and all(
        getattr(block.attn.original_component, "accepts_pattern_fn", False)
        and scores_point(self_attention(block.attn.original_component)) is block.attn.hook_attn_scores
        and "_fire_post_hoc_hook" in vars(block.attn)
        for block in bridge.blocks
    )
