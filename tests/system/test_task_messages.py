"""Empty or missing task data is refused with a message that names the task, the split and the
file read (issue 61, item 3), from tasks.load and so from every loader and command built on it
(probing.run, ablation.importance, papa.curve / table, ``attnlens importance|curve|table``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnlens.errors import InputError
from attnlens.evaluation import tasks

SST2_TRAIN = "sentence\tlabel\n" + "".join(f"good film {i} .\t1\nbad film {i} .\t0\n" for i in range(4))
FIX = "(or data_dir=None for the Hugging Face hub)."


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def refusal(*args, **kwargs) -> str:
    with pytest.raises(InputError) as error:
        tasks.load(*args, **kwargs)
    return str(error.value)


def test_a_split_with_a_header_and_no_rows(tmp_path):
    write(tmp_path / "sst2" / "dev.tsv", "sentence\tlabel\n")
    assert refusal("sst2", "dev", data_dir=tmp_path) == (
        f"the dev split of task 'sst2' (SST-2) is empty: {tmp_path / 'sst2' / 'dev.tsv'} was read and "
        f"it holds no labelled example; pass a data_dir whose sst2/dev.tsv holds the dev examples {FIX}")


def test_an_empty_file(tmp_path):
    write(tmp_path / "cola" / "glue" / "train.tsv", "")
    assert refusal("cola", "train", data_dir=tmp_path) == (
        f"the train split of task 'cola' (CoLA) is empty: {tmp_path / 'cola' / 'glue' / 'train.tsv'} "
        "was read and it is an empty file (0 bytes); pass a data_dir whose cola/glue/train.tsv holds "
        f"the train examples {FIX}")


def test_a_conll_file_without_sentences(tmp_path):
    write(tmp_path / "conll2003" / "valid.txt", "-DOCSTART- -X- -X- O\n\n")
    for name, title in (("ner", "CoNLL-2003 NER"), ("pos", "CoNLL-2003 POS")):
        assert refusal(name, "validation", data_dir=tmp_path) == (
            f"the dev split of task {name!r} ({title}) is empty: {tmp_path / 'conll2003' / 'valid.txt'} "
            "was read and it holds no labelled example; pass a data_dir whose conll2003/valid.txt "
            f"holds the dev examples {FIX}")


def test_mrpc_dev_ids_that_match_no_row(tmp_path):
    header = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    write(tmp_path / "mrpc" / "msr_paraphrase_train.txt", header + "1\t1\t2\ta .\tan a .\n")
    write(tmp_path / "mrpc" / "dev_ids.tsv", "7\t8\n")
    assert refusal("mrpc", "dev", data_dir=tmp_path) == (
        f"the dev split of task 'mrpc' (MRPC) is empty: {tmp_path / 'mrpc' / 'msr_paraphrase_train.txt'} "
        f"was read and it holds no labelled example listed in {tmp_path / 'mrpc' / 'dev_ids.tsv'}; "
        f"pass a data_dir whose mrpc/msr_paraphrase_train.txt holds the dev examples {FIX}")
    assert len(tasks.load("mrpc", "train", data_dir=tmp_path)) == 1
    write(tmp_path / "mrpc" / "dev_ids.tsv", "")
    assert refusal("mrpc", "dev", data_dir=tmp_path) == (
        f"MRPC dev ids file {tmp_path / 'mrpc' / 'dev_ids.tsv'} is empty (0 bytes), so the dev split "
        "of task 'mrpc' cannot be told apart; pass a data_dir that holds GLUE's mrpc_dev_ids.tsv as "
        "mrpc/dev_ids.tsv.")


def test_a_missing_file_names_task_split_and_file(tmp_path):
    assert refusal("sst2", "test", data_dir=tmp_path) == (
        f"SST-2 test file not found: {tmp_path / 'sst2' / 'test.tsv'} (the test split of task 'sst2'); "
        f"pass a data_dir that holds sst2/test.tsv {FIX}")


def test_probing_run_names_the_empty_split(tmp_path, minilm):
    from attnlens.evaluation import probing

    write(tmp_path / "sst2" / "train.tsv", SST2_TRAIN)
    write(tmp_path / "sst2" / "dev.tsv", "sentence\tlabel\n")
    with pytest.raises(InputError, match=r"the dev split of task 'sst2' \(SST-2\) is empty: .*sst2/dev.tsv was read"):
        probing.run(minilm, "sst2", data_dir=tmp_path, progress=False)


def test_importance_command_names_the_empty_split(tmp_path, minilm, capsys):
    """``attnlens importance --task sst2`` with an empty split said "corpus is empty:
    ablation.importance needs at least one string". Importance is measured on the train split
    (the probe's examples and those held out from it), which is the one named."""
    from attnlens import cli

    write(tmp_path / "sst2" / "train.tsv", "sentence\tlabel\n")
    write(tmp_path / "sst2" / "dev.tsv", SST2_TRAIN)
    with pytest.raises(SystemExit) as exit:
        cli.main(["importance", "--task", "sst2", "--data-dir", str(tmp_path), "--quiet",
                  "--out", str(tmp_path / "importance.html"), "--train-limit", "8", "--limit", "4"])
    assert exit.value.code == 2
    assert capsys.readouterr().err == (  # before the model loads, in the command line's terms
        f"attnlens: error: the train split of task 'sst2' (SST-2) is empty: {tmp_path / 'sst2' / 'train.tsv'} "
        "was read and it holds no labelled example; pass a --data-dir whose sst2/train.tsv holds the train "
        "examples (or no --data-dir for the Hugging Face hub).\n")
    write(tmp_path / "sst2" / "train.tsv", "sentence\tlabel\ngood film .\t1\n")  # one example: none to hold out
    with pytest.raises(SystemExit):
        cli.main(["importance", "--task", "sst2", "--data-dir", str(tmp_path), "--quiet",
                  "--out", str(tmp_path / "importance.html")])
    assert "importance needs two at least, one to fit the probe on" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["importance", "--task", "sst2", "--data-dir", str(tmp_path / "nowhere"), "--quiet",
                  "--out", str(tmp_path / "importance.html")])
    assert capsys.readouterr().err == (
        f"attnlens: error: --data-dir {tmp_path / 'nowhere'} is not a folder (of the --task sst2 files)\n")


def test_an_empty_split_on_the_hub(monkeypatch):
    import datasets

    empty = datasets.Dataset.from_dict(
        {"sentence": [], "label": []},
        features=datasets.Features({"sentence": datasets.Value("string"),
                                    "label": datasets.ClassLabel(names=["negative", "positive"])}))
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: empty)
    assert refusal("sst2", "dev") == (
        "the dev split of task 'sst2' (SST-2) is empty: the Hugging Face hub's nyu-mll/glue (sst2, "
        "split 'validation') has no example; pass data_dir=... with sst2/dev.tsv.")
