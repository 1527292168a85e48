"""A small CNN that labels attention maps with Kovaleva et al.'s five types (scikit-learn style).

Kovaleva et al. 2019 (§4.1, "BERT's self-attention patterns") hand-labelled about 400 maps of
fine-tuned BERT with the five types of :data:`attnlens.methods.patterns.TYPES` (about 30% of them
vertical) and trained a convolutional network on them, which then labelled the maps of every
head. Their labels were never published, and the network's details are not reproduced here from
the paper (the paper was not at hand when this was written; check its §4.1 before citing an
architecture), so :class:`PatternCNN` is attnlens's own small CNN, every choice documented:

- **input**: maps of any length are brought to one small fixed image. Each is made a
  distribution per row, ``|a| / Σ|a|`` (the identity for the rows of standard and PAPA maps;
  signed effective attention is read as :mod:`attnlens.methods.stats` reads it, so no flag is needed),
  resized to ``size × size`` by area averaging (``torch.nn.functional.adaptive_avg_pool2d``:
  every output pixel is the mean of the entries its bin covers, so each entry counts in
  proportion to its area and a one-token-wide diagonal or column survives at any length;
  bilinear interpolation samples only some entries when it shrinks a map and can drop a thin
  line), then divided by its largest pixel: the length, which sets the typical weight (about
  ``1/L``), does not change the input range;
- **network**: four stages of two 3×3 convolutions (8, 8, 16, 16, 32, 32, 32, 32 channels), each followed by GroupNorm (4 groups) and ReLU, 2×2 max
  pooling between stages, global average pooling and one linear layer to the classes.
  GroupNorm, not BatchNorm: it normalises each map by itself, so training and prediction compute
  the same thing (BatchNorm's running statistics, averaged over batches of varied lengths, made
  predictions unstable), and without any normalisation 8 plain layers sometimes did not train
  from some seeds;
- **length augmentation** (``augment=True``): a map of ``L`` tokens resized to ``size`` pixels
  draws one-token lines ``size / L`` pixels wide, so a network shown maps of one length only does
  not recognise a diagonal of another. Each training batch is therefore first resampled (by area
  averaging) to a random length between ``L / 2`` and ``2 L`` of each map, one factor per batch;
- **training**: Adam, ``lr`` = 3e-3, ``epochs`` = 10 passes, ``batch_size`` = 32, cross-entropy
  (``class_weight="balanced"`` weighs each class by ``n / (n_classes · n_class)``, as
  scikit-learn does), initial weights and batch order from ``seed`` (the global random state is
  left as it was), on the CPU (about 6 s of one core for 5 × 200 maps of length 32). Trained
  on those synthetic maps (seed 0), it labels held-out ones (seed 1) of lengths 24 to 128 at
  ≥ 99% per class for training seeds 0, 1 and 2, and of length 16 (the edge of the augmentation)
  at 89–99% (``tests/test_pattern_cnn.py`` checks lengths 24, 32 and 48 at ≥ 95%).

Labels to train on come from :func:`attnlens.methods.patterns.export_for_labelling` and
:func:`attnlens.methods.patterns.read_labelled` (maps you label yourself), or from
:func:`attnlens.methods.patterns.synthetic` for a quick start.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from attnlens.core.checks import all_finite, describe, finite, flag, whole_number
from attnlens.core.estimator import Estimator
from attnlens.core.files import check_sealed, read_checked, safetensors_bytes, write_atomic
from attnlens.core.modes import gradients, own_arithmetic
from attnlens.errors import (
    FileFormatError,
    InputError,
    InputTypeError,
    MissingFileError,
    NotFittedError,
)
from attnlens.methods import views
from attnlens.methods.patterns.maps_check import check_maps
from attnlens.methods.patterns.templates import TYPES

#: File format of a saved :class:`PatternCNN` (``"attnlens.PatternCNN/<version>"``).
FORMAT = "attnlens.PatternCNN/1"
#: channels of the 8 convolutional layers, two per stage
WIDTHS: tuple[int, ...] = (8, 8, 16, 16, 32, 32, 32, 32)
#: GroupNorm groups after each convolution
GROUPS = 4
#: range of the length factor of the augmentation (each batch resampled to ``L · factor``)
AUGMENT_RANGE: tuple[float, float] = (0.5, 2.0)

Maps = Float[Tensor, "n query key"] | Float[np.ndarray, "n query key"] | Sequence[Any]


class _Network(nn.Module):
    """8 convolutions (3×3, GroupNorm, ReLU) in 4 stages, max pooling between stages, global
    average pooling and a linear layer: ``[n, 1, size, size]`` images to ``[n, classes]`` logits."""

    def __init__(self, n_classes: int, widths: Sequence[int] = WIDTHS) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 1
        for index, width in enumerate(widths):
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.GroupNorm(GROUPS, width), nn.ReLU()]
            channels = width
            if index % 2 == 1 and index < len(widths) - 1:
                layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        self.out = nn.Linear(channels, n_classes)

    def forward(self, images: Float[Tensor, "n 1 size size"]) -> Float[Tensor, "n classes"]:
        return self.out(self.features(images).mean(dim=(-1, -2)))


@dataclass
class CNNSettings:
    """The CNN's hyper-parameters (see the module docstring)."""

    size: int = 32
    classes: list[str] = field(default_factory=lambda: list(TYPES))
    epochs: int = 10
    lr: float = 3e-3
    batch_size: int = 32
    seed: int = 0
    class_weight: str | None = None
    augment: bool = True


def row_distributions(pattern: Float[Tensor, "*maps query key"]) -> Float[Tensor, "*maps query key"]:
    """``|a| / Σ_k |a|`` per row (float32): the identity for rows that are distributions
    (standard and PAPA maps), signed effective attention made one as :mod:`attnlens.methods.stats` does.
    All-zero rows stay zero."""
    rows = pattern.float().abs()
    return rows / rows.sum(-1, keepdim=True).clamp_min(torch.finfo(rows.dtype).tiny)


def images(maps: Float[Tensor, "n query key"], size: int) -> Float[Tensor, "n 1 size size"]:
    """The CNN's input: maps already made row distributions, resized to ``size × size`` by area
    averaging (``adaptive_avg_pool2d``) and divided by their largest pixel (module docstring)."""
    image = F.adaptive_avg_pool2d(maps[:, None], size)
    return image / image.amax(dim=(-1, -2), keepdim=True).clamp_min(torch.finfo(image.dtype).tiny)


def as_map_list(maps: Any, what: str = "maps") -> list[Tensor]:
    """``maps`` ([n, L, L] tensor or array, or a list of 2-D square maps of any lengths) as a list
    of float CPU tensors, or one ``ValueError`` / ``TypeError`` naming the problem."""
    if isinstance(maps, Tensor | np.ndarray):
        if maps.ndim != 3:
            raise InputError(
                f"{what} must be [n, query, key] (n maps) or a list of [query, key] maps, got shape "
                f"{tuple(maps.shape)}" + ("; for one map pass map[None]." if maps.ndim == 2 else ".")
            )
        items = list(torch.as_tensor(maps))
    elif isinstance(maps, Sequence) and not isinstance(maps, str):
        items = list(maps)
    else:
        raise InputTypeError(f"{what} must be a tensor [n, query, key] or a list of 2-D maps, got {describe(maps)}.")
    if not items:
        raise InputError(f"{what} is empty: give at least one map.")
    out = []
    for index, item in enumerate(items):
        try:
            tensor = item if isinstance(item, Tensor) else torch.as_tensor(np.asarray(item))
        except (TypeError, ValueError, RuntimeError):
            raise InputTypeError(f"{what}[{index}] must be a 2-D tensor or array, got {describe(item)}.") from None
        if tensor.ndim != 2 or tensor.shape[0] != tensor.shape[1] or tensor.shape[0] == 0:
            raise InputError(
                f"{what}[{index}] must be a square [query, key] map, got shape {tuple(tensor.shape)}."
            )
        if not tensor.is_floating_point():
            raise InputTypeError(f"{what}[{index}] must hold floats (attention weights), got {tensor.dtype}.")
        if not bool(torch.isfinite(tensor).all()):
            raise InputError(f"{what}[{index}] holds NaN or infinite values.")
        out.append(tensor.detach().cpu())
    return out


def _by_length(maps: list[Tensor]) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for index, item in enumerate(maps):
        groups.setdefault(item.shape[-1], []).append(index)
    return groups


def _inputs(maps: list[Tensor], size: int, factor: float = 1.0) -> Tensor:
    """Images ``[n, 1, size, size]`` of ``maps`` (row distributions), each first resampled to
    ``round(L · factor)`` tokens when ``factor != 1`` (the augmentation)."""
    out = torch.empty(len(maps), 1, size, size)
    for length, indices in _by_length(maps).items():
        group = torch.stack([maps[i] for i in indices])
        if factor != 1.0:
            group = F.adaptive_avg_pool2d(group[:, None], max(2, round(length * factor)))[:, 0]
        out[indices] = images(group, size)
    return out


class PatternCNN(Estimator):
    """Kovaleva et al.'s small CNN on resized maps, scikit-learn style: :meth:`fit` on maps and
    their type names, :meth:`predict`, :meth:`predict_proba`, :meth:`score`, :meth:`save` /
    :meth:`load`, ``get_params`` / ``set_params``; :meth:`classify_batch` labels a pass's ``[batch, head, query, key]`` maps.

    ``size``: the side of the resized image (at least 8); ``classes``: the type names, in the
    order of :meth:`predict_proba`'s columns (default :data:`~attnlens.methods.patterns.TYPES`);
    ``epochs``, ``lr``, ``batch_size``, ``seed``, ``class_weight`` (None or ``"balanced"``),
    ``augment``: training (module docstring).
    """

    def __init__(self, size: int = 32, classes: Sequence[str] = TYPES, *, epochs: int = 10,
                 lr: float = 3e-3, batch_size: int = 32, seed: int = 0,
                 class_weight: str | None = None, augment: bool = True) -> None:
        given = dict(locals())
        if isinstance(classes, str) or not isinstance(classes, Sequence) or not all(
            isinstance(name, str) and name for name in classes
        ):
            raise InputTypeError(f"classes must be a list of type names, got {describe(classes)}.")
        if len(set(classes)) != len(classes) or len(classes) < 2:
            raise InputError(f"classes must be at least 2 distinct names, got {list(classes)}.")
        if class_weight not in (None, "balanced"):
            raise InputError(f"class_weight must be None or 'balanced', got {describe(class_weight)}.")
        self.settings = CNNSettings(
            size=whole_number(size, "size", " of pixels", minimum=8),
            classes=list(classes),
            epochs=whole_number(epochs, "epochs", minimum=1),
            lr=finite(lr, "lr", low=0.0),
            batch_size=whole_number(batch_size, "batch_size", minimum=1),
            seed=whole_number(seed, "seed", minimum=0),
            class_weight=class_weight,
            augment=flag(augment, "augment (length augmentation in training)"),
        )
        if self.settings.lr == 0:
            raise InputError("lr must be above 0 (nothing would be learned).")
        for name in self._param_names():  # scikit-learn's contract: every argument, unchanged
            setattr(self, name, given[name])
        self.network: _Network | None = None
        #: the settings of the fit (set by :meth:`fit` and :meth:`load`): a fitted CNN predicts
        #: with the classes and size it was trained on, whatever set_params changed since
        self.settings_: Any = None

    def _after_set_params(self, fresh: Estimator) -> None:
        self.settings = fresh.settings

    @property
    def _used(self) -> Any:
        """The settings predictions follow: the fit's once fitted, else the current ones."""
        return self.settings if self.settings_ is None else self.settings_

    @property
    def classes_(self) -> np.ndarray:
        """The class names, in the order of :meth:`predict_proba`'s columns (those of the fit,
        once fitted)."""
        return np.asarray(self._used.classes, dtype=object)

    # ---- training ----------------------------------------------------------------------------

    def _targets(self, labels: Any, n: int, classes: Sequence[str]) -> Tensor:
        if isinstance(labels, str) or not isinstance(labels, Sequence | np.ndarray):
            raise InputTypeError(f"labels must be a list of type names, one per map, got {describe(labels)}.")
        labels = list(labels)
        if len(labels) != n:
            raise InputError(f"{len(labels)} labels for {n} maps; give one type name per map.")
        index = {name: i for i, name in enumerate(classes)}
        for position, label in enumerate(labels):
            if label not in index:
                raise InputError(
                    f"label {describe(label)} of map {position} is not one of the classes "
                    f"{', '.join(classes)}; fix the label or pass classes=."
                )
        return torch.tensor([index[label] for label in labels], dtype=torch.long)

    @gradients()  # autograd on, whatever the caller's mode
    def fit(self, maps: Maps, labels: Sequence[str] | np.ndarray) -> PatternCNN:
        """Train on ``maps`` (``[n, query, key]``, or a list of square maps of any lengths;
        standard, PAPA or signed effective attention) and their type names; returns ``self``.
        The same settings and data give the same weights."""
        items = [row_distributions(m) for m in as_map_list(maps)]
        s = self.settings
        targets = self._targets(labels, len(items), s.classes)
        weight = None
        if s.class_weight == "balanced":
            counts = torch.bincount(targets, minlength=len(s.classes)).float()
            weight = torch.where(counts > 0, len(targets) / (len(s.classes) * counts.clamp_min(1)), 0.0)
        plain = None if s.augment else _inputs(items, s.size)
        generator = torch.Generator().manual_seed(s.seed)
        low, high = AUGMENT_RANGE
        with torch.random.fork_rng(devices=[]):  # the initial weights: from the seed, then put back
            torch.manual_seed(s.seed)
            network = _Network(len(s.classes))
        optimiser = torch.optim.Adam(network.parameters(), lr=s.lr)
        network.train()
        for _ in range(s.epochs):
            order = torch.randperm(len(items), generator=generator)
            for start in range(0, len(items), s.batch_size):
                chosen = order[start : start + s.batch_size]
                if plain is None:
                    factor = low * (high / low) ** float(torch.rand((), generator=generator))
                    batch = _inputs([items[i] for i in chosen.tolist()], s.size, factor)
                else:
                    batch = plain[chosen]
                loss = F.cross_entropy(network(batch), targets[chosen], weight=weight)
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
        network.eval()
        self.network, self.settings_ = network, s
        return self

    # ---- prediction --------------------------------------------------------------------------

    def _fitted(self) -> _Network:
        if self.network is None:
            raise NotFittedError(
                "this PatternCNN is not fitted yet; call fit(maps, labels) first or "
                "PatternCNN.load(path)."
            )
        return self.network

    def _logits(self, inputs: Tensor, batch_size: int = 512) -> Tensor:
        network = self._fitted()
        with torch.inference_mode(), own_arithmetic():
            parts = [network(inputs[start : start + batch_size])
                     for start in range(0, inputs.shape[0], batch_size)]
        return torch.cat(parts)

    def predict_proba(self, maps: Maps) -> np.ndarray:
        """``[n, classes]`` probabilities (softmax of the logits), columns in the order of
        :attr:`classes_`."""
        self._fitted()
        items = [row_distributions(m) for m in as_map_list(maps)]
        return self._logits(_inputs(items, self._used.size)).softmax(-1).numpy()

    def predict(self, maps: Maps) -> np.ndarray:
        """The type name of each map (an array of ``str``)."""
        return self.classes_[self.predict_proba(maps).argmax(-1)]

    def score(self, maps: Maps, labels: Sequence[str] | np.ndarray) -> float:
        """Accuracy of :meth:`predict` against ``labels`` (``sklearn.metrics.accuracy_score``)."""
        from sklearn.metrics import accuracy_score

        predicted = self.predict(maps)
        self._targets(labels, len(predicted), self._used.classes)  # as fit: one known name per map
        return float(accuracy_score(list(labels), list(predicted)))

    def classify_batch(
        self,
        pattern: Float[Tensor, "batch head query key"],
        key_mask: Bool[Tensor, "batch key"],
        view: str = "standard",
        *,
        causal: bool = False,
    ) -> Int[Tensor, "batch head"]:
        """Label every (example, head) map of a pass's batch: indices into
        :data:`~attnlens.methods.patterns.TYPES` (``[batch, head]``, on ``pattern``'s device).

        ``pattern``: ``[batch, head, query, key]``; ``key_mask``: ``[batch, key]``, True for real
        tokens: each example's map is cropped to its real rows and columns (wherever the padding
        is) before it is resized. ``view``: ``"standard"``, ``"effective"`` or ``"papa"``; every
        view goes through the same ``|a|`` row normalisation (the identity for standard and PAPA
        rows), so which view the CNN should label is the user's call: train it on labelled maps
        of that view. The CNN's classes must be names of ``TYPES``. The maps are checked as
        :func:`attnlens.methods.patterns.classify` checks them (standard and PAPA maps: distributions
        over their visible keys, ``causal``: a decoder's, which sees no later key; effective:
        finite; :func:`attnlens.methods.patterns.maps_check.check_maps`)."""
        self._fitted()
        if not isinstance(view, str):
            raise views.unknown_view(view)
        view = views.get_view(view).name
        unknown = [name for name in self._used.classes if name not in TYPES]
        if unknown:
            raise InputError(
                f"classify_batch gives indices into TYPES, but this CNN's classes {unknown} are not "
                f"pattern types ({', '.join(TYPES)}); use predict() for custom classes."
            )
        if key_mask.shape != (pattern.shape[0], pattern.shape[-1]) or pattern.shape[-1] != pattern.shape[-2]:
            raise InputError(
                f"pattern {tuple(pattern.shape)} and key_mask {tuple(key_mask.shape)} do not match: "
                "expected [batch, head, n, n] and [batch, n]."
            )
        check_maps(pattern, key_mask.to(pattern.device), view=view, signed=views.get_view(view).signed,
                   causal=causal)
        n_examples, n_heads = pattern.shape[:2]
        parts = []
        for example in range(n_examples):
            valid = key_mask[example].nonzero().flatten()
            if valid.numel() == 0:
                raise InputError(f"example {example} has no real token (key_mask is all False).")
            crop = pattern[example][:, valid][:, :, valid]  # [head, n, n]
            parts.append(images(row_distributions(crop), self._used.size).cpu())
        predicted = self._logits(torch.cat(parts)).argmax(-1)
        to_types = torch.tensor([TYPES.index(name) for name in self._used.classes])
        return to_types[predicted].reshape(n_examples, n_heads).to(pattern.device)

    # ---- files -------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> Path:
        """Write the fitted CNN to one safetensors file (atomically, with a checksum)."""
        network = self._fitted()
        tensors = {name: value.detach().cpu().contiguous() for name, value in network.state_dict().items()}
        metadata = {
            "format": FORMAT,
            "settings": json.dumps(asdict(self._used), sort_keys=True),  # the fit's
            "widths": json.dumps(list(WIDTHS)),
        }  # safetensors_bytes adds the checksum
        return write_atomic(path, safetensors_bytes(tensors, metadata))

    @classmethod
    def load(cls, path: str | os.PathLike) -> PatternCNN:
        """Read a CNN written by :meth:`save`: ``ValueError`` for a file that is missing,
        damaged, of another kind, or of another version of the format."""
        path = Path(path)
        if not path.is_file():
            raise MissingFileError(f"PatternCNN file {path} does not exist; fit a PatternCNN and save() it.")
        found = _format_of(path)
        if found is not None and found.startswith("attnlens.PatternCNN/") and found != FORMAT:
            check_sealed(path)  # an edited format is an edit, not another version
            raise FileFormatError(
                f"{path} is a PatternCNN file of format {found!r}, and this attnlens reads "
                f"{FORMAT!r}; fit and save the CNN again with this version."
            )
        metadata, tensors = read_checked(path, what="PatternCNN", format=FORMAT)
        try:
            settings = json.loads(metadata["settings"])
            widths = json.loads(metadata["widths"])
            cnn = cls(**settings)
            network = _Network(len(cnn.settings.classes), widths)
            network.load_state_dict(tensors)
        except (KeyError, TypeError, ValueError, RuntimeError) as error:
            raise InputError(
                f"PatternCNN file {path} does not describe a PatternCNN ({error}); write it again."
            ) from None
        if not all(all_finite(value) for value in tensors.values()):
            raise InputError(f"PatternCNN file {path} holds non-finite weights.")
        network.eval()
        cnn.network, cnn.settings_ = network, cnn.settings
        return cnn


def _format_of(path: Path) -> str | None:
    """The ``format`` of a safetensors file's metadata, or None when it cannot be read."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            return (handle.metadata() or {}).get("format")
    except (SafetensorError, OSError):
        return None
