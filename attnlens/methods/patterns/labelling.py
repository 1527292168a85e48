"""Maps to label by hand, for :class:`attnlens.methods.patterns.PatternCNN`.

Kovaleva et al. 2019 trained their CNN on about 400 maps they labelled by hand; those labels were
never published. Users label their own:

1. :func:`sample_maps` draws random (example, layer, head) maps of a model over a corpus (one
   pass of :func:`attnlens.engine.passes.run`);
2. :func:`export_for_labelling` writes them to a folder: ``maps.png`` (an image grid),
   ``labels.csv`` (one row per map, with the tile's ``row`` and ``column`` in the grid, the
   template classifier's ``suggested`` type and an empty ``label`` to fill in) and
   ``maps.safetensors`` (the maps themselves);
3. after the ``label`` column is filled (in a spreadsheet or an editor), :func:`read_labelled`
   reads the labelled maps back for :meth:`PatternCNN.fit`.

The grid needs Pillow (``pip install "attnlens[labelling]"``).
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from attnlens.core.checks import describe, whole_number
from attnlens.core.corpus import corpus_iterator
from attnlens.core.files import read_checked, safetensors_bytes, write_atomic
from attnlens.core.loading import is_causal
from attnlens.core.plots import DIVERGING, SEQUENTIAL
from attnlens.engine.accumulator import Accumulator
from attnlens.engine.passes import run
from attnlens.errors import InputError, InputTypeError, ModelBehaviourError
from attnlens.methods import views
from attnlens.methods.patterns.cnn import Maps, as_map_list
from attnlens.methods.patterns.templates import TYPES, classify

#: format of ``maps.safetensors``
FORMAT = "attnlens.labelling/1"
#: the files of a labelling folder
MAPS, GRID, LABELS = "maps.safetensors", "maps.png", "labels.csv"
#: columns of ``labels.csv`` that meta columns may not take
RESERVED: tuple[str, ...] = ("id", "row", "column", "suggested", "label")
#: white pixels between two tiles of the grid
GAP = 2


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise ImportError(
            'export_for_labelling draws the maps with Pillow, which is not installed: '
            'pip install "attnlens[labelling]" (or pip install Pillow).'
        ) from None
    return Image


# ------------------------------------------------------------------------------------------------
# sampling maps of a model


class _Sampled(Accumulator):
    """Keeps the maps of chosen (example, layer, head) triples, each cropped to its real tokens,
    and the token strings of their examples."""

    name = "labelling.sample"
    any_order = True  # maps kept by slot, each found by its example's corpus index

    def __init__(self, wanted: dict[tuple[int, int], list[tuple[int, int]]], view: str) -> None:
        self.wanted = wanted  # (example of the pass, layer) -> [(slot, head)]
        self._view = views.get_view(view)
        self.view = self._view.name
        self.needs_values = self._view.needs_values
        self.maps: dict[int, Tensor] = {}
        self.tokens: dict[int, list[str]] = {}

    def update(self, layer: Any) -> None:
        batch = layer.batch
        for index in range(len(batch)):
            chosen = self.wanted.get((batch.indices[index], layer.layer))
            if not chosen:
                continue
            source = self._view.maps(layer)
            valid = layer.key_mask[index].nonzero().flatten()
            ids = batch.batch.input_ids[index][valid].tolist()
            for slot, head in chosen:
                crop = source[index, head][valid][:, valid].float().cpu().numpy()
                self.maps[slot] = torch.from_numpy(crop.copy())  # a plain tensor, not an inference one
                self.tokens[slot] = list(batch.model.tokenizer.convert_ids_to_tokens(ids))

    def merge(self, other: Accumulator) -> Accumulator:
        if not isinstance(other, _Sampled):
            raise InputTypeError(f"cannot merge {type(self).__name__} with {type(other).__name__}")
        self.maps.update(other.maps)
        self.tokens.update(other.tokens)
        return self

    def all_reduce(self, group: Any = None) -> None:
        import torch.distributed as dist

        gathered: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, (self.maps, self.tokens), group=group)
        for maps, tokens in gathered:
            self.maps.update(maps)
            self.tokens.update(tokens)

    def result(self) -> tuple[list[Tensor], list[list[str]]]:
        slots = sorted({slot for chosen in self.wanted.values() for slot, _ in chosen})
        missing = [slot for slot in slots if slot not in self.maps]
        if missing:
            raise ModelBehaviourError(f"{len(missing)} chosen maps were not seen by the pass.")
        return [self.maps[slot] for slot in slots], [self.tokens[slot] for slot in slots]


def sample_maps(
    model: Any,
    corpus: Any,
    *,
    n: int = 100,
    view: str = "standard",
    seed: int = 0,
    max_len: int = 64,
    layout: str | None = None,
    batch_size: int = 32,
) -> tuple[list[Float[Tensor, "query key"]], list[list[str]], pd.DataFrame]:
    """``n`` random maps of ``model`` over ``corpus``, to label (:func:`export_for_labelling`).

    The (example, layer, head) triples are drawn without replacement from ``seed``, uniformly
    among all of them, before the pass; the pass (:func:`attnlens.engine.passes.run`, ``max_len``,
    ``layout``, ``batch_size``) runs over the chosen examples only. ``layout``: default
    ``"padded"``, the model's ordinary input, as :func:`attnlens.methods.patterns.types` reads it. ``view``: ``"standard"``
    (``hook_pattern``) or ``"effective"`` (effective attention, computed by the pass engine).

    Returns ``(maps, tokens, meta)``, ordered by example, layer and head: ``maps``, each
    ``[query, key]`` cropped to the example's real tokens; ``tokens``, their token strings;
    ``meta``, a DataFrame with ``example`` (index in ``corpus``), ``layer``, ``head``, ``view``,
    ``length`` (real tokens) and ``causal`` (the model is a decoder: a query sees the keys up to
    itself, which the template classifier's chance counts)."""
    readable = views.names(constants=False)  # the views given by name, registered now
    if not isinstance(view, str) or view not in readable:
        raise views.unknown_view(view, among=readable, where=" for sample_maps")
    n = whole_number(n, "n", " of maps", minimum=1)
    seed = whole_number(seed, "seed", minimum=0)
    texts = list(corpus_iterator(corpus))
    if not texts:
        raise InputError("corpus is empty: sample_maps needs at least one text or pair.")
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    total = len(texts) * n_layers * n_heads
    if n > total:
        raise InputError(
            f"n={n} maps asked, but {len(texts)} examples × {n_layers} layers × {n_heads} heads "
            f"have only {total}; give a larger corpus or a smaller n."
        )
    flat = np.sort(np.random.default_rng(seed).choice(total, size=n, replace=False))
    example, layer, head = np.unravel_index(flat, (len(texts), n_layers, n_heads))
    chosen = sorted(set(example.tolist()))
    position = {index: i for i, index in enumerate(chosen)}
    wanted: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for slot, (e, layer_, head_) in enumerate(zip(example.tolist(), layer.tolist(), head.tolist(), strict=True)):
        wanted.setdefault((position[e], layer_), []).append((slot, head_))
    sampled = _Sampled(wanted, view)
    run(model, [texts[i] for i in chosen], [sampled], max_len=max_len, layout=layout or "padded",
        batch_size=batch_size, progress=False, description="sample_maps")
    maps, tokens = sampled.result()
    meta = pd.DataFrame({
        "example": example.astype(int), "layer": layer.astype(int), "head": head.astype(int),
        "view": view, "length": [m.shape[-1] for m in maps], "causal": is_causal(model),
    })
    return maps, tokens, meta


# ------------------------------------------------------------------------------------------------
# the folder to label


def _meta_frame(meta: Any, n: int) -> pd.DataFrame:
    if meta is None:
        return pd.DataFrame(index=range(n))
    try:
        frame = meta.reset_index(drop=True) if isinstance(meta, pd.DataFrame) else pd.DataFrame(meta)
    except (TypeError, ValueError) as error:
        raise InputTypeError(f"meta must be a DataFrame, a dict of columns or a list of dicts ({error}).") from None
    if len(frame) != n:
        raise InputError(f"meta has {len(frame)} rows for {n} maps; give one row per map.")
    clashing = [str(column) for column in frame.columns if str(column) in RESERVED]
    if clashing:
        raise InputError(f"meta columns {clashing} clash with labels.csv's own columns {list(RESERVED)}; rename them.")
    return frame


def _check_tokens(tokens: Any, maps: list[Tensor]) -> list[list[str]] | None:
    if tokens is None:
        return None
    if isinstance(tokens, str) or not isinstance(tokens, Sequence) or len(tokens) != len(maps):
        raise InputError(f"tokens must be one list of token strings per map ({len(maps)}), got {describe(tokens)}.")
    out = []
    for index, (words, item) in enumerate(zip(tokens, maps, strict=True)):
        if isinstance(words, str) or not all(isinstance(word, str) for word in words):
            raise InputError(f"tokens[{index}] must be a list of token strings, got {describe(words)}.")
        if len(words) != item.shape[-1]:
            raise InputError(f"tokens[{index}] has {len(words)} tokens but map {index} is {item.shape[-1]} × {item.shape[-1]}.")
        out.append(list(words))
    return out


def _view_of(item: Tensor, frame: pd.DataFrame, index: int) -> str:
    """The view to classify a map in: the meta's ``view`` when it names one, else effective for
    a map with negative entries and standard otherwise."""
    if "view" in frame.columns and frame["view"].iloc[index] in views.REGISTRY:
        return str(frame["view"].iloc[index])
    return "effective" if bool((item < 0).any()) else "standard"


def _suggestions(suggested: Any, maps: list[Tensor], tokens: list[list[str]] | None,
                 frame: pd.DataFrame) -> list[str]:
    n = len(maps)
    if suggested is False or (suggested is None and tokens is None):
        return [""] * n
    if suggested is None:
        assert tokens is not None
        out = []
        for index, (item, words) in enumerate(zip(maps, tokens, strict=True)):
            view = _view_of(item, frame, index)
            causal = "causal" in frame.columns and bool(frame["causal"].iloc[index])
            try:
                out.append(str(classify(item, tokens=words, view=view, causal=causal).names[0, 0]))
            except ValueError as error:
                raise InputError(
                    f"map {index} cannot be classified in the {view} view to suggest a type: {error} "
                    "(give meta a 'view' column, or suggested=False)"
                ) from None
        return out
    if isinstance(suggested, str) or not isinstance(suggested, Sequence | np.ndarray) or len(suggested) != n:
        raise InputError(
            f"suggested must be one type name per map ({n}), None (the template classifier's "
            f"type when tokens are given) or False, got {describe(suggested)}."
        )
    return ["" if value is None else str(value) for value in suggested]


def _read_table(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, ValueError, pd.errors.ParserError) as error:
        raise InputError(f"{path} cannot be read as a CSV table ({error}).") from None


def _filled(path: Path) -> bool:
    """Whether an existing ``labels.csv`` has any label (or cannot be read: kept to be safe)."""
    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, ValueError, pd.errors.ParserError):
        return True
    return "label" in table.columns and bool(table["label"].str.strip().ne("").any())


def _colours(name: str) -> np.ndarray:
    """``[256, 3]`` uint8 colours of a plotly colour scale, from its low end to its high end."""
    from plotly.colors import get_colorscale, sample_colorscale

    points = np.linspace(0.0, 1.0, 256).tolist()
    rgb = sample_colorscale(get_colorscale(name), points, colortype="tuple")
    return np.clip(np.rint(np.asarray(rgb) * 255), 0, 255).astype(np.uint8)


def tile_values(item: Float[Tensor, "query key"], tile: int) -> Float[Tensor, "tile tile"]:
    """A map resized to ``tile × tile`` for the grid: nearest neighbour when it grows (each entry a
    crisp block), area averaging when it shrinks (a thin line stays visible)."""
    image = item.float()[None, None]
    if item.shape[-1] <= tile:
        return F.interpolate(image, size=(tile, tile), mode="nearest-exact")[0, 0]
    return F.adaptive_avg_pool2d(image, tile)[0, 0]


def grid_image(maps: list[Tensor], *, columns: int, tile: int) -> np.ndarray:
    """The grid of ``maps`` as ``[height, width, 3]`` uint8 RGB: tiles of ``tile × tile`` in
    row-major order, ``min(columns, n)`` per row, :data:`GAP` white pixels between them. Each map is
    scaled by its own largest ``|a|``: a map without negative entries on the sequential scale of
    :mod:`attnlens.core.plots` (0 to its largest value), a signed one on its diverging scale centred
    on 0."""

    sequential, diverging = _colours(SEQUENTIAL), _colours(DIVERGING)
    used = min(columns, len(maps))
    rows = math.ceil(len(maps) / columns)
    canvas = np.full((rows * tile + (rows - 1) * GAP, used * tile + (used - 1) * GAP, 3), 255, np.uint8)
    for index, item in enumerate(maps):
        values = tile_values(item, tile).numpy()
        largest = float(np.abs(values).max()) or 1.0
        if bool((item < 0).any()):
            position = (values / largest + 1.0) / 2.0
            table = diverging
        else:
            position = values / largest
            table = sequential
        colour = table[np.clip(np.rint(position * 255), 0, 255).astype(np.int64)]
        top, left = (index // columns) * (tile + GAP), (index % columns) * (tile + GAP)
        canvas[top : top + tile, left : left + tile] = colour
    return canvas


def export_for_labelling(
    maps: Maps,
    path: str | os.PathLike,
    *,
    tokens: Sequence[Sequence[str]] | None = None,
    meta: pd.DataFrame | Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    suggested: Sequence[str] | np.ndarray | bool | None = None,
    columns: int = 10,
    tile: int = 64,
    overwrite: bool = False,
) -> Path:
    """Write ``maps`` to the folder ``path`` for labelling by hand (module docstring); returns
    the folder.

    ``maps``: ``[n, query, key]`` or a list of square maps of any lengths (from
    :func:`sample_maps`). ``tokens``: each map's token strings (optional). ``meta``: one row per
    map (a DataFrame, a dict of columns or a list of dicts), copied into ``labels.csv`` between
    ``column`` and ``suggested`` (e.g. example, layer, head, view). ``suggested``: a type name per
    map; None (default): the template classifier's type (:func:`attnlens.methods.patterns.classify`) when
    ``tokens`` are given, in the meta's ``view`` if it has one (else ``"effective"`` for maps with
    negative entries, ``"standard"`` otherwise), as a decoder's maps where the meta's ``causal``
    says so (:func:`sample_maps` writes it), left empty without tokens; False: empty.
    ``columns``: tiles per row of the grid; ``tile``: pixels per tile side.

    Files (each written atomically): ``maps.png``, the grid (:func:`grid_image`); ``labels.csv``,
    columns ``id, row, column, <meta>, suggested, label`` (``id``: the map's index; ``row`` /
    ``column``: its tile in the grid, from 0; ``label``: empty, to fill with names of
    :data:`~attnlens.methods.patterns.TYPES`); ``maps.safetensors``, the maps padded to the longest with
    their lengths (and tokens) in float32, for :func:`read_labelled`. A ``labels.csv`` that already holds a
    label is never replaced unless ``overwrite=True`` (``FileExistsError``)."""
    image_module = _pillow()
    items = as_map_list(maps)
    columns = whole_number(columns, "columns", " of tiles per row", minimum=1)
    tile = whole_number(tile, "tile", " of pixels", minimum=4)
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{folder} is a file; give a folder to write the maps to label into.")
    if (folder / LABELS).exists() and not overwrite and _filled(folder / LABELS):
        raise FileExistsError(
            f"{folder / LABELS} already holds labels; pass overwrite=True to replace it, or "
            "export to another folder."
        )
    frame = _meta_frame(meta, len(items))
    words = _check_tokens(tokens, items)
    suggestions = _suggestions(suggested, items, words, frame)

    ids = np.arange(len(items))
    table = pd.concat(
        [pd.DataFrame({"id": ids, "row": ids // columns, "column": ids % columns}), frame,
         pd.DataFrame({"suggested": suggestions, "label": [""] * len(items)})],
        axis=1,
    )
    longest = max(item.shape[-1] for item in items)
    padded = torch.zeros(len(items), longest, longest)
    for index, item in enumerate(items):
        padded[index, : item.shape[-1], : item.shape[-1]] = item.float()
    tensors = {"maps": padded, "lengths": torch.tensor([item.shape[-1] for item in items], dtype=torch.long)}
    metadata = {"format": FORMAT, "columns": str(columns),
                "tile": str(tile), "tokens": json.dumps(words)}
    png = io.BytesIO()
    image_module.fromarray(grid_image(items, columns=columns, tile=tile), "RGB").save(png, format="PNG")

    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / MAPS, safetensors_bytes(tensors, metadata))
    write_atomic(folder / GRID, png.getvalue())
    write_atomic(folder / LABELS, table.to_csv(index=False).encode())  # last: never a CSV without maps
    return folder


def read_labelled(
    path: str | os.PathLike, *, classes: Sequence[str] = TYPES
) -> tuple[list[Float[Tensor, "query key"]], list[str]]:
    """The labelled maps of a folder written by :func:`export_for_labelling`, after its
    ``labels.csv``'s ``label`` column was filled: ``(maps, labels)`` in ``id`` order, for
    :meth:`PatternCNN.fit`. Rows with an empty label are skipped; labels are matched to
    ``classes`` ignoring case and surrounding spaces; an unknown name is a ``ValueError`` naming
    its line and the valid names."""
    folder = Path(path)
    missing = [name for name in (LABELS, MAPS) if not (folder / name).is_file()]
    if missing:
        raise InputError(
            f"{folder} has no {' and no '.join(missing)}: give a folder written by export_for_labelling."
        )
    _, tensors = read_checked(folder / MAPS, what="labelling maps", format=FORMAT)
    maps, lengths = tensors.get("maps"), tensors.get("lengths")
    if maps is None or lengths is None or maps.ndim != 3 or lengths.shape != maps.shape[:1]:
        raise InputError(f"{folder / MAPS} does not hold padded maps with their lengths; export again.")
    table = _read_table(folder / LABELS)
    if not {"id", "label"} <= set(table.columns):
        raise InputError(
            f"{folder / LABELS} must keep its 'id' and 'label' columns (comma-separated); found "
            f"{list(table.columns)}."
        )
    names = {str(name).strip().lower(): str(name) for name in classes}
    out_maps: dict[int, Tensor] = {}
    out_labels: dict[int, str] = {}
    for row, (raw_id, raw_label) in enumerate(zip(table["id"], table["label"], strict=True)):
        line = row + 2  # the header is line 1
        label = raw_label.strip()
        if not label:
            continue
        try:
            index = int(raw_id)
        except ValueError:
            raise InputError(f"{folder / LABELS} line {line}: id {raw_id!r} is not a whole number.") from None
        if not 0 <= index < maps.shape[0]:
            raise InputError(f"{folder / LABELS} line {line}: id {index} is not one of the {maps.shape[0]} maps.")
        if label.lower() not in names:
            raise InputError(
                f"{folder / LABELS} line {line} (id {index}): label {label!r} is not a pattern type; "
                f"use one of {', '.join(names.values())} (or leave it empty to skip the map)."
            )
        if index in out_labels:
            raise InputError(f"{folder / LABELS} line {line}: id {index} is labelled twice.")
        length = int(lengths[index])
        out_maps[index] = maps[index, :length, :length].clone()
        out_labels[index] = names[label.lower()]
    order = sorted(out_labels)
    return [out_maps[i] for i in order], [out_labels[i] for i in order]
