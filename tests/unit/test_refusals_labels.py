"""A task refuses predictions whose labels are not in its label set (issue 61, item 1): NER
tags scored as POS tags used to score 0.0 instead of being refused."""

from __future__ import annotations

import pytest

from attnlens.errors import InputError
from attnlens.evaluation import tasks

CONLL = (
    "-DOCSTART- -X- -X- O\n\n"
    "EU NNP B-NP B-ORG\nrejects VBZ B-VP O\nGerman JJ B-NP B-MISC\ncall NN I-NP O\n. . O O\n\n"
    "Peter NNP B-NP B-PER\nBlackburn NNP I-NP I-PER\n"
)


@pytest.fixture()
def conll(tmp_path):
    (tmp_path / "conll2003").mkdir()
    (tmp_path / "conll2003" / "valid.txt").write_text(CONLL, encoding="utf-8")
    return tasks.load("pos", "dev", data_dir=tmp_path), tasks.load("ner", "dev", data_dir=tmp_path)


def test_ner_predictions_scored_as_pos_are_refused(conll):
    pos, ner = conll
    gold_ner = ner.labels()  # what a NER probe predicts: ints into NER_TAGS
    predictions = tasks.labelled(gold_ner, tasks.NER_TAGS, task="ner")
    assert ner.score(predictions) == 1.0  # on its own task, the same predictions are fine
    with pytest.raises(InputError) as error:
        pos.score(predictions)
    assert str(error.value) == (
        "predictions for 'pos' (CoNLL-2003 POS) name 5 labels that are not a label of 'pos': "
        "'B-ORG', 'O', 'B-MISC' and 2 more; they were made for 'ner' (labels 'O', 'B-PER', 'I-PER', "
        "'B-ORG', 'I-ORG', ... (9 in all)). Pass predictions of a probe fitted on 'pos' (labels '\"', "
        "\"''\", '#', '$', '(', ... (47 in all)), as these names or ints in 0..46."
    )
    # the same refusal reaches the bootstrap's per-example counts
    from attnlens.evaluation.probing.intervals import counts

    with pytest.raises(InputError, match="not a label of 'pos'"):
        counts(pos, predictions)


def test_label_names_of_another_task_are_refused_all_at_once(conll):
    pos, _ = conll
    names = [[tasks.NER_TAGS[tag] for tag in tags] for tags in conll[1].labels()]
    with pytest.raises(tasks.TaskError) as error:
        pos.score(names)
    assert str(error.value).startswith(
        "predictions for 'pos' (CoNLL-2003 POS) name 5 labels that are not a label of 'pos': "
        "'B-ORG', 'O', 'B-MISC' and 2 more. Pass predictions of a probe fitted on 'pos'")


def test_predictions_in_another_order_of_the_same_labels_are_translated(conll):
    pos, _ = conll
    reverse = tuple(reversed(tasks.POS_TAGS))
    gold = pos.labels()
    flipped = [[reverse.index(tasks.POS_TAGS[tag]) for tag in tags] for tags in gold]
    assert pos.score(tasks.labelled(flipped, reverse, task="pos")) == 1.0
    assert pos.score(flipped) < 1.0  # read as indices into POS_TAGS: wrong


def test_a_single_unknown_sentence_label(tmp_path):
    (tmp_path / "sst2").mkdir()
    (tmp_path / "sst2" / "dev.tsv").write_text("sentence\tlabel\ngood .\t1\nbad .\t0\n", encoding="utf-8")
    sst2 = tasks.load("sst2", "dev", data_dir=tmp_path)
    assert sst2.score(["positive", "negative"]) == 1.0
    with pytest.raises(InputError) as error:
        sst2.score(["positive", "neutral"])
    assert str(error.value) == (
        "predictions for 'sst2' (SST-2) name 1 label that is not a label of 'sst2': 'neutral'. Pass "
        "predictions of a probe fitted on 'sst2' (labels 'negative', 'positive'), as these names or "
        "ints in 0..1.")
    cola = tasks.labelled([1, 0], ("unacceptable", "acceptable"), task="cola")
    with pytest.raises(InputError, match=r"'acceptable', 'unacceptable'; they were made for 'cola'"):
        sst2.score(cola)


def test_a_probes_own_predictions_carry_its_label_set(conll):
    """End to end: a probe fitted with NER's label names predicts ints that POS refuses."""
    from attnlens.evaluation import probing
    from tests import tiny

    pos, ner = conll
    features = probing.extract(tiny.bert_bridge(), ner.inputs(), max_len=16, progress=False)
    probe = probing.PapaProbe(epochs=1).fit(features, ner.labels(), task="ner", label_names=tasks.NER_TAGS)
    predicted = probe.predict(features)
    assert predicted.label_names == tuple(tasks.NER_TAGS) and predicted.task == "ner"
    ner.score(predicted)  # its own task takes them
    with pytest.raises(InputError, match="they were made for 'ner'"):
        pos.score(predicted)
