"""The attnlens command line, end to end on the default model, and its one-line errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnlens.core.corpus import default_corpus
from tests.conftest import required

ROOT = Path(__file__).resolve().parents[2]
#: this checkout first on the path: the console script runs this code, not an installed copy's
ENV = {**os.environ, "HF_HUB_OFFLINE": "1",
       "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}


def attnlens_command() -> list[str]:
    """The installed console script if there is one, else ``python -m attnlens.cli``."""
    script = Path(sys.executable).with_name("attnlens")
    if script.exists():
        return [str(script)]
    found = shutil.which("attnlens")
    return [found] if found else [sys.executable, "-m", "attnlens.cli"]


def run(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*attnlens_command(), *args], cwd=cwd, env=ENV, capture_output=True, text=True,
        timeout=timeout,
    )


def run_here(*args: str, cwd: Path, capsys, monkeypatch) -> subprocess.CompletedProcess:
    """``attnlens ARGS`` in this process (:func:`attnlens.cli.main`, as the console script calls
    it): its exit status, stdout and stderr, as :func:`run` returns them, without a process's
    start and imports (the tests of what only a process shows, its entry point and its help,
    use :func:`run`)."""
    from attnlens.cli import main

    monkeypatch.chdir(cwd)
    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exit_info:
        code = exit_info.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, out, err)


@pytest.fixture()
def small_corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(default_corpus(4)) + "\n", encoding="utf-8")
    return path


@pytest.mark.slow
def test_fit_papa_then_compare_end_to_end(tmp_path, small_corpus, capsys, monkeypatch):
    """fit-papa (in this process), then compare through the console script: its constants file
    is what the next command reads."""
    constants = tmp_path / "out" / "constants.safetensors"
    fitted = run_here(
        "fit-papa", "--corpus", str(small_corpus), "--max-len", "36", "--out", str(constants),
        cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch,
    )
    assert fitted.returncode == 0, fitted.stderr
    assert constants.is_file()
    assert "papa.fit" in fitted.stderr  # progress bar on the corpus pass
    assert f"wrote constants: {constants.resolve()}" in fitted.stdout

    report, table = tmp_path / "report.html", tmp_path / "comparison.json"
    compared = run(
        "compare", "--corpus", str(small_corpus), "--views", "standard,papa,effective",
        "--constants", str(constants), "--json", str(table), "--out", str(report), cwd=tmp_path,
    )
    assert compared.returncode == 0, compared.stderr
    assert "compare (standard, papa, effective)" in compared.stderr  # progress bar
    assert f"wrote report: {report.resolve()}" in compared.stdout
    html = report.read_text(encoding="utf-8")
    assert "Plotly.newPlot" in html and "plotly.js v" in html
    data = json.loads(table.read_text(encoding="utf-8"))
    assert len(data["table"]) == 3 * 72 and data["max_len"] == 36
    assert "papa: mean distance from standard" in compared.stdout


def _one_line_error(process: subprocess.CompletedProcess) -> str:
    assert process.returncode != 0
    lines = [line for line in process.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, process.stderr
    assert lines[0].startswith("attnlens: error: ")
    assert "Traceback" not in process.stderr
    return lines[0]


def test_unknown_view(tmp_path):
    line = _one_line_error(run("compare", "--views", "standard,attn", "--out", "r.html", cwd=tmp_path))
    assert "Unknown view 'attn'" in line and "'standard', 'papa', 'effective'" in line
    assert not (tmp_path / "r.html").exists()


def test_missing_corpus_file(tmp_path):
    line = _one_line_error(run("compare", "--corpus", "missing.txt", "--out", "r.html", cwd=tmp_path))
    assert "corpus file not found: missing.txt" in line


def test_empty_corpus(tmp_path, capsys, monkeypatch):
    (tmp_path / "empty.txt").write_text("\n  \n\n", encoding="utf-8")
    here = dict(cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch)
    line = _one_line_error(run_here("fit-papa", "--corpus", "empty.txt", "--out", "c.safetensors", **here))
    assert "empty" in line and "empty.txt" in line
    line = _one_line_error(run_here("compare", "--corpus", "empty.txt", "--out", "r.html", **here))
    assert "empty" in line


def test_other_bad_input_in_process(tmp_path, capsys):
    from attnlens.cli import main

    a_file = tmp_path / "constants.safetensors"
    a_file.write_bytes(b"")
    cases = [
        (["compare", "--out", str(tmp_path / "r.txt")], "should end in .html"),
        (["fit-papa", "--corpus", "default"], "required: --out"),
        (["compare", "--n-examples", "0"], "positive integer"),
        (["compare", "--views", ",", "--out", "r.html"], "--views is empty"),
        (["compare", "--constants", str(tmp_path / "no.safetensors")], "constants file not found"),
        (["curve", "--constants", str(a_file), "--task", "sst2", "--checkpoint", str(a_file),
          "--out", str(tmp_path / "c.html")],
         f"--checkpoint {a_file} is a file; give a folder"),
        (["nonsense"], "invalid choice"),
    ]
    for argv, expected in cases:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("attnlens: error: ") and "\n" not in err, err
        assert expected in err, (argv, err)


def test_constants_without_the_papa_view_are_refused(tmp_path, capsys):
    """--constants only feed the papa view: without it they would be silently unused."""
    from attnlens.cli import main

    constants = tmp_path / "c.safetensors"
    constants.write_bytes(b"not read: refused before")
    report = tmp_path / "r.html"
    with pytest.raises(SystemExit) as exit_info:
        main([
            "compare", "--views", "standard,effective", "--constants", str(constants),
            "--out", str(report), "--quiet",
        ])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnlens: error: ") and "\n" not in err, err
    assert f"--constants {constants} would be unused" in err
    assert "--views standard,effective has no papa view" in err
    assert "add papa to --views" in err and "drop --constants" in err
    assert not report.exists()


def test_bad_output_paths_are_refused_before_the_model_is_loaded(tmp_path, capsys, monkeypatch):
    """An --out or --json under a regular file, or naming a folder, is one line, exit 2, before
    the model is loaded (so before any pass over the corpus), and nothing is written."""
    from attnlens import cli
    from attnlens.cli.jobs import common

    def no_load(*args, **kwargs):
        pytest.fail("the model was loaded before the bad output path was refused")

    monkeypatch.setattr(common, "load", no_load)
    afile, folder, report = tmp_path / "afile", tmp_path / "folder", tmp_path / "r.html"
    afile.write_text("not a folder", encoding="utf-8")
    folder.mkdir()
    cases = [
        (["fit-papa", "--out", str(afile / "c.safetensors")], f"--out {afile / 'c.safetensors'}"),
        (["fit-papa", "--out", str(afile / "x" / "c.safetensors")], f"--out {afile / 'x' / 'c.safetensors'}"),
        (["compare", "--out", str(afile / "r.html")], f"--out {afile / 'r.html'}"),
        (["compare", "--out", str(report), "--json", str(afile / "x.json")], f"--json {afile / 'x.json'}"),
    ]
    for argv, option in cases:
        with pytest.raises(SystemExit) as exit_info:
            cli.main([*argv, "--quiet"])
        assert exit_info.value.code == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("attnlens: error: ") and "\n" not in err, err
        assert option in err and f"cannot be written: {afile} is a file, not a folder" in err, err
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["compare", "--out", str(report), "--json", str(folder), "--quiet"])
    assert exit_info.value.code == 2
    assert f"--json {folder} is a folder; give a file name" in capsys.readouterr().err
    assert not report.exists() and afile.read_text(encoding="utf-8") == "not a folder"


def test_outputs_never_overwrite_an_input_or_another_output(tmp_path, capsys, monkeypatch):
    """--json must end in .json and, like --out, not be the corpus, the constants or the report
    (through a link or another spelling): refused before the model is loaded, nothing written."""
    from attnlens import cli
    from attnlens.cli.jobs import common

    monkeypatch.setattr(common, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    for name in ("texts.json", "texts.html", "c.json"):
        (tmp_path / name).write_text("the quick brown fox .\n", encoding="utf-8")
    (tmp_path / "r.html").write_text("report", encoding="utf-8")
    (tmp_path / "link.json").symlink_to(tmp_path / "r.html")
    cases = [
        (["--out", "r.html", "--json", "r.html"], "--json r.html should end in .json"),
        (["--out", "r.html", "--json", "link.json"], "--json link.json is the same file as --out r.html"),
        (["--corpus", "texts.json", "--out", "r.html", "--json", "sub/../texts.json"],
         "--json sub/../texts.json is the same file as --corpus texts.json"),
        (["--corpus", "texts.html", "--out", str(tmp_path / "texts.html")],
         f"--out {tmp_path / 'texts.html'} is the same file as --corpus texts.html"),
        (["--constants", "c.json", "--out", "r.html", "--json", "c.json"],
         "--json c.json is the same file as --constants c.json"),
    ]
    for argv, expected in cases:
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["compare", *argv, "--quiet"])
        assert exit_info.value.code == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("attnlens: error: ") and "\n" not in err, err
        assert expected in err, (argv, err)
        assert "would overwrite it; give --" in err or "should end in" in err, err
    assert (tmp_path / "r.html").read_text(encoding="utf-8") == "report"
    for name in ("texts.json", "texts.html", "c.json"):
        assert (tmp_path / name).read_text(encoding="utf-8") == "the quick brown fox .\n"


def test_an_output_folder_that_cannot_be_written_is_refused_before_the_model_is_loaded(
    tmp_path, capsys, monkeypatch
):
    """Creating a file is tried before any work (os.access says yes to root even in /proc)."""
    from attnlens import cli
    from attnlens.cli.jobs import common

    if not Path("/proc/self").is_dir():
        required("/proc", "a folder where no file can be made, even as root (Linux has it)")

    monkeypatch.setattr(common, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    for argv in (
        ["fit-papa", "--out", "/proc/attnlens-new/c.safetensors"],
        ["fit-papa", "--out", str(tmp_path / "c.safetensors"), "--checkpoint", "/proc/ck"],
        ["compare", "--out", "/proc/r.html"],
        ["compare", "--out", str(tmp_path / "r.html"), "--json", "/proc/r.json"],
    ):
        with pytest.raises(SystemExit) as exit_info:
            cli.main([*argv, "--quiet"])
        assert exit_info.value.code == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("attnlens: error: ") and "\n" not in err, err
        path = next(arg for arg in argv if arg.startswith("/proc/"))
        option = argv[argv.index(path) - 1]
        assert f"{option} {path} cannot be written: creating a file in /proc" in err, err
        assert err.endswith("choose another path") and ".tmp" not in err, err
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_options_are_checked_before_the_model_is_loaded(tmp_path, capsys, monkeypatch):
    from attnlens import cli
    from attnlens.cli.jobs import common

    monkeypatch.setattr(common, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    out = tmp_path / "c.safetensors"
    cases = [
        (["--checkpoint-every", "3"], "--checkpoint-every 3 would be unused without --checkpoint"),
        (["--checkpoint", str(out)], f"--checkpoint {out} is the same file as --out {out}"),
        (["--checkpoint", str(tmp_path)], f"--checkpoint {tmp_path} is a folder"),
    ]
    for argv, expected in cases:
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["fit-papa", "--out", str(out), *argv, "--quiet"])
        assert exit_info.value.code == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("attnlens: error: ") and "\n" not in err, err
        assert expected in err, (argv, err)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """Folders holding a tiny BERT (an encoder) and a tiny GPT-2 (a decoder), for --model."""
    from tests import tiny

    root = tmp_path_factory.mktemp("models")
    for name, model, tokenizer in [
        ("bert", tiny.tiny_bert(), tiny.bert_tokenizer()),
        ("gpt2", tiny.tiny_gpt2(), tiny.gpt2_tokenizer()),
    ]:
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return {"bert": root / "bert", "gpt2": root / "gpt2"}


@pytest.fixture()
def tiny_corpus(tmp_path) -> Path:
    from tests import tiny

    path = tmp_path / "tiny.txt"
    path.write_text("\n".join(tiny.CORPUS) + "\n", encoding="utf-8")
    return path


def test_fit_papa_layout_defaults_to_the_models(tmp_path, tiny_models, tiny_corpus):
    """A decoder has no [CLS]/[SEP] to fix in place: its default layout is padded (as compare
    fits it), an encoder's stays papa; --layout still chooses."""
    from attnlens import papa
    from attnlens.cli import main

    for model, argv, layout in [
        ("gpt2", [], "padded"), ("bert", [], "papa"), ("bert", ["--layout", "padded"], "padded"),
    ]:
        out = tmp_path / f"{model}-{layout}.safetensors"
        assert main([
            "fit-papa", "--model", str(tiny_models[model]), "--corpus", str(tiny_corpus),
            "--max-len", "16", "--quiet", "--out", str(out), *argv,
        ]) == 0
        assert papa.load(out).layout == layout


def test_compare_checks_max_len_in_the_layout_it_fits(tmp_path, tiny_models, tiny_corpus, capsys):
    """compare fits a decoder's constants in the padded layout, so --max-len 2 is fine on GPT-2;
    on BERT the papa layout needs 3."""
    from attnlens.cli import main

    argv = ["compare", "--corpus", str(tiny_corpus), "--max-len", "2", "--quiet"]
    table = tmp_path / "g.json"
    assert main([
        *argv, "--model", str(tiny_models["gpt2"]), "--out", str(tmp_path / "g.html"),
        "--json", str(table),
    ]) == 0
    assert json.loads(table.read_text(encoding="utf-8"))["max_len"] == 2
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--model", str(tiny_models["bert"]), "--out", str(tmp_path / "b.html")])
    assert exit_info.value.code == 2
    assert "'papa' layout: single sentences need max_len >= 3" in capsys.readouterr().err


def test_fit_papa_checkpoint_resumes_an_interrupted_fit(
    tmp_path, tiny_models, tiny_corpus, monkeypatch, capsys
):
    """Interrupted after 5 of 8 batches with --checkpoint-every 2, the checkpoint holds 4 batches;
    the same command again fits only the other 4 and gives the uninterrupted fit's constants."""
    import torch

    from attnlens import papa
    from attnlens.cli import main
    from attnlens.methods.papa import fitting

    argv = [
        "fit-papa", "--model", str(tiny_models["bert"]), "--corpus", str(tiny_corpus),
        "--max-len", "16", "--batch-size", "2", "--quiet",
    ]
    whole = tmp_path / "whole.safetensors"
    assert main([*argv, "--out", str(whole)]) == 0

    checkpoint, resumed = tmp_path / "ck" / "fit.safetensors", tmp_path / "resumed.safetensors"
    argv += ["--checkpoint", str(checkpoint), "--checkpoint-every", "2", "--out", str(resumed)]
    commit, batches = fitting.PatternSums.end_batch, []

    def commit_until_the_fifth_batch(self, batch):
        batches.append(batch)
        if len(batches) == 5:
            raise KeyboardInterrupt
        commit(self, batch)

    monkeypatch.setattr(fitting.PatternSums, "end_batch", commit_until_the_fifth_batch)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 130
    err = capsys.readouterr().err.strip()
    assert err == (
        "attnlens: error: interrupted; run the same command again to resume from "
        f"--checkpoint {checkpoint}"
    )
    assert papa.load(checkpoint).n_examples == 8 and not resumed.exists()

    batches.clear()
    assert main(argv) == 0
    assert len(batches) == 4  # the 8 examples in the checkpoint are skipped
    expected, got = papa.load(whole), papa.load(resumed)
    assert (got.n_examples, got.n_tokens) == (expected.n_examples, expected.n_tokens) == (16, got.n_tokens)
    for name in ("sums", "squares", "pair_counts"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name


@pytest.mark.slow
def test_json_in_a_missing_folder_is_written(tmp_path, small_corpus, capsys, monkeypatch):
    """--json creates its folders, as --out does, instead of failing after the pass."""
    table = tmp_path / "new" / "deeper" / "comparison.json"
    compared = run_here(
        "compare", "--corpus", str(small_corpus), "--views", "standard", "--n-examples", "1",
        "--max-len", "16", "--json", str(table), "--out", str(tmp_path / "r.html"), "--quiet",
        cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch,
    )
    assert compared.returncode == 0, compared.stderr
    data = json.loads(table.read_text(encoding="utf-8"))
    assert len(data["table"]) == 72 and data["max_len"] == 16


@pytest.mark.slow
def test_max_len_beyond_the_position_embeddings(tmp_path, small_corpus, minilm, capsys, monkeypatch):
    """MiniLM has 512 positions: --max-len 600 is one line naming both numbers, exit 2, before
    the pass over the corpus (no papa.fit bar, no traceback, no constants written); 512 works."""
    positions = minilm.original_model.config.max_position_embeddings
    assert positions == 512
    out = tmp_path / "c.safetensors"
    here = dict(cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch)
    line = _one_line_error(run_here(
        "fit-papa", "--corpus", str(small_corpus), "--max-len", "600", "--out", str(out), "--quiet", **here,
    ))
    assert "max_len=600" in line and "max_position_embeddings=512" in line
    assert "use max_len=512 or less" in line
    assert not out.exists()
    compared = run_here(
        "compare", "--corpus", str(small_corpus), "--views", "standard", "--max-len", "512",
        "--n-examples", "1", "--out", str(tmp_path / "r.html"), "--quiet", **here,
    )
    assert compared.returncode == 0, compared.stderr
    assert compared.stderr == ""  # --quiet: no bars at all, the weight loading's included


# -- corpora ------------------------------------------------------------------------------------


def test_default_corpus_is_embedded_prose():
    from attnlens.core.corpus import PROJECT_SENTENCES

    texts = default_corpus()
    assert texts == default_corpus()  # deterministic
    assert len(texts) > 200 and len(set(texts)) == len(texts)
    assert texts[: len(PROJECT_SENTENCES)] == list(PROJECT_SENTENCES)
    assert all(isinstance(t, str) and t[0].isupper() for t in texts)
    assert not any("::=" in t or ">>>" in t or "\n" in t for t in texts)
    assert default_corpus(5) == texts[:5]


def test_read_corpus_formats_and_errors(tmp_path):
    from attnlens.core.corpus import CorpusError, read_corpus, resolve_corpus

    (tmp_path / "a.txt").write_text("first text\n\n  second text  \n", encoding="utf-8")
    assert read_corpus(tmp_path / "a.txt") == ["first text", "second text"]
    (tmp_path / "b.tsv").write_text("label\tsentence\n1\tgood film\n0\tbad film\n", encoding="utf-8")
    assert read_corpus(tmp_path / "b.tsv") == ["good film", "bad film"]
    (tmp_path / "c.csv").write_text('text,label\n"a, b",1\n', encoding="utf-8")
    assert read_corpus(tmp_path / "c.csv") == ["a, b"]
    (tmp_path / "d.txt").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(CorpusError, match="not UTF-8"):
        read_corpus(tmp_path / "d.txt")
    with pytest.raises(CorpusError, match="folder"):
        read_corpus(tmp_path)
    assert resolve_corpus("default") == default_corpus()
    assert resolve_corpus(["x"]) == ["x"]


def test_read_corpus_keeps_line_breaks_in_quoted_cells_and_splits_on_line_breaks_only(tmp_path):
    """A quoted CSV cell spanning lines keeps its line break; texts and TSV rows end only at
    \\n, \\r\\n or \\r, not at the other characters str.splitlines splits on."""
    from attnlens.core.corpus import read_corpus

    (tmp_path / "m.csv").write_bytes(b'text,label\n"first line\nsecond line",1\r\n"plain",0\n')
    assert read_corpus(tmp_path / "m.csv") == ["first line\nsecond line", "plain"]
    (tmp_path / "m.tsv").write_bytes("label\tsentence\r\n1\tgood\x0cfilm\r0\tbad\u2028film\n".encode())
    assert read_corpus(tmp_path / "m.tsv") == ["good\x0cfilm", "bad\u2028film"]
    inner = "\x0b \x0c \x1c \x1d \x1e \x85 \u2028 \u2029"
    text = f"one {inner} still one\r\ntwo\rthree\nfour {inner} end\n"
    (tmp_path / "m.txt").write_bytes(text.encode("utf-8"))
    assert read_corpus(tmp_path / "m.txt") == [f"one {inner} still one", "two", "three", f"four {inner} end"]


# -- a fast --help, --device, --example, --focus ------------------------------------------------

#: what the command line must not import before a subcommand runs (each costs 0.1 s to seconds)
HEAVY = ("torch", "transformers", "transformer_lens", "plotly", "pandas")


def test_the_parser_imports_no_heavy_module():
    """``import attnlens.cli`` and building (and using) the parser, in a fresh interpreter, leave
    torch, transformers, TransformerLens, plotly and pandas unimported: --help stays fast."""
    code = (
        "import sys, contextlib, io\n"
        "import attnlens.cli\n"
        "parser = attnlens.cli.build_parser()\n"
        "for argv in (['--help'], ['compare', '--help'], ['--version']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "        parser.parse_args(argv)\n"
        f"print(sorted(name for name in {HEAVY!r} if name in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=ENV, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout
    # the reference: importing a name that needs torch does import it (the check can fail)
    code = "import sys, attnlens; attnlens.Batch; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=ENV, timeout=120, cwd=ROOT)
    assert result.stdout.strip() == "True", result.stderr


def test_help_and_version_run(tmp_path):
    helped = run("--help", cwd=tmp_path)
    assert helped.returncode == 0 and "compare" in helped.stdout and "fit-papa" in helped.stdout
    versioned = run("--version", cwd=tmp_path)
    assert versioned.returncode == 0 and versioned.stdout.startswith("attnlens ")
    compare_help = run("compare", "--help", cwd=tmp_path)
    for option in ("--device", "--example", "--focus"):
        assert option in compare_help.stdout


def test_every_public_name_still_resolves():
    """``attnlens/__init__.py`` imports lazily: every name of ``__all__`` (and ``dir``) resolves
    to the object of its home module (``attnlens.compare``: the function of ``attnlens.comparison.run``)."""
    import importlib

    import attnlens

    for name in attnlens.__all__:
        value = getattr(attnlens, name)
        assert value is not None, name
        assert name in dir(attnlens), name
    assert attnlens.load is importlib.import_module("attnlens.core.loading").load
    assert attnlens.Batch is importlib.import_module("attnlens.core.inputs").Batch
    assert attnlens.Comparison is importlib.import_module("attnlens.comparison.result").Comparison
    assert attnlens.compare is importlib.import_module("attnlens.comparison.run").compare
    assert attnlens.papa.PapaConstants is not None
    namespace: dict = {}
    exec("from attnlens import *", namespace)
    assert {"load", "tokenize", "Comparison", "papa"} <= set(namespace)
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        attnlens.nonsense  # noqa: B018


def test_example_out_of_range_is_refused_before_the_model_is_loaded(tmp_path, capsys, monkeypatch):
    from attnlens import cli
    from attnlens.cli.jobs import common

    monkeypatch.setattr(common, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    for argv, expected in [
        (["--n-examples", "5", "--example", "5"],
         "--example 5 is outside the corpus of 5 texts; use 0 to 4"),
        (["--n-examples", "1", "--example=-1"],
         "--example -1 is outside the corpus of 1 text; use 0 to 0"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["compare", *argv, "--out", str(tmp_path / "r.html"), "--quiet"])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err == f"attnlens: error: {expected}", err
    assert not (tmp_path / "r.html").exists()


def test_focus_out_of_range_is_refused_before_any_pass(tmp_path, tiny_models, tiny_corpus,
                                                       capsys, monkeypatch):
    """The tiny BERT has 2 layers x 4 heads: --focus 2,0 and 0,4 are refused in one line naming
    the valid range, after loading the model (its shape) and before fitting or comparing."""
    from attnlens import cli
    from attnlens.engine import passes
    monkeypatch.setattr(passes, "run", lambda *a, **k: pytest.fail("a pass over the corpus ran"))
    for focus in ("2,0", "0,4", "-1,0"):
        with pytest.raises(SystemExit) as exit_info:
            cli.main([
                "compare", "--model", str(tiny_models["bert"]), "--corpus", str(tiny_corpus),
                f"--focus={focus}", "--out", str(tmp_path / "r.html"), "--quiet",
            ])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err == (
            f"attnlens: error: --focus {focus} is outside the model's 2 layers x 4 heads; use a "
            "layer from 0 to 1 and a head from 0 to 3"
        ), err


def test_example_and_focus_choose_the_reports_example_and_head(tmp_path, tiny_models, tiny_corpus):
    from attnlens.cli import main

    table = tmp_path / "c.json"
    assert main([
        "compare", "--model", str(tiny_models["bert"]), "--corpus", str(tiny_corpus),
        "--max-len", "16", "--views", "standard,papa", "--example", "2", "--focus", "1,3",
        "--device", "cpu", "--json", str(table), "--out", str(tmp_path / "r.html"), "--quiet",
    ]) == 0
    data = json.loads(table.read_text(encoding="utf-8"))
    assert data["example"]["index"] == 2 and data["focus"] == {"layer": 1, "head": 3}
    assert data["example"]["tokens"][1:4] == ["researchers", "measured", "how"]


def test_device_auto_and_a_missing_device(tmp_path, capsys, monkeypatch):
    """auto picks CUDA, else MPS, else the CPU; a device the machine lacks is one line naming the
    devices it has, before the model is loaded. torch's answers are replaced to test both cases
    on any machine."""
    import torch

    from attnlens import cli
    from attnlens.cli.jobs import common

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert common.resolve_device("auto") == "cpu"
    assert common.resolve_device(None) is None and common.resolve_device("cpu") == "cpu"
    monkeypatch.setattr(common, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    for device, expected in [
        ("cuda", "--device cuda: no CUDA GPU is available here"),
        ("mps", "--device mps: Apple's MPS is not available here (devices: cpu)"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["fit-papa", "--device", device, "--out", str(tmp_path / "c.safetensors")])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"attnlens: error: {expected}") and "\n" not in err, err
        assert err.endswith("use --device cpu or --device auto"), err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert common.resolve_device("auto") == "cuda" and common.resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(common.UsageError, match=r"has 2 CUDA GPUs \(cuda:0 to cuda:1\)"):
        common.resolve_device("cuda:2")
    with pytest.raises(SystemExit):
        cli.main(["compare", "--device", "tpu"])
    assert "unknown device 'tpu'; use one of cpu, cuda, mps, auto" in capsys.readouterr().err


def test_an_output_on_an_input_is_refused(tmp_path, capsys, monkeypatch):
    """--out (and curve's CSV beside it) never replaces --lm-texts, --corpus or --constants."""
    from attnlens import cli
    from attnlens.cli.jobs import common

    monkeypatch.setattr(common, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    monkeypatch.chdir(tmp_path)
    for name in ("texts.html", "lm.csv", "c.safetensors"):
        (tmp_path / name).write_text("keep\n", encoding="utf-8")
    cases = [
        (["compare", "--lm-texts", "texts.html", "--out", "texts.html"],
         "--out texts.html is the same file as --lm-texts texts.html"),
        (["compare", "--corpus", "texts.html", "--out", "./texts.html"],
         "--out texts.html is the same file as --corpus texts.html"),
        (["curve", "--constants", "c.safetensors", "--task", "sst2", "--lm-texts", "lm.csv",
          "--out", "lm.html"], "--out (its CSV) lm.csv is the same file as --lm-texts lm.csv"),
    ]
    for argv, expected in cases:
        with pytest.raises(SystemExit) as exit_info:
            cli.main([*argv, "--quiet"])
        assert exit_info.value.code == 2, argv
        err = capsys.readouterr().err.strip()
        assert expected in err and "would overwrite it" in err and "\n" not in err, err
    for name in ("texts.html", "lm.csv", "c.safetensors"):
        assert (tmp_path / name).read_text(encoding="utf-8") == "keep\n"


CONLLU = """\
1\tThe\tthe\tDET\tDT\t_\t2\tdet\t_\t_
2\tdog\tdog\tNOUN\tNN\t_\t3\tnsubj\t_\t_
3\tbarks\tbark\tVERB\tVBZ\t_\t0\troot\t_\t_
4\t.\t.\tPUNCT\t.\t_\t3\tpunct\t_\t_

1\tA\ta\tDET\tDT\t_\t2\tdet\t_\t_
2\tcat\tcat\tNOUN\tNN\t_\t3\tnsubj\t_\t_
3\tsleeps\tsleep\tVERB\tVBZ\t_\t0\troot\t_\t_

"""


def test_types_syntax_and_importance_write_csv_and_html(tmp_path, tiny_models, tiny_corpus, capsys):
    """The subcommands of what heads do: each writes its table as CSV and a self-contained figure
    as HTML, equal to what the API gives."""
    import pandas as pd

    import attnlens
    from attnlens.cli import main
    from attnlens.methods import patterns, syntax
    from tests.conftest import DATA

    model = str(tiny_models["bert"])
    assert main(["types", "--model", model, "--corpus", str(tiny_corpus), "--max-len", "32", "--quiet",
                 "--out", str(tmp_path / "types.html")]) == 0
    written = pd.read_csv(tmp_path / "types.csv")
    bridge = attnlens.load(model)
    texts = tiny_corpus.read_text(encoding="utf-8").splitlines()
    expected = patterns.types(bridge, texts, max_len=32, progress=False)
    assert list(written["view"].unique()) == ["standard", "effective"]
    got = written[written["view"] == "standard"].reset_index(drop=True)
    pd.testing.assert_frame_equal(got[list(patterns.TYPES)], expected[list(patterns.TYPES)])
    assert "plotly" in (tmp_path / "types.html").read_text(encoding="utf-8")

    treebank = tmp_path / "tiny.conllu"
    treebank.write_text(CONLLU, encoding="utf-8")
    assert main(["syntax", "--model", model, "--conllu", str(treebank), "--quiet",
                 "--out", str(tmp_path / "syntax.html")]) == 0
    written = pd.read_csv(tmp_path / "syntax.csv")
    expected = syntax.dependency_heads(bridge, treebank, progress=False)
    assert list(written["relation"]) == list(expected["relation"])
    assert written["accuracy"].tolist() == expected["accuracy"].tolist()

    assert main(["importance", "--model", model, "--task", "sst2", "--data-dir", str(DATA),
                 "--train-limit", "32", "--limit", "8", "--max-len", "32", "--quiet",
                 "--out", str(tmp_path / "importance.html")]) == 0
    written = pd.read_csv(tmp_path / "importance.csv")
    assert list(written.columns) == ["layer", "head", "importance", "raw"]
    assert len(written) == 2 * 4 and (written["raw"] > 0).all()
    assert "wrote" in capsys.readouterr().out


def test_types_syntax_and_importance_refuse_bad_arguments(tmp_path, capsys, monkeypatch):
    from attnlens import cli
    from attnlens.cli.jobs import common

    monkeypatch.setattr(common, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.conllu").write_text(CONLLU, encoding="utf-8")
    cases = [
        (["types", "--views", "standard,sideways"], "--views standard,sideways: choose among"),
        (["types", "--views", "papa"], "the papa view needs --constants"),
        (["syntax", "--conllu", "missing.conllu"], "--conllu missing.conllu: file not found"),
        (["syntax", "--conllu", "t.conllu", "--out", "t.csv"], "should end in .html"),
        (["importance", "--data-dir", "."], "--data-dir is for --task"),
    ]
    for argv, expected in cases:
        with pytest.raises(SystemExit) as exit_info:
            cli.main([*argv, "--quiet"])
        assert exit_info.value.code == 2, argv
        err = capsys.readouterr().err.strip()
        assert expected in err and "\n" not in err, err


@pytest.mark.slow
def test_table_runs_a_pair_task_with_constants_of_single_sentences(tmp_path, tiny_models, tiny_corpus, capsys):
    """`attnlens table --task mrpc` (docs/probing.md's command) was refused: MRPC's pairs need
    constants fitted on pairs. As the curve does, the table fits them on the task's training
    pairs (``constants_by_task``), here 8 of a tiny MRPC."""
    import pandas as pd

    from attnlens.cli import main

    data = tmp_path / "data" / "mrpc"
    data.mkdir(parents=True)
    rows = [f"{i % 2}\t{i}\t{100 + i}\tthe dog number {i} barks .\t{'the dog barks .' if i % 2 else 'a cat sleeps .'}"
            for i in range(16)]
    (data / "msr_paraphrase_train.txt").write_text(
        "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n" + "\n".join(rows) + "\n", encoding="utf-8")
    (data / "dev_ids.tsv").write_text("".join(f"{i}\t{100 + i}\n" for i in range(8)), encoding="utf-8")
    model, constants = str(tiny_models["bert"]), tmp_path / "c.safetensors"
    assert main(["fit-papa", "--model", model, "--corpus", str(tiny_corpus), "--max-len", "16", "--quiet",
                 "--out", str(constants)]) == 0
    assert main(["table", "--model", model, "--constants", str(constants), "--task", "mrpc",
                 "--data-dir", str(data.parent), "--train-limit", "8", "--eval-limit", "4", "--seeds", "1",
                 "--baselines", "none", "--device", "cpu", "--quiet", "--out", str(tmp_path / "t.html")]) == 0
    written = pd.read_csv(tmp_path / "t.csv")
    assert set(written["task"]) == {"mrpc"} and written["score"].notna().all()
    assert "wrote" in capsys.readouterr().out
