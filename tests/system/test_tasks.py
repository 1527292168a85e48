"""attnlens.evaluation.tasks: GLUE and CoNLL-2003 loaders on the real files of ../shared/data, their metrics
against scikit-learn's and seqeval's, and their one-line errors.

Counts are checked twice: against the figures of the data's README / MANIFEST, and against a count
of the file made here with plain Python. Tests that need ../shared/data skip locally when it is
missing and fail in CI (``CI`` set)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import datasets
import numpy as np
import pytest
from seqeval.metrics import f1_score as seqeval_f1
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from attnlens.core.inputs import Words
from attnlens.evaluation import task_files, tasks
from attnlens.evaluation.tasks import TaskError
from tests.conftest import DATA, data_file, read_tsv
from tests.typechecks import unchecked

#: a file each task needs, to skip (locally) or fail (CI) when the data is missing
NEEDS = {"sst2": "sst2/dev.tsv", "cola": "cola/glue/dev.tsv", "mrpc": "mrpc/dev_ids.tsv",
         "ner": "conll2003/valid.txt", "pos": "conll2003/valid.txt"}


@functools.cache
def _load(name: str, split: str, limit: int | None = None, seed: int = 0) -> tasks.Task:
    return tasks.load(name, split, data_dir=DATA, limit=limit, seed=seed)


def real(name: str, split: str = "dev", limit: int | None = None, seed: int = 0) -> tasks.Task:
    """A task read from ../shared/data (loaded once per arguments)."""
    data_file(NEEDS[name])
    return _load(name, split, limit, seed)


def lines(relative: str) -> list[str]:
    return data_file(relative).read_text(encoding="utf-8-sig").splitlines()


def conll_sentences(relative: str) -> list[list[list[str]]]:
    """Sentences of a CoNLL file as lists of column lists, split here independently of attnlens."""
    blocks = re.split(r"\n[ \t]*\n", data_file(relative).read_text(encoding="utf-8"))
    sentences = [[line.split(" ") for line in block.strip("\n").split("\n")] for block in blocks]
    return [s for s in sentences if s and s[0][0] and s[0][0] != "-DOCSTART-"]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


#: a small MNLI dev file in GLUE's column layout (the real one is not in ../shared/data)
MNLI_HEADER = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
               "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label")


def mnli_dir(tmp_path: Path, n: int = 30, gold: list[str] | None = None) -> Path:
    names = ("entailment", "neutral", "contradiction")
    gold = gold or [names[i % 3] for i in range(n)]
    rows = [f"{i}\t{i}\t{i}e\tfiction\t( x )\t( y )\t(ROOT x)\t(ROOT y)\tPremise \"{i}\" .\t"
            f"Hypothesis {i} .\t{label}\t{label}" for i, label in enumerate(gold)]
    write(tmp_path / "mnli" / "dev_matched.tsv", "\n".join([MNLI_HEADER, *rows]) + "\n")
    return tmp_path


# -- row counts: the README's figures and the files' own -------------------------------------


@pytest.mark.parametrize(
    ("name", "split", "readme", "count"),
    [
        ("sst2", "dev", 872, lambda: len(lines("sst2/dev.tsv")) - 1),
        ("sst2", "train", 67_349, lambda: len(lines("sst2/train.tsv")) - 1),
        ("cola", "dev", 1_043, lambda: len(lines("cola/glue/dev.tsv"))),
        ("cola", "train", 8_551, lambda: len(lines("cola/glue/train.tsv"))),
        ("mrpc", "dev", 408, lambda: len(lines("mrpc/dev_ids.tsv"))),
        ("mrpc", "train", 3_668,
         lambda: len(lines("mrpc/msr_paraphrase_train.txt")) - 1 - len(lines("mrpc/dev_ids.tsv"))),
        ("mrpc", "test", 1_725, lambda: len(lines("mrpc/msr_paraphrase_test.txt")) - 1),
        ("ner", "dev", 3_250, lambda: len(conll_sentences("conll2003/valid.txt"))),
        ("ner", "train", 14_041, lambda: len(conll_sentences("conll2003/train.txt"))),
        ("pos", "dev", 3_250, lambda: len(conll_sentences("conll2003/valid.txt"))),
    ],
)
def test_row_counts_equal_the_files(name, split, readme, count):
    task = real(name, split)
    assert len(task) == len(task.examples) == len(task.labels()) == len(task.inputs())
    assert len(task) == readme == count()


def test_conll_valid_has_the_manifests_tokens_and_entities():
    task = real("ner", "dev")
    assert sum(len(words) for words in task.examples["words"]) == 51_362
    starts = [task.label_names[t] for tags in task.labels() for t in tags if task.label_names[t][0] == "B"]
    assert {tag: starts.count(tag) for tag in set(starts)} == {
        "B-LOC": 1_837, "B-MISC": 922, "B-ORG": 1_341, "B-PER": 1_842}


# -- exact examples ----------------------------------------------------------------------------


def test_first_sst2_dev_row():
    task = real("sst2", "dev")
    assert task.examples[0] == {"text": "it 's a charming and often affecting journey . ", "label": 1}
    assert task.label_names[task.labels()[0]] == "positive"
    assert task.inputs()[:2] == ["it 's a charming and often affecting journey . ",
                                 "unflinchingly bleak and desperate "]
    assert task.labels()[:2] == [1, 0]


def test_first_cola_dev_row_and_the_validation_alias():
    data_file(NEEDS["cola"])
    task = tasks.load("cola", "validation", data_dir=DATA)
    assert task.split == "dev" and task.metric == "matthews_corrcoef"
    assert task.examples[0] == {"text": "The sailors rode the breeze clear of the rocks.", "label": 1}


def test_first_conll_valid_sentence_ner_and_pos():
    words = ("CRICKET", "-", "LEICESTERSHIRE", "TAKE", "OVER", "AT", "TOP", "AFTER", "INNINGS",
             "VICTORY", ".")
    ner, pos = real("ner", "dev"), real("pos", "dev")
    assert ner.inputs()[0] == pos.inputs()[0] == Words(words)
    assert [ner.label_names[t] for t in ner.labels()[0]] == ["O", "O", "B-ORG"] + ["O"] * 8
    assert [pos.label_names[t] for t in pos.labels()[0]] == [
        "NNP", ":", "NNP", "NNP", "IN", "NNP", "NNP", "NNP", "NNP", "NN", "."]
    assert ner.kind == pos.kind == "token" and ner.metric == "seqeval_f1" and pos.metric == "accuracy"
    assert ner.label_names == ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
    assert len(pos.label_names) == 47 and pos.label_names[25] == "NN|SYM"


def test_conll_tags_equal_an_independent_parse():
    sentences = conll_sentences("conll2003/valid.txt")
    ner, pos = real("ner", "dev"), real("pos", "dev")
    assert ner.examples["words"] == [[row[0] for row in s] for s in sentences]
    assert [[ner.label_names[t] for t in tags] for tags in ner.labels()] == [[row[3] for row in s] for s in sentences]
    assert [[pos.label_names[t] for t in tags] for tags in pos.labels()] == [[row[1] for row in s] for s in sentences]


def test_mrpc_dev_equals_glues_dev_tsv_and_train_is_the_rest():
    dev, train = real("mrpc", "dev"), real("mrpc", "train")
    glue_dev = read_tsv(data_file("mrpc/dev.tsv"))
    assert dev.inputs()[0] == (
        "He said the foodservice pie business doesn 't fit the company 's long-term growth strategy .",
        '" The foodservice pie business does not fit our long-term growth strategy .')
    assert dev.labels()[0] == 1 and dev.label_names == ("not_equivalent", "equivalent")
    assert dev.inputs() == [(row["#1 String"], row["#2 String"]) for row in glue_dev]
    assert dev.labels() == [int(row["Quality"]) for row in glue_dev]
    assert not set(dev.inputs()) & set(train.inputs())
    assert sum(train.labels()) == 2_474  # MANIFEST: 2,474 positive / 1,194 negative
    test = real("mrpc", "test")
    assert sum(test.labels()) == 1_147 and isinstance(test.inputs()[0], tuple)


def test_repr_is_one_compact_line():
    assert repr(real("sst2", "dev")) == (
        "Task('sst2', 'dev', sentence, 872 examples, labels negative/positive, metric accuracy)")
    assert repr(real("pos", "dev")) == "Task('pos', 'dev', token, 3250 examples, 47 labels, metric accuracy)"
    assert real("pos", "dev").n_labels == 47 and real("mrpc", "dev").n_labels == 2


# -- metrics equal the libraries' --------------------------------------------------------------


def _random_predictions(task: tasks.Task, rng: np.random.Generator) -> list:
    if task.kind == "token":
        # mostly the gold tag, so that entity-level F1 is neither 0 nor 1
        return [[int(t) if rng.random() < 0.8 else int(rng.integers(task.n_labels)) for t in tags]
                for tags in task.labels()]
    return rng.integers(task.n_labels, size=len(task)).tolist()


@pytest.mark.parametrize("name", ["sst2", "cola", "mrpc", "mnli", "ner", "pos"])
def test_every_metric_equals_the_librarys(name, tmp_path):
    task = tasks.load("mnli", "dev", data_dir=mnli_dir(tmp_path)) if name == "mnli" else real(name)
    rng = np.random.default_rng(7)
    gold = task.labels()
    for _ in range(3):
        predicted = _random_predictions(task, rng)
        if task.kind == "token":
            flat_gold = [t for tags in gold for t in tags]
            flat_predicted = [t for tags in predicted for t in tags]
            named = [[task.label_names[t] for t in tags] for tags in predicted]
            if task.metric == "seqeval_f1":
                expected = seqeval_f1([[task.label_names[t] for t in tags] for tags in gold], named)
            else:
                expected = accuracy_score(flat_gold, flat_predicted)
        else:
            named = [task.label_names[p] for p in predicted]
            expected = {"accuracy": accuracy_score, "matthews_corrcoef": matthews_corrcoef,
                        "f1": lambda y, p: f1_score(y, p, pos_label=1)}[task.metric](gold, predicted)
        assert expected not in (0.0, 1.0)
        assert task.score(predicted) == pytest.approx(expected, abs=1e-12)
        assert task.score(named) == pytest.approx(expected, abs=1e-12)  # label names
        if task.kind != "token":
            assert task.score(np.asarray(predicted)) == pytest.approx(expected, abs=1e-12)
    assert task.score(gold) == 1.0
    expected_metric = {"sst2": "accuracy", "cola": "matthews_corrcoef", "mrpc": "f1", "mnli": "accuracy",
                       "ner": "seqeval_f1", "pos": "accuracy"}
    assert task.metric == expected_metric[name]


@pytest.mark.parametrize("name", ["sst2", "cola", "mrpc", "ner", "pos"])
def test_majority_score_is_the_metric_of_a_constant_prediction(name):
    dev, train = real(name, "dev"), real(name, "train")
    if dev.kind == "token":
        counts = np.bincount([t for tags in train.labels() for t in tags])
        constant = dev.label_names[int(counts.argmax())]
        gold = [[dev.label_names[t] for t in tags] for tags in dev.labels()]
        predicted = [[constant] * len(tags) for tags in gold]
        if dev.metric == "seqeval_f1":
            expected = seqeval_f1(gold, predicted)  # "O" predicts no entity: 0
            assert constant == "O" and expected == 0
        else:
            expected = accuracy_score(sum(gold, []), sum(predicted, []))
            assert constant == "NNP"
    else:
        constant = int(np.bincount(train.labels()).argmax())
        metric = {"accuracy": accuracy_score, "matthews_corrcoef": matthews_corrcoef,
                  "f1": lambda y, p: f1_score(y, p, pos_label=1)}[dev.metric]
        expected = metric(dev.labels(), [constant] * len(dev))
    assert dev.majority_score(train) == pytest.approx(expected, abs=1e-12)
    own = dev.majority_score()
    assert 0 <= own <= 1


def test_majority_scores_by_counting():
    sst2 = real("sst2", "dev")
    assert sst2.majority_score() == pytest.approx(444 / 872)  # 444 positive of 872
    assert sst2.majority_score(real("sst2", "train")) == pytest.approx(444 / 872)
    mrpc = real("mrpc", "dev")  # always "equivalent": F1 = 2 * 279 / (279 + 408)
    assert mrpc.majority_score(real("mrpc", "train")) == pytest.approx(2 * 279 / (279 + 408))
    assert real("cola", "dev").majority_score(real("cola", "train")) == 0.0


# -- limit ---------------------------------------------------------------------------------------


def test_limit_is_a_seeded_subset_in_file_order():
    full = real("sst2", "dev")
    first, again, other = real("sst2", "dev", 50, 3), _load.__wrapped__("sst2", "dev", 50, 3), real("sst2", "dev", 50, 4)
    assert len(first) == 50 and first.inputs() == again.inputs() and first.labels() == again.labels()
    assert first.inputs() != other.inputs()
    expected = sorted(np.random.default_rng(3).choice(872, size=50, replace=False).tolist())
    assert first.inputs() == [full.inputs()[i] for i in expected]
    assert first.labels() == [full.labels()[i] for i in expected]
    assert real("sst2", "dev", 872).inputs() == real("sst2", "dev", 10_000).inputs() == full.inputs()
    ner = real("ner", "dev", 5, 0)
    assert len(ner) == 5 and all(isinstance(words, Words) for words in ner.inputs())


# -- the hub path, without the network -----------------------------------------------------------


def test_mnli_offline_without_data_dir_is_one_clear_error(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(TaskError) as error:
        tasks.load("mnli", "dev")
    message = str(error.value)
    assert "\n" not in message and error.value.__cause__ is None and error.value.__suppress_context__
    for words in ("MNLI", "hub", "offline", "data_dir", "mnli/dev_matched.tsv"):
        assert words in message


def test_mnli_offline_for_real_raises_task_error(monkeypatch, tmp_path):
    """datasets itself, offline, with an empty cache: its ConnectionError becomes a TaskError."""
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path)
    with pytest.raises(TaskError, match=r"MNLI needs the Hugging Face hub .*offline.*data_dir"):
        tasks.load("mnli", "validation")


def test_a_data_dir_without_mnli_never_tries_the_hub(monkeypatch, tmp_path):
    def no_hub(*args, **kwargs):
        raise AssertionError("the hub was tried although data_dir was given")

    monkeypatch.setattr(datasets, "load_dataset", no_hub)
    with pytest.raises(TaskError, match=re.escape(str(tmp_path / "mnli" / "dev_matched.tsv"))):
        tasks.load("mnli", "dev", data_dir=tmp_path)


def test_hub_tables_map_to_the_same_columns_and_label_order(monkeypatch):
    """A stand-in for the hub's tables: GLUE's column names, CoNLL's features (ClassLabel names
    in another order are mapped by name); unlabelled test rows (-1) are an error."""
    glue = datasets.Dataset.from_dict(
        {"premise": ["a", "b"], "hypothesis": ["c", "d"], "label": [2, 0], "idx": [0, 1]},
        features=datasets.Features({"premise": datasets.Value("string"), "hypothesis": datasets.Value("string"),
                                    "label": datasets.ClassLabel(names=["entailment", "neutral", "contradiction"]),
                                    "idx": datasets.Value("int32")}))
    shuffled = ["O", "B-LOC", "I-LOC", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-MISC", "I-MISC"]
    conll = datasets.Dataset.from_dict(
        {"tokens": [["Paris", "is"]], "ner_tags": [[1, 0]], "pos_tags": [[22, 42]]},
        features=datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                    "ner_tags": datasets.Sequence(datasets.ClassLabel(names=shuffled)),
                                    "pos_tags": datasets.Sequence(datasets.ClassLabel(names=list(tasks.POS_TAGS)))}))
    calls = []

    def hub(path, name=None, *, split, **kwargs):
        calls.append((path, name, split))
        if split == "test_matched":
            return glue.map(lambda row: {"label": -1}, features=glue.features.copy())
        return conll if "conll" in path else glue

    monkeypatch.setattr(datasets, "load_dataset", hub)
    mnli = tasks.load("mnli", "validation")
    assert mnli.inputs() == [("a", "c"), ("b", "d")] and mnli.labels() == [2, 0]
    assert calls[-1] == ("nyu-mll/glue", "mnli", "validation_matched")
    ner, pos = tasks.load("ner", "dev"), tasks.load("pos", "dev")
    assert ner.inputs() == [Words(("Paris", "is"))] and ner.labels() == [[5, 0]]  # B-LOC, O
    assert pos.labels() == [[22, 42]]
    with pytest.raises(TaskError, match=r"label -1.*split='dev'"):
        tasks.load("mnli", "test")
    with pytest.raises(TaskError, match=r"nyu-mll/glue \(dev\) has no column sentence"):
        tasks.load("sst2", "dev")  # the stand-in's MNLI table
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_dict(
        {"sentence": ["x"], "label": [5]}))
    with pytest.raises(TaskError, match=r"label 5, outside 0\.\.1"):
        tasks.load("sst2", "dev")


# -- bad input: one TaskError line naming the problem and the fix --------------------------------


def _one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message and isinstance(error.value, ValueError)
    return message


def test_unknown_name_and_split():
    with pytest.raises(TaskError) as error:
        tasks.load("sst3", "dev", data_dir=DATA)
    assert "sst3" in _one_line(error) and all(name in str(error.value) for name in tasks.NAMES)
    with pytest.raises(TaskError) as error:
        tasks.load("sst2", "valid", data_dir=DATA)
    assert "'valid'" in _one_line(error) and all(split in str(error.value) for split in tasks.SPLITS)


def test_a_missing_file_names_the_path(tmp_path):
    with pytest.raises(TaskError) as error:
        tasks.load("sst2", "dev", data_dir=tmp_path)
    assert str(tmp_path / "sst2" / "dev.tsv") in _one_line(error)
    write(tmp_path / "mrpc" / "msr_paraphrase_train.txt",
          "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\ta\tb\n")
    with pytest.raises(TaskError, match=re.escape(str(tmp_path / "mrpc" / "dev_ids.tsv"))):
        tasks.load("mrpc", "dev", data_dir=tmp_path)


def test_unlabelled_test_splits_say_so():
    data_file("sst2/test.tsv")
    for name, path in (("sst2", "sst2/test.tsv"), ("cola", "cola/glue/test.tsv")):
        with pytest.raises(TaskError) as error:
            tasks.load(name, "test", data_dir=DATA)
        assert str(DATA / path) in _one_line(error) and "no label" in str(error.value)
        assert "split='dev'" in str(error.value)


def test_labels_outside_the_label_set_in_a_file(tmp_path):
    write(tmp_path / "sst2" / "dev.tsv", "sentence\tlabel\ngood .\t1\nbad .\t2\n")
    with pytest.raises(TaskError) as error:
        tasks.load("sst2", "dev", data_dir=tmp_path)
    assert "line 3" in _one_line(error) and "'2'" in str(error.value)
    write(tmp_path / "conll2003" / "valid.txt", "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nx NNP B-NP B-FOO\n")
    with pytest.raises(TaskError, match=r"line 4: label 'B-FOO'"):
        tasks.load("ner", "dev", data_dir=tmp_path)
    assert tasks.load("pos", "dev", data_dir=tmp_path).labels() == [[22, 22]]
    with pytest.raises(TaskError, match=r"label '-' is not a MNLI label"):
        tasks.load("mnli", "dev", data_dir=mnli_dir(tmp_path, gold=["neutral", "-"]))


def test_bad_predictions():
    sst2, ner = real("sst2", "dev"), real("ner", "dev")
    with pytest.raises(TaskError) as error:
        sst2.score([0] * 871)
    assert "871 predictions" in _one_line(error) and "872" in str(error.value)
    for bad in (2, -1, "neutral", 1.0, True):
        with pytest.raises(TaskError, match="not a label"):
            sst2.score([0] * 871 + [bad])
    with pytest.raises(TaskError, match="single string"):
        sst2.score("positive")
    gold = ner.labels()
    with pytest.raises(TaskError, match=r"prediction 0 .* 10 labels for 11 words"):
        ner.score([tags[:-1] if i == 0 else tags for i, tags in enumerate(gold)])
    with pytest.raises(TaskError, match="not a label"):
        ner.score([["B-FOO"] * len(tags) for tags in gold])
    with pytest.raises(TaskError, match="majority_score"):
        sst2.majority_score(real("cola", "train"))


def test_limit_must_be_a_positive_whole_number():
    data_file(NEEDS["sst2"])
    for bad in (0, -3, True):
        with pytest.raises(TaskError) as error:
            tasks.load("sst2", "dev", data_dir=DATA, limit=bad)
        assert "limit" in _one_line(error)
    with unchecked(), pytest.raises(TaskError, match="limit must be a whole number"):
        tasks.load("sst2", "dev", data_dir=DATA, limit=2.5)


def test_a_split_is_parsed_once_and_read_again_when_its_file_changes(tmp_path, monkeypatch):
    """tasks.load keeps a parsed file per process: a second load does not read the file again,
    an edited file (other size and modification time) is read again, and a subset drawn from
    the kept columns equals the one drawn from the whole Dataset (numpy's draw, file order)."""
    folder = tmp_path / "sst2"
    folder.mkdir()
    rows = [f"sentence number {i}\t{i % 2}" for i in range(20)]
    (folder / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    reads = []
    real = task_files._read_tsv
    monkeypatch.setattr(task_files, "_read_tsv", lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    first = tasks.load("sst2", "train", data_dir=tmp_path)
    again = tasks.load("sst2", "train", data_dir=tmp_path, limit=5, seed=3)
    assert len(reads) == 1 and first.inputs()[0] == "sentence number 0"
    chosen = np.sort(np.random.default_rng(3).choice(20, size=5, replace=False))
    assert again.inputs() == [f"sentence number {i}" for i in chosen]
    assert again.labels() == [int(i % 2) for i in chosen]
    (folder / "train.tsv").write_text("sentence\tlabel\nan edited file\t1\n", encoding="utf-8")
    edited = tasks.load("sst2", "train", data_dir=tmp_path)
    assert len(reads) == 2 and edited.inputs() == ["an edited file"] and edited.labels() == [1]


def test_a_byte_order_mark_is_not_read_as_text(tmp_path):
    """A task file saved with a byte-order mark (SST-2's header then read ``\ufeffsentence``)
    was refused as a bad header. Reference: the rows as written."""
    (tmp_path / "sst2").mkdir()
    (tmp_path / "sst2" / "train.tsv").write_text("\ufeffsentence\tlabel\na fine film\t1\ndull\t0\n", encoding="utf-8")
    sst2 = tasks.load("sst2", "train", data_dir=tmp_path)
    assert sst2.inputs() == ["a fine film", "dull"] and sst2.labels() == [1, 0]
    (tmp_path / "conll2003").mkdir()
    (tmp_path / "conll2003" / "train.txt").write_text(
        "\ufeff-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nsays VBZ B-VP O\n\n", encoding="utf-8")
    ner = tasks.load("ner", "train", data_dir=tmp_path)
    assert ner.inputs() == [Words(("EU", "says"))]
    assert [[ner.label_names[tag] for tag in tags] for tags in ner.labels()] == [["B-ORG", "O"]]
