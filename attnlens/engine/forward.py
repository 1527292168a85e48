"""Running a batch through a model with hooks: the forward of a pass, and of anything else that
runs a :class:`attnlens.Batch` (its mask and positions never dropped).

- :func:`run_with_hooks` / :func:`model_inputs`: a batch's forward, as ``model.run_with_hooks``;
- :func:`pattern_hooks`: ``fwd_hooks`` handing each layer's pattern (and values per key-value head)
  to a callback; :func:`run_patterns`: a forward stopped after the last layer's pattern;
- :func:`check_hooks`, :func:`check_token_ids`: what the engine checks of a batch on the host.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import einops
import torch
from jaxtyping import Float
from torch import Tensor

from attnlens.core import devices, models, processing, seam
from attnlens.core.inputs import Batch
from attnlens.core.loading import is_causal, require_bridge
from attnlens.core.modes import own_arithmetic
from attnlens.engine.hooks import Hooks, as_hooks
from attnlens.errors import InputError, InputTypeError, MismatchError, ModelBehaviourError

#: what every ``hooks=`` accepts: a :class:`attnlens.engine.hooks.Hooks` (the one hook-list type,
#: which every attnlens intervention returns) or any sequence of ``(hook_name, hook_fn)`` pairs
FwdHooks = Hooks | Sequence[tuple[str | Callable, Callable]]


def device_of(model: Any) -> torch.device:
    """The device of the model's parameters (CPU for a model without any)."""
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")



class _Stop(Exception):
    """Raised after the last layer's pattern hook: the rest of the forward is not needed."""


def values_per_kv_head(
    model: Any, v: Tensor
) -> Float[Tensor, "batch kv_head key d_head"]:
    """``hook_v``'s values (``[batch, key, kv_head, d_head]`` or ``[batch, key, kv_head*d_head]``)
    as one ``[key, d_head]`` matrix per key-value head: with grouped key-value heads, query head
    ``h`` reads key-value head ``h // (n_heads / n_kv_heads)``, as Hugging Face's ``repeat_kv``
    (``kv_head`` is ``head`` without grouped heads). Not repeated for each query head: what reads
    them (:func:`attnlens.engine.effective.effective_attention`,
    :func:`attnlens.methods.norm.norm_attention`) takes key-value heads, and a decoder's effective
    attention makes its certificates once for the query heads that share them."""
    n_heads = int(model.cfg.n_heads)
    architecture = models.find(model)
    n_kv = architecture.kv_heads(model.original_model.config) if architecture else n_heads
    if v.ndim == 3:
        v = einops.rearrange(v, "b k (h d) -> b h k d", h=n_kv)
    else:
        v = einops.rearrange(v, "b k h d -> b h k d")
    if n_heads % v.shape[1]:
        raise InputError(f"{n_heads} query heads cannot share {v.shape[1]} key-value heads evenly.")
    return v


def value_hook(model: Any, layer: int) -> str:
    """Name of the hook point carrying layer ``layer``'s value vectors (the architecture's
    :attr:`~attnlens.core.models.Architecture.value_hook`)."""
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


@own_arithmetic()  # the model's dtype, whatever the caller's torch.autocast (a pass and maps turn it off themselves)
def run_with_hooks(
    model: Any, batch: Batch, hooks: FwdHooks = (), **kwargs: Any
) -> Any:
    """``model.run_with_hooks`` on a :class:`attnlens.Batch` with its mask and positions (the
    common path made impossible to get wrong), moved to the model's device; inside, pattern
    hooks' :func:`attnlens.core.seam.key_mask` is the batch's own mask and :func:`attnlens.core.seam.positions`
    its layout positions (a compact batch). Returns the model's output."""
    require_bridge(model, "attnlens.run_with_hooks")
    if not isinstance(batch, Batch):
        raise InputTypeError(
            f"attnlens.run_with_hooks takes a Batch from attnlens.tokenize, got {type(batch).__name__}."
        )
    check_hooks(hooks, batch)
    check_hooks_model(model, hooks)
    check_token_ids(model, batch)
    return forward_batch(model, batch.to(device_of(model)), hooks, unpadded=has_no_padding(batch), **kwargs)


def has_no_padding(batch: Batch) -> bool | None:
    """Whether ``batch`` has no padding, read off its mask where reads are free (on the host,
    :func:`attnlens.core.devices.reads_are_free`; a batch on a device: None, not read)."""
    mask = batch.attention_mask
    return bool(mask.all()) if devices.reads_are_free(mask) else None


@contextlib.contextmanager
def batch_context(batch: Batch, *, unpadded: bool | None = None) -> Iterator[None]:
    """What the seam and pattern hooks know of the batch being run (already on the model's
    device): its key mask (:func:`attnlens.core.seam.batch_key_mask`), a compact batch's layout
    positions (:func:`~attnlens.core.seam.batch_positions`) and, with ``unpadded``, that the host
    found no padding in it (its attention then needs no mask, :func:`~attnlens.core.seam.batch_unpadded`).
    A forward runs inside it, and so does a pass replaying a batch's recorded layers."""
    shape = tuple(batch.input_ids.shape) if unpadded else None
    with seam.batch_key_mask(batch.attention_mask.bool()), seam.batch_positions(batch.position_ids), \
            seam.batch_unpadded(shape):
        yield


def forward_batch(model: Any, batch: Batch, hooks: FwdHooks = (), *, unpadded: bool | None = None, **kwargs: Any) -> Any:
    """:func:`run_with_hooks` of a batch already on the model's device and checked (the pass
    checks its batches on the host, before they are copied: no read of a device tensor), in its
    :func:`batch_context`."""
    with batch_context(batch, unpadded=unpadded), as_hooks(hooks).patched(model) as fwd_hooks:
        return model.run_with_hooks(batch.input_ids, **batch.model_kwargs(), fwd_hooks=fwd_hooks, **kwargs)


def check_token_ids(model: Any, batch: Batch) -> None:
    """:class:`~attnlens.errors.InputError` when a token id of ``batch`` is negative or beyond
    the model's vocabulary (a batch not made by :func:`attnlens.tokenize` for this model)."""
    vocab = getattr(model.cfg, "d_vocab", None)
    ids = batch.input_ids
    if not isinstance(vocab, int) or ids.numel() == 0:
        return
    low, high = torch.stack(torch.aminmax(ids)).tolist()  # one read (a batch on a device: one wait)
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


def check_hooks_model(model: Any, hooks: FwdHooks) -> None:
    """What each hook checks of the model it runs on (its ``check_model``, e.g. PAPA's: a
    decoder's constants refused on an encoder): once a call or a pass, on the host."""
    for item in hooks:
        function = item[1] if isinstance(item, tuple | list) and len(item) == 2 else None
        check = getattr(function, "check_model", None)
        if check is not None:
            check(model)


def pattern_hooks(
    model: Any,
    on_pattern: Callable[[int, Tensor, Tensor | None, Tensor], Tensor | None],
    *,
    layers: Iterable[int] | None = None,
    values: bool = True,
) -> list[tuple[str, Callable]]:
    """``fwd_hooks`` calling ``on_pattern(layer, A, V, valid)`` at each layer's
    ``hook_pattern``, with ``V`` the layer's values per key-value head (:func:`values_per_kv_head`,
    ``[batch, kv_head, key, d_head]``; stashed at its value hook,
    which fires first; ``None`` with ``values=False``) and ``valid`` the ``[batch, key]`` mask of
    real tokens (:func:`attnlens.core.seam.key_mask`). Whatever ``on_pattern`` returns replaces the
    pattern (``None`` leaves it)."""
    if values:
        processing.check(model, ("values",), "reading a layer's value vectors (effective attention, the norm-based view)")
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
                v = values_per_kv_head(model, stash.pop(layer))
                if v.shape[-2] != pattern.shape[-1] and pattern.shape[-2] < pattern.shape[-1]:
                    raise InputError(
                        f"layer {layer}'s pattern is a step of decoding with a KV cache ({pattern.shape[-2]} "
                        f"queries over {pattern.shape[-1]} keys, as in model.generate): its value hook holds "
                        "the new tokens' values alone, and this needs every key's. Decode without the cache "
                        "(model.generate(..., use_past_kv_cache=False)).")
            return on_pattern(layer, pattern, v, seam.key_mask(pattern, causal=causal))

        fwd_hooks.append((f"blocks.{layer}.attn.hook_pattern", on_hook))
    return fwd_hooks


def run_patterns(model: Any, batch: Batch, fwd_hooks: FwdHooks, *, until: str | None = None,
                 unpadded: bool | None = None) -> int:
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
            forward_batch(model, batch.to(device_of(model)), [*fwd_hooks, (last, stop)],
                          unpadded=unpadded if unpadded is not None else has_no_padding(batch))
    except _Stop:
        pass
    return reached
