"""No silent wrong answer: damaged files, bad arguments and bad texts get one clear error.

One case per item of the reliability issue's list (and a few more), each asserting the error type
and the key words of its message; hypothesis injects NaN/inf into constants at random places.
Calls that pass values outside a function's annotations run inside ``unchecked()``, so they test
what a user without run-time type checks sees.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

import attnlens
from attnlens import papa
from attnlens.methods import effective
from tests import tiny
from tests.typechecks import unchecked


@pytest.fixture(scope="module")
def bert():
    return tiny.bert_bridge()


@pytest.fixture(scope="module")
def fitted(bert):
    return papa.fit(bert, tiny.CORPUS, max_len=16, progress=False)


def rewrite(path, out, *, tensors=None, metadata=None, drop_checksum=False):
    """A copy of the constants file ``path`` with some tensors or metadata changed (written with
    safetensors directly, as a damaged or hand-edited file would be)."""
    with safe_open(str(path), framework="pt") as handle:
        meta = dict(handle.metadata())
        values = {name: handle.get_tensor(name) for name in handle.keys()}
    values.update(tensors or {})
    meta.update({key: json.dumps(value) for key, value in (metadata or {}).items()})
    if drop_checksum:
        meta.pop("checksum")
    elif tensors or metadata:  # keep the checksum right, so that the value checks are what refuses it
        from attnlens.core.files import file_checksum

        meta["checksum"] = file_checksum(values, meta)
    save_file(values, str(out), metadata=meta)
    return out


# ---- damaged constants files --------------------------------------------------------------


def edited(tensor, index, value):
    out = tensor.clone()
    out[index] = value
    return out


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda c: {"sums": edited(c.sums, (0, 0, 3, 3), float("nan"))}, "sums: 1 of .* not finite"),
        (lambda c: {"sums": edited(c.sums, (1, 2, 0, 0), float("inf"))}, "sums: 1 of .* not finite"),
        (lambda c: {"pair_counts": edited(c.pair_counts, (2, 2), -3)}, "pair_counts: 1 of .* below 0"),
        (lambda c: {"sums": -c.sums}, "sums: .* below"),
        (lambda c: {"sums": c.sums * 1000}, "means above 1"),
        (lambda c: {"squares": c.squares + 1.0}, "a² above a"),
    ],
    ids=["nan", "inf", "negative-counts", "negative-sums", "means-above-1", "squares"],
)
def test_damaged_values_are_refused(fitted, tmp_path, change, words):
    path = fitted.save(tmp_path / "ok.safetensors")
    bad = rewrite(path, tmp_path / "bad.safetensors", tensors=change(papa.load(path)))
    with pytest.raises(ValueError, match=f"constants file .*bad.safetensors is damaged: .*{words}"):
        papa.load(bad)


def test_a_flipped_bit_is_caught_by_the_checksum(fitted, tmp_path):
    path = fitted.save(tmp_path / "c.safetensors")
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x04  # one bit of the last tensor's data
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="is damaged: its tensors do not match the checksum"):
        papa.load(path)


def test_metadata_of_the_wrong_type_is_refused(fitted, tmp_path):
    path = fitted.save(tmp_path / "c.safetensors")
    for key, value, words in [
        ("examples", "many", "metadata 'examples' must be int, got 'many'"),
        ("pairs", 1, "metadata 'pairs' must be bool or null, got 1"),
        ("tokens", -5, "metadata 'tokens' must be >= 0"),
    ]:
        bad = rewrite(path, tmp_path / f"{key}.safetensors", metadata={key: value})
        with pytest.raises(ValueError, match=words):
            papa.load(bad)


def test_counts_that_disagree_with_the_metadata_are_refused(fitted, tmp_path):
    path = fitted.save(tmp_path / "c.safetensors")
    bad = rewrite(path, tmp_path / "bad.safetensors", metadata={"tokens": fitted.n_tokens + 1})
    with pytest.raises(ValueError, match="diagonal of pair_counts adds up to .* the metadata says"):
        papa.load(bad)


def test_files_without_a_checksum_load_with_a_warning(fitted, tmp_path):
    path = fitted.save(tmp_path / "c.safetensors")
    old = rewrite(path, tmp_path / "old.safetensors", drop_checksum=True)
    with pytest.warns(UserWarning, match="has no checksum"):
        loaded = papa.load(old)
    assert torch.equal(loaded.sums, fitted.sums)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        papa.load(path)  # a file with its checksum: no warning


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    tensor=st.sampled_from(["sums", "squares"]),
    value=st.sampled_from([float("nan"), float("inf"), float("-inf")]),
    where=st.tuples(*(st.integers(0, n - 1) for n in (2, 4, 16, 16))),
)
def test_any_non_finite_cell_is_refused(fitted, tmp_path_factory, tensor, value, where):
    folder = tmp_path_factory.mktemp("hypothesis")
    path = fitted.save(folder / "ok.safetensors")
    damaged = getattr(fitted, tensor).clone()
    damaged[where] = value
    bad = rewrite(path, folder / "bad.safetensors", tensors={tensor: damaged})
    with pytest.raises(ValueError, match=f"{tensor}: 1 of .* not finite .*first at index \\{where}"[:-1]):
        papa.load(bad)


# ---- arguments ------------------------------------------------------------------------------


def test_blend_lambda_must_be_a_finite_number_in_0_1(fitted):
    for lam, words in [
        (float("nan"), "not finite"),
        (1.5, "above 1"),
        (-0.1, "below 0"),
        (torch.full((2, 4), float("nan")), "not finite"),
    ]:
        with pytest.raises(ValueError, match=f"lam .*{words}"):
            papa.hooks(fitted, mode="blend", lam=lam)
    with pytest.raises(ValueError, match=r"lam has shape \[3, 4\]; expected \[2, 4\] \(layer, head"):
        papa.hooks(fitted, mode="blend", lam=torch.full((3, 4), 0.5))


def test_batch_size_must_be_a_whole_number(bert):
    for call in (
        lambda: papa.fit(bert, tiny.CORPUS, max_len=16, batch_size=2.5, progress=False),
        lambda: effective.statistics(bert, tiny.CORPUS, max_len=16, batch_size=2.5, progress=False),
        lambda: attnlens.compare(bert, "standard", corpus=tiny.CORPUS, max_len=16, batch_size=2.5, progress=False),
    ):
        with unchecked(), pytest.raises((TypeError, ValueError), match="batch_size must be a whole number.*2.5"):
            call()


def test_heads_outside_the_model_are_named():
    with pytest.raises(ValueError, match=r"head \(6, 0\) is outside the model's 6 layers x 12 heads"):
        papa.HeadSet.from_heads([(6, 0)], 6, 12)


def test_compare_with_arguments_swapped_says_the_model_goes_first(bert):
    with unchecked(), pytest.raises((TypeError, ValueError), match="first argument is the model") as error:
        attnlens.compare("papa", bert, corpus=tiny.CORPUS)
    assert len(str(error.value)) < 300
    with unchecked(), pytest.raises(ValueError, match="views are names, got a TransformerBridge") as error:
        attnlens.compare(bert, bert, corpus=tiny.CORPUS)
    assert len(str(error.value)) < 300


def test_compare_takes_a_constants_file(bert, fitted, tmp_path):
    path = fitted.save(tmp_path / "c.safetensors")
    comparison = attnlens.compare(bert, "papa", corpus=tiny.CORPUS, constants=str(path), progress=False)
    assert comparison.max_len == 16


# ---- texts ----------------------------------------------------------------------------------


def test_blank_texts_are_refused_with_their_index_in_the_corpus(bert):
    corpus = [*tiny.CORPUS[:5], "   "]
    with pytest.raises(ValueError, match="text 5 is blank"):
        papa.fit(bert, corpus, max_len=16, batch_size=4, progress=False)
    with pytest.raises(ValueError, match="text 0 is blank"):
        attnlens.compare(bert, "standard", corpus=["   ", ""], max_len=16, progress=False)
    with pytest.raises(ValueError, match="text 1 is blank"):
        attnlens.tokenize(bert, ["fine", ""], max_len=16)


def test_texts_of_control_characters_are_refused(bert):
    for layout in ("papa", "padded"):
        with pytest.raises(ValueError, match="text 0 has no token: it is made only of characters the tokenizer drops"):
            attnlens.tokenize(bert, ["\x01" * 3000], max_len=16, layout=layout)


@pytest.mark.parametrize("layout", ["papa", "padded"])
def test_literal_special_tokens_in_a_text_are_text(bert, layout):
    """"[SEP]", "[CLS]" and "[PAD]" written in a text are read as text: they never become the
    special tokens, so a text cannot move the layout's separators or mask itself as padding."""
    tokenizer = bert.tokenizer
    batch = attnlens.tokenize(bert, ["a [SEP] b [CLS] c [PAD] d"], max_len=32, layout=layout)
    ids = batch.input_ids[0][batch.attention_mask[0].bool()].tolist()
    assert ids.count(tokenizer.sep_token_id) == 1 and ids.count(tokenizer.cls_token_id) == 1
    assert tokenizer.pad_token_id not in ids


# ---- model folders, the CLI's one-line errors and its outputs -------------------------------


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models") / "bert"
    tiny.tiny_bert().save_pretrained(folder)
    tiny.bert_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "texts.txt"
    path.write_text("\n".join(tiny.CORPUS[:4]) + "\n", encoding="utf-8")
    return path


def one_line_error(capsys, argv, status=2):
    """Run the CLI; assert it exits with ``status`` and one line on stderr, and return it."""
    from attnlens.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == status, argv
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnlens: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


class _Evil:
    """A pickle that would create a file when unpickled (code in a weights file)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return (os.mkdir, (self.marker,))


def _damage(folder, how, marker):
    weights = folder / "model.safetensors"
    if how == "truncated":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
    elif how == "garbage":
        weights.write_bytes(b"not a safetensors file" * 4)
    elif how == "pickled code":
        weights.unlink()
        torch.save({"weight": _Evil(marker)}, folder / "pytorch_model.bin")
    elif how == "no config.json":
        (folder / "config.json").unlink()
    elif how == "no weights":
        weights.unlink()


@pytest.mark.parametrize(
    ("how", "words"),
    [
        ("truncated", ["Could not read the weights", "SafetensorError", "damaged, truncated"]),
        ("garbage", ["Could not read the weights", "SafetensorError"]),
        ("pickled code", ["Could not read the weights", "pickled objects other than tensors"]),
        ("no config.json", ["No config.json in the model folder", "Hugging Face layout"]),
        ("no weights", ["No weights in the model folder", "model.safetensors"]),
    ],
)
def test_a_damaged_model_folder_is_one_line(tmp_path, bert_folder, corpus_file, capsys, how, words):
    """Truncated or foreign weights, pickled code, a folder without config.json or weights: one
    line naming the folder, exit 2, through the CLI; the API raises the same ModelFilesError.
    The pickle's code never runs (weights-only loading)."""
    import shutil

    from attnlens.core.loading import ModelFilesError

    folder, marker = tmp_path / "model", tmp_path / "pwned"
    shutil.copytree(bert_folder, folder)
    _damage(folder, how, marker)
    err = one_line_error(capsys, ["fit-papa", "--model", str(folder), "--corpus", str(corpus_file),
                                  "--out", str(tmp_path / "c.safetensors"), "--quiet"])
    for word in [*words, str(folder)]:
        assert word in err, (word, err)
    with pytest.raises(ModelFilesError, match="model folder|Could not read"):
        attnlens.load(folder)
    assert not marker.exists() and not (tmp_path / "c.safetensors").exists()


def test_an_old_transformerlens_alias_is_one_short_warning():
    """TransformerLens logs five lines of deprecation text for its aliases; attnlens resolves the
    alias itself and warns in one line."""
    from attnlens.core.loading import _official_name

    with pytest.warns(UserWarning, match=r"^'gpt2-small' is an old TransformerLens alias; loading 'gpt2'\.$"):
        assert _official_name("gpt2-small") == "gpt2"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _official_name("gpt2") == "gpt2"


@pytest.mark.slow
def test_an_uncached_hub_alias_through_the_cli_is_one_warning_and_one_error(tmp_path):
    """Offline (as the suite runs), the alias's hub name is not cached: stderr holds attnlens's
    one-line warning and one-line error, and none of TransformerLens's deprecation text."""
    import os
    import subprocess
    import sys

    # offline in the child whatever the parent's environment, so the hub is never asked
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="warning", HF_HUB_OFFLINE="1",
               HF_HOME=str(tmp_path / "hf"))  # an empty cache: gpt2 cannot be found locally
    result = subprocess.run(
        [sys.executable, "-m", "attnlens", "fit-papa", "--model", "gpt2-small",
         "--out", str(tmp_path / "c.safetensors")],
        capture_output=True, text=True, env=env,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert lines[0] == "attnlens: warning: 'gpt2-small' is an old TransformerLens alias; loading 'gpt2'."
    assert lines[1].startswith("attnlens: error: Could not load 'gpt2'") and len(lines) == 2, lines


def test_an_unexpected_error_is_one_line_and_debug_shows_its_traceback(
    tmp_path, bert_folder, corpus_file, capsys, monkeypatch
):
    from attnlens.methods.papa import fitting

    def broken(*args, **kwargs):
        raise RuntimeError("something inside broke")

    monkeypatch.setattr(fitting, "fit", broken)
    argv = ["fit-papa", "--model", str(bert_folder), "--corpus", str(corpus_file),
            "--out", str(tmp_path / "c.safetensors"), "--quiet"]
    err = one_line_error(capsys, argv, status=1)
    assert "unexpected RuntimeError: something inside broke" in err and "--debug" in err
    for debug in (["--debug", *argv], [*argv, "--debug"]):
        with pytest.raises(RuntimeError, match="something inside broke"):
            from attnlens.cli import main

            main(debug)
    # an anticipated error shows its traceback under --debug too
    with pytest.raises(ValueError, match="No config.json"):
        from attnlens.cli import main

        main(["fit-papa", "--model", str(tmp_path), "--out", str(tmp_path / "c.safetensors"), "--debug"])


def test_a_read_only_output_is_refused_before_any_work_unless_forced(tmp_path, fitted, capsys, monkeypatch):
    """A read-only --out is refused before the model is loaded (compare, fit-papa) or the inputs
    read (merge); --force replaces it, atomically."""
    import stat

    from attnlens import cli
    from attnlens.cli.jobs import common

    part = fitted.save(tmp_path / "part.safetensors")
    out = tmp_path / "ro.safetensors"
    out.write_bytes(b"keep me")
    out.chmod(stat.S_IRUSR | stat.S_IRGRP)
    monkeypatch.setattr(common, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    for argv in (["fit-papa", "--out", str(out)], ["compare", "--out", str(tmp_path / "ro.html")],
                 ["merge", str(part), "--out", str(out)]):
        if argv[0] == "compare":
            (tmp_path / "ro.html").write_text("keep me", encoding="utf-8")
            (tmp_path / "ro.html").chmod(stat.S_IRUSR)
        err = one_line_error(capsys, [*argv, "--quiet"] if argv[0] != "merge" else argv)
        assert "is read-only" in err and "--force" in err, err
    assert out.read_bytes() == b"keep me"
    assert cli.main(["merge", str(part), "--out", str(out), "--force"]) == 0
    assert torch.equal(papa.PapaConstants.load(out).sums, fitted.sums)


def test_out_through_a_symlink_never_touches_its_target(tmp_path, fitted):
    """--out naming a symlink replaces the link by the file; the file it pointed to is unchanged."""
    from attnlens import cli

    part = fitted.save(tmp_path / "part.safetensors")
    precious = tmp_path / "precious.txt"
    precious.write_text("a file the link points to", encoding="utf-8")
    link = tmp_path / "out.safetensors"
    link.symlink_to(precious)
    assert cli.main(["merge", str(part), "--out", str(link)]) == 0
    assert precious.read_text(encoding="utf-8") == "a file the link points to"
    assert not link.is_symlink() and torch.equal(papa.PapaConstants.load(link).sums, fitted.sums)


def test_a_string_corpus_says_a_list_was_maybe_meant(bert):
    from attnlens.core.corpus import CorpusError

    with pytest.raises(CorpusError, match=r"pass a list: corpus=\['the film was great'\]"):
        attnlens.compare(bert, "standard", corpus="the film was great")


def test_blank_lines_of_a_corpus_file_are_skipped_and_counted(tmp_path, bert_folder, capsys):
    """A file's blank and whitespace-only lines are skipped, their number said on stderr (the
    API refuses blank texts in a list, with their index: both are explicit)."""
    from attnlens.cli import main
    from attnlens.core.corpus import read_corpus_counted

    path = tmp_path / "texts.txt"
    path.write_text("the first text\n\n   \nthe second text\n\t\n", encoding="utf-8")
    assert read_corpus_counted(path) == (["the first text", "the second text"], 3)
    assert main(["fit-papa", "--model", str(bert_folder), "--corpus", str(path), "--max-len", "16",
                 "--out", str(tmp_path / "c.safetensors")]) == 0
    assert f"corpus {path}: 2 texts read, 3 blank lines skipped" in capsys.readouterr().err
    assert papa.PapaConstants.load(tmp_path / "c.safetensors").n_examples == 2


def test_version(capsys):
    from importlib.metadata import version

    from attnlens.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"attnlens {version('attnlens')}"
