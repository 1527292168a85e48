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
   ``AttentionMaskInterface`` (without it the attention function would receive no mask);
2. switch the HF model to ``attn_implementation="attnlens"``;
3. set ``accepts_pattern_fn = True`` on every wrapped attention module.

:func:`attention_forward` is the eager attention of BERT/RoBERTa line for line, with
``pattern_fn`` applied between the softmax and the value product. With no hook (or an identity
hook) the numerics are exactly those of ``attn_implementation="eager"``.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from attnlens import models

ATTN_IMPLEMENTATION = "attnlens"

#: model types whose hook_pattern edits go through this seam, and those whose bridges honour
#: edits natively (kept for compatibility: the facts live in :mod:`attnlens.models`)
ENCODERS_WITH_SEAM = tuple(t for a in models.ARCHITECTURES if a.seam == "attnlens" for t in a.model_types)
DECODERS_NATIVE = tuple(t for a in models.ARCHITECTURES if a.seam == "native" for t in a.model_types)

_KEY_MASK: contextvars.ContextVar[Tensor | None] = contextvars.ContextVar(
    "attnlens_key_mask", default=None
)
_POSITIONS: contextvars.ContextVar[Tensor | None] = contextvars.ContextVar(
    "attnlens_positions", default=None
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
    if pattern_fn is not None:
        token = _KEY_MASK.set(_key_mask_from_additive(attention_mask, key.shape[0], key.shape[2], key.device))
        try:
            pattern = pattern_fn(pattern)
        finally:
            _KEY_MASK.reset(token)
    output = torch.matmul(pattern, value).transpose(1, 2).contiguous()
    return output, pattern


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
    tokens) for patterns of that batch and length, unless an attention module prepared by
    :func:`install` reads its own mask (the same one). attnlens's runs over a :class:`Batch` use
    it, so that decoders (whose pattern hooks have no seam) need no inference either."""
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
    attnlens's runs over a :class:`attnlens.Batch` (:func:`attnlens.passes.run_with_hooks`)
    use it, so that PAPA hooks gather their constants at the layout's positions."""
    token = _POSITIONS.set(positions)
    try:
        yield
    finally:
        _POSITIONS.reset(token)


def positions(pattern: Float[Tensor, "batch head query key"]) -> Int[Tensor, "batch key"] | None:
    """The layout positions of the keys (and queries) of the batch being run, set by
    :func:`batch_positions` for a compact batch of ``pattern``'s batch size and length; ``None``
    when the columns are the positions (an ordinary batch)."""
    stashed = _POSITIONS.get()
    batch, _, _, n_keys = pattern.shape
    if stashed is not None and stashed.shape == (batch, n_keys):
        return stashed.to(pattern.device)
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


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, eager_mask)


def install(bridge: Any) -> Any:
    """Make ``hook_pattern`` edits change the computation of ``bridge`` (in place; returns it).

    Architectures whose seam is ``"attnlens"`` (BERT, RoBERTa) are switched to the
    ``"attnlens"`` attention implementation and their attention modules opt into
    TransformerLens's ``pattern_fn`` seam. Those whose bridges already honour pattern edits
    (``"native"``: GPT-2, Llama) are left as they are. An architecture without an adapter raises
    :class:`attnlens.models.UnsupportedArchitecture`.
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
