"""Refusals of loading and running a model (issue 26, pattern 7): devices, dtypes, token ids,
pattern-type classifiers, comparisons read back, given as one line naming the argument."""

from __future__ import annotations

import json

import pytest
import torch

import attnlens
from attnlens.errors import (
    AttnlensError,
    FileFormatError,
    InputError,
    InputTypeError,
    UnavailableError,
)
from attnlens.evaluation.lm import scorer
from attnlens.evaluation.probing import mlm
from tests import tiny
from tests.refusals import assert_refused
from tests.typechecks import unchecked


def test_attnlens_error_is_exported():
    assert attnlens.AttnlensError is AttnlensError


def test_a_device_torch_does_not_know_is_named():
    with pytest.raises(InputError, match="device 'bogus' is not a device torch knows") as info, unchecked():
        attnlens.load(tiny.tiny_bert(), tokenizer=tiny.bert_tokenizer(), device="bogus")
    assert type(info.value) is InputError


def test_cuda_on_a_machine_without_it_is_named(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # any machine: as one without CUDA
    with pytest.raises(UnavailableError, match="device 'cuda'.*no CUDA GPU.*device='cpu'") as info:
        attnlens.load(tiny.tiny_bert(), tokenizer=tiny.bert_tokenizer(), device="cuda")
    assert isinstance(info.value, RuntimeError)


def test_a_dtype_given_by_name_is_accepted_and_a_bad_one_named():
    with unchecked():
        bridge = attnlens.load(tiny.tiny_bert(), tokenizer=tiny.bert_tokenizer(), dtype="float16")
    assert next(bridge.original_model.parameters()).dtype == torch.float16
    with pytest.raises(InputError, match="dtype 'float17' is not a floating-point dtype"), unchecked():
        attnlens.load(tiny.tiny_bert(), tokenizer=tiny.bert_tokenizer(), dtype="float17")
    with pytest.raises(InputTypeError, match="dtype must be a torch.dtype or its name"), unchecked():
        attnlens.load(tiny.tiny_bert(), tokenizer=tiny.bert_tokenizer(), dtype=16)


@pytest.fixture(scope="module")
def bridge():
    return tiny.bert_bridge()


def test_a_token_id_beyond_the_vocabulary_is_named(bridge):
    batch = attnlens.tokenize(bridge, ["the dog barks ."], max_len=8, layout="padded")
    batch.input_ids[0, 1] = bridge.cfg.d_vocab + 5
    with pytest.raises(InputError, match=f"token id {bridge.cfg.d_vocab + 5}, outside the model's vocabulary"):
        attnlens.run_with_hooks(bridge, batch)


def test_compare_batch_size_as_a_string_is_named(bridge):
    with pytest.raises(InputTypeError, match="batch_size must be a whole number") as info, unchecked():
        attnlens.compare(bridge, "standard", corpus=tiny.CORPUS[:2], batch_size="4", progress=False)
    assert type(info.value) is InputTypeError


def test_a_truncated_comparison_json_is_named(bridge, tmp_path):
    from attnlens.comparison.result import Comparison

    comparison = attnlens.compare(bridge, "standard", corpus=tiny.CORPUS[:2], max_len=12, progress=False)
    path = tmp_path / "comparison.json"
    text = comparison.to_json()
    json.loads(text)
    path.write_text(text[: len(text) // 2], encoding="utf-8")
    with pytest.raises(FileFormatError, match=f"comparison file {path} is not a Comparison.*not valid JSON"):
        Comparison.from_json(path)
    path.write_text(json.dumps({"table": []}), encoding="utf-8")
    with pytest.raises(FileFormatError, match="lacks or mangles the field 'views'"):
        Comparison.from_json(path)


def test_a_classifier_given_by_name_is_named(bridge):
    from attnlens.methods import patterns

    with pytest.raises(InputTypeError, match="classifier must be None .* or a fitted PatternCNN, got 'cnn'"):
        patterns.types(bridge, tiny.CORPUS[:2], classifier="cnn", max_len=12, progress=False)


NAN = float("nan")


def sst2(limit=4):
    from attnlens.evaluation import tasks
    from tests.conftest import DATA, data_file

    data_file("sst2/dev.tsv")
    return tasks.load("sst2", "dev", data_dir=DATA, limit=limit)


def compared(bridge, **options):
    return attnlens.compare(bridge, "standard", corpus=tiny.CORPUS[:2], max_len=12, progress=False, **options)


TEXTS = ["the dog barks .", "a cat sleeps .", "it rains ."]
ROWS = [
    # (call(bridge, value), argument, bad value, error class, fragment of the message)
    (lambda m, v: sst2().select(v), "indices", [9], InputError, "indices[0] must be in 0..3"),
    (lambda m, v: sst2().select(v), "indices", [-1], InputError, "indices[0] must be in 0..3"),
    (lambda m, v: sst2().select(v), "indices", [0.5], InputTypeError, "indices[0] must be a whole number"),
    (lambda m, v: sst2().select(v), "indices", "01", InputTypeError, "indices must be a list"),
    (lambda m, v: sst2(limit=v), "limit", 2.5, InputError, "limit must be a whole number"),
    (lambda m, v: mlm.probe(m, TEXTS, max_len=v, cache=False, progress=False), "max_len", 12.5, InputTypeError, "max_len must be a whole number"),
    (lambda m, v: mlm.probe(m, TEXTS, batch_size=v, cache=False, progress=False), "batch_size", "4", InputTypeError, "batch_size must be a whole number"),
    (lambda m, v: mlm.probe(m, TEXTS, mask_rate=v, cache=False, progress=False), "mask_rate", "0.15", InputTypeError, "mask_rate must be a number"),
    (lambda m, v: scorer.score(m, TEXTS, mask_rate=v, progress=False), "mask_rate", True, InputTypeError, "mask_rate must be a number"),
    (lambda m, v: scorer.LMScorer(m, "mlm", mask_rate=v), "mask_rate", NAN, InputError, "mask_rate must be a finite number"),
    (lambda m, v: scorer.LMScorer(m, "mlm", seed=v), "seed", 1.5, InputTypeError, "seed must be a whole number"),
    (lambda m, v: compared(m, train_limit=v), "train_limit", 2.5, InputTypeError, "train_limit must be a whole number"),
    (lambda m, v: compared(m, eval_limit=v), "eval_limit", 0, InputError, "eval_limit must be at least 1"),
    (lambda m, v: compared(m, focus=v), "focus", (True, 1), InputError, "focus=(True, 1) should be a (layer, head) pair"),
    (lambda m, v: compared(m).to_circuitsvis(layer=v), "layer", 2, InputError, "layer must be in 0..1"),
    (lambda m, v: compared(m).to_circuitsvis(layer=v), "layer", 1.0, InputTypeError, "layer must be a whole number"),
    (lambda m, v: compared(m).to_json(indent=v), "indent", 1.5, InputTypeError, "indent must be a whole number"),
]


@pytest.mark.parametrize(("call", "argument", "value", "error", "words"), ROWS,
                         ids=[f"{argument}={value!r}"[:40] for _, argument, value, _, _ in ROWS])
def test_a_bad_argument_is_refused_by_name(bridge, call, argument, value, error, words):
    assert_refused(lambda: call(bridge, value), error, words, exact=False)
