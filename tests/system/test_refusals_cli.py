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


def refused(argv: list[str], capsys) -> str:
    """The one line on stderr of ``attnlens ARGV`` run in this process, which exits with status 2."""
    from attnlens.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2, (argv, err)
    assert err.startswith("attnlens: error: ") and "\n" not in err, err
    return err


@pytest.fixture()
def no_model(monkeypatch):
    """A test's commands must refuse before the model is loaded."""
    from attnlens.cli.jobs import common

    monkeypatch.setattr(common, "load", lambda *a, **k: pytest.fail("the model was loaded"))


def sst2_folder(folder: Path) -> Path:
    """A data folder holding SST-2's train and dev splits (four sentences each), nothing else."""
    rows = "sentence\tlabel\na good film .\t1\na bad film .\t0\nfine acting .\t1\ndull plot .\t0\n"
    (folder / "sst2").mkdir(parents=True)
    for split in ("train", "dev"):
        (folder / "sst2" / f"{split}.tsv").write_text(rows, encoding="utf-8")
    return folder


def test_curve_fractions_outside_0_to_1_or_repeated_are_refused_before_the_model_loads(tmp_path, capsys, no_model):
    """A share of heads above 1, below 0 or not finite, or one given twice (a repeated row of the
    curve, one more test in Holm's adjustment of the others), is refused naming --fractions."""
    constants = tmp_path / "c.safetensors"
    constants.write_bytes(b"")
    for fractions, expected in [("0,1.5", "1.5 is not a share of heads"), ("0,-0.5", "-0.5 is not a share"),
                                ("0,nan", "nan is not a share"), ("inf,1", "inf is not a share"),
                                ("0,0.5,.50,1", "gives 0.5 more than once")]:
        err = refused(["curve", "--constants", str(constants), "--task", "sst2", "--fractions", fractions,
                       "--out", str(tmp_path / "c.csv"), "--quiet"], capsys)
        assert f"--fractions {fractions}" in err and expected in err, err


def test_a_task_whose_data_cannot_be_read_is_refused_before_the_model_loads(tmp_path, capsys, no_model, corpus):
    """curve, compare and table read every --task's train and dev splits before the model loads
    (they were refused after a pass over the corpus or a fit), in the command line's words:
    --data-dir, not the Python argument data_dir."""
    data = sst2_folder(tmp_path / "data")
    constants = tmp_path / "c.safetensors"
    constants.write_bytes(b"")
    common = ["--data-dir", str(data), "--quiet"]
    for argv in (["curve", "--constants", str(constants), "--task", "sst2", "--task", "mnli",
                  "--out", str(tmp_path / "c.csv")],
                 ["compare", "--corpus", str(corpus), "--task", "mnli", "--out", str(tmp_path / "r.html")],
                 ["table", "--constants", str(constants), "--task", "mnli", "--out", str(tmp_path / "t.html")]):
        err = refused([*argv, *common], capsys)
        assert f"MNLI train file not found: {data / 'mnli' / 'train.tsv'}" in err, err
        assert "pass a --data-dir that holds mnli/train.tsv (or no --data-dir for the Hugging Face hub)" in err
        assert "data_dir" not in err
    (data / "sst2" / "dev.tsv").unlink()
    err = refused(["curve", "--constants", str(constants), "--task", "sst2", "--out", str(tmp_path / "c.csv"),
                   *common], capsys)
    assert f"SST-2 dev file not found: {data / 'sst2' / 'dev.tsv'}" in err, err


def test_types_refuses_a_max_len_other_than_the_constants(tmp_path, bert_folder, corpus, whole, capsys,
                                                         monkeypatch):
    """The papa view reads the texts at its constants' max_len (16 here): another --max-len was
    silently ignored; it is refused before the model loads, as compare refuses it. Theirs runs."""
    from attnlens.cli.jobs import common

    argv = ["types", "--model", str(bert_folder), "--corpus", str(corpus), "--views", "standard,papa",
            "--constants", str(whole), "--out", str(tmp_path / "t.html"), "--quiet"]
    with monkeypatch.context() as patch:
        patch.setattr(common, "load", lambda *a, **k: pytest.fail("the model was loaded"))
        err = refused([*argv, "--max-len", "8"], capsys)
    assert f"--max-len 8: the PAPA constants {whole} were fitted with max_len 16; give --max-len 16" in err, err
    assert here([*argv, "--max-len", "16"]) == 0
    assert (tmp_path / "t.csv").is_file()


def test_importance_with_a_task_refuses_corpus_and_n_examples(tmp_path, capsys, no_model):
    """With --task the importance is measured on the task's training examples: --corpus (even a
    missing file) and --n-examples were silently ignored."""
    base = ["importance", "--task", "sst2", "--out", str(tmp_path / "i.html"), "--quiet"]
    err = refused([*base, "--corpus", "/nonexistent.txt"], capsys)
    assert "--corpus /nonexistent.txt would be unused: with --task sst2" in err, err
    err = refused([*base, "--n-examples", "3"], capsys)
    assert "--n-examples 3 would be unused" in err and "--limit gives how many" in err, err


def test_curve_combine_refuses_every_option_of_a_run(tmp_path, capsys, no_model):
    """--combine runs nothing: --fractions, --strategy, --seeds, --baselines, --eval-limit, --model
    ... were silently ignored (the input CSV came out unchanged); each given other than its
    default is named."""
    part = tmp_path / "sst2.csv"
    part.write_text("not a curve\n", encoding="utf-8")
    base = ["curve", "--combine", str(part), "--out", str(tmp_path / "c.csv"), "--quiet"]
    err = refused([*base, "--fractions", "0,0.5"], capsys)
    assert "--combine runs nothing: --fractions would be unused; drop it" in err, err
    err = refused([*base, "--model", "gpt2", "--strategy", "random", "--seeds", "7", "--baselines", "uniform",
                   "--eval-limit", "3", "--batch-size", "4"], capsys)
    assert ("--combine runs nothing: --model, --strategy, --baselines, --seeds, --batch-size, --eval-limit "
            "would be unused; drop them") in err, err
    err = refused([*base, "--seeds", "3", "--fractions", "0,0.5,0.875,0.9375,1"], capsys)  # the defaults: read on
    assert f"--combine: {part} is not the CSV of a curve" in err, err


def test_curve_checkpoint_under_a_file_is_refused_before_the_model_loads(tmp_path, capsys, no_model):
    """A --checkpoint folder under a file (or where nothing can be made) was accepted: the run
    trained its first point, then died writing it."""
    constants, afile = tmp_path / "c.safetensors", tmp_path / "afile"
    constants.write_bytes(b"")
    afile.write_text("a file", encoding="utf-8")
    base = ["curve", "--constants", str(constants), "--task", "sst2", "--out", str(tmp_path / "c.csv"), "--quiet"]
    err = refused([*base, "--checkpoint", str(afile / "ck")], capsys)
    assert f"--checkpoint {afile / 'ck'} cannot be made: {afile} is a file, not a folder" in err, err
    if Path("/proc/self").is_dir():
        err = refused([*base, "--checkpoint", "/proc/ck"], capsys)
        assert "--checkpoint /proc/ck cannot be made: creating a file in /proc failed" in err, err


def test_curve_fit_wikitext_fits_with_the_batch_size(tmp_path, capsys, monkeypatch):
    """--fit-wikitext passed no batch size to the fit (its default, 32, whatever --batch-size said)."""
    from attnlens.cli.jobs import common
    from attnlens.cli.jobs import curve as job

    data = sst2_folder(tmp_path / "data")
    (data / "wikitext2").mkdir()
    (data / "wikitext2" / "valid.txt").write_text(" = Title = \n a paragraph of words .\n", encoding="utf-8")
    given = {}

    def fit(model, texts, **options):
        given.update(options, texts=texts)
        raise common.UsageError("stopped after the fit was called")

    monkeypatch.setattr(common, "load", lambda *a, **k: object())
    monkeypatch.setattr(job.fitting, "fit", fit)
    err = refused(["curve", "--fit-wikitext", "--data-dir", str(data), "--task", "sst2", "--batch-size", "5",
                   "--out", str(tmp_path / "c.csv"), "--quiet"], capsys)
    assert "stopped after the fit was called" in err
    assert given["batch_size"] == 5 and given["texts"] == ["a paragraph of words ."]


def test_merge_refuses_one_file_given_twice(tmp_path, whole, capsys):
    """The same file twice, even spelled differently, doubled every count of the merge."""
    other = whole.parent / ".." / whole.parent.name / whole.name
    out = tmp_path / "m.safetensors"
    err = refused(["merge", str(whole), str(other), "--out", str(out)], capsys)
    assert f"input {other} is the same file as input {whole}" in err and "give each file once" in err, err
    assert not out.exists()


#: merge whose write is interrupted by SIGTERM once its temporary file is written (at its fsync)
TERMINATED = """
import os, signal, sys
from attnlens.cli import main
fsync = os.fsync
def terminated(descriptor):
    os.kill(os.getpid(), signal.SIGTERM)
    fsync(descriptor)
os.fsync = terminated
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_while_an_output_is_written_leaves_no_temporary_file(tmp_path, whole):
    """SIGTERM (timeout, Slurm, docker stop) killed the command in write_atomic: the
    `.m.safetensors.XXXX.tmp` it was writing stayed, forever. It interrupts as Ctrl-C does now:
    one line, status 130, the temporary removed, nothing written."""
    out = tmp_path / "out" / "m.safetensors"
    done = subprocess.run([sys.executable, "-c", TERMINATED, "merge", str(whole), "--out", str(out)], env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 130, (done.returncode, done.stderr)
    assert done.stderr.strip() == "attnlens: error: interrupted; signal SIGTERM"
    assert list(out.parent.iterdir()) == []
