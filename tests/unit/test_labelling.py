"""Maps to label by hand: sample_maps, export_for_labelling (grid PNG, CSV, maps) and read_labelled.

The PNG is checked by its bytes (signature, chunk CRCs with zlib, the IHDR size, the inflated
scanlines) and its pixels against plotly's colour scales; sampled maps against the model's own
``run_with_cache`` patterns and the NumPy effective-attention loop.
"""

from __future__ import annotations

import struct
import sys
import zlib

import einops
import numpy as np
import pandas as pd
import pytest
import torch
from plotly.colors import get_colorscale, sample_colorscale

import attnlens
from attnlens.methods.patterns import (
    PatternCNN,
    classify,
    export_for_labelling,
    read_labelled,
    sample_maps,
    synthetic,
)
from attnlens.methods.patterns.labelling import GAP
from tests import tiny
from tests.typechecks import unchecked

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def maps_to_label():
    """Eleven synthetic maps of two lengths, with their tokens, types and meta."""
    short, long = synthetic("all", 1, 16, seed=0), synthetic("all", 1, 24, seed=1)
    maps = [*short.maps, *long.maps, short.maps[1]]
    tokens = short.tokens + long.tokens + [short.tokens[1]]
    truth = short.labels + long.labels + [short.labels[1]]
    meta = pd.DataFrame({"example": range(11), "layer": [i % 3 for i in range(11)],
                         "head": [i % 4 for i in range(11)], "view": "standard"})
    return maps, tokens, truth, meta


def png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """(type, payload) of each chunk, every CRC checked with zlib."""
    assert data[:8] == PNG_SIGNATURE
    chunks, offset = [], 8
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind, payload = data[offset + 4 : offset + 8], data[offset + 8 : offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length : offset + 12 + length])
        assert zlib.crc32(kind + payload) == crc, kind
        chunks.append((kind, payload))
        offset += 12 + length
    return chunks


def colour(scale: str, position: float) -> np.ndarray:
    return np.asarray(sample_colorscale(get_colorscale(scale), [position], colortype="tuple")[0]) * 255


def test_export_writes_a_grid_a_csv_and_the_maps(maps_to_label, tmp_path):
    maps, tokens, truth, meta = maps_to_label
    folder = export_for_labelling(maps, tmp_path / "label", tokens=tokens, meta=meta, columns=4, tile=32)
    assert sorted(p.name for p in folder.iterdir()) == ["labels.csv", "maps.png", "maps.safetensors"]
    table = pd.read_csv(folder / "labels.csv", dtype=str, keep_default_na=False)
    assert list(table.columns) == ["id", "row", "column", "example", "layer", "head", "view", "suggested", "label"]
    assert table["id"].astype(int).tolist() == list(range(11))
    assert table["row"].astype(int).tolist() == [i // 4 for i in range(11)]
    assert table["column"].astype(int).tolist() == [i % 4 for i in range(11)]
    assert table["layer"].astype(int).tolist() == meta["layer"].tolist()
    assert set(table["label"]) == {""}
    suggested = [str(classify(m, tokens=t).names[0, 0]) for m, t in zip(maps, tokens, strict=True)]
    assert table["suggested"].tolist() == suggested
    assert sum(s == t for s, t in zip(suggested, truth, strict=True)) >= 9  # the templates mostly agree

    given = export_for_labelling(maps, tmp_path / "given", suggested=truth, columns=20)
    table = pd.read_csv(given / "labels.csv", dtype=str, keep_default_na=False)
    assert list(table.columns) == ["id", "row", "column", "suggested", "label"]
    assert table["suggested"].tolist() == truth and set(table["row"]) == {"0"}
    table = pd.read_csv(export_for_labelling(maps, tmp_path / "none", tokens=tokens, suggested=False) / "labels.csv",
                        dtype=str, keep_default_na=False)
    assert set(table["suggested"]) == {""}


def decoder_map(n: int = 12) -> torch.Tensor:
    """A decoder's map (each query sees the keys up to itself): 0.3 on the first token, 0.65 on
    the previous and own tokens, the rest spread: vertical+diagonal by an encoder's chance, not
    by a decoder's, which counts the visible keys only."""
    pattern = torch.zeros(n, n)
    for query in range(n):
        band = [key for key in (query - 1, query) if key >= 0]
        rest = [key for key in range(1, query + 1) if key not in band]
        pattern[query, 0] += 0.3
        pattern[query, band] += 0.65 / len(band)
        pattern[query, rest or band[-1:]] += 0.05 / max(len(rest), 1)
    return pattern / pattern.sum(-1, keepdim=True)


def test_a_decoders_maps_are_suggested_a_type_as_a_decoders(tmp_path):
    """sample_maps says whether the model is a decoder (meta's ``causal``), and the suggestions
    classify such maps with a decoder's chance (they were classified as an encoder's)."""
    item, words = decoder_map(), ["<s>"] + [f"w{i}" for i in range(1, 12)]
    as_decoder, as_encoder = (str(classify(item, tokens=words, causal=causal).names[0, 0]) for causal in (True, False))
    assert as_decoder != as_encoder
    for causal, expected in ((True, as_decoder), (False, as_encoder)):
        folder = export_for_labelling([item], tmp_path / str(causal), tokens=[words],
                                      meta=pd.DataFrame({"view": ["standard"], "causal": [causal]}))
        assert pd.read_csv(folder / "labels.csv")["suggested"].tolist() == [expected]
    *_, meta = sample_maps(tiny.gpt2_bridge(), ["a short text", "another one"], n=3, max_len=16)
    assert meta["causal"].tolist() == [True] * 3


def test_the_grid_is_a_png_of_tiles_in_row_major_order(maps_to_label, tmp_path):
    from PIL import Image

    maps, *_ = maps_to_label
    signed = maps[0].clone()
    signed[0, 0], signed[0, 1] = -2.0, 0.0  # the most negative entry: the diverging scale's low end
    maps = [*maps[:10], signed]
    tile, columns = 32, 4
    folder = export_for_labelling(maps, tmp_path, columns=columns, tile=tile)
    data = (folder / "maps.png").read_bytes()
    chunks = png_chunks(data)
    width, height, depth, colour_type = struct.unpack(">IIBB", chunks[0][1][:10])
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    assert (width, height) == (4 * tile + 3 * GAP, 3 * tile + 2 * GAP)
    assert (depth, colour_type) == (8, 2)  # 8-bit RGB
    scanlines = zlib.decompress(b"".join(payload for kind, payload in chunks if kind == b"IDAT"))
    assert len(scanlines) == height * (1 + 3 * width)  # a filter byte per row

    pixels = np.asarray(Image.open(folder / "maps.png").convert("RGB")).astype(float)
    assert pixels.shape == (height, width, 3)
    assert (pixels[:, tile : tile + GAP] == 255).all() and (pixels[tile : tile + GAP] == 255).all()
    assert (pixels[2 * (tile + GAP) :, 3 * (tile + GAP) :] == 255).all()  # the empty last tile
    for index in (0, 5, 9):  # lengths 16 (each entry a 2 × 2 block) and 24
        item = maps[index].numpy()
        top, left = (index // columns) * (tile + GAP), (index % columns) * (tile + GAP)
        n = item.shape[0]
        for i, j in ((0, 0), (3, 7), (n - 1, n - 2), (5, 5)):
            y, x = top + int((i + 0.5) * tile / n), left + int((j + 0.5) * tile / n)
            expected = colour("Viridis", item[i, j] / item.max())
            assert np.abs(pixels[y, x] - expected).max() <= 2.0, (index, i, j)
    top, left = 2 * (tile + GAP), 2 * (tile + GAP)
    assert np.abs(pixels[top, left] - colour("RdBu_r", 0.0)).max() <= 2.0
    assert np.abs(pixels[top, left + 2] - colour("RdBu_r", 0.5)).max() <= 2.0  # 0: the centre


def test_read_labelled_round_trips_the_filled_labels(maps_to_label, tmp_path):
    maps, tokens, truth, meta = maps_to_label
    folder = export_for_labelling(maps, tmp_path, tokens=tokens, meta=meta)
    table = pd.read_csv(folder / "labels.csv", dtype=str, keep_default_na=False)
    filled = [0, 3, 4, 7, 10]
    for index in filled:
        table.loc[index, "label"] = truth[index]
    table.loc[3, "label"] = "  Block "  # case and spaces are forgiven
    table.to_csv(folder / "labels.csv", index=False)
    got_maps, got_labels = read_labelled(folder)
    assert got_labels == [truth[i] for i in filled]
    assert len(got_maps) == len(filled)
    for got, index in zip(got_maps, filled, strict=True):
        assert torch.equal(got, maps[index])
    cnn = PatternCNN(epochs=1).fit(got_maps, got_labels)  # ready for the CNN as they are
    assert len(cnn.predict(got_maps)) == len(filled)

    table.loc[7, "label"] = "diagnal"
    table.to_csv(folder / "labels.csv", index=False)
    with pytest.raises(ValueError, match=r"line 9 \(id 7\): label 'diagnal' is not a pattern type; use one of vertical, diagonal"):
        read_labelled(folder)


def test_a_filled_labels_file_is_never_overwritten_by_accident(maps_to_label, tmp_path):
    maps, tokens, truth, meta = maps_to_label
    folder = export_for_labelling(maps, tmp_path, meta=meta)
    export_for_labelling(maps, tmp_path, meta=meta)  # nothing labelled yet: replaced
    table = pd.read_csv(folder / "labels.csv", dtype=str, keep_default_na=False)
    table.loc[2, "label"] = "vertical"
    table.to_csv(folder / "labels.csv", index=False)
    before = (folder / "labels.csv").read_bytes()
    with pytest.raises(FileExistsError, match="already holds labels; pass overwrite=True"):
        export_for_labelling(maps, tmp_path, meta=meta)
    assert (folder / "labels.csv").read_bytes() == before
    export_for_labelling(maps, tmp_path, meta=meta, overwrite=True)
    assert read_labelled(folder) == ([], [])


def test_bad_exports_and_folders_are_refused(maps_to_label, tmp_path, monkeypatch):
    maps, tokens, truth, meta = maps_to_label
    with pytest.raises(ValueError, match="meta has 3 rows for 11 maps"):
        export_for_labelling(maps, tmp_path / "a", meta=meta[:3])
    with pytest.raises(ValueError, match=r"meta columns \['label'\] clash"):
        export_for_labelling(maps, tmp_path / "a", meta=meta.assign(label="x"))
    with pytest.raises(ValueError, match=r"tokens\[0\] has 24 tokens but map 0 is 16"):
        export_for_labelling(maps, tmp_path / "a", tokens=[tokens[5]] + tokens[1:])
    with unchecked(), pytest.raises(ValueError, match="suggested must be one type name per map"):
        export_for_labelling(maps, tmp_path / "a", suggested=["vertical"])
    with pytest.raises(ValueError, match="map 2 cannot be classified in the standard view"):
        export_for_labelling([*maps[:2], maps[2] * 2, *maps[3:]], tmp_path / "a", tokens=tokens)
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        export_for_labelling(maps, tmp_path / "file")
    with pytest.raises(ValueError, match="has no labels.csv and no maps.safetensors"):
        read_labelled(tmp_path / "a")
    assert not (tmp_path / "a").exists()  # nothing written by a refused export

    folder = export_for_labelling(maps, tmp_path / "b")
    data = bytearray((folder / "maps.safetensors").read_bytes())
    data[-5] ^= 0xFF
    (folder / "maps.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="damaged"):
        read_labelled(folder)

    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ImportError, match=r'pip install "attnlens\[labelling\]"'):
        export_for_labelling(maps, tmp_path / "c")


# -- sample_maps on a tiny model ------------------------------------------------------------------


@pytest.fixture(scope="module")
def bert():
    return tiny.bert_bridge()


TEXTS = tiny.CORPUS[:4]


def own_maps(model, text: str, layer: int, max_len: int):
    """The model's own pattern, values and token strings of one example, cropped to its real tokens."""
    batch = attnlens.tokenize(model, [text], max_len=max_len, layout="padded")  # sample_maps' default
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.input_ids, **batch.model_kwargs())
    valid = batch.attention_mask[0].bool()
    pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
    v = einops.rearrange(cache[f"blocks.{layer}.attn.hook_v"], "b k h d -> b h k d")
    tokens = model.tokenizer.convert_ids_to_tokens(batch.input_ids[0][valid].tolist())
    return pattern, v, valid, tokens


def test_sample_maps_are_the_models_own_patterns(bert):
    maps, tokens, meta = sample_maps(bert, TEXTS, n=12, seed=3, max_len=32, batch_size=3)
    n_layers, n_heads = bert.cfg.n_layers, bert.cfg.n_heads
    assert list(meta.columns) == ["example", "layer", "head", "view", "length", "causal"]
    triples = list(zip(meta["example"], meta["layer"], meta["head"], strict=True))
    assert len(set(triples)) == 12 and triples == sorted(triples)
    assert all(0 <= e < len(TEXTS) and 0 <= la < n_layers and 0 <= h < n_heads for e, la, h in triples)
    for item, words, (example, layer, head) in zip(maps, tokens, triples, strict=True):
        pattern, _, valid, expected_tokens = own_maps(bert, TEXTS[example], layer, 32)
        torch.testing.assert_close(item, pattern[0, head][valid][:, valid], atol=1e-5, rtol=0)
        assert words == expected_tokens and item.shape[-1] == len(words)
    again = sample_maps(bert, TEXTS, n=12, seed=3, max_len=32, batch_size=3)  # the same batches: bit for bit
    assert again[2].equals(meta) and all(torch.equal(a, b) for a, b in zip(again[0], maps, strict=True))
    assert not sample_maps(bert, TEXTS, n=12, seed=4, max_len=32)[2].equals(meta)


def test_sample_maps_of_effective_attention_match_the_loop(bert, tmp_path):
    from attnlens.methods.effective.reference import effective_attention_loop

    maps, tokens, meta = sample_maps(bert, TEXTS, n=6, view="effective", seed=0, max_len=32)
    assert set(meta["view"]) == {"effective"}
    assert max(meta["length"]) > bert.cfg.d_head  # longer than d_head: A⊥ differs from A
    differs = False
    for item, row in zip(maps, meta.itertuples(), strict=True):
        pattern, v, valid, _ = own_maps(bert, TEXTS[row.example], row.layer, 32)
        expected = torch.from_numpy(effective_attention_loop(pattern, v, valid[None]))[0, row.head]
        torch.testing.assert_close(item.double(), expected[valid][:, valid], atol=1e-4, rtol=0)
        differs |= bool((item - pattern[0, row.head][valid][:, valid]).abs().max() > 1e-3)
    assert differs
    folder = export_for_labelling(maps, tmp_path, tokens=tokens, meta=meta)  # suggested in the effective view
    table = pd.read_csv(folder / "labels.csv", dtype=str, keep_default_na=False)
    assert table["view"].tolist() == ["effective"] * 6 and all(table["suggested"])


def test_sample_maps_refuses_what_it_cannot_sample(bert):
    with pytest.raises(ValueError, match="n=40 maps asked, but 1 examples × 2 layers × 4 heads have only 8"):
        sample_maps(bert, TEXTS[:1], n=40)
    with pytest.raises(ValueError, match="Unknown view"):
        sample_maps(bert, TEXTS, view="papa")
    with pytest.raises(ValueError, match="empty"):
        sample_maps(bert, [])
