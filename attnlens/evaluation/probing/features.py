"""Probe features: every layer's hidden vectors of each real token, extracted once and cached.

A probe reads a frozen model (Hassid et al. 2022, §4 "probing"; Tenney et al. 2019): the
residual stream entering the first layer (the embeddings) and leaving each of the ``L`` layers,
``L + 1`` vectors of ``d_model`` per token. For BERT-style encoders these are Hugging Face's
``output_hidden_states``; for decoders the last one is taken before the final norm.

What is kept (``Features``):

- sentence and pair examples: every real token (``attention_mask`` 1, special tokens included),
  with its position in the layout (the PAPA probe learns one weight per layer and position);
- token examples (:class:`attnlens.core.inputs.Words`): the *first* sub-token of each word only, with
  its word index (the other sub-tokens are never labelled, as in PAPA and BERT's NER recipe).

Vectors are stored in float16: a probe's score does not depend on the last bits of its input
(float16 keeps 11 significant bits; the relative rounding error 2⁻¹¹ ≈ 5·10⁻⁴ is far below the
spread of hidden vectors a probe separates), and it halves the cache.

Under ``torchrun`` each rank extracts its shard of the examples (the engine shards them) and
writes it to a file of the cache folder, never through a collective; every rank then reads the
shards, and rank 0 writes the whole file.

**The cache.** Features depend on the model's weights, the interventions (``hooks``), the
examples, ``max_len`` and the layout (not whether batches ran compact, which gives the same
features: :func:`attnlens.core.inputs.compact_batch`); their hash (with attnlens's version and the format) names a
safetensors file in :func:`cache_dir` (``$ATTNLENS_CACHE/features``, else
``~/.cache/attnlens/features``). A second extraction with the same key reads the file and runs no
forward pass. Files are written atomically with a checksum (:mod:`attnlens.core.files`), verified on
load; a damaged file is refused and recomputed. :func:`clear_cache` removes them all. Hooks are
keyed by their ``key()`` (:meth:`attnlens.papa.PapaHooks.key`); other hooks cannot be told apart,
so with them nothing is cached unless ``cache_key=`` names them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from jaxtyping import Float, Int
from torch import Tensor

from attnlens.core import (
    devices,
    processing,
    version,  # read at each call: the version now (tests set it)
)
from attnlens.core.checks import all_finite
from attnlens.core.checks import indices as checked
from attnlens.core.corpus import corpus_iterator
from attnlens.core.files import read_checked, safetensors_bytes, write_atomic
from attnlens.core.fingerprints import fingerprints_kept, identity, weights_fingerprint
from attnlens.core.inputs import Words, by_length, default_layout
from attnlens.core.loading import model_id
from attnlens.core.modes import own_arithmetic
from attnlens.engine import passes
from attnlens.engine.accumulator import Accumulator, PassBatch
from attnlens.engine.distributed import world
from attnlens.engine.forward import device_of
from attnlens.engine.hooks import as_hooks, on_model
from attnlens.errors import AttnlensWarning, InputError, InputTypeError, MismatchError

#: The file format of cached features (in their key: another format is never read).
FORMAT = "attnlens.Features/1"


#: what a refusal of another model's features adds: a model is its name and a fingerprint of
#: every weight (:func:`attnlens.core.fingerprints.identity`), so a model edited in place is another
EDITED_WEIGHTS = ("(A model is known by its name and a fingerprint of every weight: this one may "
                  "have had weights edited since. To score an intervention with a learner fitted "
                  "on the unmodified model, pass it as hooks= (attnlens.ablation.hooks, "
                  "papa.hooks) instead of editing the weights.)")


@dataclass
class Features:
    """Hidden vectors of a corpus's kept tokens (see the module docstring).

    ``vectors``: ``[token, layer, d_model]`` float16: token = every kept token of every example,
    example after example; layer = 0 (embeddings) .. L (the last layer's output).
    ``lengths``: ``[example]`` kept tokens per example (they add up to ``token``).
    ``positions``: ``[token]`` a token's position in the layout (sentence and pair examples), its
    word's index (token examples) or, for masked-LM features, the original token id at a masked
    position. ``kind``: ``"sequence"``, ``"words"`` or ``"masked"``.
    ``n_words``: ``[example]`` words per example (token examples; their words cut by ``max_len``
    have no vector); empty otherwise. ``model``: the model that computed them,
    ``"<name>@<weights fingerprint>"`` (:func:`model_identity`; ``""`` for features made by
    hand), which a probe fitted on them records and checks (another model's features of the
    same width are refused, not scored).

    ``vectors`` live on the device that computes with them (:meth:`to`; :func:`extract` returns
    them on the model's); ``lengths``, ``positions`` and ``n_words`` are index metadata that a
    probe's every step reads on the host, and stay there.
    """

    vectors: Float[Tensor, "token layer d_model"]
    lengths: Int[Tensor, " example"]
    positions: Int[Tensor, " token"]
    n_words: Int[Tensor, " example_or_none"]
    kind: str
    max_len: int
    key: str = ""
    model: str = ""

    def __len__(self) -> int:
        return int(self.lengths.numel())

    @property
    def n_layers(self) -> int:
        """Layers of vectors per token: the model's layers + 1 (the embeddings)."""
        return int(self.vectors.shape[1])

    @property
    def d_model(self) -> int:
        return int(self.vectors.shape[2])

    @property
    def offsets(self) -> Int[Tensor, " example_plus_one"]:
        """``offsets[i] : offsets[i + 1]`` are example ``i``'s rows of :attr:`vectors`."""
        return torch.cat([torch.zeros(1, dtype=torch.long), self.lengths.cumsum(0)])

    def check_model(self, fitted_on: str, learner: str) -> Features:
        """``self``, or :class:`~attnlens.errors.MismatchError` when ``learner`` (``"baseline"``,
        ``"MLM head"``) was fitted on features of another model (:attr:`model`; ``""`` on either
        side, features made by hand or an older file: not checked)."""
        if fitted_on and self.model and self.model != fitted_on:
            raise MismatchError(
                f"this {learner} was fitted on features of model {fitted_on!r}; these are of model "
                f"{self.model!r}. Fit a {learner} on features of that model. {EDITED_WEIGHTS}")
        return self

    def check_finite(self) -> Features:
        """``self``, or :class:`~attnlens.errors.InputError` when a vector holds NaN or an
        infinity (a learner would train to NaN weights, or predict from them, without a word):
        one reduction and one read, for a fit or a prediction, never per batch of a pass."""
        if not all_finite(self.vectors):
            raise InputError("these features hold NaN or infinite values (a model whose hidden states "
                             "overflow, or features edited by hand); extract them again, or drop those examples.")
        return self

    def to(self, device: str | torch.device) -> Features:
        """These features with their ``vectors`` on ``device`` (the index metadata stays on the
        host); ``self`` when they are there already."""
        device = torch.device(device)
        if self.vectors.device == device:
            return self
        return dataclasses.replace(self, vectors=self.vectors.to(device))

    def subset(self, indices: Sequence[int] | Tensor) -> Features:
        """The features of the examples at ``indices`` (in that order)."""
        indices = torch.as_tensor(checked(indices, "indices", len(self)), dtype=torch.long)
        offsets = self.offsets
        rows = [torch.arange(offsets[i], offsets[i + 1]) for i in indices.tolist()]
        rows = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)
        return Features(
            self.vectors[rows.to(self.vectors.device)], self.lengths[indices], self.positions[rows],
            self.n_words[indices] if self.n_words.numel() else self.n_words,
            self.kind, self.max_len, "", self.model,
        )

    def __repr__(self) -> str:
        return (
            f"Features({len(self)} examples, {int(self.lengths.sum())} {'words' if self.kind == 'words' else 'tokens'}, "
            f"{self.n_layers} layers x {self.d_model}, {self.kind}, max_len {self.max_len})"
        )

    # ---- files ------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> Path:
        """Write to one safetensors file atomically, with a checksum of the tensors."""
        tensors = self._tensors()
        metadata = {"format": FORMAT, "kind": self.kind, "max_len": str(self.max_len),
                    "key": self.key, "model": self.model}  # safetensors_bytes adds the checksum
        return write_atomic(path, safetensors_bytes(tensors, metadata))

    def _tensors(self) -> dict[str, Tensor]:
        return {"vectors": self.vectors.contiguous().cpu(), "lengths": self.lengths, "positions": self.positions,
                "n_words": self.n_words}

    @classmethod
    def load(cls, path: str | os.PathLike) -> Features:
        """Read a file written by :meth:`save`, refusing a damaged one (``ValueError`` naming
        the file and what is wrong)."""
        metadata, tensors = read_checked(path, what="features", format=FORMAT)
        if set(tensors) != {"vectors", "lengths", "positions", "n_words"}:
            raise InputError(f"features file {path} is damaged: it lacks tensors; delete it.")
        features = cls(tensors["vectors"], tensors["lengths"], tensors["positions"], tensors["n_words"],
                       metadata["kind"], int(metadata["max_len"]), metadata.get("key", ""),
                       metadata.get("model", ""))
        problem = _inconsistent(features)
        if problem:
            raise InputError(f"features file {path} is damaged: {problem}; delete it.")
        return features


def _inconsistent(features: Features) -> str | None:
    if features.vectors.ndim != 3 or int(features.lengths.sum()) != features.vectors.shape[0]:
        return "its lengths do not add up to its vectors"
    if features.positions.shape != features.vectors.shape[:1]:
        return "one position per vector is needed"
    if (features.lengths < 0).any():
        return "negative lengths"
    if not all_finite(features.vectors):
        return "non-finite vectors"
    return None


class HiddenStates(Accumulator):
    """The pass-engine accumulator of :func:`extract`: reads ``blocks.0.hook_in`` and every
    ``blocks.{l}.hook_out`` and keeps the vectors of the tokens described in the module
    docstring. Its state is a list of batches (it concatenates; nothing adds up), so under
    ``torch.distributed`` each rank keeps its own shard."""

    name = "hidden_states"
    needs_residual = True
    compact = True

    def __init__(self, n_layers: int, examples: Sequence = ()) -> None:
        self.n_layers = n_layers
        self.examples = examples  # the corpus, for the word counts of Words examples
        self.parts: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
        self.kind: str | None = None

    def hooks(self, model: Any) -> list[tuple[str, Any]]:
        def keep(layer: int):
            def hook(residual: Tensor, hook: Any) -> None:
                self.layers[layer] = residual.detach()

            return hook

        names = ["blocks.0.hook_in"] + [f"blocks.{layer}.hook_out" for layer in range(self.n_layers)]
        return [(name, keep(index)) for index, name in enumerate(names)]

    def start_batch(self, batch: PassBatch) -> None:
        super().start_batch(batch)
        self.layers: dict[int, Tensor] = {}

    def select(self, batch: PassBatch) -> tuple[Tensor, Tensor, Tensor]:
        """``(keep [batch, pos], positions [kept], n_words [batch or 0])``: which tokens of the
        batch are kept, what :attr:`Features.positions` records for each, and word counts; all on
        the host (the pass's own copy of the inputs there: nothing is read from the device)."""
        inputs = batch.on_host if batch.on_host is not None else batch.batch.to("cpu")
        words = inputs.extra.get("word_index")
        if words is not None:
            self.kind = "words"
            keep = words >= 0
            given = self.examples[batch.start : batch.start + len(batch)]
            return keep, words[keep], torch.tensor([len(example) for example in given], dtype=torch.long)
        self.kind = "sequence"
        keep = inputs.attention_mask.bool()
        positions = inputs.positions[keep]
        return keep, positions, torch.zeros(0, dtype=torch.long)

    def end_batch(self, batch: PassBatch) -> None:
        """Keep the batch's vectors on the model's device (gathered by rows found on the host, so
        nothing is read back); :meth:`result` moves them to the host once."""
        stacked = torch.stack([self.layers[layer] for layer in range(self.n_layers + 1)], dim=2)
        keep, positions, n_words = self.select(batch)
        rows = keep.flatten().nonzero().squeeze(-1)  # keep is the host's mask (select)
        # the rows in a pinned copy (devices.to_device): a pageable one would wait for the device
        vectors = stacked.flatten(0, 1).index_select(0, devices.to_device(rows, stacked.device))
        self.parts.append((vectors.to(torch.float16), keep.sum(1), positions, n_words))
        self.layers = {}

    def result(self, order: Sequence[int] | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(vectors, lengths, positions, n_words)`` of the examples in the order they ran, or,
        when they ran in ``order`` (the ``j``-th example run is example ``order[j]`` of the
        corpus), back in corpus order (one concatenation either way)."""
        vectors, lengths, positions, n_words = (list(column) for column in zip(*self.parts, strict=True))
        vectors = [torch.cat(vectors).cpu()]  # one read of the device for the whole pass
        lengths = [torch.cat(lengths)]
        positions = [torch.cat(positions)]
        if order is None:
            return torch.cat(vectors), torch.cat(lengths), torch.cat(positions), torch.cat(n_words)
        counts = torch.cat(lengths)
        each_vectors = [piece for part, n in zip(vectors, lengths, strict=True) for piece in part.split(n.tolist())]
        each_positions = [piece for part, n in zip(positions, lengths, strict=True) for piece in part.split(n.tolist())]
        back = torch.argsort(torch.as_tensor(list(order), dtype=torch.long)).tolist()
        words = torch.cat(n_words)
        return (
            torch.cat([each_vectors[j] for j in back]), counts[back],
            torch.cat([each_positions[j] for j in back]), words[back] if words.numel() else words,
        )

    def merge(self, other: Accumulator) -> HiddenStates:
        """Append ``other``'s batches (a later part of the corpus) after this one's."""
        if type(other) is not type(self):
            raise InputTypeError(f"cannot merge {type(self).__name__} with {type(other).__name__}")
        self.parts.extend(other.parts)
        self.kind = self.kind or other.kind
        return self

    def all_reduce(self, group: Any = None) -> None:
        """Nothing: features are never gathered through collectives. Each rank keeps its own
        shard, and :func:`extract` writes it to a file (one per rank)."""


def model_identity(model: Any) -> str:
    """``"<name>@<weights fingerprint>"`` (:func:`attnlens.core.loading.model_id`,
    :func:`attnlens.core.fingerprints.weights_fingerprint`): what :attr:`Features.model` records."""
    return f"{model_id(model)}@{weights_fingerprint(model)}"


class HooksOnModel(AttnlensWarning):
    """Features of a model that carries hooks of its own (:func:`attnlens.engine.hooks.on_model`),
    computed under them and not cached: the cache key names only the hooks given as ``hooks=``."""


def cache_dir() -> Path:
    """Where cached features live: ``$ATTNLENS_CACHE/features``, else
    ``~/.cache/attnlens/features``. Delete the folder (or call :func:`clear_cache`) to clear it."""
    root = os.environ.get("ATTNLENS_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "attnlens") / "features"


def clear_cache() -> int:
    """Remove every cached features file (and the lock files beside them, see :func:`extract`);
    returns how many features files were removed."""
    folder = cache_dir()
    removed = 0
    if folder.is_dir():
        for path in folder.glob("*.safetensors"):
            path.unlink(missing_ok=True)
            removed += 1
        for path in folder.glob("*.safetensors.lock"):
            path.unlink(missing_ok=True)
    return removed


def hooks_key(hooks: Any) -> str | None:
    """A stable description of ``hooks`` for the cache key: ``"none"`` for no hooks, their
    ``key()`` when they have one (:class:`attnlens.papa.PapaHooks`), else ``None`` (unknown:
    not cacheable)."""
    if hooks is None or (isinstance(hooks, Sequence) and len(hooks) == 0):
        return "none"
    key = getattr(hooks, "key", None)
    return key() if callable(key) else None


def features_key(model: Any, examples: Sequence, *, hooks: str, max_len: int, layout: str,
                 variant: str = "") -> str:
    """The hash naming a features file: attnlens's version, the format, the model
    (:func:`attnlens.core.fingerprints.identity`: its name, weights, dtype and tokenizer), the
    hooks' key, the examples, ``max_len``, the layout and ``variant`` (what else changes them:
    e.g. the masks of MLM-probe features)."""

    digest = hashlib.sha256()
    header = {"attnlens": version.__version__, "format": FORMAT, **identity(model), "hooks": hooks, "max_len": max_len,
              "layout": layout, "n": len(examples), "variant": variant}
    digest.update(json.dumps(header, sort_keys=True).encode())
    for example in examples:
        value = {"words": list(example.words)} if isinstance(example, Words) else example
        digest.update(json.dumps(value, ensure_ascii=False).encode() + b"\n")
    return digest.hexdigest()[:32]


@fingerprints_kept()  # the cache key's fingerprint and the pass's header: computed once
@own_arithmetic()  # the pass and the features' assembly as the cache key says, whatever torch's global settings
def extract(
    model: Any,
    examples: Sequence,
    *,
    hooks: Any = (),
    cache: bool = True,
    cache_key: str | None = None,
    max_len: int = 128,
    layout: str | None = None,
    batch_size: int = 32,
    progress: bool = True,
    description: str = "features",
    states: HiddenStates | None = None,
    variant: str = "",
    compact: bool = True,
) -> Features:
    """Every layer's vectors of ``examples`` (strings, ``(str, str)`` pairs or
    :class:`attnlens.core.inputs.Words`) under ``hooks``, from the cache when it holds them.

    One pass of the engine (:func:`attnlens.engine.passes.run`), stopped after the last layer. ``cache``:
    read and write :func:`cache_dir`. ``cache_key``: names hooks that have no ``key()`` (any
    string that changes when they do), and hooks the model carries
    (:func:`attnlens.engine.hooks.on_model`: ``add_hook``, a ``model.hooks(...)`` or
    ``papa.intervention(...)`` block, a user's ``register_forward_hook``), whose features are
    otherwise computed under them but not cached (:class:`HooksOnModel`), since no key names
    them. ``states``: the accumulator that keeps the vectors (a :class:`HiddenStates` subclass
    choosing other tokens, e.g. masked ones), with ``variant`` naming what it changes in the
    cache key. ``compact``: run PAPA-layout batches at the length
    of their longest real text (:func:`attnlens.engine.passes.run`; the same features up to float32
    rounding, so one cache entry serves both), the examples run from the shortest to the longest
    (:func:`by_length`; the features come back in the examples' order). Returns :class:`Features`
    with their vectors on the model's device.

    Processes that share the cache folder compute each features file once: the one that starts
    it holds ``<file>.lock`` (a :class:`filelock.FileLock`) until it is written, and the others
    wait for it and read it (e.g. NER and POS, which read the same sentences, in two processes of
    :func:`attnlens.papa.curve`). Under ``torch.distributed`` the ranks share the pass instead.
    """
    processing.check(model, ("residual",), "probe features (the residual stream)")
    features = _extract_or_read(model, list(corpus_iterator(examples, name="examples")), hooks, cache, cache_key, max_len, layout, batch_size,
                                progress, description, states, variant, compact)
    # read from the cache (whose key holds the model: a file of another format may not say it)
    # or computed; on the model's device
    return dataclasses.replace(features.to(device_of(model)), model=model_identity(model))


def _extract_or_read(model: Any, examples: list, hooks: Any, cache: bool, cache_key: str | None, max_len: int,
                     layout: str | None, batch_size: int, progress: bool, description: str,
                     states: HiddenStates | None, variant: str, compact: bool) -> Features:
    """:func:`extract`'s features on the host: read from the cache, or computed (and cached)."""
    layout = default_layout(model) if layout is None else layout
    described = cache_key if cache_key is not None else hooks_key(hooks)
    path = None
    carried = on_model(model) if cache and cache_key is None else []
    if carried:
        shown = ", ".join(carried[:3]) + (f" and {len(carried) - 3} more" if len(carried) > 3 else "")
        warnings.warn(
            f"the model carries hooks of its own ({shown}): the features are computed under them but "
            "not cached, since the cache key cannot name them. Pass the intervention as hooks= "
            "(papa.hooks(...) and the other interventions have a key), or cache_key='...' naming "
            "what the model carries, to cache them; cache=False computes them without this warning.",
            HooksOnModel, stacklevel=3,
        )
    elif cache and described is None:
        warnings.warn(
            "these hooks have no key(), so their features cannot be told apart from others' and "
            "are not cached; pass cache_key='...' naming the intervention to cache them.",
            stacklevel=3,
        )
    elif cache:
        key = features_key(model, examples, hooks=described, max_len=max_len, layout=layout,
                           variant=variant)
        path = cache_dir() / f"{key}.safetensors"
        existed = path.exists()
        loaded = _cached(path, key) if existed else None  # a written file is read without the lock
        if loaded is not None:
            return loaded
        if not world().distributed:
            # another process extracting the same features (e.g. NER and POS, which read the same
            # sentences, in two processes of a curve): wait for its file rather than compute them twice
            path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(f"{path}.lock"):
                loaded = None if existed else _cached(path, key)  # written while this one waited?
                if loaded is not None:
                    return loaded
                return _extract(model, examples, hooks, max_len, layout, batch_size, progress,
                                description, states, compact, path)
    return _extract(model, examples, hooks, max_len, layout, batch_size, progress, description, states,
                    compact, path)


def _cached(path: Path, key: str) -> Features | None:
    """The features cached at ``path`` (``None``, warned, for a damaged file or another key's)."""
    if not path.exists():
        return None
    try:
        loaded = Features.load(path)
        if loaded.key != key:  # a valid file, but another request's (e.g. files swapped)
            raise MismatchError(f"features file {path} holds the features of cache key {loaded.key!r}.")
        return loaded
    except ValueError as error:  # MismatchError is one
        warnings.warn(f"{error} Recomputing it.", stacklevel=3)
        return None


def _extract(model: Any, examples: list, hooks: Any, max_len: int, layout: str, batch_size: int,
             progress: bool, description: str, states: HiddenStates | None, compact: bool,
             path: Path | None) -> Features:
    """One pass of the engine over ``examples`` (see :func:`extract`), written to ``path``."""
    accumulator = states if states is not None else HiddenStates(int(model.cfg.n_layers), examples)
    order = None
    if compact and layout == "papa" and accumulator.compact and not world().distributed:
        order = by_length(model.tokenizer, examples)  # compact batches of similar lengths: little padding left
        accumulator.examples = [examples[index] for index in order]
    passes.run(model, examples if order is None else accumulator.examples, [accumulator], max_len=max_len,
               layout=layout, batch_size=batch_size, hooks=as_hooks(hooks), progress=progress,
               description=description, compact=compact)
    vectors, lengths, positions, n_words = accumulator.result(order)
    features = Features(vectors, lengths, positions, n_words, accumulator.kind or "sequence", max_len,
                        path.stem if path is not None else "")
    current = world()
    if current.distributed:
        return _gather_shards(features, path, current)
    if path is not None:
        features.save(path)
    return features


def _gather_shards(features: Features, path: Path | None, current: Any) -> Features:
    """Under ``torch.distributed``: every rank writes its shard (``<key>.rank<r>-of-<n>``) to
    the cache folder, which all ranks must share (one machine, or a shared file system); then
    every rank reads the shards in rank order, so no big tensor goes through a collective.
    Rank 0 writes the whole file and removes the shards."""
    import torch.distributed as dist

    if path is None:
        raise InputError(
            "under torch.distributed, features are exchanged through files: keep cache=True (with "
            "hooks that have a key(), or cache_key=) and a cache folder every rank can read."
        )
    shards = [path.with_name(f"{path.stem}.rank{rank}-of-{current.size}{path.suffix}")
              for rank in range(current.size)]
    features.save(shards[current.rank])
    dist.barrier()
    parts = [Features.load(shard) for shard in shards]
    whole = Features(
        torch.cat([part.vectors for part in parts]), torch.cat([part.lengths for part in parts]),
        torch.cat([part.positions for part in parts]), torch.cat([part.n_words for part in parts]),
        features.kind, features.max_len, path.stem, features.model,
    )
    dist.barrier()
    if current.rank == 0:
        whole.save(path)
        for shard in shards:
            shard.unlink(missing_ok=True)
    return whole
