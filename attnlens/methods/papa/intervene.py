"""Replace or blend attention heads with constants, as hooks on an unmodified model.

:func:`hooks` returns ``fwd_hooks`` for ``model.run_with_hooks``; :func:`intervention` applies
the same hooks inside a ``with`` block. For each selected head of each layer:

- ``mode="replace"``: the head's pattern becomes the constant restricted to the example's valid
  ``(query, key)`` pairs, rows renormalized over the valid keys; a row with no mass left is
  uniform over the valid keys (see :mod:`attnlens.methods.papa.replace`);
- ``mode="blend"``: ``B = λ·A + (1 − λ)·C`` with ``λ = sigmoid(θ)`` per head; ``θ`` is a
  trainable ``nn.Parameter`` of shape ``[layer, head]`` (``hooks.theta``), 0 unless ``lam=``
  sets it. ``θ`` stays finite so that it can be trained: ``lam=1`` gives the largest float32
  ``λ`` below 1 (``1 − 1.2·10⁻⁷``: the model up to that share of the constant), ``lam=0`` gives
  ``λ = 10⁻⁷`` (replacement up to as little); see :data:`LAM_EPS`.

On a causal model (a decoder such as GPT-2) the constant pattern ``C`` is causal: keys after the
query get 0 and rows are renormalized over the keys at or before the query (see
:mod:`attnlens.methods.papa.replace`), so no token sees the future through a replaced head.

Heads that are not selected keep their attention; layers without a selected head get no hook.

A compact batch (:func:`attnlens.core.inputs.compact_batch`, what the pass engine runs by default)
gets the constants gathered at its layout positions, ``C[pos_q, pos_k]``: the hooks read them
from :func:`attnlens.core.seam.positions`, set by :func:`attnlens.engine.forward.run_with_hooks` (and by
every attnlens pass). Run a compact batch that way, not with ``model(batch.input_ids, ...)``.

Inputs must have the layout and length the constants were fitted with. The hooks check what a
pattern shows (its length, the number of heads, and where the padding is) and raise a
``ValueError`` naming both; :meth:`PapaConstants.check_compatible` checks a ``Batch`` exactly.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from attnlens.core import devices, fast_heads, seam
from attnlens.core.checks import describe, finite_tensor, flag, shape
from attnlens.core.files import tensor_checksum
from attnlens.core.heads import HeadSet
from attnlens.core.loading import is_causal, require_bridge
from attnlens.engine.hooks import Hooks
from attnlens.errors import InputError, InputTypeError
from attnlens.methods.papa.baselines import TrainableConstants
from attnlens.methods.papa.compatibility import check_model, check_padding
from attnlens.methods.papa.constants import PapaConstants
from attnlens.methods.papa.ranking import resolve_heads

MODES: tuple[str, ...] = ("replace", "blend")

#: ``lam=`` is clamped to ``[LAM_EPS, 1 − LAM_EPS]`` so that ``θ = logit(λ)`` is finite
#: (``|θ| ≈ 15.9``): ``1 − LAM_EPS`` rounds to the largest float32 below 1, the ``λ`` nearest 1
#: at which float32 ``sigmoid`` still has a gradient. Smaller would give ``λ = 1`` exactly and no
#: gradient; larger would move ``lam=0`` / ``lam=1`` further from replacement / the model.
LAM_EPS = 1e-7

Constants = PapaConstants | TrainableConstants


class PapaHooks(Hooks):
    """A list of ``(hook_name, hook_fn)`` pairs for ``run_with_hooks``, with the intervention's state.

    Attributes: ``constants``, ``heads`` (:class:`HeadSet`), ``mode``, ``theta`` (blend only:
    ``nn.Parameter [layer, head]``, ``λ = sigmoid(θ)``), :attr:`lam` and ``fast`` (replace only:
    :meth:`patched` makes the replaced heads skip their work, see :func:`hooks`).
    """

    def __init__(
        self,
        items: list,
        *,
        constants: Constants,
        heads: HeadSet,
        mode: str,
        theta: nn.Parameter | None,
        causal: bool | None = None,
        fast: bool = False,
    ) -> None:
        if fast and mode != "replace":
            raise InputError(
                f"fast=True applies only to full replacement (mode='replace', λ = 0), not mode={mode!r}: "
                "a blend λ·A + (1 − λ)·C needs the head's own pattern A"
            )
        super().__init__(items)
        self.constants, self.heads, self.mode, self.theta = constants, heads, mode, theta
        self.causal, self.fast = causal, fast

    def __repr__(self) -> str:
        n_layers, n_heads = self.heads.shape
        fast = ", fast" if self.fast else ""
        return f"PapaHooks({self.mode!r}, {len(self.heads)} of {n_layers * n_heads} heads, {len(self)} hooks{fast})"

    @contextmanager
    def patched(self, model: Any) -> Iterator[list]:
        """With ``fast``: for the block, the replaced heads of ``model`` skip their work
        (:func:`attnlens.core.fast_heads.constant_heads`) and no pair is left to pass as ``fwd_hooks``;
        without it, every pair (the hook path). :class:`~attnlens.errors.InputError` for a model
        whose heads cannot skip their work (a decoder, or a model not prepared by
        :func:`attnlens.load`)."""
        if not self.fast:
            yield list(self)
            return
        with fast_heads.constant_heads(model, *_constant_layers(self)):
            yield []

    @property
    def lam(self) -> Float[Tensor, "layer head"] | None:
        """``λ = sigmoid(θ)`` per ``[layer, head]`` for blend (differentiable); None for replace."""
        return None if self.theta is None else torch.sigmoid(self.theta)

    def key(self) -> str:
        """A stable hash of everything that makes these hooks what they are (the constants'
        tensors, the heads, the mode, ``θ`` and causality): equal keys, equal interventions.
        Caches of what a model computes under hooks (probe features) are keyed by it."""
        tensors = {"heads": self.heads.mask.to(torch.uint8)}
        if self.theta is not None:
            tensors["theta"] = self.theta.detach()
        tensors.update({f"constants.{name}": value.detach() for name, value in self.constants.tensors().items()})
        hook_names = "|".join(name for name, _ in self)
        return f"papa:{self.mode}:{self.causal}:{hook_names}:{tensor_checksum(tensors)}"

    def parameters(self) -> list[nn.Parameter]:
        """Trainable tensors: ``θ`` (blend) and the logits of trainable constants."""
        params = [] if self.theta is None else [self.theta]
        if isinstance(self.constants, nn.Module):
            params.extend(self.constants.parameters())
        return params


def hooks(
    constants: Constants,
    *,
    heads: str | HeadSet | Sequence[tuple[int, int]] | float | Bool[Tensor, "layer head"] = "all",
    mode: str = "replace",
    lam: float | Float[Tensor, "layer head"] | None = None,
    causal: bool | None = None,
    fast: bool = False,
) -> PapaHooks:
    """Forward hooks that replace (or blend) the selected heads' attention with ``constants``.

    ``constants``: :class:`PapaConstants` (fitted or data-free) or :class:`TrainableConstants`.
    ``heads``: ``"all"``, a :class:`HeadSet` (or a list of ``(layer, head)`` pairs, e.g.
    ``[(0, 3), (5, 11)]``, or a boolean ``[layer, head]`` tensor), or a fraction
    ``k`` in ``[0, 1]``: the ``round(k · layers · heads)`` least input-dependent heads by
    :attr:`PapaConstants.input_dependence` (fitted constants only; for other orders pass
    ``heads=select_heads(...)``).
    ``mode``: ``"replace"`` or ``"blend"``. ``lam`` (blend only): initial ``λ``, a number or a
    ``[layer, head]`` tensor in ``[0, 1]``, clamped to ``[LAM_EPS, 1 − LAM_EPS]`` (see
    :func:`_theta`); by default ``θ = 0``, i.e. ``λ = 0.5``.
    ``causal``: whether the model is a decoder, so that constant patterns keep keys after the
    query at 0. By default ``constants.causal`` (recorded when they were made); when that is
    unknown (files saved before it was recorded), it is read off each pattern: a pattern with no
    weight above the diagonal comes from a causal model.
    ``fast``: wherever the engine runs them (:func:`attnlens.engine.passes.run`, e.g. probe features and
    :func:`attnlens.papa.curve`; :func:`attnlens.engine.forward.run_with_hooks`; :meth:`PapaHooks.apply`),
    the replaced heads skip their work, as in :func:`intervention` with ``fast=True``; the same
    intervention and the same :meth:`PapaHooks.key`. Replace mode on an encoder only.
    """
    if mode not in MODES:
        raise InputError(f"Unknown mode {mode!r}; use one of {', '.join(MODES)}.")
    flag(fast, "fast")
    if not isinstance(constants, PapaConstants | TrainableConstants):
        raise InputTypeError(
            f"constants must be PapaConstants or TrainableConstants, got {type(constants).__name__}."
        )
    selected = resolve_heads(heads, constants)
    if causal is None:
        causal = getattr(constants, "causal", None)
    else:
        flag(causal, "causal (None: read it off constants.causal)")
    theta = None
    if mode == "blend":
        theta = nn.Parameter(_theta(lam, constants.n_layers, constants.n_heads))
    elif lam is not None:
        raise InputError("lam= is only used with mode='blend'.")
    items = []
    for layer in range(constants.n_layers):
        if bool(selected.mask[layer].any()):
            fn = _layer_hook(constants, layer, selected.mask[layer], mode, theta, causal)
            items.append((f"blocks.{layer}.attn.hook_pattern", fn))
    return PapaHooks(items, constants=constants, heads=selected, mode=mode, theta=theta, causal=causal,
                     fast=fast)


def _theta(lam: Any, n_layers: int, n_heads: int) -> Float[Tensor, "layer head"]:
    """Initial ``θ = logit(λ)`` per ``[layer, head]`` (0 when ``lam`` is None).

    ``λ`` is clamped to ``[LAM_EPS, 1 − LAM_EPS]`` first: ``logit(0)`` and ``logit(1)`` are
    ``∓inf``, where ``sigmoid`` has zero gradient and ``λ`` could never be trained. So ``lam=1``
    starts at ``θ ≈ 15.9`` (``λ = 1 − 1.2·10⁻⁷``) and ``lam=0`` at ``θ ≈ −16.1``
    (``λ = 10⁻⁷``); the blend then differs from the model (replacement) by about that share.
    """
    if lam is None:
        return torch.zeros(n_layers, n_heads)
    if isinstance(lam, bool) or not isinstance(lam, Tensor | float | int):  # not a bool, str, ndarray
        raise InputTypeError(f"lam must be a number in [0, 1] or a [layer, head] torch tensor, got {describe(lam)}.")
    try:
        lam = torch.as_tensor(lam, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        raise InputTypeError(f"lam must be a number or a [layer, head] tensor, got {type(lam).__name__}.") from None
    if lam.ndim:
        shape(lam, "lam", [n_layers, n_heads], "layer, head: one λ per head of the constants")
    lam = lam.expand(n_layers, n_heads).clone()
    finite_tensor(lam, "lam (λ of blend mode, in [0, 1])", low=0.0, high=1.0)
    return torch.logit(lam, eps=LAM_EPS)


def looks_causal(pattern: Float[Tensor, "batch head query key"]) -> bool:
    """True if no query gives weight to a later key: the pattern of a causal model.

    (A bidirectional model gives exactly 0 to every later key only when every key but the first
    is padding, where causal and bidirectional replacement are the same.)
    """
    return not bool(pattern.detach().triu(1).any())


def _layer_hook(
    constants: Constants,
    layer: int,
    head_mask: Tensor,
    mode: str,
    theta: nn.Parameter | None,
    causal: bool | None,
):
    every_head = bool(head_mask.all())

    def intervene(pattern: Float[Tensor, "batch head query key"], hook: Any) -> Tensor:
        is_causal = looks_causal(pattern) if causal is None else causal
        valid = seam.key_mask(pattern, causal=is_causal)
        positions = seam.positions(pattern)
        check_inputs(constants, pattern, valid, positions)
        constant = constants.layer_pattern(
            layer, valid, dtype=pattern.dtype, causal=is_causal, positions=positions
        )
        n_queries = pattern.shape[-2]
        if n_queries < constant.shape[-2]:
            # a decoder's step with its KV cache (``generate``): the queries are the last
            # ``n_queries`` positions, whose rows are those of the full forward
            constant = constant[..., -n_queries:, :]
        if mode == "blend":
            lam = torch.sigmoid(theta[layer]).to(device=pattern.device, dtype=pattern.dtype)
            lam = lam[None, :, None, None]
            constant = torch.lerp(constant, pattern, lam)  # accurate at both ends (λ near 0 or 1)
        if every_head:
            return constant
        selected = head_mask.to(pattern.device)[None, :, None, None]
        return torch.where(selected, constant, pattern)

    intervene.constants = constants  # what the hook was made for (forward.check_hooks reads it)
    intervene.check_batch = _batch_check(constants, head_mask.shape[0])  # and calls, on the host
    # and of the model, once a call or a pass (a decoder's constants on an encoder let a token
    # see later ones): what reads nothing of the device
    intervene.check_model = functools.partial(check_model, constants, weights=False)
    return intervene


def _batch_check(constants: Constants, n_heads: int):
    """:func:`_check_layout` of a :class:`attnlens.Batch` on the host, once per batch."""
    def check(batch: Any) -> None:
        positions = batch.position_ids if getattr(batch, "compact", False) else None
        given = getattr(batch, "max_len", None)
        if positions is not None and constants.layout == "papa" and given != constants.max_len:
            # a compact batch of a shorter max_len has its final [SEP] at another position (an
            # ordinary one has another length, which _check_layout names)
            raise InputError(
                f"constants were fitted with layout='papa', max_len={constants.max_len}; the batch was "
                f"tokenized with max_len={given}, whose final separator sits at another position. Tokenize "
                f"with attnlens.tokenize(model, texts, max_len={constants.max_len}, layout='papa')."
            )
        _check_layout(constants, n_heads, batch.attention_mask.bool().cpu(),
                      None if positions is None else positions.cpu(), on_host=True)

    return check


def check_inputs(
    constants: Constants,
    pattern: Float[Tensor, "batch head query key"],
    key_mask: Bool[Tensor, "batch key"],
    positions: Int[Tensor, "batch key"] | None = None,
) -> None:
    """Raise :class:`~attnlens.errors.InputError` if a pattern cannot come from inputs in the
    constants' layout (``positions``: the layout positions of a compact batch's columns, if it is
    one)."""
    _check_layout(constants, pattern.shape[1], key_mask, positions)


def _check_layout(
    constants: Constants,
    n_heads: int,
    key_mask: Bool[Tensor, "batch key"],
    positions: Int[Tensor, "batch key"] | None,
    *,
    on_host: bool = False,
) -> None:
    """:func:`check_inputs` for a batch known by its head count and key mask (no pattern).

    The checks of the mask's values (where the padding is, the positions' range) read the
    device, so off the CPU they run once per batch on the host, where :func:`check_hooks`
    (:attr:`check_batch` of a hook, which :func:`attnlens.engine.forward.run_with_hooks` and the pass call)
    checks it (``on_host``); here only the shapes are checked there."""
    length = key_mask.shape[-1]
    reads = on_host or devices.reads_are_free(key_mask)
    fitted = f"constants were fitted with layout={constants.layout!r}, max_len={constants.max_len}"
    if n_heads != constants.n_heads:
        raise InputError(f"{fitted} for {constants.n_heads} heads; the pattern has {n_heads} heads.")
    if positions is not None:
        if constants.layout != "papa":
            raise InputError(f"{fitted}; the inputs are a compact 'papa' batch. Tokenize with layout='padded'.")
        last = constants.max_len - 1  # every example's final separator, in the PAPA layout
        if length > constants.max_len or reads and bool(
                (positions.masked_fill(~key_mask, -1).amax(-1) != last).any()):
            raise InputError(
                f"{fitted}; the inputs have positions up to {int(positions.max())}. Tokenize with "
                f"attnlens.tokenize(model, texts, max_len={constants.max_len}, layout='papa')."
            )
        return
    if constants.layout == "papa":
        if length != constants.max_len:
            compact = (
                " A compact batch must run through attnlens.run_with_hooks(model, batch, hooks), "
                "which tells the hooks its positions." if length < constants.max_len else ""
            )
            raise InputError(
                f"{fitted}; the inputs have length {length}. Tokenize with "
                f"attnlens.tokenize(model, texts, max_len={constants.max_len}, layout='papa').{compact}"
            )
    elif length > constants.max_len:
        raise InputError(
            f"{fitted}; the inputs have length {length}. Fit constants with max_len >= {length} "
            "(papa.fit(model, texts, max_len=...)) or use shorter inputs (with model.generate: the "
            "prompt and its new tokens together).")
    if reads:
        check_padding(constants, key_mask)


@contextmanager
def intervention(
    model: Any,
    constants: Constants,
    *,
    heads: str | HeadSet | Sequence[tuple[int, int]] | float | Bool[Tensor, "layer head"] = "all",
    mode: str = "replace",
    lam: float | Float[Tensor, "layer head"] | None = None,
    fast: bool = False,
) -> Iterator[PapaHooks]:
    """``with papa.intervention(model, constants, ...) as h:`` runs of ``model`` use the hooks.

    Same arguments as :func:`hooks`; checks first that the constants were made for ``model``
    (model id, layers, heads, weights) and that its ``hook_pattern`` edits are real. Whether the
    patterns are causal is taken from ``model`` (:func:`attnlens.core.loading.is_causal`). Yields the
    :class:`PapaHooks` (e.g. to train ``h.theta``).

    ``fast=True``: the replaced heads skip their work (:func:`attnlens.core.fast_heads.constant_heads`): no
    query or key projection, no ``QKᵀ``, no softmax; their pattern is the constant, exactly as
    the hooks make it (the same :meth:`~PapaConstants.layer_pattern` and input checks), made for
    the replaced heads only (once per layer when every example shares it), and ``hook_pattern``
    still sees it whenever a hook is attached there (without one, no full pattern is assembled). Only for full replacement (``mode="replace"``: a blend
    ``λ·A + (1 − λ)·C`` needs ``A``) of an encoder with the attnlens seam (BERT, RoBERTa);
    ``ValueError`` otherwise. The yielded hooks are then not installed (the list is the same
    as without ``fast``, for :meth:`PapaHooks.key` and ``h.heads``); a hook on a layer's
    ``hook_q``, ``hook_k`` or ``hook_attn_scores`` makes that layer compute every head's, as the
    hooks do.
    """
    require_bridge(model, "papa.intervention")
    constants.check_compatible(model)
    if not seam.is_installed(model):
        raise InputError(
            "hook_pattern edits do not reach this model's output; load it with attnlens.load()."
        )
    installed = hooks(constants, heads=heads, mode=mode, lam=lam, causal=is_causal(model), fast=fast)
    with installed.apply(model):
        yield installed


def _constant_layers(installed: PapaHooks) -> tuple[dict[int, Tensor], fast_heads.ConstantFn]:
    """The replaced heads of ``installed`` by layer, and their constant patterns for a batch, every
    layer's in one call (:meth:`attnlens.methods.papa.replace.ConstantPatterns.heads_pattern`),
    for :func:`attnlens.core.fast_heads.constant_heads` (replace mode only: :class:`PapaHooks` refuses
    ``fast`` with a blend)."""
    if installed.causal:
        raise InputError("fast=True is for encoders (BERT, RoBERTa); this model is causal")
    constants, mask = installed.constants, installed.heads.mask
    replaced = {layer: mask[layer] for layer in range(mask.shape[0]) if bool(mask[layer].any())}
    selected = {layer: tuple(int(h) for h in heads.nonzero().squeeze(-1).tolist()) for layer, heads in replaced.items()}

    def constant(valid: Tensor, dtype: torch.dtype) -> dict[int, Tensor]:
        # a compact batch's layout positions, as the hook path reads them (by batch and length)
        positions = seam.mask_positions(valid)
        _check_layout(constants, constants.n_heads, valid, positions)
        same = devices.reads_are_free(valid) and _same_rows(valid) and (positions is None or _same_rows(positions))
        if same:
            # every example gets the same pattern (e.g. no padding): make it once, [1, ...]
            valid = valid[:1]
            positions = None if positions is None else positions[:1]
        pattern = constants.heads_pattern(selected, valid, dtype=dtype, causal=False, positions=positions)
        return dict(zip(selected, pattern.split([len(heads) for heads in selected.values()], dim=1), strict=True))

    return replaced, constant


def _same_rows(rows: Tensor) -> bool:
    """True when every row of ``rows`` (``[batch, key]``) equals the first."""
    return bool((rows == rows[:1]).all())
