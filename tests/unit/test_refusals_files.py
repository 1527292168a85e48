"""Refusals of files (issue 26, pattern 1): every metadata key of every kind of file attnlens
writes is covered by its checksum, so a file edited by hand is refused, naming the file and the
key; an old file (a checksum of its tensors only) still loads, with a warning."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from attnlens.errors import (
    AttnlensError,
    AttnlensWarning,
    DamagedFileError,
    FileFormatError,
    MissingFileError,
)
from tests import tiny


def read_header(path: Path) -> dict:
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + size])


def rewrite_header(path: Path, header: dict) -> None:
    """Replace a safetensors file's header as a person with a text editor would."""
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + size :])


def edited(value: str) -> str:
    """Another value of the same kind: a number changed, else a character appended (JSON that
    still parses, so only the checksum can tell)."""
    try:
        parsed = json.loads(value)
    except ValueError:
        return value + "x"
    if isinstance(parsed, bool) or parsed is None:
        return json.dumps(not parsed)
    if isinstance(parsed, int | float):
        return json.dumps(parsed * 10 + 7)
    return value + " "


def features(kind: str = "sequence", n: int = 6, key: str = "k"):
    from attnlens.evaluation.probing.features import Features

    generator = torch.Generator().manual_seed(0)
    lengths = torch.full((n,), 3, dtype=torch.long)
    vectors = torch.randn(3 * n, 3, 8, generator=generator).half()
    positions = torch.arange(3).repeat(n)
    n_words = torch.full((n,), 3, dtype=torch.long) if kind == "words" else torch.zeros(0, dtype=torch.long)
    return Features(vectors, lengths, positions, n_words, kind, 8, key)


@pytest.fixture(scope="module")
def bridge():
    return tiny.bert_bridge()


def _constants(folder: Path, bridge) -> tuple[Path, callable]:
    from attnlens import papa

    path = papa.fit(bridge, tiny.CORPUS[:4], max_len=12, progress=False).save(folder / "c.safetensors")
    return path, papa.load


def _checkpoint(folder: Path, bridge) -> tuple[Path, callable]:
    from attnlens import papa
    from attnlens.engine.checkpoints import read_checkpoint
    path = folder / "fit.ckpt"
    papa.fit(bridge, tiny.CORPUS[:4], max_len=12, progress=False, checkpoint=path)
    return path, read_checkpoint


def _features(folder: Path, bridge) -> tuple[Path, callable]:
    from attnlens.evaluation.probing.features import Features

    return features().save(folder / "f.safetensors"), Features.load


def _probe(folder: Path, bridge) -> tuple[Path, callable]:
    from attnlens.evaluation.probing.probe import PapaProbe

    probe = PapaProbe(epochs=1).fit(features(), [0, 1, 0, 1, 0, 1])
    return probe.save(folder / "p.safetensors"), PapaProbe.load


def _mlm_head(folder: Path, bridge) -> tuple[Path, callable]:
    from attnlens.evaluation.probing.mlm import MLMHead

    head = MLMHead(epochs=1).fit(features("masked"), 5)
    return head.save(folder / "h.safetensors"), MLMHead.load


def _pattern_cnn(folder: Path, bridge) -> tuple[Path, callable]:
    from attnlens.methods.patterns.cnn import PatternCNN

    generator = torch.Generator().manual_seed(0)
    maps = torch.softmax(torch.randn(8, 6, 6, generator=generator), -1)
    cnn = PatternCNN(size=8, classes=("diagonal", "vertical"), epochs=1).fit(maps, ["diagonal", "vertical"] * 4)
    return cnn.save(folder / "cnn.safetensors"), PatternCNN.load


def _linear_baseline(folder: Path, bridge) -> tuple[Path, callable]:
    from attnlens.evaluation.probing import LinearBaseline

    linear = LinearBaseline(grid=(0.1,)).fit(features(), [0, 1, 0, 1, 0, 1])
    return linear.save(folder / "linear.safetensors"), LinearBaseline.load


def _curve_point(folder: Path, bridge) -> tuple[Path, callable]:
    """A task's first point in a curve's checkpoint folder (its result and linear baseline)."""
    from attnlens.evaluation import points
    from attnlens.evaluation.probing import LinearBaseline, ProbeResult

    linear = LinearBaseline(grid=(0.1,)).fit(features(), [0, 1, 0, 1, 0, 1])
    result = ProbeResult(task="sst2", split="dev", metric="accuracy", score=0.5, majority=0.5,
                         predictions=["a", "b"], runs=[["a", "b"]], settings={"baseline_C": 0.1}, linear=linear)
    point = {"task": "sst2", "metric": "accuracy", "seconds": {"probe": 1.5}, "rank": 0,
             "columns": {"score": 0.5, "significant": False}, "runs": result.runs, "result": result}
    key = "0123456789abcdef" * 2
    return points.save(folder, key, point), lambda path: points.load(path.parent, key)


KINDS = {"constants": _constants, "checkpoint": _checkpoint, "features": _features, "probe": _probe,
         "mlm head": _mlm_head, "pattern cnn": _pattern_cnn, "linear baseline": _linear_baseline,
         "curve point": _curve_point}


@pytest.mark.parametrize("kind", KINDS)
def test_every_metadata_key_of_every_file_is_covered_by_its_checksum(kind, tmp_path, bridge):
    path, load = KINDS[kind](tmp_path, bridge)
    load(path)  # the file as written loads
    header = read_header(path)
    keys = [key for key in header["__metadata__"] if key != "checksum"]
    assert "format" in keys and len(keys) >= 2
    original = path.read_bytes()
    for key in keys:
        changed = json.loads(json.dumps(header))
        changed["__metadata__"][key] = edited(changed["__metadata__"][key])
        rewrite_header(path, changed)
        with pytest.raises(DamagedFileError) as info:
            load(path)
        message = str(info.value)
        assert str(path) in message and repr(key) in message, (key, message)
        assert info.value.keys == (key,) and isinstance(info.value, ValueError | AttnlensError)
        path.write_bytes(original)
    # a key added by hand, and a checksum edited by hand, are refused too
    for change in ("added", "checksum"):
        changed = json.loads(json.dumps(header))
        if change == "added":
            changed["__metadata__"]["note"] = "hello"
        else:
            changed["__metadata__"]["checksum"] = changed["__metadata__"]["checksum"].replace("a", "b", 1)
        rewrite_header(path, changed)
        with pytest.raises(DamagedFileError, match="note|checksum"):
            load(path)
        path.write_bytes(original)


def test_constants_whose_examples_were_edited_are_not_merged(tmp_path, bridge):
    """The issue's case: examples edited from 4 to 1000 would weight the file 250 times."""
    from attnlens.cli import main

    path, _ = _constants(tmp_path, bridge)
    header = read_header(path)
    assert json.loads(header["__metadata__"]["examples"]) == 4
    header["__metadata__"]["examples"] = "1000"
    rewrite_header(path, header)
    with pytest.raises(SystemExit) as info:
        main(["merge", str(path), str(path), "--out", str(tmp_path / "m.safetensors")])
    assert info.value.code == 2


def test_an_old_file_with_a_checksum_of_its_tensors_only_still_loads_with_a_warning(tmp_path, bridge):
    from attnlens import papa
    from attnlens.core.files import tensor_checksum

    path, _ = _constants(tmp_path, bridge)
    header = read_header(path)
    constants = papa.load(path)
    tensors = {name: getattr(constants, name) for name in ("sums", "squares", "pair_counts")}
    header["__metadata__"]["checksum"] = tensor_checksum(tensors)  # what attnlens 0.1 wrote
    rewrite_header(path, header)
    with pytest.warns(AttnlensWarning, match="older attnlens.*save it again"):
        again = papa.load(path)
    assert again.n_examples == constants.n_examples
    again.save(path)  # saving it again covers its metadata
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        papa.load(path)


def test_a_folder_or_a_missing_path_given_as_a_file_is_named(tmp_path):
    from attnlens import papa
    from attnlens.evaluation.probing.probe import PapaProbe

    with pytest.raises(FileFormatError, match=f"constants file {tmp_path} is a folder"):
        papa.load(tmp_path)
    with pytest.raises(MissingFileError, match="probe file .*nothing.safetensors does not exist"):
        PapaProbe.load(tmp_path / "nothing.safetensors")


def _with_a_nan(kind: str):
    """A fitted object of ``kind`` with one NaN in its first weight (or vector), and its loader:
    what a diverged fit would save, its checksum valid."""
    from attnlens.evaluation.probing.features import Features
    from attnlens.evaluation.probing.mlm import MLMHead
    from attnlens.evaluation.probing.probe import PapaProbe
    from attnlens.methods.patterns.cnn import PatternCNN

    if kind == "features":
        made = features()
        made.vectors[1, 2, 3] = float("nan")
        return made, Features.load
    if kind == "linear baseline":
        from attnlens.evaluation.probing import LinearBaseline

        made = LinearBaseline(grid=(0.1,)).fit(features(), [0, 1, 0, 1, 0, 1])
        made.model[-1].coef_[0, 3] = float("nan")
        return made, LinearBaseline.load
    if kind == "probe":
        made = PapaProbe(epochs=1).fit(features(), [0, 1, 0, 1, 0, 1])
    elif kind == "mlm head":
        made = MLMHead(epochs=1).fit(features("masked"), 5)
    else:
        generator = torch.Generator().manual_seed(0)
        maps = torch.softmax(torch.randn(8, 6, 6, generator=generator), -1)
        made = PatternCNN(size=8, classes=("diagonal", "vertical"), epochs=1).fit(maps, ["diagonal", "vertical"] * 4)
    with torch.no_grad():
        next(made.network.parameters()).view(-1)[3] = float("nan")
    return made, type(made).load


@pytest.mark.parametrize("kind", ["features", "probe", "mlm head", "pattern cnn", "linear baseline"])
def test_a_saved_non_finite_weight_is_refused_on_load(kind, tmp_path):
    """A file whose checksum holds but whose tensors hold a NaN (a diverged fit, saved) is
    refused on load with one error naming the file and the non-finite values, never loaded to
    give NaN predictions later (the loaders' ``checks.all_finite``)."""
    made, load = _with_a_nan(kind)
    path = made.save(tmp_path / "nan.safetensors")
    with pytest.raises(AttnlensError, match="non-finite") as info:
        load(path)
    assert str(path) in str(info.value)
