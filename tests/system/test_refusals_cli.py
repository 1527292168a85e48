"""Refusals and promises of the command line (issue 26): an interrupt saves what it promises
(pattern 5), an empty fraction list is refused (pattern 6), a CSV that loses rows is refused
(pattern 4)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}

#: runs the CLI; with SIGNAL set, the process sends itself that signal during its third batch
SIGNALLED = """
import os, signal, sys
from attnlens.methods.papa import fitting
from attnlens.cli import main
name = os.environ.get("SIGNAL")
if name:
    commit, seen = fitting.PatternSums.end_batch, []
    def signalled(self, batch):
        seen.append(1)
        if len(seen) == 3:
            os.kill(os.getpid(), getattr(signal, name))  # arrives in the middle of the batch
        commit(self, batch)
    fitting.PatternSums.end_batch = signalled
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory) -> Path:
    from tests import tiny

    folder = tmp_path_factory.mktemp("models") / "bert"
    tiny.tiny_bert().save_pretrained(folder)
    tiny.bert_tokenizer().save_pretrained(folder)
    return folder


def write_corpus(folder: Path) -> Path:
    from tests import tiny

    path = folder / "tiny.txt"
    path.write_text("\n".join(tiny.CORPUS) + "\n", encoding="utf-8")
    return path


@pytest.fixture()
def corpus(tmp_path) -> Path:
    return write_corpus(tmp_path)


def cli(argv: list[str], signal_name: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SIGNALLED, *argv], env={**ENV, "SIGNAL": signal_name},
                          capture_output=True, text=True, timeout=300)


def here(argv: list[str]) -> int:
    """The CLI in this process (one thread, as :func:`cli`'s): what needs no signal needs no
    process start."""
    from attnlens.cli import main

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return main(argv)
    finally:
        torch.set_num_threads(threads)


def fit_argv(bert_folder: Path, corpus: Path) -> list[str]:
    return ["fit-papa", "--model", str(bert_folder), "--corpus", str(corpus), "--max-len", "16",
            "--batch-size", "2", "--quiet"]


@pytest.fixture(scope="module")
def whole(tmp_path_factory, bert_folder) -> Path:
    """The uninterrupted fit, run once for both signals (its own copy of the corpus: the
    constants do not record the corpus's path)."""
    folder = tmp_path_factory.mktemp("whole")
    assert here([*fit_argv(bert_folder, write_corpus(folder)), "--out", str(folder / "whole.safetensors")]) == 0
    return folder / "whole.safetensors"


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_a_signal_mid_batch_writes_the_checkpoint_it_promises_and_resumes_bit_identically(
    signal_name, tmp_path, bert_folder, corpus, whole
):
    from attnlens import papa

    argv = fit_argv(bert_folder, corpus)

    checkpoint, resumed = tmp_path / "ck.safetensors", tmp_path / "resumed.safetensors"
    argv += ["--checkpoint", str(checkpoint), "--checkpoint-every", "100000", "--out", str(resumed)]
    interrupted = cli(argv, signal_name)
    assert interrupted.returncode == 130, interrupted.stderr
    assert "run the same command again to resume" in interrupted.stderr
    assert checkpoint.is_file() and not resumed.exists()  # the promise holds
    assert papa.load(checkpoint).n_examples == 6  # the batch the signal came in is kept

    assert here(argv) == 0  # resumed in this process: the checkpoint is all it shares with the first
    expected, got = papa.load(whole), papa.load(resumed)
    assert (got.n_examples, got.n_tokens) == (expected.n_examples, expected.n_tokens)
    for name in ("sums", "squares", "pair_counts"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name


def test_an_empty_fraction_list_is_refused(tmp_path, bert_folder, capsys):
    from attnlens.cli import main

    constants = tmp_path / "c.safetensors"
    constants.write_bytes(b"")
    for fractions in (",", "", " , "):
        with pytest.raises(SystemExit) as info:
            main(["curve", "--model", str(bert_folder), "--constants", str(constants), "--task", "sst2", "--fractions", fractions,
                  "--out", str(tmp_path / "c.html")])
        assert info.value.code == 2
        assert f"--fractions {fractions!r} holds no fraction" in capsys.readouterr().err


def test_a_csv_corpus_with_an_unclosed_quote_is_refused_naming_the_row(tmp_path, capsys):
    from attnlens.cli import main

    rows = [f"sentence number {i} is here." for i in range(100)]
    rows[7] = '"an unclosed quote opens row 7, and swallows the rest'
    path = tmp_path / "corpus.csv"
    path.write_text("text\n" + "\n".join(rows) + "\n", encoding="utf-8")
    with pytest.raises(SystemExit) as info:
        main(["fit-papa", "--corpus", str(path), "--out", str(tmp_path / "c.safetensors"), "--quiet"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "row 7" in err or "line 9" in err, err
    assert "quote" in err
