"""Constant attention matrices: running sums, counts, their mean, metadata, merge, save and load.

A :class:`PapaConstants` holds, per ``(layer, head, query, key)``:

- ``sums``: float64 sum over examples of ``attention × valid(query) × valid(key)``;
- ``squares``: float64 sum of the same masked attention squared (for
  :attr:`PapaConstants.input_dependence`);
- ``counts``: how many examples had both ``query`` and ``key`` as real tokens. Counts do not
  depend on the layer or head, so they are stored once as ``pair_counts[query, key]`` and
  ``counts`` is an expanded ``[layer, head, query, key]`` view;

and ``mean = sums / counts`` (0 where a pair was never seen). Fitted constants
(:func:`attnlens.papa.fit`) and data-free ones (:mod:`attnlens.methods.papa.baselines`) share this class;
``kind`` tells them apart.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from attnlens.core.checks import describe, finite_tensor, index, whole_number
from attnlens.core.files import (
    check_readable,
    check_sealed,
    safetensors_bytes,
    verify_checksum,
    write_atomic,
)
from attnlens.core.fingerprints import weights_fingerprint
from attnlens.core.inputs import LAYOUTS
from attnlens.core.loading import is_causal
from attnlens.core.modes import version
from attnlens.core.notebook import constants_html
from attnlens.errors import DamagedFileError, FileFormatError, InputError, InputTypeError
from attnlens.methods.papa.compatibility import check_batch, check_model, model_info
from attnlens.methods.papa.replace import ConstantPatterns, constant_pattern

FORMAT = "attnlens.papa.constants/1"
#: ``kind`` of constants: fitted means, data-free baselines, and snapshots of trained constants
KINDS: tuple[str, ...] = ("average", "identity", "toeplitz", "zeros", "uniform", "trained")
_TENSORS = ("sums", "squares", "pair_counts")


#: metadata that must agree for constants to be merged
IDENTITY: tuple[str, ...] = ("model_id", "layout", "max_len", "n_layers", "n_heads")


#: the metadata keys of a constants file (and of a fit's checkpoint) that hold the counts, and
#: the field each is (:attr:`PapaConstants.metadata` writes these keys, as every file has)
FILE_COUNTS: dict[str, str] = {"examples": "n_examples", "tokens": "n_tokens", "truncated": "n_truncated"}


def fields_of(metadata: dict[str, Any]) -> dict[str, Any]:
    """A file's metadata (:attr:`PapaConstants.metadata`'s keys) as constructor arguments."""
    return {FILE_COUNTS.get(key, key): value for key, value in metadata.items()}


@dataclass(eq=False)
class PapaConstants(ConstantPatterns):
    """Per-head constant attention matrices and how they were obtained.

    Axes: ``layer`` and ``head`` index attention heads; ``query`` and ``key`` are token positions
    ``0 .. max_len-1`` of inputs tokenized with ``layout`` (see :mod:`attnlens.core.inputs`).

    Metadata: ``model_id``, ``layout``, ``max_len``, ``n_examples`` (examples seen), ``n_tokens``
    (real tokens seen, i.e. valid query rows), ``n_truncated`` (examples that lost tokens to
    ``max_len``; a file's metadata keeps them under the keys ``examples``, ``tokens`` and
    ``truncated``, :data:`FILE_COUNTS`), ``kind`` (one of :data:`KINDS`), ``pairs`` (True if fitted on sentence
    pairs, False on single sentences, None for data-free constants), ``causal`` (True for a
    decoder: replacement then keeps keys after the query at 0; None when unknown, as in files
    saved before it was recorded) and ``fingerprint`` (the fitted model's
    :func:`attnlens.core.fingerprints.weights_fingerprint`; None for data-free constants and older files,
    which are then not checked against the model's weights).
    """

    sums: Float[Tensor, "layer head query key"]
    squares: Float[Tensor, "layer head query key"]
    pair_counts: Int[Tensor, "query key"]
    model_id: str
    layout: str
    max_len: int
    n_examples: int = 0
    n_tokens: int = 0
    n_truncated: int = 0
    kind: str = "average"
    pairs: bool | None = None
    causal: bool | None = None
    fingerprint: str | None = None
    _cache: dict = field(default_factory=dict, repr=False, init=False)

    def __post_init__(self) -> None:
        self.sums = torch.as_tensor(self.sums, dtype=torch.float64)
        self.squares = torch.as_tensor(self.squares, dtype=torch.float64)
        self.pair_counts = torch.as_tensor(self.pair_counts, dtype=torch.int64)
        if self.layout not in LAYOUTS:
            raise InputError(f"Unknown layout {self.layout!r}; use one of {', '.join(LAYOUTS)}.")
        if self.kind not in KINDS:
            raise InputError(f"Unknown kind {self.kind!r}; use one of {', '.join(KINDS)}.")
        if self.sums.ndim != 4 or self.sums.shape[-2:] != (self.max_len, self.max_len):
            raise InputError(
                f"sums must be [layer, head, {self.max_len}, {self.max_len}], got {tuple(self.sums.shape)}."
            )
        if self.squares.shape != self.sums.shape:
            raise InputError(f"squares {tuple(self.squares.shape)} != sums {tuple(self.sums.shape)}.")
        if self.pair_counts.shape != (self.max_len, self.max_len):
            raise InputError(
                f"pair_counts must be [{self.max_len}, {self.max_len}], got {tuple(self.pair_counts.shape)}."
            )

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def empty(cls, model: Any, *, max_len: int, layout: str) -> PapaConstants:
        """Zero sums and counts for ``model``, ready to be accumulated into by a fit."""
        max_len = whole_number(max_len, "max_len", " of tokens", minimum=1)
        name, n_layers, n_heads = model_info(model)
        shape = (n_layers, n_heads, max_len, max_len)
        return cls(
            sums=torch.zeros(shape, dtype=torch.float64),
            squares=torch.zeros(shape, dtype=torch.float64),
            pair_counts=torch.zeros(max_len, max_len, dtype=torch.int64),
            model_id=name,
            layout=layout,
            max_len=max_len,
            causal=is_causal(model),
            fingerprint=weights_fingerprint(model),
        )

    # ---- views --------------------------------------------------------------------------

    @property
    def n_layers(self) -> int:
        return int(self.sums.shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.sums.shape[1])

    @property
    def counts(self) -> Int[Tensor, "layer head query key"]:
        """Examples in which both ``query`` and ``key`` were real tokens (a read-only view)."""
        return self.pair_counts.expand(self.n_layers, self.n_heads, self.max_len, self.max_len)

    @property
    def mean(self) -> Float[Tensor, "layer head query key"]:
        """Mean attention over the examples where the pair was valid; 0 where it never was."""
        seen = self.pair_counts > 0
        return torch.where(seen, self.sums / self.pair_counts.clamp_min(1), 0.0)

    @property
    def renormalize(self) -> bool:
        """Whether replacement renormalizes rows over the valid keys (all kinds but ``zeros``)."""
        return self.kind != "zeros"

    @property
    def input_dependence(self) -> Float[Tensor, "layer head"]:
        """How far each head's attention is from its mean, measured exactly during the fit.

        For every example and valid query ``q`` of a head, the squared L2 distance between the
        example's attention row ``a_q`` and the mean row ``c_q``, over the valid keys, averaged
        over all valid query rows seen::

            sum_{q,k} (squares[q,k] - sums[q,k]**2 / counts[q,k]) / tokens

        which equals ``mean over rows of sum_k (a_qk - c_qk)**2`` (``c_qk = sums / counts``).
        0 means the head's attention is the same on every input; larger means more input
        dependent. Only fitted averages have it.
        """
        if self.kind != "average" or self.n_tokens == 0:
            raise InputError(
                f"input_dependence is measured during papa.fit; these constants are "
                f"{self.kind!r} with {self.n_tokens} tokens seen."
            )
        tensors = (self.sums, self.squares, self.pair_counts)
        source = (*tensors, *(version(t) for t in tensors), self.n_tokens)
        cached = self._cache.get("input_dependence")
        if cached is None or not _same_source(cached[0], source):  # cached: heads=k selects by it
            seen = self.pair_counts > 0
            spread = torch.where(
                seen, self.squares - self.sums.square() / self.pair_counts.clamp_min(1), 0.0
            ).clamp_min(0.0)
            cached = (source, spread.sum(dim=(-2, -1)) / self.n_tokens)
            self._cache["input_dependence"] = cached
        return cached[1].clone()

    def tensors(self) -> dict[str, Tensor]:
        """The sums, squares and pair counts the constants are made from."""
        return {"sums": self.sums, "squares": self.squares, "pair_counts": self.pair_counts}

    @property
    def metadata(self) -> dict[str, Any]:
        """Everything but the tensors, as plain Python values."""
        return {
            "model_id": self.model_id,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "max_len": self.max_len,
            "layout": self.layout,
            "examples": self.n_examples,
            "tokens": self.n_tokens,
            "truncated": self.n_truncated,
            "kind": self.kind,
            "pairs": self.pairs,
            "causal": self.causal,
            "fingerprint": self.fingerprint,
        }

    def layer_mean(
        self,
        layer: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
        heads: Int[Tensor, "selected"] | Sequence[int] | None = None,
    ) -> Float[Tensor, "head query key"]:
        """``mean[layer]`` cast to ``dtype`` on ``device`` (cached for the hooks); with ``heads``
        (head indices), only those heads' matrices, in that order.

        The cache entry remembers the ``sums`` and ``pair_counts`` tensors it was computed from
        (the objects, compared with ``is``, and their in-place version counters), so assigning new
        tensors to these attributes or changing them in place recomputes it.
        """
        layer = index(layer, "layer", self.n_layers, "layers")
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise InputTypeError(
                "dtype must be a floating torch dtype (e.g. torch.float32; not a string), got "
                f"{dtype if isinstance(dtype, torch.dtype) else describe(dtype)}: the means are fractions, "
                "which an integer dtype would truncate to 0."
            )
        listed = heads.reshape(-1).tolist() if isinstance(heads, Tensor) else heads
        selected = None if listed is None else tuple(int(h) for h in listed)
        if selected is not None and any(not 0 <= h < self.n_heads for h in selected):
            raise InputError(f"heads {list(selected)} must be head indices in 0 .. {self.n_heads - 1}.")
        key = (layer, dtype, str(device), selected)
        source = (self.sums, self.pair_counts, version(self.sums), version(self.pair_counts))
        cached = self._cache.get(key)
        if cached is None or not _same_source(cached[0], source):
            mean = self.mean[layer]
            if selected is not None:
                mean = mean[list(selected)]
            cached = (source, mean.to(device=device, dtype=dtype).contiguous())
            self._cache[key] = cached
        return cached[1]

    def _matrices(self, layer: int, heads: Int[Tensor, "selected"] | Sequence[int] | None, dtype: torch.dtype,
                  device: torch.device) -> Float[Tensor, "head max_len max_len"]:
        """:meth:`layer_mean` (:class:`~attnlens.methods.papa.replace.ConstantPatterns`' matrices)."""
        return self.layer_mean(layer, dtype=dtype, device=device, heads=heads)

    def _pattern(self, matrices: Float[Tensor, "head max_len max_len"], key_mask: Bool[Tensor, "batch key"], *,
                 dtype: torch.dtype, causal: bool, positions: Int[Tensor, "batch key"] | None,
                 ) -> Float[Tensor, "batch head query key"]:
        """:func:`constant_pattern` (the averages restricted to the valid keys, renormalised
        unless :attr:`renormalize` is False)."""
        return constant_pattern(matrices, key_mask, renormalize=self.renormalize, dtype=dtype, causal=causal,
                                positions=positions, check=False)  # the means were checked when made

    def __repr__(self) -> str:
        return (
            f"PapaConstants(kind={self.kind!r}, model_id={self.model_id!r}, "
            f"shape=[{self.n_layers}, {self.n_heads}, {self.max_len}, {self.max_len}], "
            f"layout={self.layout!r}, n_examples={self.n_examples}, n_tokens={self.n_tokens}, "
            f"n_truncated={self.n_truncated})"
        )

    def _repr_html_(self) -> str:
        """Jupyter's view: origin and shape, not values (:func:`attnlens.present.display.constants_html`)."""
        return constants_html(self)

    # ---- merging ------------------------------------------------------------------------

    def merge(self, other: PapaConstants) -> PapaConstants:
        """Constants of the union of both corpora (sums, counts and metadata added).

        Refuses constants of another model (id, or weights when both recorded a fingerprint),
        layout, ``max_len`` or input kind, and data-free constants (only fitted averages can be
        merged). The result keeps the fingerprint only when both parts have it.
        """
        if not isinstance(other, PapaConstants):
            raise InputTypeError(f"Cannot merge PapaConstants with {type(other).__name__}.")
        for part in (self, other):
            if part.kind != "average":
                raise InputError(f"Only fitted averages can be merged; got {part.kind!r} constants.")
        mine, theirs = self._identity(), other._identity()
        if mine != theirs:
            diff = ", ".join(
                f"{name} {mine[name]!r} vs {theirs[name]!r}"
                for name in mine
                if mine[name] != theirs[name]
            )
            raise InputError(f"Cannot merge constants fitted differently: {diff}.")
        pairs = self.pairs if self.n_examples else other.pairs
        if self.n_examples and other.n_examples and self.pairs != other.pairs:
            raise InputError(
                "Cannot merge constants fitted on single sentences with constants fitted on pairs."
            )
        if None not in (self.fingerprint, other.fingerprint) and self.fingerprint != other.fingerprint:
            raise InputError(
                f"Cannot merge constants fitted on models with different weights (fingerprint "
                f"{self.fingerprint} vs {other.fingerprint}), although both are {self.model_id!r}."
            )
        return PapaConstants(
            sums=self.sums + other.sums,
            squares=self.squares + other.squares,
            pair_counts=self.pair_counts + other.pair_counts,
            model_id=self.model_id,
            layout=self.layout,
            max_len=self.max_len,
            n_examples=self.n_examples + other.n_examples,
            n_tokens=self.n_tokens + other.n_tokens,
            n_truncated=self.n_truncated + other.n_truncated,
            kind="average",
            pairs=pairs,
            causal=self.causal if self.causal is not None else other.causal,
            fingerprint=self.fingerprint if self.fingerprint == other.fingerprint else None,
        )

    def __add__(self, other: PapaConstants) -> PapaConstants:
        return self.merge(other)

    def __radd__(self, other: Any) -> PapaConstants:
        if isinstance(other, int) and other == 0:  # sum([...])
            return self
        return NotImplemented

    def _identity(self) -> dict[str, Any]:
        """The metadata two constants must share to be merged."""
        return {key: self.metadata[key] for key in IDENTITY}

    # ---- compatibility ------------------------------------------------------------------

    def check_compatible(self, model: Any = None, batch: Any = None) -> None:
        """Raise ``ValueError`` unless ``model`` and/or ``batch`` match these constants.

        ``model`` must have the same id, number of layers and heads, and the same weights when
        the constants recorded a :attr:`fingerprint`; ``batch`` (an :class:`attnlens.Batch`) the
        same layout and ``max_len``, and the same kind of inputs (sentences or pairs) when that
        is known.
        """
        check_model(self, model)
        if batch is not None:
            check_batch(self, batch)

    # ---- persistence --------------------------------------------------------------------

    def save(self, path: str | os.PathLike, *, overwrite_read_only: bool = False) -> Path:
        """Write tensors and metadata to one safetensors file, atomically (through
        :func:`attnlens.core.files.write_atomic`; a read-only file is replaced only with
        ``overwrite_read_only``); returns the path."""
        return self._save(path, overwrite_read_only=overwrite_read_only)

    def _save(
        self, path: str | os.PathLike, extra: dict[str, Any] | None = None, *,
        overwrite_read_only: bool = False,
    ) -> Path:
        metadata = {key: json.dumps(value) for key, value in self.metadata.items()}
        metadata["format"] = FORMAT
        metadata["extra"] = json.dumps(extra or {}, sort_keys=True)
        tensors = {name: getattr(self, name).contiguous() for name in _TENSORS}
        data = safetensors_bytes(tensors, metadata)  # with the checksum of tensors and metadata
        return write_atomic(path, data, overwrite_read_only=overwrite_read_only)

    @classmethod
    def load(cls, path: str | os.PathLike, model: Any = None) -> PapaConstants:
        """Read constants written by :meth:`save`; with ``model``, refuse ones fitted on another."""
        constants, _ = cls._load(path)
        constants.check_compatible(model)
        return constants

    @classmethod
    def _load(cls, path: str | os.PathLike) -> tuple[PapaConstants, dict[str, Any]]:
        """Constants and the ``extra`` metadata of a file written by :meth:`_save`.

        Raises ``ValueError("<path> is not an attnlens constants file ...: <reason>")`` for a
        file that is not one (corrupt, another format, missing fields); a file that does not
        exist raises ``FileNotFoundError``.
        """
        raw, tensors = _read(path)
        try:
            meta = {key: json.loads(value) for key, value in raw.items() if key not in ("format", "checksum")}
            extra = meta.pop("extra", {})
            n_layers, n_heads = meta.pop("n_layers"), meta.pop("n_heads")
            _check_metadata({**meta, "n_layers": n_layers, "n_heads": n_heads})
            constants = cls(**tensors, **fields_of(meta))
            if (constants.n_layers, constants.n_heads) != (n_layers, n_heads):
                raise InputError("its tensor shapes do not match the recorded layers and heads")
        except (ValueError, TypeError, KeyError) as error:
            raise FileFormatError(_not_constants(path, error)) from error
        try:
            constants.check_values()
        except ValueError as error:
            raise FileFormatError(f"constants file {path} is damaged: {error}") from None
        return constants, extra

    def check_values(self) -> None:
        """``ValueError`` unless the tensors can be constants: finite; counts ``>= 0`` and
        symmetric in (query, key); sums ``>= 0``, means in ``[0, 1]`` (softmax attention) and no
        mass where no pair was seen; squares between 0 and the sums (``a² <= a`` on ``[0, 1]``);
        and, for fitted averages, counts no larger than the examples and whose diagonal adds up
        to the tokens seen. Each violation names the tensor, how many values break it and where
        the first one is."""
        finite_tensor(self.sums, "sums")
        finite_tensor(self.squares, "squares")
        counts = self.pair_counts
        finite_tensor(counts, "pair_counts", low=0)
        if not torch.equal(counts, counts.T):
            raise InputError("pair_counts is not symmetric: both (query, key) and (key, query) count the same examples")
        slack = 1e-6  # float32 softmax entries and their float32 batch sums, rounded
        finite_tensor(self.sums, "sums", low=-slack)
        finite_tensor(self.sums - counts * (1 + slack), "sums minus pair_counts (means above 1)", high=slack)
        unseen = (counts == 0).expand_as(self.sums)
        finite_tensor(self.sums.abs() * unseen, "sums where no pair was seen", high=0.0)
        finite_tensor(self.squares, "squares", low=-slack)
        finite_tensor(self.squares - self.sums * (1 + slack), "squares minus sums (a² above a)", high=slack)
        if self.kind == "average" and self.n_examples:
            if int(counts.max()) > self.n_examples:
                raise InputError(f"pair_counts reach {int(counts.max())}, more than the {self.n_examples} examples seen")
            if int(counts.diagonal().sum()) != self.n_tokens:
                raise InputError(
                    f"the diagonal of pair_counts adds up to {int(counts.diagonal().sum())} tokens, "
                    f"the metadata says {self.n_tokens}"
                )

    def replace(self, **changes: Any) -> PapaConstants:
        """A copy with some fields changed (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)


def _same_source(cached: tuple, current: tuple) -> bool:
    """Whether a :class:`PapaConstants` cache entry was computed from ``current``: the same
    tensor objects (``sums``, ``pair_counts``, ...) at the same versions (and other values)."""
    return len(cached) == len(current) and all(
        a is b if isinstance(a, Tensor) else a == b for a, b in zip(cached, current, strict=True)
    )


def _read(path: str | os.PathLike) -> tuple[dict[str, str], dict[str, Tensor]]:
    """The raw string metadata and the tensors of a constants file, or a ``ValueError`` saying
    why the file is not one."""
    from safetensors import SafetensorError, safe_open

    check_readable(path, "constants")
    try:
        with safe_open(str(path), framework="pt") as handle:
            raw = handle.metadata() or {}
            if raw.get("format") == PASS_FORMAT:  # a checkpoint of papa.fit: its "papa" state
                everything = {name: handle.get_tensor(name) for name in handle.keys()}
                verify_checksum(path, raw, everything)
                raw, prefix = _checkpointed(raw), "papa/"
                tensors = {name: everything[prefix + name] for name in _TENSORS}
                return raw, tensors
            if raw.get("format") != FORMAT:
                check_sealed(path, raw, {name: handle.get_tensor(name) for name in handle.keys()})
                raise InputError(f"its format is {raw.get('format')!r}, not {FORMAT!r}")
            missing = [name for name in _TENSORS if name not in handle.keys()]
            if missing:
                raise InputError(f"it lacks the tensors {', '.join(missing)}")
            tensors = {name: handle.get_tensor(name) for name in _TENSORS}
    except DamagedFileError:
        raise
    except (SafetensorError, ValueError, KeyError) as error:
        raise FileFormatError(_not_constants(path, error)) from error
    verify_checksum(path, raw, tensors)
    return raw, tensors


#: metadata fields of a constants file and the types they must have
_METADATA_TYPES: dict[str, tuple[type, ...]] = {
    "model_id": (str,),
    "n_layers": (int,),
    "n_heads": (int,),
    "max_len": (int,),
    "layout": (str,),
    "examples": (int,),
    "tokens": (int,),
    "truncated": (int,),
    "kind": (str,),
    "pairs": (bool, type(None)),
    "causal": (bool, type(None)),
    "fingerprint": (str, type(None)),
}


def _check_metadata(meta: dict[str, Any]) -> None:
    """``ValueError`` naming the first metadata field of the wrong type or out of range."""
    for key, value in meta.items():
        kinds = _METADATA_TYPES.get(key)
        if kinds is None:
            raise InputError(f"unknown metadata field {key!r}")
        if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
            names = " or ".join("null" if kind is type(None) else kind.__name__ for kind in kinds)
            raise InputError(f"metadata {key!r} must be {names}, got {value!r}")
        if kinds == (int,) and value < 0:
            raise InputError(f"metadata {key!r} must be >= 0, got {value}")


#: the format of the pass engine's checkpoints (:data:`attnlens.engine.checkpoints.CHECKPOINT_FORMAT`)
PASS_FORMAT = "attnlens.pass/1"


def _checkpointed(raw: dict[str, str]) -> dict[str, str]:
    """The metadata of the ``"papa"`` accumulator of a pass checkpoint, as a constants file's."""
    states = json.loads(raw["accumulators"])
    if "papa" not in states:
        raise InputError("it is a checkpoint of another pass (it holds no PAPA sums)")
    meta = {key: json.dumps(value) for key, value in states["papa"].items()}
    meta["format"] = FORMAT
    return meta


def _not_constants(path: str | os.PathLike, reason: Exception) -> str:
    return (
        f"{path} is not an attnlens constants file (one written by PapaConstants.save or "
        f"papa.fit(checkpoint=...)): {reason}"
    )


def _umask() -> int:
    """The process's file-creation mask (read by setting it, then put back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
