"""Tiny randomly initialised HF models with offline tokenizers, for fast unit tests."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2TokenizerFast,
    LlamaConfig,
    LlamaForCausalLM,
    RobertaConfig,
    RobertaForMaskedLM,
    RobertaTokenizerFast,
)

from attnlens.core.loading import default_model_path

CORPUS = [
    "the quick brown fox jumps over the lazy dog .",
    "a film that is funny , moving and wise , though slow at times !",
    "researchers measured how much attention heads depend on their input ?",
    "it rained all day ; the match was postponed until sunday .",
] * 4


@functools.cache
def bpe_tokenizer_files() -> ByteLevelBPETokenizer:
    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(
        CORPUS, vocab_size=400, min_frequency=1,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
    )
    return tokenizer


#: The saved tokenizers' folders, removed when the process exits (their finalizers).
_FOLDERS: list[tempfile.TemporaryDirectory] = []


def _saved(tokenizer, name: str):
    """Save and reload: TransformerLens re-creates tokenizers from their name_or_path, so the
    folder lives as long as the process."""
    _FOLDERS.append(tempfile.TemporaryDirectory(prefix=f"attnlens-tiny-{name}-"))
    folder = Path(_FOLDERS[-1].name)
    tokenizer.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


@functools.cache
def roberta_tokenizer() -> RobertaTokenizerFast:
    return _saved(RobertaTokenizerFast(
        tokenizer_object=bpe_tokenizer_files(), bos_token="<s>", eos_token="</s>",
        sep_token="</s>", cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>",
    ), "roberta")


@functools.cache
def gpt2_tokenizer() -> GPT2TokenizerFast:
    return _saved(
        GPT2TokenizerFast(tokenizer_object=bpe_tokenizer_files(), bos_token="<s>", eos_token="</s>"),
        "gpt2",
    )


@functools.cache
def bert_tokenizer():
    return AutoTokenizer.from_pretrained(str(default_model_path()))


SIZES = dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=32, intermediate_size=64)


def tiny_bert(seed: int = 0) -> BertForMaskedLM:
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=30522, max_position_embeddings=128, **SIZES)
    config.architectures = ["BertForMaskedLM"]
    return BertForMaskedLM(config).eval()


def tiny_roberta(seed: int = 0) -> RobertaForMaskedLM:
    torch.manual_seed(seed)
    config = RobertaConfig(
        vocab_size=len(roberta_tokenizer()), max_position_embeddings=130, pad_token_id=1,
        bos_token_id=0, eos_token_id=2, type_vocab_size=1, **SIZES,
    )
    config.architectures = ["RobertaForMaskedLM"]
    return RobertaForMaskedLM(config).eval()


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(gpt2_tokenizer()), n_positions=128, n_layer=2, n_head=4, n_embd=32,
        bos_token_id=0, eos_token_id=2,
    )
    config.architectures = ["GPT2LMHeadModel"]
    return GPT2LMHeadModel(config).eval()


def bert_bridge(seed: int = 0):
    """A fresh tiny BERT as an attnlens bridge (attnlens.load with its tokenizer)."""
    import attnlens

    return attnlens.load(tiny_bert(seed), tokenizer=bert_tokenizer())


def roberta_bridge(seed: int = 0):
    """A fresh tiny RoBERTa as an attnlens bridge (attnlens.load with its tokenizer)."""
    import attnlens

    return attnlens.load(tiny_roberta(seed), tokenizer=roberta_tokenizer())


def gpt2_bridge(seed: int = 0):
    """A fresh tiny GPT-2 as an attnlens bridge (attnlens.load with its tokenizer)."""
    import attnlens

    return attnlens.load(tiny_gpt2(seed), tokenizer=gpt2_tokenizer())


def llama_bridge(seed: int = 0):
    """A random Llama as an attnlens bridge, whose 6 query heads share 2 key-value heads (3
    each), as in Llama 3 (RMSNorm bridges; GPT-2's tokenizer)."""
    import attnlens

    tokenizer = gpt2_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=48, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(seed)
    return attnlens.load(LlamaForCausalLM(config).eval(), tokenizer=tokenizer)
