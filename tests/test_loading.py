"""attnlens.load: the default model offline, wrapping, and errors that say what to do."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import attnlens
from attnlens import seam
from tests import tiny


def test_default_model_is_a_bridge_with_the_seam(minilm):
    assert type(minilm).__name__ == "TransformerBridge"
    assert (minilm.cfg.n_layers, minilm.cfg.n_heads, minilm.cfg.d_head) == (6, 12, 32)
    assert seam.is_installed(minilm)
    assert not minilm.training


def test_import_and_load_print_transformerbridge_offline():
    code = "import attnlens, torch; m = attnlens.load(); print(type(m).__name__)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "TransformerBridge"


def test_default_head_is_reproducible(minilm):
    again = attnlens.load()
    ids = attnlens.tokenize(minilm, ["a film ."], max_len=8).input_ids
    with torch.no_grad():
        torch.testing.assert_close(again(ids), minilm(ids), atol=0, rtol=0)


def test_existing_bridge_is_prepared_in_place():
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(
        str(attnlens.loading.default_model_path()), device="cpu"
    )
    assert not seam.is_installed(bridge)
    assert attnlens.load(bridge) is bridge and seam.is_installed(bridge)


def test_local_folder(tmp_path):
    model = tiny.tiny_bert()
    model.save_pretrained(tmp_path)
    tiny.bert_tokenizer().save_pretrained(tmp_path)
    bridge = attnlens.load(str(tmp_path))
    assert bridge.cfg.n_layers == 2 and seam.is_installed(bridge)


def test_unsupported_architecture_lists_supported_ones():
    from transformers import BertConfig, BertModel

    with pytest.raises(ValueError, match="BertForMaskedLM, RobertaForMaskedLM, GPT2LMHeadModel"):
        attnlens.load(BertModel(BertConfig(**tiny.SIZES)), tokenizer=tiny.bert_tokenizer())


def test_hub_name_offline_says_how_to_pass_a_local_folder(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match="local folder"):
        attnlens.load("google-bert/bert-base-uncased")


def test_missing_tokenizer():
    with pytest.raises(ValueError, match="tokenizer="):
        attnlens.load(tiny.tiny_bert())


def test_bad_type():
    with pytest.raises(TypeError, match="hub name or local folder"):
        attnlens.load(42)
