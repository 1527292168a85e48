"""PatternCNN: Kovaleva et al.'s small CNN on resized maps, trained on synthetic maps.

Held-out maps come from other seeds and other lengths than the training maps; per-class accuracy
is scikit-learn's recall per class (the share of each true class labelled correctly).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from sklearn.metrics import recall_score

from attnlens.methods.patterns import TYPES, PatternCNN, synthetic
from attnlens.methods.patterns.cnn import FORMAT
from tests.typechecks import unchecked

# most tests here need the `trained` fixture: a CNN trained on synthetic maps
pytestmark = pytest.mark.slow

HELD_OUT_LENGTHS = (24, 32, 48)


@pytest.fixture(scope="module")
def trained() -> PatternCNN:
    train = synthetic("all", 200, 32, seed=0)
    return PatternCNN().fit(train.maps, train.labels)


@pytest.fixture(scope="module")
def held_out() -> dict[int, object]:
    return {length: synthetic("all", 60, length, seed=1) for length in HELD_OUT_LENGTHS}


def per_class(truth, predicted) -> dict[str, float]:
    return dict(zip(TYPES, recall_score(truth, predicted, labels=list(TYPES), average=None), strict=True))


def test_labels_held_out_maps_of_other_lengths_and_seeds(trained, held_out):
    for length, maps in held_out.items():
        accuracy = per_class(maps.labels, trained.predict(maps.maps))
        assert min(accuracy.values()) >= 0.95, (length, accuracy)
    assert trained.score(held_out[32].maps, held_out[32].labels) >= 0.95


def test_a_list_of_maps_of_mixed_lengths_is_labelled_map_by_map(trained, held_out):
    maps = [m for length in HELD_OUT_LENGTHS for m in held_out[length].maps[::7]]
    together = trained.predict(maps)
    alone = [trained.predict(m[None])[0] for m in maps]
    assert list(together) == alone
    probabilities = trained.predict_proba([m.numpy() for m in maps])
    assert probabilities.shape == (len(maps), len(TYPES))
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, atol=1e-5)
    assert list(trained.classes_[probabilities.argmax(-1)]) == alone


def test_save_and_load_give_identical_predictions(trained, held_out, tmp_path):
    path = trained.save(tmp_path / "cnn.safetensors")
    loaded = PatternCNN.load(path)
    assert loaded.settings == trained.settings
    for maps in held_out.values():
        np.testing.assert_array_equal(loaded.predict(maps.maps), trained.predict(maps.maps))
        np.testing.assert_array_equal(loaded.predict_proba(maps.maps), trained.predict_proba(maps.maps))
        accuracy = per_class(maps.labels, loaded.predict(maps.maps))
        assert min(accuracy.values()) >= 0.95
    assert trained.save(tmp_path / "again.safetensors").read_bytes() == path.read_bytes()


def test_signed_and_rescaled_maps_are_read_as_row_distributions(trained, held_out):
    """Effective attention is signed: the CNN reads |a| / Σ|a| per row, so flipping signs or
    scaling a row does not change the label (and standard maps are unchanged by it)."""
    maps = held_out[32].maps[::5]
    signs = torch.where(torch.rand(maps.shape, generator=torch.Generator().manual_seed(0)) < 0.3, -1.0, 1.0)
    scale = torch.linspace(0.5, 3.0, maps.shape[-1])[None, :, None]
    np.testing.assert_array_equal(trained.predict(maps * signs * scale), trained.predict(maps))


def test_classify_batch_crops_each_example_and_gives_indices_into_types(trained, held_out):
    """A pass's [batch, head, query, key] maps with right and left padding: each example's real
    part is labelled as the map alone would be."""
    short, long = held_out[24].maps, held_out[32].maps
    n_heads, width = 3, 40
    pattern = torch.zeros(2, n_heads, width, width)
    key_mask = torch.zeros(2, width, dtype=torch.bool)
    pattern[0, :, :24, :24] = short[[0, 70, 140]]  # right padding
    key_mask[0, :24] = True
    pattern[1, :, 8:, 8:] = long[[10, 130, 250]]  # left padding
    key_mask[1, 8:] = True
    pattern[1, :, :8] = 0.25  # whatever sits in the padded rows is ignored
    labels = trained.classify_batch(pattern, key_mask, "standard")
    assert labels.dtype == torch.long and labels.shape == (2, n_heads)
    expected = [list(trained.predict(short[[0, 70, 140]])), list(trained.predict(long[[10, 130, 250]]))]
    assert [[TYPES[i] for i in row] for row in labels.tolist()] == expected
    assert torch.equal(trained.classify_batch(pattern, key_mask, "effective"), labels)


def test_the_same_seed_gives_the_same_weights_and_leaves_the_global_state():
    small = synthetic("all", 12, 16, seed=3)
    before = torch.get_rng_state()
    first = PatternCNN(epochs=2, seed=5).fit(small.maps, small.labels)
    assert torch.equal(torch.get_rng_state(), before)
    second = PatternCNN(epochs=2, seed=5).fit(list(small.maps), small.labels)
    other = PatternCNN(epochs=2, seed=6).fit(small.maps, small.labels)
    a, b, c = (model.network.state_dict() for model in (first, second, other))
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert not all(torch.equal(a[name], c[name]) for name in a)
    unaugmented = PatternCNN(epochs=2, seed=5, augment=False, class_weight="balanced")
    unaugmented.fit(small.maps, small.labels)
    again = PatternCNN(epochs=2, seed=5, augment=False, class_weight="balanced").fit(small.maps, small.labels)
    assert np.array_equal(unaugmented.predict_proba(small.maps), again.predict_proba(small.maps))


def test_custom_classes_train_and_predict_by_name():
    maps = synthetic("vertical", 10, 16, seed=0).maps.tolist() + synthetic("diagonal", 10, 16, seed=0).maps.tolist()
    labels = ["columns"] * 10 + ["band"] * 10
    cnn = PatternCNN(classes=["columns", "band"], epochs=3).fit([np.asarray(m) for m in maps], labels)
    assert set(cnn.predict(torch.tensor(maps))) <= {"columns", "band"}
    with pytest.raises(ValueError, match="not pattern types"):
        cnn.classify_batch(torch.tensor(maps)[None, :2], torch.ones(1, 16, dtype=torch.bool))


# -- bad inputs ----------------------------------------------------------------------------------


def test_an_unfitted_cnn_refuses_to_predict_or_save(tmp_path):
    maps = synthetic("diagonal", 2, 16).maps
    cnn = PatternCNN()
    for call in (lambda: cnn.predict(maps), lambda: cnn.predict_proba(maps),
                 lambda: cnn.save(tmp_path / "x.safetensors"),
                 lambda: cnn.classify_batch(maps[None], torch.ones(1, 16, dtype=torch.bool))):
        with pytest.raises(RuntimeError, match="not fitted"):
            call()


def test_unknown_labels_and_wrong_counts_are_refused():
    small = synthetic("all", 2, 16)
    with pytest.raises(ValueError, match=r"'verticle' of map 3 is not one of the classes vertical"):
        PatternCNN(epochs=1).fit(small.maps, small.labels[:3] + ["verticle"] + small.labels[4:])
    with pytest.raises(ValueError, match="9 labels for 10 maps"):
        PatternCNN(epochs=1).fit(small.maps, small.labels[:9])
    with unchecked(), pytest.raises(TypeError, match="list of type names"):
        PatternCNN(epochs=1).fit(small.maps, "vertical")


def test_maps_of_the_wrong_shape_or_values_are_refused(trained):
    good = synthetic("block", 3, 16).maps
    with unchecked():
        with pytest.raises(ValueError, match=r"for one map pass map\[None\]"):
            trained.predict(good[0])
        with pytest.raises(ValueError, match="must be"):
            trained.predict(good[None])
        with pytest.raises(ValueError, match=r"maps\[1\] must be a square"):
            trained.predict([good[0], good[1][:, :10]])
        with pytest.raises(TypeError, match="must hold floats"):
            trained.predict(torch.ones(2, 5, 5, dtype=torch.long))
        with pytest.raises(ValueError, match="empty"):
            trained.predict([])
        with pytest.raises(ValueError, match="do not match"):
            trained.classify_batch(good[None], torch.ones(1, 12, dtype=torch.bool))
    bad = good.clone()
    bad[1, 2, 3] = float("nan")
    with pytest.raises(ValueError, match=r"maps\[1\] holds NaN"):
        trained.predict(bad)
    with pytest.raises(ValueError, match="Unknown view"):
        trained.classify_batch(good[None], torch.ones(1, 16, dtype=torch.bool), "constant")


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="size must be at least 8"):
        PatternCNN(size=4)
    with pytest.raises(ValueError, match="class_weight"):
        PatternCNN(class_weight="equal")
    with pytest.raises(ValueError, match="2 distinct"):
        PatternCNN(classes=["vertical", "vertical"])
    with pytest.raises(ValueError, match="lr must"):
        PatternCNN(lr=0.0)


def test_damaged_foreign_and_other_version_files_are_refused(trained, tmp_path):
    path = trained.save(tmp_path / "cnn.safetensors")
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    damaged = tmp_path / "damaged.safetensors"
    damaged.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="damaged"):
        PatternCNN.load(damaged)
    text = tmp_path / "notes.safetensors"
    text.write_text("not a model")
    with pytest.raises(ValueError, match="cannot be read"):
        PatternCNN.load(text)
    foreign = tmp_path / "foreign.safetensors"
    save_file({"x": torch.zeros(2)}, str(foreign), metadata={"format": "attnlens.PapaProbe/1"})
    with pytest.raises(ValueError, match="not an attnlens PatternCNN file"):
        PatternCNN.load(foreign)
    newer = tmp_path / "newer.safetensors"
    save_file({"x": torch.zeros(2)}, str(newer), metadata={"format": "attnlens.PatternCNN/2"})
    with pytest.raises(ValueError, match=r"format 'attnlens.PatternCNN/2'.*reads 'attnlens.PatternCNN/1'"):
        PatternCNN.load(newer)
    with pytest.raises(ValueError, match="does not exist"):
        PatternCNN.load(tmp_path / "missing.safetensors")
    # the right format and checksum, but tensors of another network
    from attnlens.core.files import safetensors_bytes, tensor_checksum

    tensors = {"out.weight": torch.zeros(5, 3)}
    settings = json.dumps({"size": 32, "classes": list(TYPES)})
    other = tmp_path / "other.safetensors"
    other.write_bytes(safetensors_bytes(tensors, {"format": FORMAT, "settings": settings, "widths": "[8, 8]",
                                                  "checksum": tensor_checksum(tensors)}))
    with pytest.raises(ValueError, match="does not describe a PatternCNN"):
        PatternCNN.load(other)
