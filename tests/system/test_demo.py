"""examples/demo.py prints only numbers that mean something for MiniLM.

The default checkpoint (all-MiniLM-L6-v2) ships no masked-LM head: the bridge's MLM head is
randomly initialised at load, so its logits and top predictions are noise. MiniLM's real output is
the sentence embedding (the last hidden state mean-pooled over the real tokens); the demo reports
how PAPA replacement moves it. Reference for the embedding: Hugging Face's ``BertModel`` (eager
attention) on the same inputs, pooled the way sentence-transformers pools.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

import attnlens

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo.py"


@pytest.fixture(scope="module")
def demo():
    spec = importlib.util.spec_from_file_location("attnlens_demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_demo_embeddings_are_minilms_sentence_embeddings(demo, minilm):
    from transformers import BertModel

    from attnlens.core.loading import default_model_path

    hf = BertModel.from_pretrained(str(default_model_path()), attn_implementation="eager").eval()
    batch = attnlens.tokenize(minilm, demo.SENTENCES, max_len=32, layout="padded")
    assert (batch.attention_mask == 0).any(), "padding must be left out of the mean"
    with torch.no_grad():
        hidden = hf(input_ids=batch.input_ids, **batch.model_kwargs()).last_hidden_state
    real = batch.attention_mask[..., None].float()
    expected = (hidden * real).sum(1) / real.sum(1)
    # both float32 forwards of the same eager attention (the seam is eager attention line for line)
    torch.testing.assert_close(demo.sentence_embeddings(minilm, batch), expected, atol=1e-5, rtol=0)


def test_demo_prints_embedding_similarities_and_no_mlm_head_numbers(demo, minilm, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(demo, "N_TEXTS", 12)
    monkeypatch.setattr(demo, "REPORT", tmp_path / "report.html")
    monkeypatch.setattr(attnlens, "load", lambda *args, **kwargs: minilm)
    demo.main()
    out = capsys.readouterr().out
    assert (tmp_path / "report.html").exists()
    for meaningless in ("logit", "prediction", "top ", "mlm"):
        assert meaningless not in out.lower(), f"the demo prints MLM-head numbers ({meaningless!r})"
    assert "cosine similarity to the model's own sentence embedding (papa layout)" in out
    assert re.search(r"layout only\s+half replaced\s+all replaced", out)
    rows = {}
    for sentence in demo.SENTENCES:
        shown = sentence if len(sentence) <= 48 else sentence[:45] + "..."
        line = next(line for line in out.splitlines() if line.strip().startswith(shown))
        rows[sentence] = [float(value) for value in line[len(shown) + 2 :].split()]
    for layout_only, half, all_ in rows.values():
        assert all(-1 <= value <= 1 for value in (layout_only, half, all_))
        assert layout_only > 0.9, "moving [SEP] alone keeps the embedding"
        assert all_ < layout_only, "replacing every head moves the embedding"
    assert re.search(r"two different sentences above: mean cosine similarity -?\d\.\d{3}", out)
