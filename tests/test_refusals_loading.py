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
from tests import tiny
from tests.typechecks import unchecked


def test_attnlens_error_is_exported():
    assert attnlens.AttnlensError is AttnlensError


def test_a_device_torch_does_not_know_is_named():
    with pytest.raises(InputError, match="device 'bogus' is not a device torch knows") as info, unchecked():
        attnlens.load(tiny.tiny_bert(), tokenizer=tiny.bert_tokenizer(), device="bogus")
    assert type(info.value) is InputError


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_on_a_machine_without_it_is_named():
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
    from attnlens.compare import Comparison

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
    from attnlens import patterns

    with pytest.raises(InputTypeError, match="classifier must be None .* or a fitted PatternCNN, got 'cnn'"):
        patterns.types(bridge, tiny.CORPUS[:2], classifier="cnn", max_len=12, progress=False)
