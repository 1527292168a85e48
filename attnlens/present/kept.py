"""Every head's map for several examples, kept small for the interactive report.

:func:`attnlens.compare` keeps, besides its statistics of the whole corpus, the attention maps of
the first examples of the corpus under each view (valid tokens only), so that the HTML report can
show any head of any of them (:mod:`attnlens.present.explorer`). A map ``a[query, key]`` of one head is
stored as 8-bit codes with one scale per map:

- non-negative views (standard, PAPA): ``code = round(a / scale)`` with ``scale = max a / 255``;
- signed views (effective attention, Brunner et al. 2020, can be negative):
  ``code = 128 + round(a / scale)`` with ``scale = max |a| / 127``;

and ``a ≈ scale · (code − zero)`` (``zero`` 0 or :data:`SIGNED_ZERO`): the error is at most half
a step, ``scale / 2``, i.e. 1/510 of the map's largest value (1/254 of its largest magnitude for
signed maps). The codes of an example and view, ``[layer, head, query, key]`` in C order, are
deflated (zlib format, RFC 1950, which browsers inflate with ``DecompressionStream("deflate")``)
by :func:`deflate`.

Which examples: the first ``limit`` of the corpus, in order, as long as their compressed codes fit
in ``budget`` bytes (an example that does not fit in what is left is skipped, a later shorter one
may still fit), plus the example the report shows first, always (counted first). See
:meth:`KeptPatterns.select`.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from isal import isal_zlib
from jaxtyping import Float, UInt8
from torch import Tensor

from attnlens.errors import InputError

#: the code of 0 in signed maps (codes 1 .. 255 stand for -127 .. 127 steps)
SIGNED_ZERO = 128
#: level of the kept codes' deflate (:func:`deflate`). zlib's level 1 deflated the 8-bit maps 17x
#: faster than its level 9 for 8% more bytes (90 maps of MiniLM, 16.2 MB of codes: level 1 0.22 s
#: and 8.45 MB, level 6 0.88 s and 7.86 MB, level 9 3.74 s and 7.80 MB); at level 9 deflating
#: took 12% of ``compare``'s time (42% on 64 texts). ISA-L's level 1 (``isal``, the same zlib
#: format) is 6.6x faster again and 6% smaller than zlib's level 1 (24 WikiText paragraphs'
#: maps, 20.6 MB of codes, one thread: 0.053 s and 7.69 MB against 0.351 s and 8.17 MB; zlib's
#: level 6 1.39 s and 7.14 MB): zlib's level 1 had taken 4.4% of ``compare``'s time on a
#: 2-thread Intel Xeon (``benchmarks/compare_cost.py``). The report's budget
#: (:data:`attnlens.comparison.run.REPORT_BUDGET`) bounds the bytes either way.
COMPRESSION_LEVEL = 1


def deflate(data: bytes) -> bytes:
    """``data`` deflated in the zlib format (RFC 1950: what :func:`zlib.decompress` and the
    browsers' ``DecompressionStream("deflate")`` inflate) at :data:`COMPRESSION_LEVEL`, by ISA-L
    (``isal``), several times faster than :func:`zlib.compress` for the same format."""
    return isal_zlib.compress(data, COMPRESSION_LEVEL)


#: characters of an example's text shown in the report's example list
LABEL_CHARS = 60


#: the most negative value an unsigned view's map may hold (float32 rounding of a non-negative sum)
NEGATIVE = 1e-6


def encode(
    maps: Float[Tensor, "*maps query key"], *, signed: bool, check: bool = True
) -> tuple[UInt8[Tensor, "*maps query key"], Float[Tensor, "*maps"]]:
    """8-bit codes and one scale per map (the module docstring gives the formulas).

    ``maps``: any leading axes (e.g. ``[head, query, key]``), each ``[query, key]`` map coded with
    its own scale; ``signed``: code around :data:`SIGNED_ZERO` (for values that can be negative).
    An all-zero map gets scale 0 and the code of 0. A map :func:`encode` refuses, one with a value
    that is not finite or, unsigned, a negative one (below ``-1e-6``), gets a scale that is not
    finite (its codes mean nothing): ``check=True`` raises ``ValueError`` for it, reading the
    scales; ``check=False`` leaves the scales to the caller, who reads them later
    (:func:`refused`; a pass on a device reads nothing per batch). Its reductions find each map's
    scale and whether it is refused at once (the largest magnitude, or the least and largest values)."""
    values = maps.detach().float()
    if signed:
        top = values.abs().amax(dim=(-2, -1))  # NaN or infinite anywhere: not finite
        scale = top / 127
        steps = (values / _nonzero(scale)[..., None, None]).round_().clamp_(-127, 127)  # in place: no new maps
        codes = steps.add_(SIGNED_ZERO).to(torch.uint8)
    else:
        # a NaN propagates to both (torch.aminmax, one kernel, is 10x slower on a CPU)
        low, top = values.amin(dim=(-2, -1)), values.amax(dim=(-2, -1))
        scale = torch.where(low < -NEGATIVE, torch.nan, top.clamp_min(0) / 255)
        codes = (values / _nonzero(scale)[..., None, None]).round_().clamp_(0, 255).to(torch.uint8)
    if check:  # the scales' bounds read (where reads are free: the caller says)
        if not bool(torch.isfinite(top if signed else torch.stack((low, top))).all()):
            raise InputError("attention maps to keep hold NaN or infinite values")
        if not signed and bool((low < -NEGATIVE).any()):
            raise InputError("a view coded as non-negative has negative values; code it as signed")
    return codes, scale


def refused(scales: Float[np.ndarray, "*maps"]) -> bool:
    """Whether :func:`encode` (``check=False``) refused any of the maps of ``scales`` (read on the
    host): a scale that is not finite."""
    return not bool(np.isfinite(scales).all())


def decode(
    codes: UInt8[np.ndarray, "*maps query key"], scales: Float[np.ndarray, "*maps"], *, signed: bool
) -> Float[np.ndarray, "*maps query key"]:
    """The values ``scale · (code − zero)`` of :func:`encode`'s codes, as float32."""
    zero = SIGNED_ZERO if signed else 0
    return ((codes.astype(np.float32) - zero) * scales.astype(np.float32)[..., None, None]).astype(
        np.float32
    )


def _nonzero(scale: Tensor) -> Tensor:
    return torch.where(scale > 0, scale, 1.0)


def segments_of(separators: Sequence[bool], is_pair: bool) -> list[int]:
    """The segment of each token, 0 (first sentence) or 1 (second): for a pair the first segment
    runs up to the first run of separator tokens included (``[CLS] A [SEP]``, RoBERTa's
    ``<s> A </s></s>``, a decoder's ``<bos> A <bos>``: its second start token is a separator of
    :func:`attnlens.methods.stats.token_classes`), the second after it; a single text is all 0."""
    flags = [bool(s) for s in separators]
    if not is_pair:
        return [0] * len(flags)
    segments, segment = [], 0
    for i, flag in enumerate(flags):
        segments.append(segment)
        if flag and (i + 1 == len(flags) or not flags[i + 1]):
            segment = 1
    return segments


def label_of(text: Any) -> str:
    """The start of a corpus text in at most :data:`LABEL_CHARS` characters, for the report's
    list; a pair as ``first ‖ second``, each part shortened to half of them."""
    if isinstance(text, tuple | list):
        half = (LABEL_CHARS - 3) // 2
        return " ‖ ".join(_shortened(str(part), half) for part in text)
    return _shortened(str(text), LABEL_CHARS)


def _shortened(text: str, length: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= length else text[: length - 1].rstrip() + "…"


@dataclass
class KeptExample:
    """One kept example: its corpus ``index``, a ``label`` (the text's start), its valid
    ``tokens``, the ``segments`` of :func:`segments_of`, and per view the deflated codes
    (``blobs``) of its ``[layer, head, query, key]`` maps with their ``[layer, head]`` scales."""

    index: int
    label: str
    tokens: list[str]
    segments: list[int]
    blobs: dict[str, bytes]
    scales: dict[str, np.ndarray]

    @property
    def n_bytes(self) -> int:
        """Bytes of the compressed codes (what the report embeds, before base64)."""
        return sum(len(blob) for blob in self.blobs.values())

    @classmethod
    def from_codes(
        cls, index: int, label: str, tokens: list[str], segments: list[int],
        codes: Mapping[str, UInt8[np.ndarray, "layer head query key"]],
        scales: Mapping[str, Float[np.ndarray, "layer head"]],
    ) -> KeptExample:
        """Deflate the codes of :func:`encode` (one ``[layer, head, query, key]`` array per view)."""
        n = len(tokens)
        for view, array in codes.items():
            if array.dtype != np.uint8 or array.ndim != 4 or array.shape[2:] != (n, n):
                raise InputError(
                    f"view {view!r}: codes of shape {array.shape} ({array.dtype}) for {n} tokens; "
                    "expected uint8 [layer, head, n, n]"
                )
        return cls(
            index=int(index), label=label, tokens=list(tokens), segments=[int(s) for s in segments],
            blobs={
                view: deflate(np.ascontiguousarray(array).tobytes())
                for view, array in codes.items()
            },
            scales={view: np.asarray(value, dtype=np.float32) for view, value in scales.items()},
        )

    def codes(self, view: str) -> UInt8[np.ndarray, "layer head query key"]:
        """The 8-bit codes of ``view``, inflated."""
        n_layers, n_heads = self.scales[view].shape
        n = len(self.tokens)
        raw = np.frombuffer(zlib.decompress(self.blobs[view]), dtype=np.uint8)
        return raw.reshape(n_layers, n_heads, n, n)


@dataclass
class KeptPatterns:
    """The maps of several examples under each view (see the module docstring).

    ``views``: the views kept; ``signed``: those coded around :data:`SIGNED_ZERO`; ``examples``:
    :class:`KeptExample` in corpus order; ``limit`` / ``budget``: how they were chosen
    (:meth:`select`); ``n_considered``: how many examples were candidates.
    """

    views: tuple[str, ...]
    signed: tuple[str, ...]
    n_layers: int
    n_heads: int
    examples: list[KeptExample] = field(default_factory=list)
    limit: int = 0
    budget: int = 0
    n_considered: int = 0

    @property
    def indices(self) -> list[int]:
        """Corpus indices of the kept examples, ascending."""
        return [example.index for example in self.examples]

    @property
    def n_bytes(self) -> int:
        return sum(example.n_bytes for example in self.examples)

    def example(self, index: int) -> KeptExample:
        """The kept example of corpus index ``index``; ``ValueError`` naming the kept ones."""
        for example in self.examples:
            if example.index == index:
                return example
        raise InputError(
            f"example {index} was not kept: the comparison kept the maps of examples "
            f"{_ranges(self.indices)} (the first {self.limit} of the corpus that fit in "
            f"{self.budget} bytes); pass compare(..., report_examples=, report_budget=) to keep others"
        )

    def pattern(self, index: int, view: str) -> Float[np.ndarray, "layer head query key"]:
        """Every head's map of example ``index`` under ``view`` (decoded, float32)."""
        if view not in self.views:
            raise InputError(f"view {view!r} was not kept; kept views: {', '.join(self.views)}")
        example = self.example(index)
        return decode(example.codes(view), example.scales[view], signed=view in self.signed)

    def select(self, *, limit: int, budget: int, always: int | None = None) -> KeptPatterns:
        """The examples kept in the report: ``always`` (if a candidate) first, then, in corpus
        order among the first ``limit``, each example whose bytes fit in what is left of
        ``budget`` (one that does not is skipped)."""
        candidates = sorted(
            (e for e in self.examples if e.index < limit or e.index == always), key=lambda e: e.index
        )
        left = budget
        chosen: set[int] = set()
        for example in candidates:
            if example.index == always:
                chosen.add(example.index)
                left -= example.n_bytes
        for example in candidates:
            if example.index not in chosen and example.n_bytes <= left:
                chosen.add(example.index)
                left -= example.n_bytes
        return KeptPatterns(
            self.views, self.signed, self.n_layers, self.n_heads,
            [e for e in candidates if e.index in chosen], limit, budget, self.n_considered,
        )

    def merged(self, others: Iterable[KeptPatterns]) -> KeptPatterns:
        """The union of the examples of ``self`` and ``others`` (e.g. shards of a corpus)."""
        by_index = {example.index: example for example in self.examples}
        considered = self.n_considered
        for other in others:
            considered += other.n_considered
            for example in other.examples:
                by_index.setdefault(example.index, example)
        return KeptPatterns(
            self.views, self.signed, self.n_layers, self.n_heads,
            [by_index[i] for i in sorted(by_index)], self.limit, self.budget, considered,
        )

    # -- JSON ------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: codes as base64 of their deflated bytes, scales as the shortest decimals
        that read back as the same float32."""
        return {
            "views": list(self.views),
            "signed": list(self.signed),
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "limit": self.limit,
            "budget": self.budget,
            "n_considered": self.n_considered,
            "zero": SIGNED_ZERO,
            "examples": [
                {
                    "index": e.index,
                    "label": e.label,
                    "tokens": e.tokens,
                    "segments": e.segments,
                    "codes": {view: base64.b64encode(blob).decode("ascii") for view, blob in e.blobs.items()},
                    "scales": {view: [float(str(v)) for v in s.ravel()] for view, s in e.scales.items()},
                }
                for e in self.examples
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KeptPatterns:
        """Rebuild from :meth:`to_dict`; inconsistent data raises ``ValueError``."""
        try:
            views = tuple(data["views"])
            n_layers, n_heads = int(data["n_layers"]), int(data["n_heads"])
            if int(data.get("zero", SIGNED_ZERO)) != SIGNED_ZERO:
                raise InputError(f"signed maps coded around {data['zero']}, not {SIGNED_ZERO}")
            examples = []
            for item in data["examples"]:
                tokens = list(item["tokens"])
                n = len(tokens)
                blobs = {view: base64.b64decode(text, validate=True) for view, text in item["codes"].items()}
                scales = {
                    view: np.asarray(values, dtype=np.float32).reshape(n_layers, n_heads)
                    for view, values in item["scales"].items()
                }
                if set(blobs) != set(views) or set(scales) != set(views):
                    raise InputError(f"example {item['index']} does not have the views {views}")
                if len(item["segments"]) != n:
                    raise InputError(f"example {item['index']}: {len(item['segments'])} segments for {n} tokens")
                for view, blob in blobs.items():
                    size = len(zlib.decompress(blob))
                    if size != n_layers * n_heads * n * n:
                        raise InputError(
                            f"example {item['index']}, view {view!r}: {size} codes, expected "
                            f"{n_layers} x {n_heads} x {n} x {n}"
                        )
                examples.append(KeptExample(
                    int(item["index"]), str(item["label"]), tokens,
                    [int(s) for s in item["segments"]], blobs, scales,
                ))
            return cls(
                views, tuple(data["signed"]), n_layers, n_heads, examples,
                int(data.get("limit", 0)), int(data.get("budget", 0)), int(data.get("n_considered", 0)),
            )
        except (KeyError, TypeError, ValueError, zlib.error) as error:
            raise InputError(
                f"kept_patterns of the comparison JSON is not valid ({type(error).__name__}: "
                f"{error}); write it again with Comparison.to_json"
            ) from None

def _ranges(indices: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    if not indices:
        return "(none)"
    parts, start, previous = [], indices[0], indices[0]
    for index in [*indices[1:], None]:
        if index is not None and index == previous + 1:
            previous = index
            continue
        parts.append(f"{start}-{previous}" if previous > start else f"{start}")
        if index is not None:
            start = previous = index
    return ", ".join(parts)
