"""Constants that need no corpus, and trainable constants.

Data-free constants (each a :class:`PapaConstants` usable wherever fitted ones are):

- :func:`identity`: every token attends to itself;
- :func:`toeplitz`: weight ``1 / (|i - j| + 1)`` (the harmonic series), rows normalized;
- :func:`zeros`: the head contributes nothing (replacement does *not* renormalize these rows);
- :func:`uniform`: every valid key gets the same weight.

They are made for the same model, layout and ``max_len`` as a ``like`` argument: a bridge (give
``max_len``, checked against the model by :func:`attnlens.core.inputs.check_max_len`; ``layout``
defaults to the model's, :func:`attnlens.core.inputs.default_layout`: ``"papa"`` for an encoder,
``"padded"`` for a decoder) or fitted constants (their settings are used).
For a causal model (a decoder such as GPT-2) the matrices are causal: keys after the query get 0
and each row is renormalized over the keys at or before the query (a causal Toeplitz matrix,
uniform attention over the past), and replacement keeps them causal on every batch.

:class:`TrainableConstants` are ``[layer, head, query, key]`` logits, initialized from fitted
means or from the Toeplitz matrix, for the paper's "labeled data" rows: train their
``parameters()`` through :func:`attnlens.papa.intervention` with any loss. Each example sees a
softmax over its valid keys (see :func:`attnlens.papa.softmax_pattern`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from attnlens.core.checks import finite, finite_tensor, whole_number
from attnlens.core.inputs import LAYOUTS, check_max_len, default_layout
from attnlens.core.layouts import special_ids
from attnlens.core.loading import is_causal, require_bridge
from attnlens.core.notebook import constants_html
from attnlens.errors import InputError
from attnlens.methods.papa.compatibility import check_batch, check_model, model_info
from attnlens.methods.papa.constants import PapaConstants
from attnlens.methods.papa.replace import ConstantPatterns, softmax_pattern


def _settings(
    like: Any, max_len: int | None, layout: str | None, who: str = "papa constants"
) -> tuple[str, int, int, int, str, bool | None]:
    """(model id, n_layers, n_heads, max_len, layout, causal) for constants made like ``like``:
    fitted or data-free constants (their settings, ``max_len`` and ``layout`` overriding them), or
    a bridge (``max_len`` checked against the model, :func:`attnlens.core.inputs.check_max_len`;
    ``layout`` by default the model's, :func:`attnlens.core.inputs.default_layout`). ``who``
    names the caller in the messages."""
    if layout is not None and (not isinstance(layout, str) or layout not in LAYOUTS):
        raise InputError(f"Unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}.")
    if isinstance(like, PapaConstants | TrainableConstants):
        name, n_layers, n_heads = like.model_id, like.n_layers, like.n_heads
        max_len = like.max_len if max_len is None else whole_number(max_len, "max_len", " of tokens", minimum=1)
        layout = like.layout if layout is None else layout
        return name, n_layers, n_heads, max_len, layout, like.causal
    require_bridge(like, f"{who}(like=...) (a model, or PapaConstants / TrainableConstants whose settings are copied)")
    name, n_layers, n_heads = model_info(like)
    if max_len is None:
        raise InputError("Pass max_len= (the length the inputs will be tokenized to).")
    layout = default_layout(like) if layout is None else layout
    max_len = check_max_len(like, max_len, layout=layout)  # before a [max_len, max_len] matrix is made
    if layout == "papa" and getattr(like, "tokenizer", None) is not None:
        special_ids(like.tokenizer)  # a decoder's tokenizer has no [CLS]/[SEP] to fix: layout='padded'
    return name, n_layers, n_heads, max_len, layout, is_causal(like)


def causal_matrix(matrix: Float[Tensor, "query key"]) -> Float[Tensor, "query key"]:
    """``matrix`` with keys after the query set to 0 and each row renormalized over the keys at or
    before it (rows summing to 0 stay 0)."""
    lower = matrix.tril()
    total = lower.sum(-1, keepdim=True)
    return torch.where(total > 0, lower / torch.where(total > 0, total, 1.0), lower)


def _data_free(
    kind: str, make: Callable[[int], Float[Tensor, "query key"]], like: Any, max_len: int | None,
    layout: str | None
) -> PapaConstants:
    """Constants of ``kind`` whose every head is ``make(max_len)``, made once the settings are
    checked (:func:`_settings`: a length the model cannot take allocates nothing)."""
    name, n_layers, n_heads, max_len, layout, causal = _settings(like, max_len, layout, f"papa.{kind}")
    matrix = make(max_len).to(torch.float64)
    if causal:
        matrix = causal_matrix(matrix)
    full = matrix.expand(n_layers, n_heads, max_len, max_len).contiguous()
    return PapaConstants(
        sums=full,
        squares=full.square(),
        pair_counts=torch.ones(max_len, max_len, dtype=torch.int64),
        model_id=name,
        layout=layout,
        max_len=max_len,
        kind=kind,
        causal=causal,
    )


def toeplitz_matrix(max_len: int) -> Float[Tensor, "query key"]:
    """``1 / (|i - j| + 1)`` with each row normalized to sum to 1 (float64)."""
    positions = torch.arange(max_len, dtype=torch.float64)
    weights = 1.0 / ((positions[:, None] - positions[None, :]).abs() + 1.0)
    return weights / weights.sum(-1, keepdim=True)


def identity(like: Any, *, max_len: int | None = None, layout: str | None = None) -> PapaConstants:
    """Each token attends only to itself."""
    return _data_free("identity", lambda n: torch.eye(n, dtype=torch.float64), like, max_len, layout)


def toeplitz(like: Any, *, max_len: int | None = None, layout: str | None = None) -> PapaConstants:
    """Attention decaying with distance as the harmonic series, ``∝ 1 / (|i - j| + 1)``."""
    return _data_free("toeplitz", toeplitz_matrix, like, max_len, layout)


def zeros(like: Any, *, max_len: int | None = None, layout: str | None = None) -> PapaConstants:
    """All-zero attention: a replaced head contributes nothing (its rows are not renormalized)."""
    return _data_free("zeros", lambda n: torch.zeros(n, n, dtype=torch.float64), like, max_len, layout)


def uniform(like: Any, *, max_len: int | None = None, layout: str | None = None) -> PapaConstants:
    """Equal attention on every valid key."""
    return _data_free("uniform", lambda n: torch.full((n, n), 1.0 / n, dtype=torch.float64), like, max_len, layout)


class TrainableConstants(nn.Module, ConstantPatterns):
    """Trainable constant attention: logits ``[layer, head, query, key]`` as an ``nn.Parameter``.

    Each example's pattern is a softmax of the logits over its valid keys (masked and
    row-normalized like the output of a softmax; on a causal model only the keys at or before the
    query). Use :meth:`from_average` or :meth:`from_toeplitz`; :meth:`to_constants` takes a
    :class:`PapaConstants` snapshot (``kind="trained"``) that can be saved and gives the same
    patterns. ``causal`` and ``fingerprint`` are as in :class:`PapaConstants`.
    """

    def __init__(
        self,
        logits: Float[Tensor, "layer head query key"],
        *,
        model_id: str,
        layout: str,
        max_len: int,
        init: str,
        pairs: bool | None = None,
        causal: bool | None = None,
        fingerprint: str | None = None,
    ) -> None:
        super().__init__()
        max_len = whole_number(max_len, "max_len", " of tokens", minimum=1)
        finite_tensor(logits, "logits")
        if logits.ndim != 4 or logits.shape[-2:] != (max_len, max_len):
            raise InputError(f"logits must be [layer, head, {max_len}, {max_len}], got {tuple(logits.shape)}.")
        with torch.inference_mode(False):  # an ordinary tensor, trainable, even made under inference mode
            self.logits = nn.Parameter(logits.detach().clone().float())
        self.model_id, self.layout, self.max_len = model_id, layout, int(max_len)
        self.init, self.pairs = init, pairs
        self.causal, self.fingerprint = causal, fingerprint

    @classmethod
    def from_average(cls, constants: PapaConstants, *, floor: float = 1e-12) -> TrainableConstants:
        """Start from fitted means: ``logits = log(max(mean, floor))``.

        Before training, the patterns equal replacement with ``constants`` up to ``floor``
        (never-seen pairs get weight ``floor``; never-seen rows are uniform, as in replacement).
        """
        if constants.kind != "average":
            raise InputError(f"from_average needs fitted constants, got {constants.kind!r}.")
        floor = finite(floor, "floor", low=0.0)
        if floor <= 0:  # log(0) = -inf: a never-seen pair could never be trained
            raise InputError(f"floor must be above 0 (e.g. 1e-12), got {floor}")
        logits = constants.mean.clamp_min(floor).log()
        return cls(
            logits, model_id=constants.model_id, layout=constants.layout,
            max_len=constants.max_len, init="average", pairs=constants.pairs,
            causal=constants.causal, fingerprint=constants.fingerprint,
        )

    @classmethod
    def from_toeplitz(
        cls, like: Any, *, max_len: int | None = None, layout: str | None = None
    ) -> TrainableConstants:
        """Start from the harmonic Toeplitz matrix (see :func:`toeplitz`)."""
        name, n_layers, n_heads, max_len, layout, causal = _settings(
            like, max_len, layout, "papa.TrainableConstants.from_toeplitz")
        logits = toeplitz_matrix(max_len).log().expand(n_layers, n_heads, max_len, max_len)
        return cls(
            logits, model_id=name, layout=layout, max_len=max_len, init="toeplitz", causal=causal
        )

    @property
    def n_layers(self) -> int:
        return int(self.logits.shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.logits.shape[1])

    @property
    def mean(self) -> Float[Tensor, "layer head query key"]:
        """``softmax(logits)`` over all keys (over the keys at or before the query when
        :attr:`causal`), detached float64: the current constant matrices."""
        logits = self.logits.detach().double()
        if self.causal:
            future = torch.ones(self.max_len, self.max_len, dtype=torch.bool).triu(1)
            logits = logits.masked_fill(future.to(logits.device), float("-inf"))
        return torch.softmax(logits, dim=-1)

    def _matrices(self, layer: int, heads: Int[Tensor, "selected"] | Sequence[int] | None, dtype: torch.dtype,
                  device: torch.device) -> Float[Tensor, "head max_len max_len"]:
        """The logits of ``layer`` (of ``heads``; differentiable), refused when not finite (e.g.
        a training step diverged)."""
        logits = self.logits[layer]
        if not bool(torch.isfinite(logits).all()):
            finite_tensor(logits.detach(), f"TrainableConstants.logits[{layer}]")
        if heads is None:
            return logits
        heads = torch.as_tensor(heads, dtype=torch.long)
        if bool(((heads < 0) | (heads >= logits.shape[0])).any()):
            raise InputError(f"heads {heads.tolist()} must be head indices in 0 .. {logits.shape[0] - 1}.")
        return logits.index_select(0, heads.to(logits.device))

    def _pattern(self, matrices: Float[Tensor, "head max_len max_len"], key_mask: Bool[Tensor, "batch key"], *,
                 dtype: torch.dtype, causal: bool, positions: Int[Tensor, "batch key"] | None,
                 ) -> Float[Tensor, "batch head query key"]:
        """:func:`softmax_pattern` of the logits over the allowed keys."""
        return softmax_pattern(matrices, key_mask, dtype=dtype, causal=causal, positions=positions, check=False)

    def tensors(self) -> dict[str, Tensor]:
        """The logits the patterns are made from (the module's state)."""
        return dict(self.state_dict())

    def to_constants(self) -> PapaConstants:
        """A :class:`PapaConstants` snapshot (``kind="trained"``) of the current softmax."""
        mean = self.mean
        return PapaConstants(
            sums=mean,
            squares=mean.square(),
            pair_counts=torch.ones(self.max_len, self.max_len, dtype=torch.int64),
            model_id=self.model_id,
            layout=self.layout,
            max_len=self.max_len,
            kind="trained",
            pairs=self.pairs,
            causal=self.causal,
            fingerprint=self.fingerprint,
        )

    def check_compatible(self, model: Any = None, batch: Any = None) -> None:
        """Same checks as :meth:`PapaConstants.check_compatible`."""
        check_model(self, model)
        if batch is not None:
            check_batch(self, batch)

    def extra_repr(self) -> str:
        return (
            f"model_id={self.model_id!r}, shape={list(self.logits.shape)}, layout={self.layout!r}, "
            f"init={self.init!r}"
        )

    def _repr_html_(self) -> str:
        """Jupyter's view: origin and shape, not values (:func:`attnlens.present.display.constants_html`)."""
        return constants_html(self)
