"""What tells two models apart: :func:`identity`, what caches and checkpoints key a model's
results by: its name (:func:`attnlens.core.loading.model_id`); :func:`weights_fingerprint`, a
short hash of every weight attention depends on, of every stored bit (``exact=True``, what keys a
result) or rounded to float16 (what PAPA constants check), the same on every device and thread
count; :func:`weights_dtype`, the dtypes the model computes in;
:func:`tokenizer_fingerprint`, what turns its texts into token ids. :func:`fingerprints_kept` is
a block that computes each model's fingerprints once.

A fingerprint is what a cache or a checkpoint keys a model's results by (probe features, curve
points, a pass's checkpoint) and what PAPA constants check the model they are used on against. It
must change with any weight: before (2026-12-03) it hashed 1,024 evenly spaced elements of each
parameter, and a head ablated by hand (the 32 columns of MiniLM's layer-0 ``W_O`` that head 2
writes through, set to zero) touched none of them, so that the ablated model's probe features
came back from the cache as the intact model's. Now every element counts, through a checksum
computed on the model's device in integers (exact, so independent of the order of the sum) and
read in one copy. And every bit counts where a result is keyed: before (session 59) the keys
held the checksum of the weights rounded to float16, and an edit below float16's rounding (a
relative 2**-11: a perturbation of 1e-4 of every weight) was served the unedited model's features.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import torch
from jaxtyping import Int64
from torch import Tensor

from attnlens.core import devices
from attnlens.core.loading import model_id

#: the checksums' modulus (the largest prime below 2**31), the width of the rows each level of
#: :func:`checksum` sums (2**14: a level's sums stay below 2**45, exact in float64, and below
#: 2**60 in int64) and the elements widened at once (2**20: a float64 copy of 16 MiB at most,
#: which a CPU's cache holds while the product reads it; 2**24, 128 MiB, took MiniLM's two
#: checksums 155 ms instead of 66 at 1 thread, the same values)
MODULUS = 2**31 - 1
ROW = 2**14
BLOCK = 2**20


#: a fast tokenizer's fingerprint by the sha256 of the serialized pipeline it is computed from
#: (:func:`tokenizer_fingerprint`): the same text, the same fingerprint, so it is computed once
#: (sorting and writing a 30,522-word vocabulary as JSON took 55 ms, most of a small pass;
#: serializing and hashing it takes 2 ms), at most :data:`PIPELINES_KEPT` of them kept
_PIPELINES: dict[str, str] = {}
PIPELINES_KEPT = 64

#: inside :func:`fingerprints_kept`: each model's fingerprints by what and ``id``, computed once
_FINGERPRINTS: contextvars.ContextVar[dict[tuple[str, int], Any] | None] = contextvars.ContextVar("fingerprints", default=None)


@contextlib.contextmanager
def fingerprints_kept() -> Iterator[None]:
    """Inside the block, :func:`weights_fingerprint` and :func:`tokenizer_fingerprint` compute
    each model's fingerprint once: for a job that does not change the model it runs with
    (``compare``: its fit's pass and its comparison's, the constants' checks; ``papa.fit``; a
    curve or a table: every point's feature extractions, their cache keys and their passes'
    headers; a probing run; an extraction), where each pass's header and each check would read
    every parameter again (on a GPU, a wait for the device each). A block inside another keeps
    the outer one's fingerprints."""
    if _FINGERPRINTS.get() is not None:
        yield
        return
    token = _FINGERPRINTS.set({})
    try:
        yield
    finally:
        _FINGERPRINTS.reset(token)


def identity(bridge: Any) -> dict[str, str]:
    """What a key of the model's results holds of the model: ``model`` (its name), ``weights``
    (:func:`weights_fingerprint` of every bit, ``exact=True``), ``dtype`` (:func:`weights_dtype`)
    and ``tokenizer``
    (:func:`tokenizer_fingerprint`). The features cache, a pass's checkpoint, a curve's points
    and its labelled constants are keyed by it, so that an edit of any of them (a head ablated in
    place, the model loaded in float16, another tokenizer) is not served another's results."""
    return {"model": model_id(bridge), "weights": weights_fingerprint(bridge, exact=True), "dtype": weights_dtype(bridge),
            "tokenizer": tokenizer_fingerprint(bridge)}


def weights_fingerprint(bridge: Any, *, exact: bool = False) -> str:
    """A short hash (16 hex digits) of the weights attention depends on, to tell apart two
    models that share a name (two in-memory models of one architecture, a model and its
    fine-tuned copy, a model with a head ablated by hand).

    Every parameter of the Hugging Face base model (the encoder or decoder stack: not the LM
    head, which attention does not depend on and which is randomly initialised when a checkpoint
    has none) contributes its name, shape and :func:`checksum`: of every element rounded to
    float16 (the default: a model loaded in float16 has the fingerprint of its float32 weights,
    and takes PAPA constants fitted on them; an edit smaller than float16's rounding, a relative
    2**-11, is not told apart), or of every stored bit (``exact=True``: what the keys of results
    hold, :func:`identity`; a float16 model's differs from its float32 weights'). Both are computed
    together, on the model's device, and read in one copy. Inside :func:`fingerprints_kept`, once
    per model."""
    return _kept("weights", bridge, _fingerprint)[exact]


def tokenizer_fingerprint(bridge: Any) -> str:
    """A short hash (16 hex digits) of ``bridge``'s tokenizer, which turns texts into the token
    ids the model runs on: of a fast tokenizer, its serialized pipeline (``to_str()``: the
    vocabulary and added tokens, the normalizer with its lower-casing, the pre-tokenizer, the
    post-processor's special tokens) less the truncation and padding that each call sets; of
    another, its class, vocabulary and special tokens; ``"none"`` without one. Inside
    :func:`fingerprints_kept`, once per model; a fast tokenizer's, once per serialized pipeline
    (each call serializes and hashes it, 2 ms for MiniLM's, and a pipeline already seen, the
    same text, keeps its fingerprint)."""
    return _kept("tokenizer", bridge, _tokenizer_fingerprint)


def _kept(what: str, bridge: Any, compute: Callable[[Any], Any]) -> Any:
    """``compute(bridge)``, once per model inside :func:`fingerprints_kept`."""
    kept = _FINGERPRINTS.get()
    if kept is None:
        return compute(bridge)
    if (what, id(bridge)) not in kept:
        kept[what, id(bridge)] = compute(bridge)
    return kept[what, id(bridge)]


def weights_dtype(bridge: Any) -> str:
    """The dtypes of the base model's floating-point parameters, sorted and joined by ``+``
    (``"float32"``; ``"float16"`` for a model loaded in float16, which :func:`weights_fingerprint`
    does not tell from its float32 weights): what else keys a result the model computes."""
    dtypes = {str(param.dtype).removeprefix("torch.") for _, param in _parameters(bridge) if param.is_floating_point()}
    return "+".join(sorted(dtypes))


def checksum(values: Tensor, *, exact: bool = False) -> Int64[Tensor, "1"]:
    """An integer in ``[0, MODULUS)`` of every element of ``values`` (any shape), rounded to
    float16 (``exact=True``: of every stored bit), and of its place. Its definition: the
    elements' float16 bit patterns ``b_i`` as signed 16-bit integers (``exact=True``: the 16-bit
    words of the elements' bytes in memory order, little-endian on every device torch runs on: two
    an element of float32, the low one first; one of float16 or bfloat16; an element of one byte
    widened to one) in rows of :data:`ROW`, the last one short; each row's dot product
    with :func:`row_weights` ``w``, ``s_r = sum_i b_(r ROW + i) w_i mod MODULUS``; then the
    ``s_r`` in rows the same way, until one is left. Every partial sum of the first level is an
    integer below 2**45 and is exact in float64 (what the first level runs in, a matrix-vector
    product, where the device has it; int64 on MPS), and the later levels run in int64; so the
    value is the same on every device, in every order of summation, at every thread count. Two
    inputs that differ collide with a chance of about 1 in 2**31 (per parameter; the
    fingerprint hashes them all)."""
    flat = values.detach().reshape(-1)
    if flat.numel() == 0:
        return torch.zeros(1, dtype=torch.int64, device=flat.device)
    # at most BLOCK elements widened at once (a multiple of ROW: the same rows as all at once)
    rows = torch.cat([_first_level(_words(flat[start:start + BLOCK], exact)) for start in range(0, flat.numel(), BLOCK)])
    while rows.numel() > 1:
        padded = torch.nn.functional.pad(rows, (0, -rows.numel() % ROW))
        rows = (padded.view(-1, ROW) * row_weights(rows.device)).sum(1) % MODULUS
    return rows


@functools.cache
def row_weights(device: torch.device) -> Int64[Tensor, " row"]:
    """The :data:`ROW` weights of a row's places, distinct, in ``[1, 32749]``:
    ``w_i = (40503 i + 12345) mod 32749 + 1`` (32749 is prime and above ROW), on ``device``
    (made outside any inference mode: an ordinary tensor, kept)."""
    with torch.inference_mode(False):
        places = torch.arange(ROW, dtype=torch.int64)
        return ((places * 40503 + 12345) % 32749 + 1).to(device)


def _words(block: Tensor, exact: bool) -> Tensor:
    """:func:`checksum`'s ``b_i`` of a contiguous block of elements, as int16."""
    if not exact:
        return block.to(torch.float16).view(torch.int16)
    return block.to(torch.int16) if block.element_size() == 1 else block.view(torch.int16)


def _first_level(bits: Tensor, accumulate: torch.dtype | None = None) -> Int64[Tensor, " rows"]:
    """:func:`checksum`'s first level: the ``s_r`` of the rows of ``bits`` (int16; the last row
    short), in ``accumulate`` (default float64, int64 on MPS, which has no float64: the same
    integers)."""
    if accumulate is None:
        accumulate = torch.int64 if bits.device.type == "mps" else torch.float64
    weights = row_weights(bits.device).to(accumulate)
    full = bits.numel() // ROW * ROW
    sums = [_dot(bits[:full].to(accumulate).view(-1, ROW), weights)] if full else []
    if full < bits.numel():
        sums.append(_dot(bits[full:].to(accumulate), weights[: bits.numel() - full]).reshape(1))
    return torch.cat(sums).to(torch.int64) % MODULUS


def _dot(rows: Tensor, row: Tensor) -> Tensor:
    """Each row of ``rows`` (the last axis) times ``row``, summed: a matrix-vector product in
    float64, a product and a sum in int64 (MPS has no integer product of matrices)."""
    return rows @ row if rows.dtype == torch.float64 else (rows * row).sum(-1)


def _parameters(bridge: Any) -> list[tuple[str, Tensor]]:
    """The base model's named parameters (the encoder or decoder stack, not the LM head)."""
    hf_model = getattr(bridge, "original_model", bridge)
    hf_model = getattr(hf_model, "base_model", hf_model)
    return list(hf_model.named_parameters())


def _fingerprint(bridge: Any) -> tuple[str, str]:
    """:func:`weights_fingerprint`, computed: rounded to float16, then of every bit. A float16
    parameter's words are its float16 bits: one checksum serves both."""
    named = _parameters(bridge)
    sums = devices.to_host([torch.cat([checksum(param), checksum(param, exact=True)]) if param.dtype != torch.float16
                            else checksum(param).repeat(2) for _, param in named])  # one copy from the device
    digests = hashlib.sha256(), hashlib.sha256()
    for (name, param), values in zip(named, sums, strict=True):
        for digest, value in zip(digests, values.tolist(), strict=True):
            digest.update(f"{name}{tuple(param.shape)}{value}".encode())
    rounded, exact = (digest.hexdigest()[:16] for digest in digests)
    return rounded, exact


def _tokenizer_fingerprint(bridge: Any) -> str:
    """:func:`tokenizer_fingerprint`, computed."""
    tokenizer = getattr(bridge, "tokenizer", None)
    if tokenizer is None:
        return "none"
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return _digest({"class": type(tokenizer).__name__, "vocabulary": sorted(tokenizer.get_vocab().items()),
                        "special": tokenizer.special_tokens_map})
    serialized = backend.to_str()
    raw = hashlib.sha256(serialized.encode()).hexdigest()
    if raw not in _PIPELINES:
        if len(_PIPELINES) >= PIPELINES_KEPT:
            _PIPELINES.clear()
        _PIPELINES[raw] = _digest({key: value for key, value in json.loads(serialized).items()
                                   if key not in ("truncation", "padding")})
    return _PIPELINES[raw]


def _digest(pipeline: dict[str, Any]) -> str:
    """16 hex digits of the sha256 of ``pipeline`` as JSON, its keys sorted."""
    return hashlib.sha256(json.dumps(pipeline, sort_keys=True, default=str).encode()).hexdigest()[:16]
