"""attnlens.load: the default model offline, wrapping, and errors that say what to do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attnlens
from attnlens import papa
from attnlens.core import seam
from attnlens.core.loading import is_causal, model_id
from attnlens.errors import InputError
from tests import tiny


def test_default_model_is_a_bridge_with_the_seam(minilm):
    assert type(minilm).__name__ == "TransformerBridge"
    assert (minilm.cfg.n_layers, minilm.cfg.n_heads, minilm.cfg.d_head) == (6, 12, 32)
    assert seam.is_installed(minilm)
    assert not minilm.training


@pytest.mark.slow
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
        str(attnlens.core.loading.default_model_path()), device="cpu"
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


def test_local_folder_by_relative_path_has_the_id_of_its_absolute_path(tmp_path, monkeypatch):
    folder = tmp_path / "tiny-bert"
    tiny.tiny_bert().save_pretrained(folder)
    tiny.bert_tokenizer().save_pretrained(folder)
    absolute = attnlens.load(str(folder))
    monkeypatch.chdir(tmp_path)
    relative = [attnlens.load("./tiny-bert"), attnlens.load("tiny-bert"), attnlens.load(Path("tiny-bert"))]
    monkeypatch.chdir(folder)
    relative.append(attnlens.load("../tiny-bert"))
    assert model_id(absolute) == str(folder.resolve())
    assert [model_id(bridge) for bridge in relative] == [str(folder.resolve())] * 4
    # so constants fitted on one are accepted for the other (same id, same weights)
    constants = papa.fit(relative[0], tiny.CORPUS[:4], max_len=16, progress=False)
    constants.check_compatible(absolute)


def test_is_causal():
    assert is_causal(tiny.gpt2_bridge()) is True
    assert is_causal(tiny.bert_bridge()) is False


def test_folder_without_tokenizer_files_is_refused(tmp_path):
    """transformers makes up a 5-token BertTokenizer for such a folder: every word would be [UNK]."""
    tiny.tiny_bert().save_pretrained(tmp_path)
    from transformers import BertForMaskedLM

    for model in (str(tmp_path), BertForMaskedLM.from_pretrained(tmp_path)):
        with pytest.raises(ValueError, match="tokenizer knows 5 tokens but the model's vocabulary has 30522"):
            attnlens.load(model)
    bridge = attnlens.load(str(tmp_path), tokenizer=tiny.bert_tokenizer())
    assert len(bridge.tokenizer) == 30522


def test_missing_local_folder_is_named_not_looked_up_on_the_hub(tmp_path):
    for path in (tmp_path / "missing", "./no-such-model", "~/no/such/model"):
        with pytest.raises(FileNotFoundError, match="No model folder at /"):
            attnlens.load(path if isinstance(path, str) else str(path))


@pytest.mark.slow
def test_cached_hub_name_loads_offline(tmp_path):
    """HF_HUB_OFFLINE=1 still lets transformers read its cache; attnlens must not refuse first."""
    snapshot = tmp_path / "hub" / "models--someorg--tiny-bert" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (tmp_path / "hub" / "models--someorg--tiny-bert" / "refs").mkdir()
    (tmp_path / "hub" / "models--someorg--tiny-bert" / "refs" / "main").write_text("0" * 40)
    tiny.tiny_bert().save_pretrained(snapshot)
    tiny.bert_tokenizer().save_pretrained(snapshot)
    code = "import attnlens; m = attnlens.load('someorg/tiny-bert'); print(m.cfg.n_layers, attnlens.core.seam.is_installed(m))"
    env = {**__import__("os").environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "2 True"


def test_model_object_keeps_its_dtype_and_a_bridge_takes_no_arguments():
    model = tiny.tiny_bert().to(torch.float64)
    bridge = attnlens.load(model, tokenizer=tiny.bert_tokenizer())
    assert bridge.original_model.dtype == torch.float64 and bridge.original_model is model
    with pytest.raises(ValueError, match="dtype="):
        attnlens.load(bridge, dtype=torch.float32)


def test_an_architecture_without_adapter_gets_one_short_line_naming_the_adapters(tmp_path):
    """A folder of a model attnlens has no adapter for: one short message naming the adapters,
    not TransformerLens's list of ~100 architectures."""
    from transformers import DistilBertConfig, DistilBertForMaskedLM

    model = DistilBertForMaskedLM(DistilBertConfig(n_layers=1, n_heads=2, dim=16, hidden_dim=32))
    model.save_pretrained(tmp_path)
    tiny.bert_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(attnlens.core.models.UnsupportedArchitecture) as error:
        attnlens.load(str(tmp_path))
    message = str(error.value)
    assert "\n" not in message and len(message) < 600, message
    for name in ("BertForMaskedLM", "GPT2LMHeadModel", "LlamaForCausalLM"):
        assert name in message


def test_every_adapter_is_one_file_of_facts():
    from attnlens.core import models

    names = [architecture.name for architecture in models.ARCHITECTURES]
    assert names == ["bert", "roberta", "gpt2", "llama"]
    for architecture in models.ARCHITECTURES:
        assert architecture.seam in ("attnlens", "native")
        assert architecture.layout == ("padded" if architecture.causal else "papa")
    assert models.of(tiny.tiny_gpt2()).causal and not models.of(tiny.tiny_bert()).causal
    with pytest.raises(models.UnsupportedArchitecture, match="adapters: bert"):
        models.of(types_config("t5"))


def types_config(model_type: str):
    from types import SimpleNamespace

    return SimpleNamespace(model_type=model_type)


def test_a_gpt2_whose_scores_are_not_scaled_is_refused():
    """TransformerLens's bridge scales GPT-2's attention scores by 1/sqrt(d_head) whatever the
    config says: with scale_attn_weights=False its logits were off Hugging Face's by 1.5e-3 (a
    pattern by 2e-2); such a model is refused at load, naming the setting."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = tiny.gpt2_tokenizer()
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=32, n_layer=1, n_head=2, n_embd=16,
                        scale_attn_weights=False)
    config.architectures = ["GPT2LMHeadModel"]
    with pytest.raises(attnlens.core.models.UnsupportedArchitecture, match="scale_attn_weights=False"):
        attnlens.load(GPT2LMHeadModel(config).eval(), tokenizer=tokenizer)


@pytest.mark.parametrize("name", ["bert", "roberta"])
def test_an_encoder_configured_as_a_decoder_is_refused(name):
    """BERT or RoBERTa with ``is_decoder=True`` runs causal self-attention in Hugging Face, which
    attnlens took for an encoder's: PAPA's constants and the uniform ablation then let a token
    see later ones (a uniform replacement moved logits of positions 0-2 by 0.95 when token 10
    changed, where the model moves them by 0). Refused at load, naming the setting."""
    model = tiny.tiny_bert() if name == "bert" else tiny.tiny_roberta()
    model.config.is_decoder = True
    tokenizer = tiny.bert_tokenizer() if name == "bert" else tiny.roberta_tokenizer()
    with pytest.raises(attnlens.core.models.UnsupportedArchitecture, match="is_decoder=True"):
        attnlens.load(model, tokenizer=tokenizer)


@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_texts_of_a_sliding_window_model_fit_in_its_window(family):
    """A Mistral (or a Qwen2 with ``use_sliding_window``) attends to the last ``sliding_window``
    keys only; attnlens's constant and uniform patterns know no window, so a head replaced by
    them read keys the model cannot (on a 17-token text with a window of 4, 0.77 of a query's
    mass). A text may hold at most the window's tokens: a longer max_len is refused by name, one
    within it is taken. The window's meaning is Hugging Face's own: its eager attention of the
    same model gives a query no weight on keys ``window`` or more positions back."""
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    tokenizer, window = tiny.gpt2_tokenizer(), 4
    sizes = dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                 sliding_window=window, attn_implementation="eager")
    if family == "mistral":
        config, model_class = MistralConfig(**sizes), MistralForCausalLM
    else:
        config, model_class = Qwen2Config(use_sliding_window=True, max_window_layers=0, **sizes), Qwen2ForCausalLM
    config.architectures = [model_class.__name__]
    torch.manual_seed(0)
    hf = model_class(config).eval()
    ids = torch.arange(3, 3 + 9)[None]
    with torch.no_grad():
        attentions = hf(input_ids=ids, output_attentions=True).attentions
    reach = torch.arange(9)[:, None] - torch.arange(9)[None, :]
    assert all(bool((pattern[..., reach >= window] == 0).all()) for pattern in attentions)
    assert all(bool((pattern[..., reach == window - 1] > 0).all()) for pattern in attentions)
    bridge = attnlens.load(hf, tokenizer=tokenizer)
    assert attnlens.core.inputs.position_limit(bridge) == window
    with pytest.raises(InputError, match="sliding window of 4 tokens"):
        attnlens.tokenize(bridge, ["one two three four five six"], max_len=window + 1)
    with pytest.raises(InputError, match="sliding window"):
        papa.fit(bridge, ["one two three"], max_len=8, progress=False)
    assert attnlens.tokenize(bridge, ["one two three four five six"], max_len=window).input_ids.shape == (1, window)
