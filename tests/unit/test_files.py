"""Files attnlens writes: one atomic writer, reproducible bytes, checkpoints that cannot mix."""

from __future__ import annotations

import hashlib
import os
import signal

import pytest
import torch

from attnlens import papa
from attnlens.core import files
from attnlens.engine import passes
from attnlens.engine.checkpoints import read_checkpoint, save_checkpoint
from tests import interrupts, tiny


@pytest.fixture(scope="module")
def bert():
    return tiny.bert_bridge()


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_equal_fits_give_equal_files(bert, tmp_path):
    first = papa.fit(bert, tiny.CORPUS, max_len=16, progress=False).save(tmp_path / "a.safetensors")
    second = papa.fit(bert, tiny.CORPUS, max_len=16, progress=False).save(tmp_path / "b.safetensors")
    assert digest(first) == digest(second)
    assert torch.equal(papa.load(first).sums, papa.load(second).sums)


def test_the_writer_replaces_a_symlink_not_its_target(tmp_path):
    target = tmp_path / "unrelated.txt"
    target.write_text("keep me", encoding="utf-8")
    link = tmp_path / "report.html"
    link.symlink_to(target)
    files.write_atomic(link, b"<html></html>")
    assert target.read_text(encoding="utf-8") == "keep me"
    assert not link.is_symlink() and link.read_bytes() == b"<html></html>"


def test_the_writer_refuses_a_read_only_file_unless_asked(tmp_path):
    path = tmp_path / "out.safetensors"
    path.write_bytes(b"old")
    path.chmod(0o444)  # refused by its mode bits, also for root (whom os.access lets write)
    with pytest.raises(PermissionError, match="read-only"):
        files.write_atomic(path, b"new")
    files.write_atomic(path, b"new", overwrite_read_only=True)
    assert path.read_bytes() == b"new"


def test_leftover_temporaries_are_removed_and_never_taken_for_results(tmp_path):
    path = tmp_path / "fit.safetensors"
    leftover = tmp_path / ".fit.safetensors.abc123.tmp"
    leftover.write_bytes(b"half a file")
    assert files.clean_temporaries(path) == 1 and not leftover.exists()
    assert not path.exists()
    # a name with glob's brackets: its own leftover goes, another file's stays
    bracketed = tmp_path / "run[1].safetensors"
    own, other = tmp_path / ".run[1].safetensors.x1.tmp", tmp_path / ".run1.safetensors.x2.tmp"
    own.write_bytes(b"half"), other.write_bytes(b"another writer's")
    assert files.clean_temporaries(bracketed) == 1 and not own.exists() and other.exists()


def test_a_checkpoint_refuses_another_corpus(bert, tmp_path):
    checkpoint = tmp_path / "fit.safetensors"
    papa.fit(bert, tiny.CORPUS[:8], max_len=16, batch_size=4, progress=False, checkpoint=checkpoint)
    other = ["a different text ."] + list(tiny.CORPUS[1:12])
    with pytest.raises(ValueError, match="written for another corpus: the first 8 examples"):
        papa.fit(bert, other, max_len=16, batch_size=4, progress=False, checkpoint=checkpoint)
    # by length, a longer corpus that starts the same resumes: the checkpoint goes back to the
    # start of the window it ended in, which the longer corpus fills, and equals a fresh fit
    extended = papa.fit(bert, tiny.CORPUS[:12], max_len=16, batch_size=4, progress=False, checkpoint=checkpoint)
    fresh = papa.fit(bert, tiny.CORPUS[:12], max_len=16, batch_size=4, progress=False)
    assert extended.n_examples == 12 and torch.equal(extended.sums, fresh.sums)
    assert torch.equal(extended.squares, fresh.squares) and torch.equal(extended.pair_counts, fresh.pair_counts)
    # in corpus order, a finished checkpoint resumed with a longer corpus that starts the same continues it
    ordered = tmp_path / "ordered.safetensors"
    kwargs = dict(max_len=16, batch_size=4, progress=False, by_length=False)
    papa.fit(bert, tiny.CORPUS[:8], checkpoint=ordered, **kwargs)
    longer = papa.fit(bert, tiny.CORPUS[:12], checkpoint=ordered, **kwargs)
    whole = papa.fit(bert, tiny.CORPUS[:12], **kwargs)
    assert longer.n_examples == 12 and torch.equal(longer.sums, whole.sums)


def test_a_checkpoint_refuses_other_settings(bert, tmp_path):
    checkpoint = tmp_path / "fit.safetensors"
    papa.fit(bert, tiny.CORPUS[:8], max_len=16, batch_size=4, progress=False, checkpoint=checkpoint)
    with pytest.raises(ValueError, match="batch_size 4 \\(now 2\\)"):
        papa.fit(bert, tiny.CORPUS, max_len=16, batch_size=2, progress=False, checkpoint=checkpoint)


def test_sigterm_saves_the_checkpoint_like_ctrl_c(bert, tmp_path, monkeypatch):
    """``timeout``, Slurm and ``docker stop`` send SIGTERM: the pass finishes the batch it is
    running, saves what it did, then stops; the same call resumes to the uninterrupted result."""
    checkpoint = tmp_path / "fit.safetensors"
    before = signal.getsignal(signal.SIGTERM)
    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        interrupts.at_batch(patch, 3, interrupts.send(signal.SIGTERM))  # during the third batch
        papa.fit(bert, tiny.CORPUS, max_len=16, batch_size=4, progress=False,
                 checkpoint=checkpoint, checkpoint_every=100)
    assert signal.getsignal(signal.SIGTERM) is before, "the handler is put back"
    assert papa.load(checkpoint).n_examples == 12
    resumed = papa.fit(bert, tiny.CORPUS, max_len=16, batch_size=4, progress=False, checkpoint=checkpoint)
    whole = papa.fit(bert, tiny.CORPUS, max_len=16, batch_size=4, progress=False)
    assert torch.equal(resumed.sums, whole.sums) and resumed.metadata == whole.metadata


def test_a_second_signal_during_the_save_waits_for_it(bert, tmp_path, monkeypatch):
    """Ctrl-C, then another Ctrl-C while the interrupt-time checkpoint is being written: the
    write finishes (the second signal waits for it), and the run stops with a checkpoint that
    resumes to the uninterrupted result."""
    checkpoint = tmp_path / "fit.safetensors"
    original = save_checkpoint
    calls = []

    def save_interrupted(*args, **kwargs):
        calls.append(1)
        os.kill(os.getpid(), signal.SIGINT)  # arrives while the checkpoint is written
        return original(*args, **kwargs)

    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(passes, "save_checkpoint", save_interrupted)
        interrupts.at_batch(patch, 3, interrupts.send(signal.SIGINT))  # during the third batch
        papa.fit(bert, tiny.CORPUS, max_len=16, batch_size=4, progress=False,
                 checkpoint=checkpoint, checkpoint_every=100)
    assert calls == [1] and papa.load(checkpoint).n_examples == 12
    resumed = papa.fit(bert, tiny.CORPUS, max_len=16, batch_size=4, progress=False, checkpoint=checkpoint)
    whole = papa.fit(bert, tiny.CORPUS, max_len=16, batch_size=4, progress=False)
    assert torch.equal(resumed.sums, whole.sums)


def test_a_pass_checkpoint_holds_every_accumulator(bert, tmp_path):
    from attnlens.methods.stats import Statistics

    checkpoint = tmp_path / "pass.safetensors"
    stats = Statistics(2, 4, "standard")
    summary = passes.run(bert, tiny.CORPUS, [stats], max_len=16, progress=False, checkpoint=checkpoint)
    meta, tensors = read_checkpoint(checkpoint)
    assert meta["counts"]["examples"] == summary.n_examples == len(tiny.CORPUS)
    assert torch.equal(tensors["statistics.standard/counts"], stats.statistics.counts)
    again = Statistics(2, 4, "standard")
    passes.run(bert, tiny.CORPUS, [again], max_len=16, progress=False, checkpoint=checkpoint)
    for name, value in stats.result().items():  # restored from the finished checkpoint
        assert torch.equal(again.result()[name], value), name
    with pytest.raises(ValueError, match="not an attnlens checkpoint"):
        read_checkpoint(papa.fit(bert, tiny.CORPUS, max_len=16, progress=False).save(tmp_path / "c.safetensors"))


def test_the_tensor_checksum_is_sha256_of_the_definition():
    """tensor_checksum hashes each tensor's bytes in place; the digest is the one of its
    definition (name, dtype, shape, then a copy of the bytes, in name order), so files
    written before keep verifying. Non-contiguous, empty and 0-d tensors included."""
    tensors = {"b": torch.arange(12, dtype=torch.float16).reshape(3, 4).T, "a": torch.zeros(0, 5),
               "c": torch.tensor(7, dtype=torch.long), "d": torch.rand(2, 3, dtype=torch.bfloat16)}
    expected = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        expected.update(f"{name}|{tensor.dtype}|{list(tensor.shape)}|".encode())
        expected.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    assert files.tensor_checksum(tensors) == f"sha256:{expected.hexdigest()}"


def test_a_saved_file_has_one_checksum_whatever_the_caller_passes(tmp_path):
    """safetensors_bytes computes the file's checksum itself: a stale one given with the
    metadata changes nothing, and the file verifies."""
    tensors = {"x": torch.rand(4, 3)}
    given = files.safetensors_bytes(tensors, {"format": "t/1", "checksum": "sha256:stale"})
    assert given == files.safetensors_bytes(tensors, {"format": "t/1"})
    path = files.write_atomic(tmp_path / "x.safetensors", given)
    metadata, read = files.read_checked(path, what="test", format="t/1")
    assert torch.equal(read["x"], tensors["x"]) and metadata["checksum"].startswith(files.CHECKSUM_PREFIX)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_all_finite_is_isfinite_all(dtype):
    """checks.all_finite (one aminmax) against torch.isfinite(...).all(): a NaN or an infinity
    of either sign anywhere, in a tensor long enough for vectorised lanes; empty and integer
    tensors are finite."""
    from attnlens.core.checks import all_finite

    clean = torch.randn(1000, 7, 3).to(dtype)
    assert all_finite(clean) and bool(torch.isfinite(clean).all())
    for bad in (float("nan"), float("inf"), float("-inf")):
        for index in (0, 1, 17, 4097, clean.numel() - 1):
            tensor = clean.clone()
            tensor.view(-1)[index] = bad
            assert all_finite(tensor) is False and not bool(torch.isfinite(tensor).all())
    assert all_finite(torch.zeros(0, dtype=dtype)) and all_finite(torch.arange(5))
